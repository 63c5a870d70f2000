"""Request/reply against the real embedded broker, with responders in worker processes."""

from __future__ import annotations

import functools
import pickle
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from pathlib import Path

import pytest

from eventspool import Spool
from eventspool.broker import LocalBroker
from eventspool.clock import ManualClock
from eventspool.consumer import Consumer, ConsumerSettings, Record
from eventspool.rpc import (
    CORRELATION_ID,
    DEADLINE_MS,
    REPLY_TO,
    Responder,
    RpcClient,
    RpcRemoteError,
    RpcTimeoutError,
)
from tests.consumer.conftest import GROUP_KAFKA, wait_for
from tests.rpc_handlers import decorated, refuse, upper_tagged

pytestmark = pytest.mark.timeout(300)


@pytest.fixture
def client(broker: LocalBroker, tmp_path: Path) -> Iterator[RpcClient]:
    with (
        Spool(tmp_path / "spool", bootstrap_servers=broker.bootstrap_servers) as spool,
        RpcClient(spool, broker.bootstrap_servers) as rpc,
    ):
        yield rpc


def server(
    broker: LocalBroker, topic: str, function: Callable[[Record], bytes], group: str
) -> Consumer:
    return Consumer(
        group,
        [topic],
        Responder(function, broker.bootstrap_servers),
        workers=1,
        bootstrap_servers=broker.bootstrap_servers,
        settings=ConsumerSettings(kafka=GROUP_KAFKA, commit_every_s=0.5),
    )


def test_a_call_returns_the_responders_answer(
    broker: LocalBroker, topic_factory: Callable[[int], str], client: RpcClient
) -> None:
    topic = topic_factory(2)
    with server(broker, topic, functools.partial(upper_tagged, "a"), "upper"):
        assert client.call(topic, b"hello", timeout=30) == b"HELLO|a"
        futures = [client.call_async(topic, f"m{i}".encode(), key=str(i)) for i in range(20)]
        assert [f.result() for f in futures] == [f"M{i}|a".encode() for i in range(20)]
    assert client.counters.replies == 21


def test_a_call_nobody_answers_times_out_with_a_clear_error(
    topic_factory: Callable[[int], str], client: RpcClient
) -> None:
    topic = topic_factory(1)
    started = time.monotonic()
    with pytest.raises(RpcTimeoutError) as caught:
        client.call(topic, b"anyone?", timeout=1.0)
    elapsed = time.monotonic() - started
    assert 1.0 <= elapsed < 3.0
    error = caught.value
    assert error.topic == topic
    assert error.timeout == 1.0
    assert str(error) == (
        f"no reply to the request on topic {topic!r} within 1 s "
        f"(correlation_id {error.correlation_id}); it may still be handled later"
    )
    assert client.counters.timeouts == 1


def test_an_exception_in_the_responder_is_raised_to_the_caller(
    broker: LocalBroker, topic_factory: Callable[[int], str], client: RpcClient
) -> None:
    topic = topic_factory(1)
    with (
        server(broker, topic, refuse, "refuse"),
        pytest.raises(RpcRemoteError, match="raised LookupError: no order 42") as caught,
    ):
        client.call(topic, b"42", timeout=30)
    assert caught.value.error_type == "LookupError"
    assert caught.value.remote_message == "no order 42"


def test_requests_past_their_deadline_and_other_events_are_not_answered() -> None:
    """Nothing is sent: an attempt would wait for the unreachable broker."""
    clock = ManualClock()
    answer = Responder(functools.partial(upper_tagged, "a"), "127.0.0.1:9", clock=clock)

    def request(headers: list[tuple[str, bytes | None]]) -> Record:
        return Record("requests", 0, 7, None, b"late", headers, None, None)

    started = time.monotonic()
    expired = str(clock.now_ms() - 1).encode()
    answer(request([(CORRELATION_ID, b"c1"), (REPLY_TO, b"replies"), (DEADLINE_MS, expired)]))
    answer(request([(REPLY_TO, b"replies")]))
    assert time.monotonic() - started < 1.0


def test_a_decorated_function_pickles_by_reference_for_worker_processes() -> None:
    assert isinstance(decorated, Responder)
    copy = pickle.loads(pickle.dumps(decorated))
    record = Record("requests", 0, 0, None, b"x", None, None, None)
    assert copy.function(record) == b"decorated x"
    with pytest.raises(ValueError, match="module-level function"):
        Responder(lambda record: b"", "127.0.0.1:9")


@pytest.mark.slow
def test_calls_during_a_rebalance_are_all_answered_correctly(
    broker: LocalBroker, topic_factory: Callable[[int], str], client: RpcClient
) -> None:
    """A second member joins and leaves while calls go on; every call gets its own answer,
    and both members answered some."""
    topic = topic_factory(4)
    group = f"rpc-{uuid.uuid4().hex[:8]}"
    first = server(broker, topic, functools.partial(upper_tagged, "first"), group)
    second = server(broker, topic, functools.partial(upper_tagged, "second"), group)
    answers: Counter[str] = Counter()
    failures: list[RpcTimeoutError] = []
    wrong: list[tuple[bytes, bytes]] = []
    stop = threading.Event()
    calls = 0

    def call_continuously() -> None:
        nonlocal calls
        while not stop.is_set():
            batch: list[tuple[bytes, Future[bytes]]] = []
            for _ in range(8):
                value = f"req-{calls}-{uuid.uuid4().hex[:6]}".encode()
                batch.append((value, client.call_async(topic, value, key=value, timeout=20)))
                calls += 1
            for value, future in batch:
                try:
                    reply = future.result()
                except RpcTimeoutError as exc:
                    failures.append(exc)
                    continue
                answer, _, tag = reply.partition(b"|")
                if answer != value.upper():
                    wrong.append((value, reply))
                answers[tag.decode()] += 1

    first.start()
    caller = threading.Thread(target=call_continuously)
    try:
        caller.start()
        wait_for(lambda: answers["first"] >= 40, 60, "answers from the first member")
        second.start()
        wait_for(lambda: answers["second"] >= 20, 60, "answers from the second member")
        second.stop()
        after_leave = sum(answers.values())
        wait_for(
            lambda: sum(answers.values()) >= max(after_leave + 40, 200), 60, "calls after leave"
        )
    finally:
        stop.set()
        caller.join(60)
        first.stop()
        second.stop()
    assert not failures, f"{len(failures)} calls timed out, the first: {failures[0]}"
    assert not wrong, f"wrong answers: {wrong[:5]}"
    assert sum(answers.values()) == calls
    assert first.status().counters.rebalances >= 2
    print(f"{calls} calls, answers {dict(answers)}, {client.counters.unmatched} duplicates")
