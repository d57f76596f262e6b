"""The house's structure (design.md §2): no import cycle, even through imports inside functions, and
imports strictly downward between the layers (model/ knows nothing of memory/, writers or jobs;
library code never imports the CLI)."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "worldtrace_cli"


def module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imports(path: Path, known: set[str]) -> set[str]:
    """worldtrace modules ``path`` imports anywhere (module level and inside functions), except under
    ``if TYPE_CHECKING`` and ``if __name__ == "__main__"``."""
    name = module_name(path)
    package = name.split(".") if path.name == "__init__.py" else name.split(".")[:-1]
    found = set()

    def visit(node):
        if isinstance(node, ast.If) and ("TYPE_CHECKING" in ast.dump(node.test) or "__main__" in ast.dump(node.test)):
            for child in node.orelse:
                visit(child)
            return
        if isinstance(node, ast.ImportFrom):
            base = package[:len(package) - node.level + 1] if node.level else []
            target = ".".join(base + ([node.module] if node.module else [])) if node.level else node.module or ""
            for alias in node.names:
                full = f"{target}.{alias.name}"
                found.add(full if full in known else target)
        elif isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        for child in ast.iter_child_nodes(node):
            visit(child)

    visit(ast.parse(path.read_text()))
    return {m for m in found if m in known and m != name}


def graph() -> dict[str, set[str]]:
    paths = list(PACKAGE.rglob("*.py"))
    known = {module_name(p) for p in paths}
    return {module_name(p): imports(p, known) for p in paths}


def cycles(g: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index, low, stack, on, out, counter = {}, {}, [], set(), [], [0]

    def connect(v):
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in g[v]:
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    for v in g:
        if v not in index:
            connect(v)
    return out


def test_the_cycle_finder_finds_cycles():
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_no_import_cycle():
    g = graph()
    assert len(g) > 80 and "worldtrace_cli.memory.base" in g["worldtrace_cli.memory.field"]
    assert cycles(g) == []


def test_imports_go_downward():
    g = graph()
    for mod, deps in g.items():
        if mod.startswith("worldtrace_cli.model"):  # the networks know nothing of writers, runs or jobs
            assert not {d for d in deps if d.split(".")[1] in ("memory", "jobs", "runs", "cli", "loopbench",
                                                               "pipeline", "rollout", "config", "engine",
                                                               "session", "play")}, mod  # nor of presets
        if not mod.startswith("worldtrace_cli.cli") and mod != "worldtrace_cli.__main__":
            assert not {d for d in deps if d.startswith("worldtrace_cli.cli")}, mod  # library code never imports the CLI
        if not mod.startswith(("worldtrace_cli.cli", "worldtrace_cli.jobs")):  # jobs are run by the CLI only
            assert not {d for d in deps if d.startswith("worldtrace_cli.jobs")}, mod
        if mod.startswith("worldtrace_cli.memory"):
            assert not {d for d in deps if d.split(".")[1] in ("jobs", "runs", "cli", "pipeline")}, mod


def test_no_library_module_runs_the_cli_as_a_script():
    """``python -m worldtrace_cli COMMAND`` is the one script entry (``__main__.py``); a library module
    whose ``__main__`` block imported the CLI closed a cycle (parity.py <-> cli/parity.py)."""
    for path in PACKAGE.rglob("*.py"):
        text = path.read_text()
        if path.name != "__main__.py" and 'if __name__ == "__main__":' in text:
            block = text.split('if __name__ == "__main__":', 1)[1]
            assert ".cli" not in block, path
