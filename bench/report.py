"""Run every benchmark and the soak, and write docs/benchmarks.md with its plots and data.

    python bench/report.py                  # every bench in full, the soak for 30 minutes
    python bench/report.py --quick          # every bench with --quick, a 2-minute soak
    python bench/report.py --only e2e,uds   # rerun two benches, keep the others' results
    python bench/report.py --render-only    # redraw the page from docs/benchmarks.json
    python bench/report.py --check          # rerun; compare each ratio with the published one

Each bench script runs as its own process, one at a time (they would share the cores);
its last stdout line, one JSON object, is stored as is in docs/benchmarks.json, from which
the page and its plots in docs/img are drawn. Not a benchmark: `make bench` leaves it out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure as Plot

import _plots
from _report_page import IMAGE_DIR, RATIO_PLOT, SOAK_PLOT, render, script_plot
from harness.figures import Figure, compare, figures_of
from harness.machine import load_average_1m, machine
from harness.output import format_table, progress

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
DOCS_DIR = REPO_ROOT / "docs"
STORE = DOCS_DIR / "benchmarks.json"
PAGE = DOCS_DIR / "benchmarks.md"
# The page's order: the spool, the agent, the anchors users would pick, then consumers.
ORDER = (
    "enqueue",
    "e2e",
    "uds",
    "log_shipper",
    "logging_handler",
    "kill_loss",
    "failover",
    "routing",
    "consumer",
    "spark_source",
    "soak",
)
SOAK = "soak"
REPORT_SOAK_S = 1800
QUICK_SOAK_S = 120
DEFAULT_TOLERANCE = 0.25


def bench_scripts() -> list[str]:
    """Every bench script's name in page order; scripts not in ORDER come last, sorted."""
    found = {
        path.stem
        for path in BENCH_DIR.glob("*.py")
        if not path.name.startswith("_") and path.stem != Path(__file__).stem
    }
    return [name for name in ORDER if name in found] + sorted(found - set(ORDER))


def script_args(script: str, *, quick: bool, soak_duration_s: int) -> list[str]:
    if script == SOAK:
        return ["--duration", str(soak_duration_s)]
    return ["--quick"] if quick else []


def run_script(script: str, args: Sequence[str], position: str) -> dict[str, Any]:
    """Run one bench script, its progress going to our stderr; its stored result."""
    command = [sys.executable, str(BENCH_DIR / f"{script}.py"), *args]
    progress(f"report {position}: bench/{script}.py {' '.join(args)}".rstrip())
    load_before = load_average_1m()
    started = time.monotonic()
    finished = subprocess.run(
        command, cwd=REPO_ROOT, stdout=subprocess.PIPE, text=True, check=False
    )
    elapsed = time.monotonic() - started
    if finished.returncode != 0:
        raise SystemExit(
            f"bench/{script}.py failed with exit status {finished.returncode} after "
            f"{elapsed:.0f} s; the results before it are kept: rerun the rest with --only."
        )
    result = last_json_line(finished.stdout, script)
    headline = f"{result['figure']} ratio {result['ratio']}"
    progress(f"report {position}: {script} took {elapsed:.0f} s, {headline}")
    return {
        "script": script,
        "args": list(args),
        "elapsed_s": round(elapsed, 1),
        "load_average_1m_before": load_before,
        "result": result,
    }


def last_json_line(stdout: str, script: str) -> dict[str, Any]:
    """The bench contract: the last non-empty stdout line is one JSON object."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise SystemExit(f"bench/{script}.py printed nothing on stdout")
    try:
        result = json.loads(lines[-1])
    except json.JSONDecodeError as exc:
        raise SystemExit(f"bench/{script}.py: its last stdout line is not JSON ({exc})") from exc
    if not isinstance(result, dict):
        raise SystemExit(f"bench/{script}.py: its last stdout line is not a JSON object")
    figures_of(script, result)  # refuse a malformed result before it is stored
    return result


def revision() -> str:
    """The commit measured, "-dirty" if code other than docs and tests had changes."""

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=REPO_ROOT, capture_output=True, text=True, check=False
        ).stdout.strip()

    commit = git("rev-parse", "--short", "HEAD") or "unknown"
    changed = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":!docs", ":!tests")
    return f"{commit}-dirty" if changed else commit


def write_report(store: Mapping[str, Any], docs_dir: Path = DOCS_DIR) -> None:
    """benchmarks.md and the plots in `docs_dir`, from `store` (benchmarks.json's content)."""
    page = docs_dir / PAGE.name
    images = docs_dir / IMAGE_DIR
    write_plots(store, images)
    page.write_text(render(store, BENCH_DIR), encoding="utf-8")
    progress(f"wrote {page} and the plots in {images}")


def write_plots(store: Mapping[str, Any], images: Path) -> dict[Path, Plot]:
    """Every PNG the page shows, into `images`; each file's figure, for measuring it."""
    plots: dict[Path, Plot] = {}
    figures: list[Figure] = []
    for run in store["scripts"]:
        script, result = run["script"], run["result"]
        own = figures_of(script, result)
        figures += own
        path = images / script_plot(script)
        plots[path] = _plots.ours_against_anchor(own, f"bench/{script}.py", path)
        if "timeline" in result:
            plots[images / SOAK_PLOT] = _plots.soak_timeline(result, images / SOAK_PLOT)
    plots[images / RATIO_PLOT] = _plots.ratio_overview(figures, images / RATIO_PLOT)
    return plots


def load_store() -> dict[str, Any]:
    if not STORE.exists():
        raise SystemExit(f"{STORE.relative_to(REPO_ROOT)} does not exist: run the report first")
    store: dict[str, Any] = json.loads(STORE.read_text(encoding="utf-8"))
    return store


def check(store: Mapping[str, Any], runs: Sequence[Mapping[str, Any]], tolerance: float) -> bool:
    """Print each published ratio beside the fresh one; True when all lie within tolerance."""
    published = [f for run in store["scripts"] for f in figures_of(run["script"], run["result"])]
    fresh = [f for run in runs for f in figures_of(run["script"], run["result"])]
    fresh_scripts = {run["script"] for run in runs}
    comparisons = [
        c for c in compare(published, fresh, tolerance) if c.published.script in fresh_scripts
    ]
    rows = [
        [
            f"{c.published.script}: {c.published.name}",
            c.published.ratio,
            None if c.fresh is None else c.fresh.ratio,
            None if c.change is None else f"{c.change:.2f}x",
            "ours same, same side of 1"
            if c.fresh is not None and c.fresh.random_anchor
            else f"x/÷{1 + c.band:.2f}",
            "ok" if c.within else "OUTSIDE",
        ]
        for c in comparisons
    ]
    print(
        format_table(["figure", "published", "fresh", "change", "required", "verdict"], rows),
        file=sys.stderr,
    )
    outside = [c for c in comparisons if not c.within]
    progress(f"{len(comparisons) - len(outside)} of {len(comparisons)} ratios within tolerance")
    return not outside


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    add, mode = parser.add_argument, parser.add_mutually_exclusive_group().add_argument
    add("--quick", action="store_true", help="run every bench with --quick")
    soak = f"default {REPORT_SOAK_S}, {QUICK_SOAK_S} with --quick or --check"
    add("--soak-duration", type=int, help=f"soak seconds ({soak})")
    add("--only", default="", help="comma-separated bench names to rerun")
    mode("--render-only", action="store_true", help="redraw from the stored JSON")
    mode("--check", action="store_true", help="rerun as published, compare ratios; write nothing")
    add("--tolerance", type=float, default=DEFAULT_TOLERANCE, help="--check: ratio change allowed")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    if args.render_only:
        write_report(load_store())
        return 0
    available = bench_scripts()
    chosen = [name for name in args.only.split(",") if name] or available
    unknown = sorted(set(chosen) - set(available))
    if unknown:
        raise SystemExit(f"no bench script named {', '.join(unknown)}; have {', '.join(available)}")
    # --check reruns in the published mode and writes nothing.
    published = load_store() if args.check else None
    quick = bool(published.get("quick")) if published is not None else args.quick
    soak_s = args.soak_duration or (QUICK_SOAK_S if quick or args.check else REPORT_SOAK_S)
    measured_revision = revision()
    results = {run["script"]: run for run in (load_store()["scripts"] if STORE.exists() else [])}
    fresh = []
    for index, script in enumerate(chosen, start=1):
        arguments = script_args(script, quick=quick, soak_duration_s=soak_s)
        fresh.append(run := run_script(script, arguments, f"{index}/{len(chosen)}"))
        if published is None:
            results[script] = run | {"revision": measured_revision}
            # Kept after every script, so a failure later on costs only the script that failed.
            runs = [results[name] for name in available if name in results]
            save_store(runs, quick=quick, revision=measured_revision)
    if published is not None:
        return 0 if check(published, fresh, args.tolerance) else 1
    write_report(load_store())
    return 0


def save_store(runs: Sequence[Mapping[str, Any]], *, quick: bool, revision: str) -> None:
    soak = next((run for run in runs if run["script"] == SOAK), None)
    store = {
        "generated_at": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "make report" + (" REPORT_ARGS=--quick" if quick else ""),
        "revision": revision,
        "quick": quick,
        "soak_duration_s": int(soak["args"][1]) if soak else None,
        "elapsed_s": round(sum(float(run["elapsed_s"]) for run in runs), 1),
        "machine": machine(),
        "scripts": list(runs),
    }
    STORE.write_text(json.dumps(store, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
