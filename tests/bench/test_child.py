"""The bench's child processes: one that will not stop says where it hung, and is killed."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from harness.child import Child, ChildError

BENCH = Path(__file__).resolve().parents[2] / "bench"
READY_TIMEOUT_S = 30.0

# A child that touches the file named by its last argument once ready, then waits in a
# function whose name its stacks must show. SIGTERM_ACTION decides whether SIGTERM stops
# it; READS_ARGUMENTS whether it calls child_arguments (which arms the stack dump) first.
CHILD = """
import signal, sys, time
from pathlib import Path
sys.path.insert(0, {bench!r})
from harness.child import child_arguments

def waits_in_this_function() -> None:
    while True:
        time.sleep(0.05)

if {reads_arguments}:
    child_arguments(None)
signal.signal(signal.SIGTERM, {sigterm_action})
Path(sys.argv[-1]).touch()
waits_in_this_function()
"""


@pytest.fixture
def children() -> Iterator[list[Child]]:
    """Children a test started, killed at its end whatever happened."""
    started: list[Child] = []
    yield started
    for child in started:
        child.terminate()


def _started(
    tmp_path: Path, children: list[Child], sigterm_action: str, *, reads_arguments: bool = True
) -> Child:
    script = tmp_path / "child_script.py"
    source = CHILD.format(
        bench=os.fspath(BENCH), sigterm_action=sigterm_action, reads_arguments=reads_arguments
    )
    script.write_text(source)
    ready = tmp_path / "ready"
    child = Child.of_script("waiter", os.fspath(script), [os.fspath(ready)], tmp_path / "err")
    children.append(child.start())
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not ready.exists():
        assert time.monotonic() < deadline, child.stderr_tail()
        child.check()
        time.sleep(0.02)
    return child


def test_a_child_that_does_not_stop_is_killed_and_its_stacks_name_where_it_waited(
    tmp_path: Path, children: list[Child]
) -> None:
    child = _started(tmp_path, children, "signal.SIG_IGN")
    with pytest.raises(ChildError) as caught:
        child.stop(0.5)
    message = str(caught.value)
    assert "waiter did not stop in 0.5 s" in message
    assert "waits_in_this_function" in message
    assert child.process is not None and child.process.poll() is not None


def test_a_child_that_had_not_read_its_arguments_says_so_instead_of_its_stacks(
    tmp_path: Path, children: list[Child]
) -> None:
    child = _started(tmp_path, children, "signal.SIG_IGN", reads_arguments=False)
    with pytest.raises(ChildError, match="it had not read its arguments yet"):
        child.stop(0.5)


def test_a_child_that_stops_in_time_raises_nothing(tmp_path: Path, children: list[Child]) -> None:
    child = _started(tmp_path, children, "lambda _signum, _frame: sys.exit(0)")
    child.stop(10.0)
    assert child.process is not None and child.process.returncode == 0
