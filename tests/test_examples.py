"""The scripts in examples/ run and say what docs/patterns.md promises, so the docs stay
runnable. Each starts its own embedded broker."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize(
    ("script", "expected"),
    [
        ("work_queue.py", r"^100 of 100 tasks done by [1-4] worker processes$"),
        ("pubsub.py", r"^billing got 20 of 20, shipping got 20 of 20$"),
        ("rpc.py", r"^HELLO\nA B C\ntimeout: no reply to the request on topic 'rpc.nobody' "),
        ("structlog_logging.py", r"^order placed 0 0 info\norder placed 1 10 info\n"),
    ],
)
def test_example_runs_and_prints_its_result(script: str, expected: str) -> None:
    result = subprocess.run(
        [sys.executable, str(EXAMPLES / script)],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert re.search(expected, result.stdout, re.MULTILINE), result.stdout
