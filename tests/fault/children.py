"""Child processes the fault tests SIGKILL at a random moment, and what they acknowledged.

A child is run as ``python -m MODULE LEDGER ARGS...``: it prints "R <start>" on stdout
once it is ready, then appends one line to the ledger file LEDGER
(`eventspool.testing.ledger`) per acknowledged action, after the call it reports has
returned. The ledger, not the pipe, is the record: a kill cannot cut it short. A child
may print status lines after the ready line (a "done" line, say); they are not
acknowledgements.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from eventspool.testing.ledger import LedgerLine, read_lines

REPO_ROOT = Path(__file__).resolve().parents[2]
READY_TIMEOUT_S = 60.0


def emit(line: str) -> None:
    """Say one line on stdout, as a child: one `os.write`, so a kill cannot cut it unnoticed."""
    os.write(1, line.encode() + b"\n")


class LineReader(threading.Thread):
    """Drains a child's stdout so it never blocks on a full pipe; keeps complete lines."""

    def __init__(self, stream: IO[bytes]) -> None:
        super().__init__(daemon=True)
        self._stream = stream
        self.lines: list[str] = []
        self.ready = threading.Event()

    def run(self) -> None:
        for raw in self._stream:
            if not raw.endswith(b"\n"):
                break  # a line cut by the kill reports nothing
            self.lines.append(raw.decode().strip())
            self.ready.set()
        self.ready.set()


@dataclass(frozen=True, slots=True)
class KilledChild:
    """A SIGKILLed child: the number on its ready line, its ledger's lines in order, and
    the status lines it printed after the ready line."""

    start: int
    acknowledged: list[LedgerLine]
    said: list[str]
    stderr: str
    pid: int


def run_and_kill(
    module: str,
    args: list[str],
    delay_s: float = 0.0,
    *,
    until: Callable[[LineReader, subprocess.Popen[bytes]], object] | None = None,
) -> KilledChild:
    """Run `python -m module LEDGER args`, SIGKILL it `delay_s` after its ready line, or as
    soon as `until(reader, process)` returns; then read its ledger."""
    with tempfile.TemporaryDirectory() as scratch, tempfile.TemporaryFile() as stderr:
        ledger = Path(scratch) / "acknowledged.ids"
        proc = subprocess.Popen(
            [sys.executable, "-m", module, os.fspath(ledger), *args],
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
        assert proc.stdout is not None
        reader = LineReader(proc.stdout)
        reader.start()
        try:
            assert reader.ready.wait(READY_TIMEOUT_S), f"{module} never became ready"
            if until is None:
                time.sleep(delay_s)
            else:
                until(reader, proc)
        finally:
            if proc.poll() is None:
                os.kill(proc.pid, signal.SIGKILL)
            proc.wait()
            reader.join(10)
            proc.stdout.close()
        stderr.seek(0)
        errors = stderr.read().decode(errors="replace")
        assert proc.returncode == -signal.SIGKILL, f"{module} died on its own: {errors}"
        assert reader.lines and reader.lines[0].startswith("R "), f"no ready line: {errors}"
        acknowledged = read_lines(ledger)
    start = int(reader.lines[0].split()[1])
    return KilledChild(start, acknowledged, reader.lines[1:], errors, proc.pid)
