"""The documents' proofs must not rot: docs/semantics.md cites a real test for each
guarantee, the README's figures are sections of the benchmark report, and docs/agent.md
documents every agent.toml key."""

from __future__ import annotations

import ast
import re
from pathlib import Path

from eventspool.agent import config as agent_config
from eventspool.agent.config_loader import env_variables
from eventspool.agent.config_tables import EXCHANGE_KEYS

REPO = Path(__file__).resolve().parents[1]
SEMANTICS = REPO / "docs" / "semantics.md"
README = REPO / "README.md"
REPORT = REPO / "docs" / "benchmarks.md"
REPORT_LINK = re.compile(r"\]\((?:docs/)?benchmarks\.md#([\w-]+)\)")
SEMANTICS_LINK = re.compile(r"\]\(docs/semantics\.md#([\w-]+)\)")
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


def heading_anchors(markdown: str) -> set[str]:
    """GitHub's anchors for a page's headings: lower case, punctuation dropped, spaces as -."""
    headings = re.findall(r"^#+ (.+)$", markdown, flags=re.MULTILINE)
    return {re.sub(r"[^\w\- ]", "", h).strip().lower().replace(" ", "-") for h in headings}


def test_the_readme_links_figures_that_the_report_has() -> None:
    readme = README.read_text()
    cited = set(REPORT_LINK.findall(readme))
    assert len(cited) >= 6, "the README's links to the report are no longer found"
    missing = cited - heading_anchors(REPORT.read_text())
    assert not missing, f"the README links report sections that do not exist: {missing}"
    bench_scripts = {path.stem for path in (REPO / "bench").glob("[!_]*.py")} - {"report"}
    assert bench_scripts <= heading_anchors(REPORT.read_text()), "a bench is not reported"


def test_the_readme_links_guarantees_that_semantics_has() -> None:
    cited = set(SEMANTICS_LINK.findall(README.read_text()))
    assert cited, "the README's links to docs/semantics.md are no longer found"
    missing = cited - heading_anchors(SEMANTICS.read_text())
    assert not missing, f"the README links sections of semantics.md that do not exist: {missing}"


def test_the_agent_reference_documents_every_agent_toml_key() -> None:
    """docs/agent.md has a row for each key config.py accepts, under its section's heading,
    with its environment variable: the keys come from config.py's own tables, so a new key
    fails here until it is documented."""
    parts = re.split(r"^#{2,3} (.+)$", (REPO / "docs" / "agent.md").read_text(), flags=re.M)
    body = dict(zip(parts[1::2], parts[2::2], strict=True))
    expected: dict[str, list[str]] = {
        **{f"[{section.name}]": list(section.names()) for section in agent_config.SECTIONS},
        **{
            f"[{section.name}.{table}]": []
            for section in agent_config.SECTIONS
            for table in section.tables
        },
        "[topics.NAME]": [setting.name for setting in agent_config.QUEUE_SETTINGS],
        "[exchanges.NAME]": list(EXCHANGE_KEYS),
    }
    missing = [f"section {heading}" for heading in expected if heading not in body]
    missing += [
        f"{heading} {key}"
        for heading, keys in expected.items()
        for key in keys
        if f"| `{key}` |" not in body.get(heading, "")
    ]
    missing += [
        f"{variable} ({section}.{key})"
        for variable, (section, key) in env_variables(agent_config.SECTIONS).items()
        if f"`{variable}`" not in body.get(f"[{section}]", "")
    ]
    assert not missing, f"docs/agent.md does not document: {missing}"


def test_the_architecture_names_every_module() -> None:
    """docs/architecture.md gives each module its one line, so a new module must get one."""
    text = (REPO / "docs" / "architecture.md").read_text()
    package = REPO / "src" / "eventspool"
    modules = [
        path
        for pattern in ("*.py", "*.pyx", "*.pxi")
        for path in package.rglob(pattern)
        if path.name != "__init__.py"
    ]
    missing = [
        str(path.relative_to(package))
        for path in modules
        if f"`{path.relative_to(package)}`" not in text
        and not (path.suffix == ".pxi" and f"`{path.name}`" in text)
    ]
    assert not missing, f"docs/architecture.md has no line for: {sorted(missing)}"
