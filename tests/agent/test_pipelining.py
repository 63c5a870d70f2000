"""Many requests in flight on one connection, answered by request id.

A request that waits (a full `block` topic) must hold back neither the other topics on
its connection nor other connections; requests for the same topic keep their order. And
all of it at once with 16 blocking caller processes, nothing acknowledged lost.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from eventspool.broker import LocalBroker, find_free_port
from eventspool.client.sync import Client
from eventspool.testing.agent import AgentProcess
from eventspool.verify import consume_event_ids, ledger
from eventspool.wire.protocol import (
    Frame,
    FrameDecoder,
    FrameType,
    Status,
    WireEvent,
    decode_send_result,
    encode_frame,
    encode_send,
)
from tests.fault import test_agent_kill
from tests.fault.test_agent_kill import _ClientChild, _reported, _wait_for_progress

# pytest collects fixtures from module attributes by attribute name (see tests/client).
short_dir = test_agent_kill.short_dir

BLOCK_TIMEOUT_S = 2.0
EVENT = b"e" * 90_000  # five of these fill the blocked topic's 512 KiB queue
QUICK_S = 1.0  # far below BLOCK_TIMEOUT_S: the other requests did not wait for the blocked
# With 16 caller processes on the same cores: still below the first blocked answer.
LOADED_QUICK_S = BLOCK_TIMEOUT_S * 0.8
CALLERS_WARM = 300  # events the callers had acknowledged: they are connected and sending
CALLER_PAUSE_S = 0.002  # 16 callers leave the rest of the suite some of the two cores


def _blocking_agent(tmp_path: Path) -> AgentProcess:
    """An agent whose broker never answers, so nothing drains: a full queue stays full."""
    unreachable = f"127.0.0.1:{find_free_port()}"
    extra = (
        f'[topics.blocked]\nqueue_bytes = 524288\nfull_policy = "block"\n'
        f"block_timeout_s = {BLOCK_TIMEOUT_S}\n"
    )
    return AgentProcess(tmp_path, unreachable, extra)


def _read_answers(
    sock: socket.socket, wanted: int, deadline_s: float, seen: Callable[[Frame, float], None]
) -> None:
    decoder = FrameDecoder()
    started = time.monotonic()
    count = 0
    sock.settimeout(deadline_s)
    while count < wanted:
        data = sock.recv(1 << 16)
        assert data, "the agent closed the connection"
        for frame in decoder.feed(data):
            seen(frame, time.monotonic() - started)
            count += 1


def _pipelined_requests(
    blocked: str, free: list[str]
) -> tuple[list[bytes], dict[int, tuple[str, int]]]:
    """64 requests for one write: four of one event each to the full topic (each waits the
    block timeout, one after the other), PINGs, and the rest spread over the `free`
    topics; request ids 1..64. Returns the frames and each id's (topic, event count)."""
    requests: dict[int, tuple[str, int]] = {}
    frames = []
    for request_id in range(1, 65):
        if request_id % 16 == 0:
            frames.append(encode_frame(FrameType.PING, request_id, b"p%d" % request_id))
            requests[request_id] = ("ping", 0)
            continue
        if request_id % 16 == 8:
            topic, events = blocked, [WireEvent(EVENT)]
        else:
            topic = free[request_id % len(free)]
            events = [WireEvent(b"request %d event %d" % (request_id, n)) for n in range(3)]
        frames.append(encode_send(request_id, topic, events))
        requests[request_id] = (topic, len(events))
    return frames, requests


def _send_pipelined(
    socket_path: Path, frames: list[bytes], quick_s: float
) -> dict[int, tuple[Frame, float]]:
    """Each request id's answer and how long after the write it came."""
    answered: dict[int, tuple[Frame, float]] = {}
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(socket_path))
        sock.sendall(b"".join(frames))
        _read_answers(
            sock,
            len(frames),
            BLOCK_TIMEOUT_S * 4 + quick_s,
            lambda frame, after: answered.__setitem__(frame.request_id, (frame, after)),
        )
    return answered


def _check_answers(
    requests: dict[int, tuple[str, int]],
    answered: dict[int, tuple[Frame, float]],
    blocked: str,
    quick_s: float,
) -> list[str]:
    """Every request got its own answer; the full topic's waited, in order, and held
    back nothing else. Returns the event ids the other SENDs were answered with."""
    assert sorted(answered) == sorted(requests)
    blocked_order = []
    ids: list[str] = []
    for request_id, (topic, count) in requests.items():
        frame, after = answered[request_id]
        if topic == "ping":
            assert (frame.type, frame.body) == (FrameType.PONG, b"p%d" % request_id)
            assert after < quick_s
            continue
        assert frame.type is FrameType.SEND_RESULT
        results = decode_send_result(frame.body)
        assert len(results) == count
        if topic == blocked:
            assert {result.status for result in results} == {Status.SPOOL_FULL}
            assert after >= BLOCK_TIMEOUT_S * 0.9
            blocked_order.append((after, request_id))
        else:
            assert all(result.ok for result in results), results
            assert after < quick_s, f"request {request_id} waited {after:.2f} s"
            ids.extend(result.text for result in results)
    # One queue per topic and connection: the blocked requests were served in order.
    assert [request_id for _, request_id in sorted(blocked_order)] == sorted(
        request_id for request_id, (topic, _) in requests.items() if topic == blocked
    )
    return ids


def test_a_full_block_topic_holds_back_nothing_else_on_its_connection(tmp_path: Path) -> None:
    agent = _blocking_agent(tmp_path)
    agent.start()
    try:
        with Client(agent.socket_path) as client:
            filled = client.send_many("blocked", [EVENT] * 5)
        assert all(isinstance(outcome, str) for outcome in filled), filled
        frames, requests = _pipelined_requests("blocked", [f"free-{n}" for n in range(3)])
        answered = _send_pipelined(agent.socket_path, frames, QUICK_S)
    finally:
        agent.stop()
    _check_answers(requests, answered, "blocked", QUICK_S)


@pytest.mark.slow
def test_sixteen_callers_a_pipelined_connection_and_a_full_topic_at_once(
    broker: LocalBroker,
    topic_factory: Callable[[int], str],
    tmp_path: Path,
    short_dir: Path,
) -> None:
    """16 single-threaded caller processes in a blocking `send()` loop, while one
    connection has 64 requests in flight and four of them wait on a full `block` topic:
    every answer matches its request, the callers go on while the full topic waits, and
    every acknowledged event reaches Kafka once the agent is restarted with a broker (it
    ran without one, so that the topic stayed full)."""
    blocked, callers_topic = topic_factory(1), topic_factory(4)
    free = [topic_factory(2) for _ in range(3)]
    socket_path = short_dir / "agent.sock"
    extra = (
        f'[topics."{blocked}"]\nqueue_bytes = 524288\nfull_policy = "block"\n'
        f"block_timeout_s = {BLOCK_TIMEOUT_S}\n"
    )
    offline = AgentProcess(tmp_path, f"127.0.0.1:{find_free_port()}", extra, socket_path)
    children: list[_ClientChild] = []
    try:
        offline.start_answering()
        with Client(socket_path) as filler:
            filled = filler.send_many(blocked, [EVENT] * 5)
        assert all(isinstance(outcome, str) for outcome in filled), filled
        children = [
            _ClientChild(
                socket_path,
                callers_topic,
                tmp_path / f"caller-{n}.err",
                n,
                threads=1,
                pause_s=CALLER_PAUSE_S,
            )
            for n in range(16)
        ]
        _wait_for_progress(children, CALLERS_WARM)
        frames, requests = _pipelined_requests(blocked, free)
        before = _reported(children)
        answered = _send_pipelined(socket_path, frames, LOADED_QUICK_S)
        while_blocked = _reported(children) - before
        for child in children:
            child.check_alive()
    finally:
        for child in children:
            child.stop()
        offline.stop()
    answer_ids = _check_answers(requests, answered, blocked, LOADED_QUICK_S)
    assert while_blocked >= CALLERS_WARM, f"the callers sent {while_blocked} while it waited"
    acknowledged = [event_id for child in children for event_id in child.acknowledged()]
    expected = {*acknowledged, *answer_ids, *(str(event_id) for event_id in filled)}
    assert len(expected) == len(acknowledged) + len(answer_ids) + len(filled)
    online = AgentProcess(tmp_path, broker.bootstrap_servers, extra, socket_path)
    try:
        online.start_answering()
        seen = consume_event_ids(
            broker.bootstrap_servers, [blocked, callers_topic, *free], expected, timeout=90
        )
    finally:
        online.stop()
    result = ledger(expected, seen)
    assert result.lost == 0, f"{result.lost} of {result.sent} acknowledged events lost"


def test_other_connections_go_on_while_one_waits_on_a_full_topic(tmp_path: Path) -> None:
    agent = _blocking_agent(tmp_path)
    agent.start()
    try:
        with Client(agent.socket_path) as filler:
            filler.send_many("blocked", [EVENT] * 5)
        with (
            Client(agent.socket_path, timeout=BLOCK_TIMEOUT_S * 4) as waiting,
            Client(agent.socket_path) as other,
        ):
            stuck = waiting.send_async("blocked", EVENT)
            time.sleep(0.2)  # it is waiting in the agent now
            started = time.monotonic()
            ids = other.send_many("free", [b"a", b"b", b"c"])
            took = time.monotonic() - started
            assert not stuck.done()
            assert all(isinstance(event_id, str) for event_id in ids)
            assert took < QUICK_S
            error = stuck.exception(BLOCK_TIMEOUT_S * 4)
            assert error is not None and "full" in str(error)
    finally:
        agent.stop()
