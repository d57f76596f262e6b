"""The house's structure (docs/architecture.md §4-5): rooms that name their purpose, no import cycle
even through imports inside functions, imports strictly downward between the rooms (model/ knows
nothing of memory/, writers or jobs; library code never imports the CLI), at most 8 levels, and no
module over 400 lines."""

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


def room(module: str) -> str:
    """The room of a module: the first folder or root module under the package (``engine`` for
    ``worldtrace_cli.engine.loop``); ``(root)`` for the package's own ``__init__``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


# every room, lowest first: a room imports only rooms before it (imports inside functions included)
ROOMS = ["errors", "schemas", "writer_options", "trajectory", "outputs", "model", "config", "world", "continuation",
         "memory", "integrations", "metrics", "engine", "runs", "loopbench", "train", "session", "jobs", "play", "(root)", "cli", "__main__"]


def room_graph(g: dict[str, set[str]]) -> dict[str, set[str]]:
    rooms: dict[str, set[str]] = {}
    for mod, deps in g.items():
        rooms.setdefault(room(mod), set()).update(room(d) for d in deps if room(d) != room(mod))
    return rooms


def upward(rooms: dict[str, set[str]], order: list[str]) -> list[tuple[str, str]]:
    """The room imports that point up ``order`` (or to a room it does not list)."""
    rank = {r: i for i, r in enumerate(order)}
    return sorted((r, d) for r, deps in rooms.items() for d in deps if rank.get(d, len(order)) >= rank.get(r, -1))


def levels(rooms: dict[str, set[str]]) -> dict[str, int]:
    """A room's import level: 1 for a room that imports no other, else 1 + the highest level it imports
    (an acyclic graph: :func:`upward` finds none)."""
    out: dict[str, int] = {}

    def level(r):
        if r not in out:
            out[r] = 1 + max((level(d) for d in rooms.get(r, ())), default=0)
        return out[r]

    for r in rooms:
        level(r)
    return out


def test_the_room_checks_catch_what_they_are_for():
    assert upward({"a": {"b"}, "b": set()}, ["a", "b"]) == [("a", "b")]
    assert upward({"a": set(), "b": {"a"}}, ["a", "b"]) == []
    assert upward({"a": {"x"}}, ["a"]) == [("a", "x")]  # a room the order does not know is an error
    assert levels({"a": {"b"}, "b": {"c"}, "c": set()}) == {"a": 3, "b": 2, "c": 1}


def test_the_package_root_holds_only_what_every_room_shares():
    """Issue 40: the engine, metrics, outputs and trajectory parser live in rooms named for them."""
    loose = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert loose == ["__init__.py", "__main__.py", "errors.py"], loose
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").exists()}
    assert {"engine", "memory", "model", "metrics", "outputs", "trajectory", "runs", "jobs", "session",
            "cli", "writer_options"} <= folders  # writer_options: the torch-free writer rows, MemoryConfig


def test_rooms_import_downward_in_at_most_8_levels():
    rooms = room_graph(graph())
    assert set(rooms) == set(ROOMS), set(rooms) ^ set(ROOMS)  # a new room takes its place in ROOMS
    assert upward(rooms, ROOMS) == []
    lv = levels(rooms)
    # __main__ is `python -m worldtrace_cli`'s entry over the CLI, the top of the house
    assert max(v for r, v in lv.items() if r != "__main__") <= 8, lv
    assert lv["errors"] == 1 and lv["cli"] == max(lv.values()) - 1, lv


def test_no_module_is_over_400_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py")
            if (n := len(p.read_text().splitlines())) > 400}
    assert long == {}, long


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


# docs/architecture.md §5, "Torch-free modules": the CLI's checks run on these before torch loads
TORCH_FREE = ["config", "errors", "writer_options", "writer_options.checks", "trajectory", "trajectory.actions",
              "trajectory.prompts",
              "trajectory.images", "outputs", "outputs.video", "outputs.files", "outputs.records", "outputs.timeline",
              "outputs.sheet", "schemas", "runs", "runs.folder", "runs.resume", "runs.summary", "runs.sinks",
              "engine.loop", "engine.record", "engine.tally", "engine.shard_check", "engine.launch", "config.backbones", "session", "session.live",
              "session.opening", "session.storage",
              "play.server", "play.page", "play.views",
              "loopbench.report", "loopbench.plan", "model.config", "model.layout", "model.lingbot.config",
              "model.lingbot.inputs", "model.lingbot.camera", "world.scene", "world.render", "cli", "cli.generate",
              "cli.play", "jobs.generate", "jobs.compare", "jobs.loopbench", "jobs.inputs", "jobs.bench_memory"]


def test_the_torch_free_modules_load_no_torch():
    """Every module the docs call torch-free, imported together in a fresh process, loads no torch."""
    import subprocess
    import sys

    names = [f"worldtrace_cli.{m}" for m in TORCH_FREE]
    code = (f"import importlib, sys\nfor m in {names!r}:\n    importlib.import_module(m)\n"
            "print(sorted(k for k in sys.modules if k == 'torch' or k.startswith('torch.'))[:3])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "[]", out.stdout + out.stderr
