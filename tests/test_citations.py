"""Docstrings cite what the repository holds: every "§N" a module cites is a section of the document
it names (the paper and outside papers apart), the reference specs live in docs/reference/, and no
product code or page points to the issue tracker or to a design document the clone does not have."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "docs" / "reference"
DOCS = {"mg2": REF / "mg2-architecture.md", "lingbot": REF / "lingbot-architecture.md",
        "selfforcing": REF / "selfforcing-architecture.md", "worldkv": REF / "worldkv.md",
        "architecture": ROOT / "docs" / "architecture.md"}
# what the text before a "§" names (the nearest wins); None: a document outside the repository
TOKENS = [(r"docs/architecture\.md|(?<![-\w])architecture\.md", "architecture"),
          (r"mg2-architecture\.md|MG2 spec", "mg2"),
          (r"lingbot-architecture\.md|[Ll]ing[Bb]ot spec", "lingbot"),
          (r"selfforcing-architecture\.md|Self-Forcing spec", "selfforcing"),
          (r"worldkv\.md|WorldKV", "worldkv"),
          (r"\bpaper\b|Xiao et al|Appendix|Table|Def\.", None)]


def _sections(path: Path) -> set[str]:
    return set(re.findall(r"^#+ (\d+(?:\.\d+)*)[. ]", path.read_text(), re.M))


def _named_by_docstring(path: Path) -> set[str]:
    """The reference specs a module's docstring names, else its package's."""
    for p in (path, path.parent / "__init__.py"):
        if p.is_file():
            doc = re.match(r'\s*(?:#.*\n|\s)*"""(.*?)"""', p.read_text(), re.S)
            named = {name for pat, name in TOKENS[1:-1] if doc and re.search(pat, doc.group(1))}
            if named:
                return named
    return set()


def _cited(num: str, sections: set[str]) -> bool:
    """``§5`` or ``§5.1`` as a heading; ``§16.4`` also as item 4 of a section 16 without subsections."""
    top = num.split(".")[0]
    return num in sections or (top in sections and not any(s.startswith(top + ".") for s in sections))


def bad_citations(root: Path) -> list[str]:
    bad = []
    for path in sorted(root.rglob("*.py")):
        for n, line in enumerate(path.read_text().splitlines(), 1):
            for m in re.finditer(r"§(\d+(?:\.\d+)*)", line):
                found = [(t.start(), name) for pat, name in TOKENS for t in re.finditer(pat, line[:m.start()])]
                if found:
                    doc = max(found, key=lambda f: f[0])[1]
                    if doc is None:
                        continue
                else:
                    named = _named_by_docstring(path)
                    if len(named) != 1:
                        bad.append(f"{path.relative_to(root.parent)}:{n}: §{m.group(1)} names no one document "
                                   f"(the docstring names {sorted(named)})")
                        continue
                    doc = named.pop()
                if not _cited(m.group(1), _sections(DOCS[doc])):
                    bad.append(f"{path.relative_to(root.parent)}:{n}: §{m.group(1)} is no section of "
                               f"{DOCS[doc].relative_to(ROOT)}")
    return bad


def test_the_reference_specs_are_in_the_repository():
    for path in DOCS.values():
        assert path.is_file() and _sections(path), path


def test_every_cited_section_exists_in_the_document_it_names():
    assert bad_citations(ROOT / "worldtrace_cli") == []


def test_a_wrong_or_unnamed_citation_is_found(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text('"""From the MG2 spec."""\n# spec §5.4 (no such subsection), spec §8 (fine)\n')
    (pkg / "b.py").write_text('"""Nothing named."""\nX = 1  # spec §3\n')
    (pkg / "c.py").write_text('"""The paper."""\nX = 1  # paper §9.9, LingBot spec §10.3\n')
    assert [b.split(": ", 1)[1] for b in bad_citations(pkg)] == [
        "§5.4 is no section of docs/reference/mg2-architecture.md",
        "§3 names no one document (the docstring names [])"]


def test_no_pointer_to_the_issue_tracker_or_the_first_design_document():
    pages = [*(ROOT / "worldtrace_cli").rglob("*.py"), ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    stale = [f"{p.relative_to(ROOT)}:{n}: {line.strip()[:80]}" for p in pages
             for n, line in enumerate(p.read_text().splitlines(), 1)
             if re.search(r"\b[Ii]ssues? #?\d+\b|\bdesign\.md\b", line)]
    assert stale == []
