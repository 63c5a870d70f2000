"""The report: reading bench output, and drawing the page and its plots from stored results."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

import report
from _report_page import intro_of
from harness.output import format_number

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_the_last_stdout_line_is_the_result() -> None:
    stdout = 'progress\n{"not": "last"}\n{"figure": "f", "ours": 2, "anchor": 1, "ratio": 2}\n\n'
    assert report.last_json_line(stdout, "x")["figure"] == "f"


@pytest.mark.parametrize(
    ("stdout", "message"),
    [
        ("", "printed nothing"),
        ("table\n", "not JSON"),
        ("[1, 2]\n", "not a JSON object"),
        ('{"figure": "f"}\n', "a figure lacks ours, anchor, ratio"),
    ],
)
def test_a_broken_bench_output_is_refused(stdout: str, message: str) -> None:
    with pytest.raises((SystemExit, ValueError), match=message):
        report.last_json_line(stdout, "x")


def test_every_bench_script_is_on_the_page_and_the_report_is_not() -> None:
    scripts = report.bench_scripts()
    on_disk = {p.stem for p in report.BENCH_DIR.glob("[!_]*.py")} - {"report"}
    assert set(scripts) == on_disk
    known = [name for name in report.ORDER if name in on_disk]
    assert scripts[: len(known)] == known


def test_the_soak_gets_a_duration_and_the_others_quick() -> None:
    assert report.script_args("soak", quick=True, soak_duration_s=120) == ["--duration", "120"]
    assert report.script_args("e2e", quick=True, soak_duration_s=120) == ["--quick"]
    assert report.script_args("e2e", quick=False, soak_duration_s=1800) == []


def test_numbers_are_readable() -> None:
    assert [format_number(v) for v in (0, 3, 0.12345, 12.5, 1234.5, 2_084_735, 18792.0)] == [
        "0",
        "3",
        "0.123",
        "12.5",
        "1,234",
        "2,084,735",
        "18,792",
    ]


def test_intro_is_the_docstring_headline_and_method(tmp_path: Path) -> None:
    script = tmp_path / "bench.py"
    script.write_text('"""The headline,\nwrapped.\n\nHow it is\nmeasured.\n"""\n')
    assert intro_of(script) == ("The headline, wrapped.", "How it is\nmeasured.")


def store() -> dict[str, Any]:
    listed = {
        "figure": "e2e_cpu",
        "ours": 2.0,
        "anchor": 3.0,
        "ratio": 1.5,
        "unit": "CPU s",
        "higher_is_better": False,
        "title": "CPU per million",
        "anchor_is": "the producer",
    }
    e2e = {
        "figure": "e2e_rate",
        "ours": 250_000,
        "anchor": 280_000,
        "ratio": 0.89,
        "unit": "events/s",
        "title": "Spool to broker",
        "figures": [listed],
        "settings": {"partitions": 12, "nested": {"linger.ms": 5}},
    }
    soak = {
        "figure": "soak_fraction",
        "ours": 1.0,
        "anchor": 0.8,
        "ratio": 1.25,
        "ledger": {"acked": 1000, "lost": 0, "duplicates": 3, "by_topic": {"a": {"lost": 0}}},
        "timeline": [{"t": 0, "acked": 0, "handled": 0}, {"t": 5, "acked": 500, "handled": 400}],
        "faults": [{"t": 2, "kind": "broker_cut", "duration_s": 3}, {"t": 7, "kind": "agent_kill"}],
    }
    return {
        "generated_at": "2026-11-21 09:00 UTC",
        "command": "make report",
        "revision": "abc1234",
        "quick": False,
        "soak_duration_s": 1800,
        "elapsed_s": 2400.0,
        "machine": {"cpu_model": "Test CPU", "usable_cores": 2, "memory_gib": 24},
        "scripts": [
            {"script": "e2e", "args": [], "elapsed_s": 60.0, "result": e2e},
            {"script": "soak", "args": ["--duration", "1800"], "elapsed_s": 1900, "result": soak},
        ],
    }


def test_the_page_and_plots_are_drawn_from_the_stored_results(tmp_path: Path) -> None:
    report.write_report(store(), tmp_path)
    page = (tmp_path / "benchmarks.md").read_text(encoding="utf-8")
    assert "| [e2e](#e2e) | Spool to broker | - | 250,000 | 280,000 | **0.89** | events/s |" in page
    assert "| CPU per million | the producer | 2 | 3 | **1.5** | CPU s, lower is better |" in page
    assert "Command: `python bench/soak.py --duration 1800`, 32 min" in page
    assert "| lost | 0 |" in page and "| duplicates | 3 |" in page
    assert "by topic" not in page  # nested breakdowns stay in the JSON
    assert "  - linger.ms: `5`" in page
    assert "Test CPU, 2 usable cores" in page
    images = sorted(p.name for p in (tmp_path / "img").iterdir())
    assert images == ["e2e.png", "ratios.png", "soak-timeline.png", "soak.png"]
    for name in images:
        assert (tmp_path / "img" / name).read_bytes().startswith(PNG_MAGIC)
        assert f"img/{name}" in page


def test_check_passes_within_tolerance_and_fails_outside() -> None:
    published = store()
    fresh = [dict(run) for run in published["scripts"]]
    assert report.check(published, fresh, tolerance=0.25)
    moved = dict(fresh[0], result=dict(fresh[0]["result"], ratio=0.5))
    assert not report.check(published, [moved, fresh[1]], tolerance=0.25)
    # Only the scripts that were rerun are compared.
    assert report.check(published, [fresh[1]], tolerance=0.25)
