"""The agent's compiled intake (`intake_send`, and `intake_frames` for a whole read) and
the client's `decode_results`, in process.

Each event intake_send accepts must be in its ring, decoding to the key and value sent,
under the id its answer gives; what it leaves to the Python path (a topic not opened
yet, headers, a body that does not parse) goes through the fallback or returns None.
Random bodies must never crash it. The sanitizer test runs this file against the
instrumented build.
"""

from __future__ import annotations

import contextlib
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from eventspool._core.native import decode_results, intake_frames, intake_send
from eventspool.config import QueueSettings, SpoolSettings
from eventspool.envelope import decode
from eventspool.pipeline import Spool
from eventspool.wire.protocol import (
    FrameDecoder,
    FrameType,
    Status,
    WireEvent,
    decode_send_result,
    encode_frame,
    encode_send,
)
from tests.wire_support import spooled

TOPIC = "intake"
SETTINGS = SpoolSettings(max_event_bytes=4096, queue=QueueSettings(capacity_bytes=1 << 20))

payloads = st.one_of(st.none(), st.binary(max_size=300))
events = st.lists(st.tuples(payloads, payloads), min_size=1, max_size=40)


def _spool(directory: Path) -> Spool:
    spool = Spool(directory, settings=SETTINGS)
    spool.set_partition_count(TOPIC, 2)
    return spool


def _fallback(spool: Spool) -> object:
    calls: list[tuple[str, bytes | None, bytes | None]] = []

    def fallback(topic: str, value: bytes | None, key: bytes | None) -> tuple[int, bytes]:
        calls.append((topic, value, key))
        return Status.OK, spool.send(topic, value, key).encode()

    fallback.calls = calls  # type: ignore[attr-defined]
    return fallback


@settings(max_examples=30)
@given(batch=events, request_id=st.integers(1, 2**32 - 1))
def test_every_accepted_event_is_in_its_ring_under_the_id_it_was_answered_with(
    tmp_path_factory: object, batch: list[tuple[bytes | None, bytes | None]], request_id: int
) -> None:
    directory = tmp_path_factory.mktemp("intake")  # type: ignore[attr-defined]
    with _spool(directory) as spool:
        spool.send(TOPIC, b"opens partition 0", b"0")  # "0" hashes to one partition,
        spool.send(TOPIC, b"opens partition 1", b"2")  # "2" to the other
        fallback = _fallback(spool)
        body = encode_send(request_id, TOPIC, [WireEvent(v, k, None) for k, v in batch])[9:]
        answer = intake_send(spool, request_id, body, fallback)  # type: ignore[arg-type]
        assert answer is not None, "plain events to an open topic stay on the compiled path"
        frame_bytes, accepted = answer
        (frame,) = FrameDecoder().feed(frame_bytes)
        assert (frame.type, frame.request_id) == (FrameType.SEND_RESULT, request_id)
        ids = decode_results(frame.body)
        assert [r.text for r in decode_send_result(frame.body)] == ids
        assert all(isinstance(event_id, str) for event_id in ids)
        assert accepted == sum(len(k or b"") + len(v or b"") for k, v in batch)  # quotas
        in_rings = spooled(spool)
        assert [in_rings[event_id] for event_id in ids] == batch  # type: ignore[index]


def test_a_topic_not_opened_yet_goes_through_the_fallback(tmp_path: Path) -> None:
    with Spool(tmp_path, settings=SETTINGS) as spool:
        fallback = _fallback(spool)
        body = encode_send(7, "fresh", [WireEvent(b"v", b"k", None)])[9:]
        answer = intake_send(spool, 7, body, fallback)  # type: ignore[arg-type]
        assert fallback.calls == [("fresh", b"v", b"k")]  # type: ignore[attr-defined]
        assert answer is not None
        (frame,) = FrameDecoder().feed(answer[0])
        (event_id,) = decode_results(frame.body)
        assert spooled(spool)[str(event_id)] == (b"k", b"v")


def test_events_with_headers_are_left_to_the_python_path(tmp_path: Path) -> None:
    with _spool(tmp_path) as spool:
        body = encode_send(1, TOPIC, [WireEvent(b"v", None, [("h", b"x")])])[9:]
        assert intake_send(spool, 1, body, _fallback(spool)) is None  # type: ignore[arg-type]


@settings(max_examples=150)
@given(body=st.binary(max_size=200))
def test_random_bodies_never_crash_the_intake_nor_the_result_decoder(
    tmp_path_factory: object, body: bytes
) -> None:
    directory = tmp_path_factory.mktemp("fuzz")  # type: ignore[attr-defined]
    with _spool(directory) as spool:
        spool.send(TOPIC, b"open", b"0")
        answer = intake_send(spool, 3, body, _fallback(spool))  # type: ignore[arg-type]
        if answer is not None:
            (frame,) = FrameDecoder().feed(answer[0])
            decode_results(frame.body)
    with contextlib.suppress(ValueError):  # a clear refusal is fine; a crash is not
        decode_results(body)


def _never(raw_topic: bytes) -> bool:
    """The `learn` of a read where every topic but those in the inline set may wait."""
    return False


def _intake_read(spool: Spool, data: bytes) -> tuple[bytes, int, int]:
    """`intake_frames` on one read, TOPIC spooled inline."""
    return intake_frames(spool, data, 1 << 20, {TOPIC.encode()}, _never, _fallback(spool))  # type: ignore[arg-type]


def _frames_of(answers: bytes) -> list[tuple[int, list[str | tuple[int, str]]]]:
    return [
        (frame.request_id, decode_results(frame.body)) for frame in FrameDecoder().feed(answers)
    ]


@settings(max_examples=10)
@given(batches=st.lists(events, min_size=1, max_size=6), cut=st.integers(0, 40))
def test_a_read_of_sends_is_spooled_frame_by_frame_up_to_the_first_partial_frame(
    tmp_path_factory: object, batches: list[list[tuple[bytes | None, bytes | None]]], cut: int
) -> None:
    directory = tmp_path_factory.mktemp("reads")  # type: ignore[attr-defined]
    frames = [
        encode_send(n + 1, TOPIC, [WireEvent(v, k, None) for k, v in batch])
        for n, batch in enumerate(batches)
    ]
    whole = b"".join(frames)
    data = whole[: max(len(whole) - cut, 0)]
    complete = [
        frame for n, frame in enumerate(frames) if len(b"".join(frames[: n + 1])) <= len(data)
    ]
    with _spool(directory) as spool:
        spool.send(TOPIC, b"opens partition 0", b"0")
        spool.send(TOPIC, b"opens partition 1", b"2")
        answers, consumed, requests = _intake_read(spool, data)
        assert (consumed, requests) == (len(b"".join(complete)), len(complete))
        answered = _frames_of(answers)
        assert [request_id for request_id, _ in answered] == list(range(1, len(complete) + 1))
        in_rings = spooled(spool)
        for (_, ids), batch in zip(answered, batches, strict=False):
            assert [in_rings[event_id] for event_id in ids] == batch  # type: ignore[index]


def test_a_read_stops_at_the_first_frame_it_leaves_to_python(tmp_path: Path) -> None:
    """A topic that may wait, a STATS, headers, a length out of bounds: from there on,
    the read is the Python path's, so a connection's requests keep their order."""
    inline_send = encode_send(1, TOPIC, [WireEvent(b"a", None, None)])
    for stopper in (
        encode_send(2, "may-wait", [WireEvent(b"b", None, None)]),
        encode_frame(FrameType.STATS, 2, b""),
        encode_send(2, TOPIC, [WireEvent(b"b", None, [("h", b"x")])]),
        b"\x00\x00\x00\x04",
        b"POST /v1/topics/x HTTP/1.1\r\n",
    ):
        with _spool(tmp_path / str(len(stopper))) as spool:
            data = inline_send + stopper + inline_send
            answers, consumed, requests = _intake_read(spool, data)
            assert (consumed, requests) == (len(inline_send), 1)
            assert [request_id for request_id, _ in _frames_of(answers)] == [1]


def test_pings_are_answered_in_order_and_new_topics_are_learned(tmp_path: Path) -> None:
    learned: list[bytes] = []
    inline = {TOPIC.encode()}

    def learn(raw_topic: bytes) -> bool:
        learned.append(raw_topic)
        inline.add(raw_topic)
        return True

    data = (
        encode_frame(FrameType.PING, 1, b"first")
        + encode_send(2, "new-topic", [WireEvent(b"b", None, None)])
        + encode_frame(FrameType.PING, 3, b"")
        + encode_send(4, "new-topic", [WireEvent(b"c", None, None)])
    )
    with _spool(tmp_path) as spool:
        answers, consumed, sends = intake_frames(
            spool,
            data,
            1 << 20,
            inline,
            learn,
            _fallback(spool),  # type: ignore[arg-type]
        )
        assert (consumed, sends, learned) == (len(data), 2, [b"new-topic"])
        frames = FrameDecoder().feed(answers)
        assert [(f.type, f.request_id) for f in frames] == [
            (FrameType.PONG, 1),
            (FrameType.SEND_RESULT, 2),
            (FrameType.PONG, 3),
            (FrameType.SEND_RESULT, 4),
        ]
        assert frames[0].body == b"first"
        in_rings = spooled(spool)
        assert [in_rings[decode_results(frames[n].body)[0]] for n in (1, 3)] == [  # type: ignore[index]
            (None, b"b"),
            (None, b"c"),
        ]


def test_a_run_of_sends_to_one_topic_is_judged_once_and_each_event_keeps_its_topic(
    tmp_path: Path,
) -> None:
    """The intake remembers the last topic found never to wait, even when `learn` keeps
    no answer (the agent's cache of topics is full): a run of SENDs to it is judged
    once, and a SEND to another topic is judged and spooled to that topic."""
    judged: list[bytes] = []

    def learn(raw_topic: bytes) -> bool:
        judged.append(raw_topic)
        return True

    sends = [(1, "a"), (2, "a"), (3, "b"), (4, "b"), (5, "a"), (6, "ab")]
    data = b"".join(
        encode_send(request_id, topic, [WireEvent(None, f"{request_id}".encode(), None)])
        for request_id, topic in sends
    )
    with _spool(tmp_path) as spool:
        for topic in ("a", "b", "ab"):
            spool.set_partition_count(topic, 1)
        answers, consumed, spooled_sends = intake_frames(
            spool,
            data,
            1 << 20,
            set(),
            learn,
            _fallback(spool),  # type: ignore[arg-type]
        )
        assert (consumed, spooled_sends) == (len(data), len(sends))
        assert judged == [b"a", b"b", b"a", b"ab"]
        event_ids = [decode_results(frame.body)[0] for frame in FrameDecoder().feed(answers)]
        topic_of = {
            decode(record.payload).event_id: ref.topic
            for ref in spool.queues()
            for record in ref.ring.read_batch(100, 1 << 20)
        }
        assert [topic_of[event_id] for event_id in event_ids] == [t for _, t in sends]  # type: ignore[index]


@settings(max_examples=50)
@given(data=st.binary(max_size=300), prefix=st.booleans())
def test_random_reads_never_crash_the_read_intake(
    tmp_path_factory: object, data: bytes, prefix: bool
) -> None:
    directory = tmp_path_factory.mktemp("fuzz-reads")  # type: ignore[attr-defined]
    if prefix:  # a valid SEND first, so the garbage comes mid-read
        data = encode_send(1, TOPIC, [WireEvent(b"v", None, None)]) + data
    with _spool(directory) as spool:
        spool.send(TOPIC, b"open", b"0")
        answers, consumed, requests = intake_frames(
            spool,
            data,
            4096,
            {TOPIC.encode(), b""},
            _never,
            _fallback(spool),  # type: ignore[arg-type]
        )
        assert 0 <= consumed <= len(data)
        answered = FrameDecoder().feed(answers)
        assert sum(frame.type is FrameType.SEND_RESULT for frame in answered) == requests
