"""Commands given no Kafka address use the embedded broker of the state file, and say so;
with none running they stop at once, naming both ways out."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from click.testing import CliRunner

from eventspool import Spool
from eventspool.broker import create_topic
from eventspool.cli import main
from tests.consumer.conftest import GROUP_KAFKA
from tests.consumer.handlers import OUT_ENV, SLEEP_ENV

REPO = Path(__file__).resolve().parents[1]
STATE_FILE = Path(".eventspool") / "broker" / "broker.json"
# Variables that would give an address, or another state directory, to the commands.
_ADDRESS_VARIABLES = (
    "EVENTSPOOL_BOOTSTRAP_SERVERS",
    "EVENTSPOOL_STATE_DIR",
    "EVENTSPOOL_KAFKA_BOOTSTRAP_SERVERS",
)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _ADDRESS_VARIABLES}
    return {**env, "PYTHONPATH": os.fspath(REPO), **extra}


def _eventspool(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "eventspool", *args],
        cwd=cwd,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


@pytest.fixture
def started(tmp_path: Path) -> Iterator[tuple[Path, str, str]]:
    """`eventspool broker start` in a folder of its own: (folder, address, its stderr)."""
    folder = tmp_path / "work"
    folder.mkdir()
    start = _eventspool(folder, "broker", "start")
    assert start.returncode == 0, start.stderr
    try:
        yield folder, start.stdout.strip(), start.stderr
    finally:
        _eventspool(folder, "broker", "stop")


def _stderr_until(process: subprocess.Popen[str], wanted: str, timeout: float) -> list[str]:
    """Lines of *process*'s stderr up to the first that holds *wanted*."""
    assert process.stderr is not None
    lines: list[str] = []
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = process.stderr.readline()
        if not line:
            break
        lines.append(line.rstrip("\n"))
        if wanted in line:
            return lines
    raise AssertionError(f"{wanted!r} not on stderr: {lines}")


def _stop(process: subprocess.Popen[str]) -> int:
    process.send_signal(signal.SIGTERM)
    try:
        return process.wait(timeout=30)
    finally:
        process.kill()
        process.wait()


def test_start_says_where_its_state_is_and_that_it_keeps_all_in_memory(
    started: tuple[Path, str, str],
) -> None:
    folder, address, stderr = started
    state = json.loads((folder / STATE_FILE).read_text())
    assert address == f"127.0.0.1:{state['port']}"
    assert "keeps everything in memory" in stderr
    assert os.fspath(STATE_FILE) in stderr


def test_topics_and_tail_find_the_embedded_broker_and_say_so(
    started: tuple[Path, str, str],
) -> None:
    folder, address, _ = started
    create_topic(address, "orders", 2)
    with Spool(folder / "spool", address) as spool:
        ids = [spool.send("orders", b"v%d" % i, key=b"k%d" % i) for i in range(6)]
        assert spool.flush(timeout=30) == 0
    said = f"using the embedded broker at {address} (from {STATE_FILE})\n"

    topics = _eventspool(folder, "topics")
    assert (topics.returncode, topics.stderr) == (0, said)
    assert topics.stdout.splitlines()[1].split() == ["orders", "2", "6"]

    tail = _eventspool(folder, "tail", "orders", "--json")
    assert (tail.returncode, tail.stderr) == (0, said)
    read = [json.loads(line) for line in tail.stdout.splitlines()]
    assert sorted(d["headers"]["event_id"] for d in read) == sorted(ids)

    elsewhere = CliRunner().invoke(
        main,
        ["topics"],
        env={
            "EVENTSPOOL_STATE_DIR": os.fspath(folder / STATE_FILE.parent),
            "EVENTSPOOL_BOOTSTRAP_SERVERS": None,
        },
    )
    assert elsewhere.exit_code == 0, elsewhere.output
    assert f"(from {folder / STATE_FILE})" in elsewhere.stderr

    given = CliRunner().invoke(main, ["topics", "--bootstrap-servers", address])
    assert (given.exit_code, given.stderr) == (0, "")


def test_consume_finds_the_embedded_broker_and_the_agent_only_names_it(
    started: tuple[Path, str, str],
) -> None:
    """consume reads from the broker; an agent without bootstrap_servers stays spool-only
    (a valid set-up) and logs the address it could ship to."""
    folder, address, _ = started
    create_topic(address, "orders", 1)
    with Spool(folder / "spool", address) as spool:
        ids = {spool.send("orders", b"v%d" % i) for i in range(3)}
        assert spool.flush(timeout=30) == 0
    handled = folder / "handled"
    consume = subprocess.Popen(
        [
            *(sys.executable, "-m", "eventspool", "consume", "--group", "g", "--topic", "orders"),
            *("--handler", "tests.consumer.handlers:slow_from_env", "--status-interval", "0"),
            *(arg for name, value in GROUP_KAFKA.items() for arg in ("--kafka", f"{name}={value}")),
        ],
        cwd=folder,
        env=_env(**{OUT_ENV: os.fspath(handled), SLEEP_ENV: "0"}),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        first = _stderr_until(consume, "using the embedded broker", 30)
        assert first == [f"using the embedded broker at {address} (from {STATE_FILE})"]
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and (
            not handled.exists() or len(handled.read_text().splitlines()) < len(ids)
        ):
            time.sleep(0.2)
        assert {line.split()[0] for line in handled.read_text().splitlines()} == ids
    finally:
        _stop(consume)

    agent = subprocess.Popen(
        [sys.executable, "-m", "eventspool", "agent"],
        cwd=folder,
        env=_env(EVENTSPOOL_AGENT_SPOOL_DIR=os.fspath(folder / "agent-spool")),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        lines = _stderr_until(agent, "agent listening", 30)
    finally:
        assert _stop(agent) == 0
    hint = [line for line in lines if "EVENTSPOOL_KAFKA_BOOTSTRAP_SERVERS" in line]
    assert len(hint) == 1
    assert hint[0].endswith(
        f"spooling only, sending nothing; to ship to the embedded broker "
        f"running here, set EVENTSPOOL_KAFKA_BOOTSTRAP_SERVERS={address}"
    )


def test_consume_on_the_embedded_broker_gets_partitions_within_seconds_by_default(
    started: tuple[Path, str, str],
) -> None:
    """No --kafka settings at all: the CLI picks the embedded broker's session timeout
    and says so; the first event is handled within 5 s of the command's start."""
    folder, address, _ = started
    create_topic(address, "orders", 2)
    with Spool(folder / "spool", address) as spool:
        event_id = spool.send("orders", b"first")
        assert spool.flush(timeout=30) == 0
    handled = folder / "handled"
    began = time.monotonic()
    consume = subprocess.Popen(
        [
            *(sys.executable, "-m", "eventspool", "consume", "--group", "quick", "--topic"),
            *("orders", "--handler", "tests.consumer.handlers:slow_from_env"),
            *("--status-interval", "0"),
        ],
        cwd=folder,
        env=_env(**{OUT_ENV: os.fspath(handled), SLEEP_ENV: "0"}),
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        said = _stderr_until(consume, "on the embedded broker: session.timeout.ms=6000", 30)
        assert any("--kafka session.timeout.ms=N" in line for line in said)
        while not handled.exists() and time.monotonic() - began < 30:
            time.sleep(0.05)
        took = time.monotonic() - began
    finally:
        _stop(consume)
    assert handled.read_text().split()[0] == event_id
    # Python, the worker processes and the group join; 23 s with librdkafka's defaults.
    assert took < 5 + 3, f"first event handled {took:.1f} s after start"


COMMANDS = [
    ["consume", "--group", "g", "--topic", "t", "--handler", "tests.consumer.handlers:record_to"],
    ["tail", "t"],
    ["topics"],
    ["pipeline", "run", "--topic", "t", "--output", "out", "--dsn", "host=db"],
    [
        *("pipeline", "backfill", "--topic", "t", "--output", "out", "--dsn", "host=db"),
        *("--from", "2026-11-01", "--to", "2026-11-02"),
    ],
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: " ".join(command[:2]))
def test_with_no_address_and_no_broker_commands_fail_at_once(
    command: list[str], tmp_path: Path
) -> None:
    state_dir = tmp_path / "state"
    env = {"EVENTSPOOL_STATE_DIR": os.fspath(state_dir), "EVENTSPOOL_BOOTSTRAP_SERVERS": None}
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    stale = {"pid": dead.pid, "port": 1, "cluster_id": "gone", "log_path": "", "started_at": 0}
    for state in (None, stale):
        if state is not None:
            state_dir.mkdir()
            (state_dir / "broker.json").write_text(json.dumps(state))
        began = time.monotonic()
        result = CliRunner().invoke(main, command, env=env)
        assert time.monotonic() - began < 5
        assert result.exit_code == 1, result.output
        assert "--bootstrap-servers HOST:PORT" in result.stderr
        assert "`eventspool broker start`" in result.stderr
        assert os.fspath(state_dir / "broker.json") in result.stderr


def test_an_unreadable_state_file_is_named(tmp_path: Path) -> None:
    (tmp_path / "broker.json").write_text("{not json")
    env = {"EVENTSPOOL_STATE_DIR": os.fspath(tmp_path), "EVENTSPOOL_BOOTSTRAP_SERVERS": None}
    result = CliRunner().invoke(main, ["topics"], env=env)
    assert result.exit_code == 1
    assert "no --bootstrap-servers given, and broker state file" in result.stderr
    assert "unreadable" in result.stderr
