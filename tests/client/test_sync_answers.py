"""The blocking Client's reader (compiled: `PipelineCore._frames` and `_answer_all`)
against a scripted peer on a real unix socket, for answers a real agent never gives:
a SEND_RESULT that holds another count of results than its SEND had events, or a status
the client does not know. Such an answer ends the connection; every event of the frame
it answered fails with the connection's error, at once, and none is left waiting.
The sanitizer test runs this file against the instrumented build.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, wait
from pathlib import Path

import pytest

from eventspool.client.sync import AgentError, Client
from eventspool.wire.protocol import (
    HEADER_SIZE,
    EventResult,
    Frame,
    Status,
    decode_send,
    encode_send_result,
)
from tests.wire_support import scripted_agent

EVENT_ID = "0190a5c3-7e1f-7a00-8c2b-3d4e5f607182"
EVENTS = 20
STATUS_AT = HEADER_SIZE + 4  # a SEND_RESULT's first status: after the header and the count


def _one_result_per_frame(status: int) -> Callable[[Frame], list[bytes]]:
    """Answers each SEND with one result whatever its count of events: EVENT_ID, under
    the status byte `status` (which the protocol may have no name for)."""

    def answer(frame: Frame) -> list[bytes]:
        result = encode_send_result(frame.request_id, [EventResult(Status.OK, EVENT_ID)])
        return [result[:STATUS_AT] + bytes([status]) + result[STATUS_AT + 1 :]]

    return answer


def _fire(client: Client) -> list[Future[str]]:
    """Events queued at once: the first is written alone, the others wait for its
    answer and go out together in the next frame."""
    return [client.send_async("t", b"v%d" % n) for n in range(EVENTS)]


def test_a_send_result_short_of_its_events_fails_them_all_at_once(tmp_path: Path) -> None:
    scripted_agent(tmp_path / "a.sock", _one_result_per_frame(Status.OK))
    with Client(tmp_path / "a.sock", timeout=30.0) as client:
        futures = _fire(client)
        _done, waiting = wait(futures, timeout=10)
    assert not waiting, "events of a wrongly answered frame were left waiting"
    outcomes = [future.exception() or future.result() for future in futures]
    assert outcomes[0] == EVENT_ID
    failed = [outcome for outcome in outcomes if isinstance(outcome, AgentError)]
    assert len(failed) == EVENTS - 1
    assert all(f"1 results for a SEND of {EVENTS - 1} events" in str(e) for e in failed)
    assert all("outcome is unknown" in str(e) for e in failed)


def test_an_unknown_status_fails_its_event_at_once(tmp_path: Path) -> None:
    """Its answer cannot be handed out: the event fails with the connection, in words,
    instead of waiting for an answer that was read already."""
    scripted_agent(tmp_path / "a.sock", _one_result_per_frame(0x7E))
    with Client(tmp_path / "a.sock", timeout=30.0) as client:
        future = client.send_async("t", b"v")
        error = future.exception(10)
    assert isinstance(error, AgentError)
    assert "unknown status 126" in str(error)
    assert "outcome is unknown" in str(error)


def test_threads_waiting_on_a_wrongly_answered_frame_raise_at_once(tmp_path: Path) -> None:
    """The same with blocking `send()`s of threads, whose calls the reader settles in C."""
    scripted_agent(tmp_path / "a.sock", _one_result_per_frame(Status.OK))
    outcomes: list[str | BaseException] = []
    with Client(tmp_path / "a.sock", timeout=30.0) as client:

        def send(n: int) -> None:
            try:
                outcomes.append(client.send("t", b"v%d" % n))
            except AgentError as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=send, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(10)
        assert not any(thread.is_alive() for thread in threads)
    assert len(outcomes) == 8
    assert EVENT_ID in outcomes  # the first call, alone in its frame
    failed = [o for o in outcomes if isinstance(o, AgentError)]
    assert failed and all("results for a SEND of" in str(e) for e in failed)


@pytest.mark.parametrize("topics", [["a", "b", "a", "b"], ["a", "a", "b", "b"], ["b", "a"]])
def test_events_queued_behind_frames_in_flight_go_in_one_frame_per_topic_in_order(
    tmp_path: Path, topics: list[str]
) -> None:
    """With a frame of each topic in flight, the events queued meanwhile are written
    together after the next answer: one SEND per topic, its events in the order queued."""
    sends: list[tuple[str, list[bytes]]] = []

    def record(frame: Frame) -> list[bytes]:
        request = decode_send(frame.body)
        sends.append((request.topic, [event.value or b"" for event in request.events]))
        ok = EventResult(Status.OK, EVENT_ID)
        return [encode_send_result(frame.request_id, [ok] * len(request.events))]

    scripted_agent(tmp_path / "a.sock", record)
    values = [b"%s%d" % (topic.encode(), n) for n, topic in enumerate(topics)]
    with Client(tmp_path / "a.sock", timeout=30.0) as client:
        futures = [client.send_async(topic, b"first") for topic in ("a", "b")]
        futures += [client.send_async(t, v) for t, v in zip(topics, values, strict=True)]
        assert [future.result(10) for future in futures] == [EVENT_ID] * len(futures)
    assert sorted(sends[:2]) == [("a", [b"first"]), ("b", [b"first"])]
    expected = {
        topic: [v for t, v in zip(topics, values, strict=True) if t == topic]
        for topic in sorted(set(topics))
    }
    assert sorted(sends[2:]) == sorted(expected.items())


def test_a_request_put_back_after_close_dropped_the_connection_still_fails(
    tmp_path: Path,
) -> None:
    """The race of a wrongly answered frame with `close()`, replayed step by step in the
    order the two threads can take: the reader takes the answered request out of flight;
    `close()` drops the connection, failing what is still in flight; the reader cannot
    hand the answer out and puts the request back, then drops the connection too. That
    drop must fail it: no later one comes, and its caller would wait out its timeout."""
    scripted_agent(tmp_path / "a.sock", lambda _frame: [])  # it never answers
    client = Client(tmp_path / "a.sock", timeout=30.0)
    try:
        future = client.send_async("t", b"v")
        pipeline = client._pipeline
        connection = pipeline._connection
        assert connection is not None
        deadline = time.monotonic() + 10
        while not connection.in_flight and time.monotonic() < deadline:
            time.sleep(0.01)
        with pipeline._lock:
            ((request_id, _request),) = connection.in_flight.items()
            taken = connection.take_answered(request_id)
        pipeline._drop(connection, "the client was closed")
        if connection.reader is not None:  # it ends on the shut-down socket, dropping nothing
            connection.reader.join(5)
        assert not future.done(), "the taken request was not in flight: nothing failed it"
        with pipeline._lock:
            connection.note_in_flight({request_id: taken})
        pipeline._drop(connection, "1 results for a SEND of 2 events")
        error = future.exception(5)
    finally:
        client.close()
    assert isinstance(error, AgentError)
    assert "outcome is unknown" in str(error)
