"""docs/semantics.md cites a test for each guarantee: every citation must name a real test."""

from __future__ import annotations

import ast
import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SEMANTICS = REPO / "docs" / "semantics.md"
CITATION = re.compile(r"(tests/[\w/]+\.py)::(\w+)")
LINK = re.compile(r"\[(tests/[\w/]+\.py)::\w+\]\(([^)]*)\)")


def defined_names(path: Path) -> set[str]:
    """Tests at the top of a module, as pytest addresses them: functions, classes, and
    assigned names (a hypothesis state machine's TestCase)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    kinds = (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)
    names = {node.name for node in tree.body if isinstance(node, kinds)}
    names.update(
        target.id
        for node in tree.body
        if isinstance(node, ast.Assign)
        for target in node.targets
        if isinstance(target, ast.Name)
    )
    return {name for name in names if name.startswith(("test_", "Test"))}


def test_every_cited_test_exists() -> None:
    text = SEMANTICS.read_text()
    citations = CITATION.findall(text)
    assert len(citations) >= 40, "the citations are no longer found: did their form change?"
    missing = [
        f"{path}::{name}"
        for path, name in sorted(set(citations))
        if not (REPO / path).is_file() or name not in defined_names(REPO / path)
    ]
    assert not missing, f"docs/semantics.md cites tests that do not exist: {missing}"


def test_every_citation_links_to_its_file() -> None:
    text = SEMANTICS.read_text()
    links = LINK.findall(text)
    assert len(links) == len(CITATION.findall(text)), "a citation is not a link"
    wrong = [(cited, target) for cited, target in links if target != f"../{cited}"]
    assert not wrong, f"links that do not lead to the cited file: {wrong}"
