"""Many requests in flight on one connection, answered by request id.

A request that waits (a full `block` topic) must hold back neither the other topics on
its connection nor other connections; requests for the same topic keep their order.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

from eventspool.broker import find_free_port
from eventspool.client.sync import Client
from eventspool.testing.agent import AgentProcess
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

BLOCK_TIMEOUT_S = 2.0
EVENT = b"e" * 90_000  # five of these fill the blocked topic's 512 KiB queue
QUICK_S = 1.0  # far below BLOCK_TIMEOUT_S: the other requests did not wait for the blocked


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


def test_a_full_block_topic_holds_back_nothing_else_on_its_connection(tmp_path: Path) -> None:
    agent = _blocking_agent(tmp_path)
    agent.start()
    try:
        with Client(agent.socket_path) as client:
            filled = client.send_many("blocked", [EVENT] * 5)
        assert all(isinstance(outcome, str) for outcome in filled), filled
        # 64 requests in one write: four of one event each to the full topic (each waits
        # the block timeout, one after the other), PINGs, and the rest spread over three
        # other topics; request ids 1..64.
        requests: dict[int, tuple[str, int]] = {}
        frames = []
        for request_id in range(1, 65):
            if request_id % 16 == 0:
                frames.append(encode_frame(FrameType.PING, request_id, b"p%d" % request_id))
                requests[request_id] = ("ping", 0)
                continue
            if request_id % 16 == 8:
                topic, events = "blocked", [WireEvent(EVENT)]
            else:
                topic = f"free-{request_id % 3}"
                events = [WireEvent(b"request %d event %d" % (request_id, n)) for n in range(3)]
            frames.append(encode_send(request_id, topic, events))
            requests[request_id] = (topic, len(events))
        answered: dict[int, tuple[Frame, float]] = {}
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(agent.socket_path))
            sock.sendall(b"".join(frames))
            _read_answers(
                sock,
                len(frames),
                BLOCK_TIMEOUT_S * 4,
                lambda frame, after: answered.__setitem__(frame.request_id, (frame, after)),
            )
    finally:
        agent.stop()

    assert sorted(answered) == sorted(requests)
    blocked_order = []
    for request_id, (topic, count) in requests.items():
        frame, after = answered[request_id]
        if topic == "ping":
            assert (frame.type, frame.body) == (FrameType.PONG, b"p%d" % request_id)
            assert after < QUICK_S
            continue
        assert frame.type is FrameType.SEND_RESULT
        results = decode_send_result(frame.body)
        assert len(results) == count
        if topic == "blocked":
            assert {result.status for result in results} == {Status.SPOOL_FULL}
            assert after >= BLOCK_TIMEOUT_S * 0.9
            blocked_order.append((after, request_id))
        else:
            assert all(result.ok for result in results), results
            assert after < QUICK_S, f"request {request_id} waited {after:.2f} s"
    # One queue per topic and connection: the blocked requests were served in order.
    assert [request_id for _, request_id in sorted(blocked_order)] == sorted(
        request_id for request_id, (topic, _) in requests.items() if topic == "blocked"
    )


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
