"""Threads sharing one blocking Client: their queued `send()` calls go on the lane, are
framed and written in C, and the compiled reader settles their answers without the
interpreter lock (queued_calls.pxi). Against a scripted peer on a real unix socket, which
answers as a real agent would, or as one never does: refusals among event_ids, answers
after the caller's timeout, a hang-up, a frame too large. The sanitizer test runs this
file against the instrumented build.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from eventspool.client.sync import AgentError, Client
from eventspool.errors import EventspoolError, InvalidTopicError
from eventspool.wire.protocol import (
    EventResult,
    Frame,
    FrameDecoder,
    FrameType,
    Status,
    decode_send,
    encode_frame,
    encode_send_result,
)
from tests.wire_support import listening, scripted_agent

THREADS = 16
CALLS = 4  # per thread


def _event_id(value: bytes) -> str:
    """The event_id the peer gives an event: made of its value, so each caller can tell
    its own from another's."""
    return "00000000-0000-7000-8000-" + value.hex()[-12:].rjust(12, "0")


def _answer_ids(
    refuse: Callable[[int, list[bytes]], bool] = lambda _at, _values: False,
) -> tuple[Callable[[Frame], list[bytes]], list[tuple[str, list[bytes]]], set[bytes]]:
    """Answers each SEND with one result per event: its event_id, or INVALID_TOPIC where
    `refuse(index, values)` says so; records each SEND's topic and values, and the
    values refused."""
    sends: list[tuple[str, list[bytes]]] = []
    refused: set[bytes] = set()

    def answer(frame: Frame) -> list[bytes]:
        request = decode_send(frame.body)
        values = [event.value or b"" for event in request.events]
        sends.append((request.topic, values))
        results = []
        for at, value in enumerate(values):
            if refuse(at, values):
                refused.add(value)
                results.append(EventResult(Status.INVALID_TOPIC, "refused here"))
            else:
                results.append(EventResult(Status.OK, _event_id(value)))
        return [encode_send_result(frame.request_id, results)]

    return answer, sends, refused


def _in_threads(client: Client, topics: tuple[str, ...]) -> dict[bytes, str | BaseException]:
    """THREADS threads each `send()` CALLS events, round the `topics`, until one fails
    with AgentError: each event's outcome by its value."""
    outcomes: dict[bytes, str | BaseException] = {}

    def calls(thread: int) -> None:
        for n in range(CALLS):
            value = b"%02d%02d" % (thread, n)
            try:
                outcomes[value] = client.send(topics[(thread + n) % len(topics)], value)
            except EventspoolError as exc:
                outcomes[value] = exc
                if isinstance(exc, AgentError):
                    return

    threads = [threading.Thread(target=calls, args=(n,)) for n in range(THREADS)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(thread.is_alive() for thread in threads), "a caller was left waiting"
    return outcomes


def _answer_then(path: Path, count: int, last: bytes | None) -> None:
    """A peer that answers `count` SENDs with their event_ids, then hangs up (`last`
    None) or sends `last` and reads on until the client hangs up."""
    answer, sends, _refused = _answer_ids()
    listener = listening(path)

    def serve() -> None:
        with listener, listener.accept()[0] as peer:
            decoder = FrameDecoder()
            while len(sends) < count and (data := peer.recv(65536)):
                for frame in decoder.feed(data)[: count - len(sends)]:
                    peer.sendall(b"".join(answer(frame)))
            if last is not None:
                peer.sendall(last)
                while peer.recv(65536):
                    pass

    threading.Thread(target=serve, daemon=True).start()


@pytest.mark.parametrize("topics", [("t",), ("a", "b", "c")])
def test_threads_each_get_their_own_event_id(tmp_path: Path, topics: tuple[str, ...]) -> None:
    answer, sends, _refused = _answer_ids()
    scripted_agent(tmp_path / "a.sock", answer)
    with Client(tmp_path / "a.sock", timeout=30.0) as client:
        outcomes = _in_threads(client, topics)
    assert outcomes == {value: _event_id(value) for value in outcomes}
    assert len(outcomes) == THREADS * CALLS
    # Calls that queued behind the first shared frames: one topic's events each.
    assert max(len(values) for _topic, values in sends) > 1
    for topic, values in sends:
        assert all(topics[(int(v[:2]) + int(v[2:])) % len(topics)] == topic for v in values)
    for thread in range(THREADS):  # each thread's events were written in its order
        mine = [v for _topic, values in sends for v in values if v.startswith(b"%02d" % thread)]
        assert mine == sorted(mine)


def test_frames_of_queued_calls_stay_under_max_frame_bytes(tmp_path: Path) -> None:
    answer, sends, _refused = _answer_ids()
    scripted_agent(tmp_path / "a.sock", answer)
    with Client(tmp_path / "a.sock", timeout=30.0, max_frame_bytes=40) as client:
        outcomes = _in_threads(client, ("t",))
    assert outcomes == {value: _event_id(value) for value in outcomes}
    # Each event is 9 bytes as a SEND carries it, the frame's own 12 with the topic.
    assert all(len(values) <= 3 for _topic, values in sends)
    assert max(len(values) for _topic, values in sends) == 3


def test_a_refused_call_raises_its_error_and_the_others_of_its_frame_get_their_ids(
    tmp_path: Path,
) -> None:
    """A frame with a refusal is handed to the pipeline's Python, which words it: here
    the first event of each frame of several is refused."""
    answer, _sends, refused = _answer_ids(lambda at, values: at == 0 and len(values) > 1)
    scripted_agent(tmp_path / "a.sock", answer)
    with Client(tmp_path / "a.sock", timeout=30.0) as client:
        outcomes = _in_threads(client, ("t",))
    assert refused, "no frame held more than one event"
    for value, outcome in outcomes.items():
        if value in refused:
            assert isinstance(outcome, InvalidTopicError)
            assert "refused here" in str(outcome)
        else:
            assert outcome == _event_id(value)


def test_calls_answered_after_their_timeout_fail_and_the_late_answers_harm_nothing(
    tmp_path: Path,
) -> None:
    """Frames answered 0.3 s apart, in turn: calls queued behind a few of them outwait
    their 0.5 s, while the reader, never 0.5 s without an answer, keeps the connection.
    Their answers come later and settle calls whose callers left, which stay alive
    until then; the connection goes on."""
    answer, _sends, _refused = _answer_ids()

    def slowly(frame: Frame) -> list[bytes]:
        time.sleep(0.25)  # and the scripted peer's own 0.05 s
        return answer(frame)

    scripted_agent(tmp_path / "a.sock", slowly)
    with Client(tmp_path / "a.sock", timeout=0.5) as client:
        outcomes = _in_threads(client, ("t",))
        client.timeout = 30.0
        assert client.send("t", b"last") == _event_id(b"last")
    timed_out = [o for o in outcomes.values() if isinstance(o, AgentError)]
    assert timed_out and all("no answer within 0.5 s" in str(o) for o in timed_out)
    assert any(isinstance(o, str) for o in outcomes.values())


def test_an_agent_that_hangs_up_fails_every_call_in_words(tmp_path: Path) -> None:
    """It answers three SENDs, then closes the connection (and listens no more): the
    calls in flight fail with the connection, the later ones cannot connect; none is
    left waiting."""
    _answer_then(tmp_path / "a.sock", 3, None)
    with Client(tmp_path / "a.sock", timeout=1.0, reconnect_backoff_s=0.01) as client:
        outcomes = _in_threads(client, ("t",))
    answered = [o for o in outcomes.values() if isinstance(o, str)]
    failed = [o for o in outcomes.values() if isinstance(o, AgentError)]
    assert answered and failed and len(answered) + len(failed) == len(outcomes)
    # A call queued while another caller spends the timeout failing to connect fails
    # with its own timeout: nothing was written.
    words = ("broke after the request was written", "cannot connect", "no answer within")
    assert all(any(w in str(o) for w in words) for o in failed), [str(o) for o in failed]


def test_a_frame_too_large_ends_the_connection_and_fails_the_calls_in_words(
    tmp_path: Path,
) -> None:
    """It answers two SENDs, then sends a length no frame has and stops: the compiled
    reader hands that to the decoder, which words the fault; the calls fail with it."""
    _answer_then(tmp_path / "a.sock", 2, b"\xff\xff\xff\xf0" + encode_frame(FrameType.PONG, 1, b""))
    with Client(tmp_path / "a.sock", timeout=1.0, reconnect_backoff_s=0.01) as client:
        outcomes = _in_threads(client, ("t",))
    failed = [o for o in outcomes.values() if isinstance(o, AgentError)]
    assert failed
    assert any("exceeds the maximum" in str(o) for o in failed), [str(o) for o in failed]


def test_large_calls_beside_futures_are_all_answered(
    tmp_path: Path,
) -> None:
    """Events larger than the socket takes at once, from threads that block (on the lane)
    and threads that fire (in the Python queue, their answers handed to Python), to a
    peer that answers slowly: every call is answered, none twice."""
    answer, sends, _refused = _answer_ids()
    scripted_agent(tmp_path / "a.sock", answer)
    big = 300_000
    outcomes: dict[bytes, str | BaseException] = {}
    with Client(tmp_path / "a.sock", timeout=30.0) as client:

        def blocking(thread: int) -> None:
            for n in range(3):
                value = b"%02d%02d" % (thread, n) + b"x" * big
                outcomes[value[:4]] = client.send("t", value)

        def firing(thread: int) -> None:
            futures = [
                (
                    b"%02d%02d" % (thread, n),
                    client.send_async("t", b"%02d%02d" % (thread, n) + b"y" * big),
                )
                for n in range(3)
            ]
            for key, future in futures:
                outcomes[key] = future.result(30)

        threads = [threading.Thread(target=blocking, args=(n,)) for n in range(4)]
        threads += [threading.Thread(target=firing, args=(n,)) for n in range(4, 8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads), "a caller was left waiting"
    assert len(outcomes) == 24
    for outcome in outcomes.values():
        assert isinstance(outcome, str) and outcome.startswith("00000000-0000-7000-8000-")
    assert sum(len(values) for _topic, values in sends) == 24
