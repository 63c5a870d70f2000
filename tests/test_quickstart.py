"""docs/quickstart.md works as written: its ```sh blocks run in order, in one shell, in an
empty folder, and each step shows what the page says it shows.

The set-up step (make, venv) is skipped: `eventspool` is this interpreter's
`python -m eventspool`, put first on the PATH. Everything else runs unchanged, the
background agent, the `until` loop and the `timeout`-bounded consumer included.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

QUICKSTART = Path(__file__).resolve().parents[1] / "docs" / "quickstart.md"
SH_BLOCK = re.compile(r"^```sh\n(.*?)^```$", re.MULTILINE | re.DOTALL)
EVENT_ID = r"[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[0-9a-f]{4}-[0-9a-f]{12}"
# The whole page: about 55 s on two cores alone, up to 93 s beside the rest of the suite.
SCRIPT_SECONDS = 150.0


@dataclass(frozen=True, slots=True)
class Step:
    """What one block must show: its exit status and patterns its output must match."""

    name: str
    returncode: int = 0
    stdout: str = ""
    stderr: str = ""


# One entry per ```sh block after the set-up, in the page's order.
STEPS = [
    Step("broker", stderr=r"keeps everything in memory"),
    Step("agent"),
    Step("send", stdout=rf"^{EVENT_ID}$", stderr=r"sent 1, failed 0"),
    Step("tail", stdout=r"^orders/\d@0 key= headers=event_id={id} value=\{\"type\": \"order_"),
    Step("handler"),
    Step("consume", 124, stdout=r"^handled {id}: u-17 paid 4200 cents$", stderr=r"processed=1"),
    Step("status", stdout=r"delivered: 1\b[\s\S]*^orders/\d +0 "),
    Step("pipeline", stdout=r"archive: 1 rows[\s\S]*rewards: 84 cents to 1 users"),
    Step("clean up", stdout=r"^stopped pid \d+$"),
]


def blocks() -> list[str]:
    """The page's ```sh blocks, in order."""
    return SH_BLOCK.findall(QUICKSTART.read_text())


def script(steps: list[str]) -> str:
    """One bash script of the steps, each framed by markers on stdout and stderr, so the
    output can be cut back into steps; the status of each is printed after it."""
    parts = []
    for number, step in enumerate(steps):
        parts.append(f"echo '@@step {number}'; echo '@@step {number}' >&2\n{step}")
        parts.append(f'echo "@@status {number} $?"')
    return "\n".join(parts) + "\n"


def split(output: str, count: int) -> list[str]:
    """The output of each step, by the markers `script` printed."""
    pieces = re.split(r"^@@step \d+\n", output, flags=re.MULTILINE)
    assert len(pieces) == count + 1, f"not every step ran:\n{output}"
    return pieces[1:]


def command_folder(folder: Path) -> Path:
    """A folder holding an `eventspool` command that is this interpreter's module."""
    bin_dir = folder / "bin"
    bin_dir.mkdir()
    command = bin_dir / "eventspool"
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m eventspool "$@"\n')
    command.chmod(0o755)
    return bin_dir


def run_page(steps: list[str], folder: Path) -> tuple[str, str]:
    """Run the steps in `folder` with a clean environment; whatever they left running
    (the agent, the broker) is stopped afterwards, also when a step hangs."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVENTSPOOL_")}
    env["PATH"] = f"{command_folder(folder.parent)}{os.pathsep}{env['PATH']}"
    process = subprocess.Popen(
        ["bash", "-c", script(steps)],
        stdin=subprocess.DEVNULL,
        cwd=folder,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = process.communicate(timeout=SCRIPT_SECONDS)
    finally:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        process.wait()
        stop = [sys.executable, "-m", "eventspool", "broker", "stop"]
        subprocess.run(stop, cwd=folder, env=env, capture_output=True, check=False, timeout=30)
    return stdout, stderr


@pytest.mark.slow
@pytest.mark.spark  # the pipeline as a command, with a Spark of its own
@pytest.mark.timeout(240)
def test_the_quickstart_runs_as_written(tmp_path: Path) -> None:
    """Each step's visible outcome: the id `send` prints is the one `tail` reads back and
    the handler prints, `status` shows the queue drained, the pipeline archives it."""
    setup, *steps = blocks()
    assert setup.startswith("make "), "the first block is no longer the set-up"
    assert len(steps) == len(STEPS), "the page's steps and this test's list differ"
    folder = tmp_path / "clone"
    folder.mkdir()
    stdout, stderr = run_page(steps, folder)
    event_id = ""
    for step, out, err in zip(
        STEPS, split(stdout, len(steps)), split(stderr, len(steps)), strict=True
    ):
        said = f"step {step.name!r}:\n{out}\n{err}"
        status = re.search(r"^@@status \d+ (\d+)$", out, re.MULTILINE)
        assert status is not None and int(status.group(1)) == step.returncode, said
        assert re.search(step.stdout.replace("{id}", event_id), out, re.MULTILINE), said
        assert re.search(step.stderr, err, re.MULTILINE), said
        event_id = event_id or next(iter(re.findall(EVENT_ID, out)), "")
    assert "agent listening on" in (folder / "agent.log").read_text()
    assert (folder / "handlers.py").is_file()
