"""The agent SIGKILLed again and again under load from several client processes: 16
single-threaded ones in a blocking `send()` loop (each call made in person on its idle
connection), and one whose 4 threads share a pipelined `Client`.

What must hold: every event whose `Client.send()` returned an event id reaches Kafka,
however often the agent dies; the agent restarts on the same spool directory and
socket path, and the clients carry on without being restarted (their `Client`
reconnects). A kill can land while a client waits for its answer: that `send()` raises
AgentError and is not counted, even though its event may have been spooled. At least
once: a kill may make the sender resend what was in flight, so duplicates are reported,
not forbidden.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from eventspool.broker import LocalBroker, find_free_port
from eventspool.testing.agent import AgentProcess
from eventspool.testing.ledger import committed_lines, read_lines
from eventspool.verify import consume_event_ids, ledger
from tests.agent.conftest import call

pytestmark = [pytest.mark.slow, pytest.mark.fault]

REPO_ROOT = Path(__file__).resolve().parents[2]
RecordProperty = Callable[[str, object], None]

KILL_CYCLES = 8
# (processes, threads per process, pause between sends): callers alone on their
# connection, and one client shared by threads; paced, so that 20 callers leave the rest
# of the suite some of the two cores.
CLIENT_LAYOUT = ((16, 1, 0.002), (1, 4, 0.002))
PARTITIONS = 4
PROGRESS_EVENTS = 300  # acknowledged after a restart before the next kill is armed
KILL_DELAY_S = (0.1, 1.5)  # then the kill lands at a random moment in this window
PROGRESS_TIMEOUT_S = 60.0  # a restart on two loaded cores can take half of it
START_TIMEOUT_S = 20.0
DRAIN_TIMEOUT_S = 90.0


class _ClientChild:
    """One `agent_client_child` process: its stderr file, and beside it (suffix `.ids`)
    the ledger of the event ids its sends were answered with."""

    def __init__(  # noqa: PLR0917  # the child's own arguments, in their order
        self,
        socket_path: Path,
        topic: str,
        stderr_path: Path,
        seed: int,
        threads: int = 4,
        pause_s: float = 0.0,
    ) -> None:
        self.stderr_path = stderr_path
        self.ledger = stderr_path.with_suffix(".ids")
        with stderr_path.open("wb") as stderr:
            self.process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "tests.fault.agent_client_child",
                    os.fspath(self.ledger),
                    os.fspath(socket_path),
                    topic,
                    str(threads),
                    str(seed),
                    str(pause_s),
                ],
                cwd=REPO_ROOT,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=stderr,
            )

    def acknowledged(self) -> list[str]:
        """The event ids its sends returned so far, in the order they were recorded."""
        return [line.event_id for line in read_lines(self.ledger)]

    def errors(self) -> str:
        return self.stderr_path.read_text(errors="replace")

    def failed_sends(self) -> int:
        return self.errors().count("AgentError:")

    def check_alive(self) -> None:
        code = self.process.poll()
        assert code is None, f"client child exited with {code}: {self.errors()[-2000:]}"

    def stop(self) -> None:
        """SIGTERM, then SIGKILL if it lingers: its ledger keeps what it recorded either way."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


def _reported(children: list[_ClientChild]) -> int:
    return sum(committed_lines(child.ledger) for child in children)


def _wait_for_progress(children: list[_ClientChild], events: int) -> None:
    """Until the clients together had `events` more sends acknowledged: they are connected."""
    target = _reported(children) + events
    deadline = time.monotonic() + PROGRESS_TIMEOUT_S
    while _reported(children) < target:
        for child in children:
            child.check_alive()
        assert time.monotonic() < deadline, "the clients made no progress after a restart"
        time.sleep(0.01)


@pytest.fixture
def short_dir() -> Iterator[Path]:
    """A short directory for the socket: a unix socket path has at most 107 bytes."""
    path = Path(tempfile.mkdtemp(prefix="eventspool-kill-"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def test_sigkilled_agent_loses_no_acknowledged_event(
    broker: LocalBroker,
    topic_factory: Callable[[int], str],
    tmp_path: Path,
    short_dir: Path,
    record_property: RecordProperty,
) -> None:
    """Kill the agent at random moments under load; every acknowledged send reaches Kafka."""
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    topic = topic_factory(PARTITIONS)
    agent = AgentProcess(tmp_path, broker.bootstrap_servers, socket_path=short_dir / "agent.sock")
    children: list[_ClientChild] = []
    restart_s: list[float] = []
    try:
        try:
            restart_s.append(agent.start_answering(START_TIMEOUT_S))
            children = [
                _ClientChild(
                    agent.socket_path,
                    topic,
                    tmp_path / f"client-{threads}-{n}.stderr",
                    rng.getrandbits(32),
                    threads,
                    pause_s,
                )
                for processes, threads, pause_s in CLIENT_LAYOUT
                for n in range(processes)
            ]
            for _ in range(KILL_CYCLES):
                _wait_for_progress(children, PROGRESS_EVENTS)
                time.sleep(rng.uniform(*KILL_DELAY_S))
                agent.kill()
                restart_s.append(agent.start_answering(START_TIMEOUT_S))
            # The clients reconnect once more, after the last restart, before they stop.
            _wait_for_progress(children, PROGRESS_EVENTS)
            for child in children:
                child.check_alive()
        finally:
            for child in children:
                child.stop()
        drain_s = agent.wait_until_drained(DRAIN_TIMEOUT_S)
        stats = agent.stats()
    finally:
        agent.stop()

    reported = [event_id for child in children for event_id in child.acknowledged()]
    failed_sends = sum(child.failed_sends() for child in children)
    expected = set(reported)
    record_property("seed", seed)
    record_property("kills", KILL_CYCLES)
    record_property("events_acknowledged_by_send", len(reported))
    record_property("sends_failed_by_a_kill", failed_sends)
    record_property("restart_s_max", round(max(restart_s), 3))
    record_property("drain_after_clients_stopped_s", round(drain_s, 2))
    record_property("sender_counters_since_last_restart", stats["sender"])
    assert len(expected) == len(reported), f"seed {seed}: send() returned an event id twice"

    seen = consume_event_ids(broker.bootstrap_servers, [topic], expected, timeout=60)
    result = ledger(expected, seen)
    unreported = sum(1 for event_id in seen if event_id not in expected)
    record_property("delivered", result.delivered)
    record_property("duplicates", result.duplicated)
    record_property("spooled_but_not_acknowledged_to_a_client", unreported)
    print(
        f"seed {seed}: {KILL_CYCLES} kills, restart max {max(restart_s):.2f} s; "
        f"{len(reported)} sends acknowledged, {failed_sends} failed by a kill; "
        f"{result.delivered} delivered, {result.lost} lost, {result.duplicated} duplicates, "
        f"{unreported} spooled but not acknowledged; drain {drain_s:.2f} s"
    )
    missing = sorted(expected - seen.keys())
    assert result.lost == 0, (
        f"seed {seed}: {result.lost} of {result.sent} acknowledged events lost after "
        f"{KILL_CYCLES} kills ({failed_sends} sends failed by a kill), e.g. {missing[:3]}"
    )


HTTP_REQUESTS = 20
HTTP_EVENTS_PER_REQUEST = 10


def test_events_acknowledged_over_http_survive_a_sigkill_of_the_agent(
    broker: LocalBroker,
    topic_factory: Callable[[int], str],
    tmp_path: Path,
    short_dir: Path,
) -> None:
    """An HTTP 200 means on disk: the agent answers while Kafka is unreachable, so the
    events exist only in its spool when it is SIGKILLed; restarted with the broker, it
    delivers every event id the answers carried."""
    topic = topic_factory(2)
    socket_path = short_dir / "agent.sock"
    offline = AgentProcess(tmp_path, f"127.0.0.1:{find_free_port()}", socket_path=socket_path)
    ids: list[str] = []
    try:
        offline.start_answering()
        for request in range(HTTP_REQUESTS):
            events = [
                {"value": f"http {request}-{n}", "key": f"k{n}"}
                for n in range(HTTP_EVENTS_PER_REQUEST)
            ]
            status, answer = call(offline, "POST", f"/v1/topics/{topic}", {"events": events})
            assert status == 200, answer
            assert [result["status"] for result in answer["results"]] == ["ok"] * len(events)
            ids.extend(result["event_id"] for result in answer["results"])
        assert offline.depth() == len(ids), "events left the agent although Kafka was unreachable"
        offline.kill()
    finally:
        offline.stop()

    online = AgentProcess(tmp_path, broker.bootstrap_servers, socket_path=socket_path)
    try:
        online.start_answering()
        seen = consume_event_ids(broker.bootstrap_servers, [topic], ids, timeout=60)
    finally:
        online.stop()
    result = ledger(ids, seen)
    assert len(set(ids)) == HTTP_REQUESTS * HTTP_EVENTS_PER_REQUEST
    assert result.lost == 0, f"{result.lost} of {result.sent} events answered over HTTP were lost"
