"""The soak (bench/soak.py) for one minute, two cycles of its short fault timing: every
fault kind, and not one acknowledged event lost.

It runs as a subprocess, exactly as the 30-minute report does, and only its final JSON
is judged: acknowledged events lost on the way to Kafka and on the way to the
consumer's handlers (both must be zero), every fault kind injected at least once
(the disk-full one may be skipped where no tmpfs can be mounted, with the reason), the
disk-full probes answered as they must be, duplicates reported as numbers.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest

pytestmark = [pytest.mark.slow, pytest.mark.fault]

REPO_ROOT = Path(__file__).resolve().parents[2]
SOAK = REPO_ROOT / "bench" / "soak.py"
DURATION_S = 60
# The workload, the stops (the anchor's may take its whole flush), the drain, the read-back
# and the consumer's catch-up; then the soak's unwinding when it is interrupted: together
# under pytest's own 600 s, so that this test says why.
TIMEOUT_S = 540
UNWIND_TIMEOUT_S = 30
MIN_ACKNOWLEDGED = 10_000  # well under the paced rate: the workload really ran
RecordProperty = Callable[[str, object], None]


def _take_down(proc: subprocess.Popen[bytes]) -> tuple[bytes, bytes]:
    """Interrupt the soak so that it unwinds (its disk is a tmpfs it mounted), then kill
    whatever is left of its process group; its output."""
    proc.send_signal(signal.SIGINT)
    try:
        return proc.communicate(timeout=UNWIND_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        return proc.communicate()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)


def test_one_minute_soak_loses_no_acknowledged_event(
    tmp_path: Path, record_property: RecordProperty
) -> None:
    seed = int.from_bytes(os.urandom(4), "little")
    record_property("seed", seed)
    argv = [sys.executable, os.fspath(SOAK), "--duration", str(DURATION_S), "--seed", str(seed)]
    # A session of its own, so that a soak out of time goes with every process it started.
    proc = subprocess.Popen(
        [*argv, "--dir", os.fspath(tmp_path)],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT_S)
    except subprocess.TimeoutExpired:
        _, err = _take_down(proc)
        pytest.fail(
            f"seed {seed}: the soak did not end in {TIMEOUT_S} s; its stderr ends:\n"
            f"{err.decode(errors='replace')[-3000:]}"
        )
    finally:
        if proc.poll() is None:  # pytest's own timeout, or an interrupt, came first
            _take_down(proc)
    stderr = err.decode(errors="replace")
    lines = out.decode().strip().splitlines()
    assert lines, f"seed {seed}: the soak printed no result (exit {proc.returncode}):\n{stderr}"
    result = json.loads(lines[-1])
    ledger, consumer = result["ledger"], result["consumer_ledger"]
    for name in ("acknowledged_events", "delivered", "lost", "duplicates"):
        record_property(f"ledger_{name}", ledger[name])
    for name in ("in_kafka", "handled", "lost", "duplicates"):
        record_property(f"consumer_{name}", consumer[name])
    record_property("refused", ledger["refused"])
    record_property("faults_by_kind", result["faults_by_kind"])
    record_property("anchor_lost", result["anchor_ledger"]["lost"])
    summary = f"seed {seed}; end of the soak's stderr:\n{stderr[-3000:]}"

    assert ledger["lost"] == 0, f"{ledger['lost']} acknowledged events not in Kafka; {summary}"
    assert consumer["lost"] == 0, f"{consumer['lost']} events never handled; {summary}"
    assert consumer["handled_not_in_kafka"] == 0, summary
    assert proc.returncode == 0, f"the soak failed (exit {proc.returncode}); {summary}"
    assert ledger["acknowledged_events"] >= MIN_ACKNOWLEDGED, summary
    assert type(ledger["duplicates"]) is int, summary
    assert type(consumer["duplicates"]) is int, summary

    skipped = result["faults_skipped"]
    for kind, count in result["faults_by_kind"].items():
        if kind not in skipped:
            assert count >= 1, f"no {kind} fault was injected; {summary}"
    if "disk_full" not in skipped:
        checks = result["disk_full_checks"]
        assert checks["existing_queue_accepted"] >= 1, f"{checks}; {summary}"
        assert checks["existing_queue_refused"] == 0, f"{checks}; {summary}"
        assert checks["new_queue_refused"] >= 1, f"{checks}; {summary}"
        assert checks["new_queue_accepted"] == 0, f"{checks}; {summary}"
