"""docs/benchmarks.md from the stored bench results: tables, plots and how they were made.

Pure text: the caller draws the plots (see `_plots`) under the names given here.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from harness.figures import Figure, figures_of
from harness.output import format_number

IMAGE_DIR = "img"
RATIO_PLOT = "ratios.png"
SOAK_PLOT = "soak-timeline.png"

# Result keys shown in a section's details list; everything else stays in the JSON.
_DETAIL_KEYS = ("settings", "versions", "method")
_SOAK_TABLES = (
    ("ledger", "Acknowledged by the agent, then found in Kafka, by event_id"),
    ("consumer_ledger", "Found in Kafka, then run by the consumer's handlers, by event_id"),
    ("anchor_ledger", "The anchor: accepted by a bare producer, then found in Kafka"),
    ("faults_by_kind", "Faults injected"),
    ("disk_full_checks", "Sends while the disk was full"),
)


def script_plot(script: str) -> str:
    return f"{script}.png"


def intro_of(script_path: Path) -> tuple[str, str]:
    """A bench script's docstring: its first line, and the rest (the method) as written."""
    if not script_path.exists():
        return f"`bench/{script_path.name}` is no longer in the repository.", ""
    docstring = ast.get_docstring(ast.parse(script_path.read_text(encoding="utf-8"))) or ""
    headline, _, method = docstring.strip().partition("\n\n")
    return " ".join(headline.split()) or script_path.stem, method.strip()


def render(store: Mapping[str, Any], bench_dir: Path) -> str:
    """The whole page for `store` (the content of docs/benchmarks.json)."""
    runs: Sequence[Mapping[str, Any]] = store["scripts"]
    figures = [figure for run in runs for figure in figures_of(run["script"], run["result"])]
    lines = [
        "# Benchmarks",
        "",
        "Every figure below was measured beside its anchor, the tool a user would pick",
        "instead, in the same run on the same machine; the ratio is oriented so that above 1",
        "means eventspool is ahead. Nothing here is edited by hand.",
        "",
        f"- Regenerate this page, its plots and `benchmarks.json`: `{store['command']}`",
        f"  ({_minutes(store['elapsed_s'])} for this run{_soak_note(store)}).",
        "- Check that a fresh run reproduces these ratios: `make report-check` reruns every",
        "  bench (the soak for 2 minutes) and compares each ratio with this page's, within",
        "  x/÷1.25 or the wider band a noisy figure declares; for a count the anchor reaches",
        "  by chance (events lost where a random SIGKILL lands) our own value must come again",
        "  and the ratio must stay on the same side of 1.",
        f"- Last run {store['generated_at']} at revision `{store['revision']}`"
        f"{' with `--quick` runs' if store.get('quick') else ''}, on "
        f"{_machine(store['machine'])}. A run with `--only` measures some benches again and",
        "  keeps the others: each section names the revision and machine it was measured on.",
        "- Broker: the embedded tansu (in-memory storage) on the same machine, so the broker",
        "  competes with the measured code for the cores; `failover` runs on librdkafka's",
        "  3-broker mock cluster instead.",
        "",
        "## Summary",
        "",
        *_figure_table(figures, with_script=True),
        "",
        f"![ratio of every figure]({IMAGE_DIR}/{RATIO_PLOT})",
        "",
    ]
    for run in runs:
        lines.extend(_section(run, bench_dir))
    return "\n".join(lines).rstrip() + "\n"


def _section(run: Mapping[str, Any], bench_dir: Path) -> list[str]:
    script = str(run["script"])
    result: Mapping[str, Any] = run["result"]
    headline, method = intro_of(bench_dir / f"{script}.py")
    command = " ".join(["python", f"bench/{script}.py", *run.get("args", [])])
    lines = [
        f"## {script}",
        "",
        headline,
        "",
        *_figure_table(figures_of(script, result), with_script=False),
        "",
        f"![{script}: eventspool against its anchor]({IMAGE_DIR}/{script_plot(script)})",
        "",
    ]
    if "timeline" in result:
        lines += [f"![soak timeline]({IMAGE_DIR}/{SOAK_PLOT})", ""]
    for key, title in _SOAK_TABLES:
        table = result.get(key)
        if isinstance(table, Mapping):
            lines += [f"**{title}**", "", *_mapping_table(table), ""]
    lines += [
        f"Command: `{command}`, {_minutes(run['elapsed_s'])}, 1-minute load average "
        f"{run.get('load_average_1m_before', '-')} before it started{_provenance(run)}. "
        f"Everything it printed is in `benchmarks.json`.",
        "",
    ]
    if method:
        lines += _details("How it is measured", ["```text", method, "```"])
    details = [(key, result[key]) for key in _DETAIL_KEYS if key in result]
    if details:
        bullets = [line for key, value in details for line in [f"- **{key}**", *_bullets(value, 1)]]
        lines += _details("Settings", bullets)
    return lines


def _details(summary: str, body: list[str]) -> list[str]:
    """A folded block of the page."""
    return [f"<details><summary>{summary}</summary>", "", *body, "", "</details>", ""]


def _provenance(run: Mapping[str, Any]) -> str:
    """Where a section's figures come from, when the run recorded it."""
    parts = []
    if "revision" in run:
        parts.append(f"at revision `{run['revision']}`")
    machine = run["result"].get("machine")
    if isinstance(machine, Mapping):
        parts.append(f"on {_machine(machine)}")
    return ", measured " + " ".join(parts) if parts else ""


def _figure_table(figures: Iterable[Figure], *, with_script: bool) -> list[str]:
    bench = ["Bench"] if with_script else []
    header = [*bench, "Figure", "Anchor", "eventspool", "anchor", "Ratio", "Unit"]
    alignments = ["---"] * len(bench) + ["---", "---", "--:", "--:", "--:", "---"]
    rows = ["| " + " | ".join(header) + " |", "|" + "|".join(alignments) + "|"]
    for figure in figures:
        cells = [
            figure.title,
            figure.anchor_is or "-",
            format_number(figure.ours),
            format_number(figure.anchor),
            "-" if figure.ratio is None else f"**{format_number(figure.ratio)}**",
            figure.unit + ("" if figure.higher_is_better else ", lower is better"),
        ]
        if with_script:
            cells.insert(0, f"[{figure.script}](#{figure.script})")
        rows.append("| " + " | ".join(cells) + " |")
    return rows


def _mapping_table(table: Mapping[str, Any]) -> list[str]:
    """The table's numbers, one row each; nested breakdowns stay in the JSON."""
    rows = ["| | |", "|---|--:|"]
    for key, value in table.items():
        if isinstance(value, int | float):
            rows.append(f"| {key.replace('_', ' ')} | {format_number(value)} |")
    return rows


def _bullets(value: Any, indent: int) -> list[str]:
    pad = "  " * indent
    if isinstance(value, Mapping):
        lines = []
        for key, item in value.items():
            if isinstance(item, Mapping):
                lines += [f"{pad}- {key}:", *_bullets(item, indent + 1)]
            else:
                lines.append(f"{pad}- {key}: {_inline(item)}")
        return lines
    return [f"{pad}- {_inline(value)}"]


def _inline(value: Any) -> str:
    return value if isinstance(value, str) else f"`{json.dumps(value, separators=(', ', ': '))}`"


def _minutes(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 90 else f"{seconds / 60:.0f} min"


def _soak_note(store: Mapping[str, Any]) -> str:
    soak = store.get("soak_duration_s")
    return f", of which the soak ran {_minutes(float(soak))}" if soak else ""


def _machine(described: Mapping[str, Any]) -> str:
    return (
        f"{described.get('cpu_model', 'unknown CPU')}, {described.get('usable_cores')} usable "
        f"cores, {described.get('memory_gib')} GiB, {described.get('os')}, "
        f"{described.get('python')}"
    )
