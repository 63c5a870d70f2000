"""The Consumer against the real embedded broker, real worker processes and real signals."""

from __future__ import annotations

import functools
import gc
import logging
import os
import signal
import subprocess
import sys
import time
import uuid
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from eventspool.broker import LocalBroker
from eventspool.clock import SYSTEM_CLOCK, Clock, ManualClock
from eventspool.consumer import Consumer, ConsumerSettings, HandlerError, Record
from eventspool.consumer.forwarding import DEAD_LETTER_HEADERS
from eventspool.consumer.metrics import ConsumerCollector
from eventspool.consumer.runner import _collector_paused
from tests.consumer.conftest import (
    GROUP_KAFKA,
    committed,
    handled,
    handled_attempts,
    produce,
    read_topic,
    wait_for,
)
from tests.consumer.handlers import (
    OUT_ENV,
    SLEEP_ENV,
    async_hang_first_attempt,
    async_record_to,
    fail_on_poison,
    fails_first,
    hang_on_victim,
    hang_once_on_victim,
    record_sequence,
    record_to,
    slow_record_to,
)

pytestmark = pytest.mark.timeout(300)
REPO = Path(__file__).resolve().parents[2]


def make_consumer(
    broker: LocalBroker,
    topic: str,
    handler: Any,
    *,
    group: str | None = None,
    workers: int = 2,
    clock: Clock = SYSTEM_CLOCK,
    kafka: dict[str, Any] | None = None,
    **settings: Any,
) -> Consumer:
    return Consumer(
        group or f"group-{uuid.uuid4().hex[:8]}",
        [topic],
        handler,
        workers=workers,
        bootstrap_servers=broker.bootstrap_servers,
        settings=ConsumerSettings(kafka={**GROUP_KAFKA, **(kafka or {})}, **settings),
        clock=clock,
    )


def partition_0_committed(broker: LocalBroker, consumer: Consumer, topic: str) -> int:
    return committed(broker.bootstrap_servers, consumer.group, topic, 1)[0]


def test_every_event_is_handled_once_in_key_order_and_committed_to_the_true_end(
    broker: LocalBroker, topic_factory: Any, tmp_path: Path
) -> None:
    topic = topic_factory(3)
    count = 3000
    keys = [f"user-{i % 20}".encode() for i in range(count)]
    ids = produce(broker.bootstrap_servers, topic, [b"v"] * count, keys=keys)
    out = tmp_path / "handled"
    consumer = make_consumer(
        broker, topic, functools.partial(record_to, out), commit_every_s=0.2, lag_interval_s=0.3
    )
    with consumer:
        wait_for(lambda: consumer.status().counters.processed == count, 60, "every event")
        wait_for(lambda: consumer.status().lag == 0, 20, "lag 0 from the true end offsets")
        status = consumer.status()
        registry = CollectorRegistry()
        registry.register(ConsumerCollector(consumer))
        metrics = generate_latest(registry).decode()
        ends = {p.partition: p.end for p in status.partitions}
        wait_for(
            lambda: committed(broker.bootstrap_servers, consumer.group, topic, 3) == ends,
            20,
            "commits up to the end",
        )
    assert handled(out) == Counter(dict.fromkeys(ids, 1))
    assert sum(end or 0 for end in ends.values()) == count, "end offsets must be exact"
    lag_labels = f'group="{consumer.group}",partition="0",topic="{topic}"'
    assert f"eventspool_consumer_lag{{{lag_labels}}} 0.0" in metrics
    assert (
        f'eventspool_consumer_events_total{{group="{consumer.group}",outcome="processed"}} 3000.0'
        in metrics
    )
    key_of = dict(zip(ids, keys, strict=True))
    offsets_per_key: dict[bytes, list[int]] = {}
    for line in out.read_text().splitlines():
        event_id, where, _pid, _attempt = line.split()
        offsets_per_key.setdefault(key_of[event_id], []).append(int(where.rsplit("@", 1)[1]))
    for key, offsets in offsets_per_key.items():
        assert offsets == sorted(offsets), f"key {key!r} handled out of order"


def test_key_hash_routing_keeps_each_keys_order_across_retries_and_loses_nothing(
    broker: LocalBroker, topic_factory: Any, tmp_path: Path
) -> None:
    """2 workers, 1,000 keys, a sequence number per key in the value: every key is handled
    by one worker, in sequence, exactly once, although about one event in 40 fails its
    first attempt and holds back its key's later events for the retry."""
    topic = topic_factory(4)
    keys, per_key = 1000, 10
    pairs = [(b"key-%d" % k, b"%d" % n) for n in range(per_key) for k in range(keys)]
    produce(
        broker.bootstrap_servers,
        topic,
        [value for _, value in pairs],
        keys=[key for key, _ in pairs],
    )
    out = tmp_path / "handled"
    consumer = make_consumer(
        broker,
        topic,
        functools.partial(record_sequence, out),
        retry_backoff_s=0.01,
        commit_every_s=0.2,
    )
    failing = sum(
        fails_first(Record(topic, 0, 0, key, value, None, None, None)) for key, value in pairs
    )
    assert failing > 100
    with consumer:
        wait_for(lambda: consumer.status().counters.processed == len(pairs), 120, "every event")
        wait_for(
            lambda: (
                sum(committed(broker.bootstrap_servers, consumer.group, topic, 4).values())
                == len(pairs)
            ),
            20,
            "commits up to the end",
        )
        counters = consumer.status().counters
    assert (counters.failed, counters.retried, counters.dead_lettered) == (failing, failing, 0)
    sequences: dict[str, list[int]] = {}
    workers: dict[str, set[str]] = {}
    for line in _lines(out):
        key, sequence, pid, _attempt = line.split()
        sequences.setdefault(key, []).append(int(sequence))
        workers.setdefault(key, set()).add(pid)
    assert len(sequences) == keys
    for key, seen in sequences.items():
        assert seen == list(range(per_key)), f"key {key}: {seen}"
    assert all(len(pids) == 1 for pids in workers.values()), "a key moved between workers"
    assert len(set().union(*workers.values())) == 2, "both workers took keys"


@pytest.mark.slow
def test_a_handler_three_times_max_poll_interval_keeps_the_member_in_its_group(
    broker: LocalBroker, topic_factory: Any, tmp_path: Path
) -> None:
    topic = topic_factory(2)
    ids = produce(broker.bootstrap_servers, topic, [b"a", b"b"], keys=[b"k1", b"k2"])
    out = tmp_path / "handled"
    max_poll_ms = 3000
    consumer = make_consumer(
        broker,
        topic,
        functools.partial(slow_record_to, out, 3 * max_poll_ms / 1000),
        kafka={"max.poll.interval.ms": max_poll_ms},
        commit_every_s=0.2,
    )
    with consumer:
        wait_for(lambda: consumer.status().counters.processed == 2, 60, "both slow events")
        time.sleep(1.0)
        status = consumer.status()
    assert status.counters.rebalances == 1, "the member was expelled and rejoined"
    assert status.counters.abandoned == 0
    assert handled(out) == Counter(dict.fromkeys(ids, 1))
    offsets = committed(broker.bootstrap_servers, consumer.group, topic, 2).values()
    assert sum(max(offset, 0) for offset in offsets) == 2


@pytest.mark.slow
def test_two_members_joining_and_leaving_lose_nothing_and_duplicate_little(
    broker: LocalBroker, topic_factory: Any, tmp_path: Path
) -> None:
    topic = topic_factory(4)
    total = 100_000
    group = f"group-{uuid.uuid4().hex[:8]}"
    out = tmp_path / "handled"
    max_buffered = 500
    members = [
        make_consumer(
            broker,
            topic,
            functools.partial(record_to, out),
            group=group,
            workers=1,
            max_buffered=max_buffered,
            commit_every_s=0.5,
        )
        for _ in range(2)
    ]
    first, second = members
    first.start()
    ids: list[str] = []
    for chunk in range(10):
        ids += produce(broker.bootstrap_servers, topic, [b"e"] * (total // 10))
        if chunk == 2:
            wait_for(lambda: first.status().counters.processed > 0, 60, "the first member")
            second.start()
        if chunk == 6:
            wait_for(lambda: second.status().counters.processed > 0, 60, "the second member")
    wait_for(lambda: len(handled(out)) >= 0.6 * total, 120, "60% handled")
    second.stop()
    wait_for(lambda: set(ids) <= handled(out).keys(), 180, "every event handled")
    first.stop()
    counts = handled(out)
    duplicates = sum(n - 1 for n in counts.values())
    rebalances = first.status().counters.rebalances + second.status().counters.rebalances
    print(f"{total} events, {duplicates} duplicates, {rebalances} assignments")
    assert not set(ids) - counts.keys()
    assert second.status().counters.processed > 0
    assert duplicates <= 2 * 2 * max_buffered, "more duplicates than the in-flight bound"


@pytest.mark.slow
@pytest.mark.fault
def test_sigkill_of_a_worker_mid_handler_retries_the_event_and_only_then_commits_past_it(
    broker: LocalBroker, topic_factory: Any, tmp_path: Path
) -> None:
    topic = topic_factory(1)
    values = [b"before"] * 5 + [b"victim"] + [b"after"] * 5
    ids = produce(broker.bootstrap_servers, topic, values, partition=0)
    out, started = tmp_path / "handled", tmp_path / "victim.pid"
    consumer = make_consumer(
        broker,
        topic,
        functools.partial(hang_on_victim, out, started),
        ordering="unordered",
        max_batch=1,
        commit_every_n=1,
        commit_every_s=0.1,
    )

    with consumer:
        wait_for(started.exists, 30, "the victim's handler to start")
        wait_for(lambda: consumer.status().counters.processed == 10, 30, "the other events")
        wait_for(
            lambda: partition_0_committed(broker, consumer, topic) == 5,
            10,
            "a commit up to the victim",
        )
        time.sleep(0.5)
        assert partition_0_committed(broker, consumer, topic) == 5, (
            "committed past an event still running"
        )
        os.kill(int(started.read_text()), signal.SIGKILL)
        wait_for(lambda: consumer.status().counters.processed == 11, 30, "the retried victim")
        wait_for(
            lambda: partition_0_committed(broker, consumer, topic) == 11,
            10,
            "a commit past the victim",
        )
        assert consumer.status().counters.worker_restarts == 1
    attempts = handled_attempts(out)
    assert attempts.pop(ids[5]) == [2]
    assert attempts == {event_id: [1] for event_id in ids if event_id != ids[5]}


@pytest.mark.slow
@pytest.mark.fault
def test_sigkill_of_a_key_routed_worker_retries_what_it_did_not_report_in_key_order(
    broker: LocalBroker, topic_factory: Any, tmp_path: Path
) -> None:
    """Key ordering: the victim's key has events after it, queued in the same worker.
    After the kill, the victim runs again (attempt 2) before them, nothing is lost, and
    the commit stays before the victim until then."""
    topic = topic_factory(1)
    values = [b"before"] * 5 + [b"victim"] + [b"after"] * 5
    keys = [b"k%d" % (n % 3) for n in range(11)]
    ids = produce(broker.bootstrap_servers, topic, values, keys=keys, partition=0)
    out, started = tmp_path / "handled", tmp_path / "victim.pid"
    consumer = make_consumer(
        broker,
        topic,
        functools.partial(hang_on_victim, out, started),
        workers=1,
        commit_every_n=1,
        commit_every_s=0.1,
        retry_backoff_s=0.05,
    )
    with consumer:
        wait_for(started.exists, 30, "the victim's handler to start")
        time.sleep(0.5)
        assert partition_0_committed(broker, consumer, topic) <= 5, "committed past the victim"
        os.kill(int(started.read_text()), signal.SIGKILL)
        wait_for(lambda: set(ids) <= handled(out).keys(), 30, "every event")
        wait_for(
            lambda: partition_0_committed(broker, consumer, topic) == 11,
            10,
            "a commit past the victim",
        )
        assert consumer.status().counters.worker_restarts == 1
    attempts = handled_attempts(out)
    assert attempts[ids[5]] == [2]
    order = [line.split()[0] for line in _lines(out)]
    victim_key = [ids[n] for n in range(5, 11) if keys[n] == keys[5]]
    assert [order.index(i) for i in victim_key] == sorted(order.index(i) for i in victim_key)


@pytest.mark.slow
@pytest.mark.fault
def test_a_worker_killed_while_a_revoke_waits_for_it_gets_no_revoked_events_back(
    broker: LocalBroker, topic_factory: Any, tmp_path: Path
) -> None:
    """A second member joins while the victim runs, its key's later events queued behind
    it in the same worker, and the worker is SIGKILLed while the revoke waits for it.
    The revoked events belong to the next owner: the replacement must not run them as
    retries, so each event runs once, as a first attempt, and none is lost."""
    topic = topic_factory(1)
    values = [b"victim"] + [b"after"] * 5
    ids = produce(broker.bootstrap_servers, topic, values, keys=[b"k"] * 6, partition=0)
    out, started = tmp_path / "handled", tmp_path / "victim.pid"
    handler = functools.partial(hang_once_on_victim, out, started)
    group = f"group-{uuid.uuid4().hex[:8]}"
    first, second = (
        make_consumer(
            broker,
            topic,
            handler,
            group=group,
            workers=1,
            revoke_timeout_s=60,
            commit_every_n=1,
            commit_every_s=0.1,
        )
        for _ in range(2)
    )
    with first:
        wait_for(started.exists, 30, "the victim's handler to start")
        with second:
            wait_for(lambda: first.status().state == "revoking", 60, "the revoke to wait")
            os.kill(int(started.read_text()), signal.SIGKILL)
            wait_for(lambda: set(ids) <= handled(out).keys(), 60, "every event")
            assert first.status().counters.worker_restarts == 1
    assert handled_attempts(out) == {event_id: [1] for event_id in ids}


def _lines(path: Path) -> list[str]:
    return path.read_text().splitlines() if path.exists() else []


def test_async_handlers_let_other_keys_overtake_a_slow_one_and_never_commit_past_it(
    broker: LocalBroker, topic_factory: Any, tmp_path: Path
) -> None:
    """Concurrency 100: while the first event of key `slow` waits, the 300 events of other
    keys behind it in the partition finish; its key's next events wait for it, in order,
    and the commit stays before it until it is done."""
    topic = topic_factory(1)
    values = [b"slow-0", b"slow-1", b"slow-2"] + [b"e%d" % n for n in range(300)]
    keys = [b"slow"] * 3 + [b"k%d" % (n % 100) for n in range(300)]
    ids = produce(broker.bootstrap_servers, topic, values, keys=keys, partition=0)
    out = tmp_path / "handled"
    consumer = make_consumer(
        broker,
        topic,
        functools.partial(async_record_to, out, b"slow-0", 4.0),
        concurrency=100,
        commit_every_n=10,
        commit_every_s=0.1,
    )
    with consumer:
        wait_for(lambda: consumer.status().counters.processed >= 300, 30, "the other keys")
        assert ids[0] not in handled(out), "the slow event finished before the others"
        assert not {ids[1], ids[2]} & handled(out).keys(), "its key's next events overtook it"
        time.sleep(0.5)  # commits every 0.1 s: one would have passed it by now
        assert partition_0_committed(broker, consumer, topic) < 1, "committed past it"
        wait_for(lambda: consumer.status().counters.processed == 303, 30, "the slow key")
        wait_for(
            lambda: partition_0_committed(broker, consumer, topic) == 303, 10, "the last commit"
        )
    assert handled(out) == Counter(ids)
    order = [line.split()[0] for line in _lines(out)]
    assert [order.index(event_id) for event_id in ids[:3]] == sorted(
        order.index(event_id) for event_id in ids[:3]
    )
    for key in range(100):  # every other key in its offset order too
        positions = [order.index(ids[3 + n]) for n in range(key, 300, 100)]
        assert positions == sorted(positions)


def test_sigkill_of_an_async_worker_retries_every_unfinished_handler(
    broker: LocalBroker, topic_factory: Any, tmp_path: Path
) -> None:
    """100 handlers in flight in the one worker, 100 more queued in it, when it is
    SIGKILLed: each is retried (attempt 2), none is lost, and nothing was committed past
    them meanwhile."""
    topic = topic_factory(1)
    ids = produce(
        broker.bootstrap_servers,
        topic,
        [b"e%d" % n for n in range(200)],
        keys=[b"k%d" % n for n in range(200)],
        partition=0,
    )
    out = tmp_path / "handled"
    consumer = make_consumer(
        broker,
        topic,
        functools.partial(async_hang_first_attempt, out, 5.0),
        workers=1,
        concurrency=100,
        commit_every_n=1,
        commit_every_s=0.1,
        retry_backoff_s=0.1,
    )
    with consumer:
        wait_for(lambda: len(_lines(out.with_suffix(".start"))) >= 100, 30, "100 handlers")
        wait_for(lambda: consumer.status().in_flight == 200, 10, "100 more queued in it")
        assert len(_lines(out.with_suffix(".start"))) == 100, "more than 100 at once"
        time.sleep(0.3)
        assert partition_0_committed(broker, consumer, topic) < 1
        os.kill(next(pid for pid in consumer.worker_pids() if pid), signal.SIGKILL)
        wait_for(lambda: consumer.status().counters.processed == 200, 60, "every event")
        wait_for(
            lambda: partition_0_committed(broker, consumer, topic) == 200, 10, "the last commit"
        )
        assert consumer.status().counters.worker_restarts == 1
    assert handled_attempts(out) == {event_id: [2] for event_id in ids}


def test_commits_happen_every_n_events_or_t_seconds_of_the_injected_clock(
    broker: LocalBroker, topic_factory: Any, tmp_path: Path
) -> None:
    topic = topic_factory(1)
    produce(broker.bootstrap_servers, topic, [b"e"] * 12, partition=0)
    clock = ManualClock(start_ms=time.time_ns() // 1_000_000)
    consumer = make_consumer(
        broker,
        topic,
        functools.partial(record_to, tmp_path / "handled"),
        workers=1,
        clock=clock,
        max_batch=1,
        commit_every_n=5,
        commit_every_s=3600,
    )

    with consumer:
        wait_for(lambda: consumer.status().counters.processed == 12, 30, "every event")
        wait_for(
            lambda: partition_0_committed(broker, consumer, topic) == 10,
            10,
            "the count-triggered commits",
        )
        time.sleep(1.0)
        assert partition_0_committed(broker, consumer, topic) == 10, (
            "committed without N events or T seconds"
        )
        clock.advance(3600)
        wait_for(
            lambda: partition_0_committed(broker, consumer, topic) == 12,
            10,
            "the time-triggered commit",
        )


def test_stale_events_are_skipped_counted_and_forwarded(
    broker: LocalBroker, topic_factory: Any, tmp_path: Path
) -> None:
    topic = topic_factory(1)
    an_hour_ago = time.time_ns() // 1_000_000 - 3_600_000
    stale = produce(broker.bootstrap_servers, topic, [b"old"] * 5, timestamp_ms=an_hour_ago)
    fresh = produce(broker.bootstrap_servers, topic, [b"new"] * 5)
    out = tmp_path / "handled"
    consumer = make_consumer(
        broker,
        topic,
        functools.partial(record_to, out),
        max_age_s=60,
        stale_topic="{topic}.stale",
        commit_every_s=0.1,
    )
    with consumer:
        wait_for(lambda: consumer.status().counters.stale == 5, 30, "the stale events")
        wait_for(lambda: consumer.status().counters.processed == 5, 30, "the fresh events")
        wait_for(
            lambda: partition_0_committed(broker, consumer, topic) == 10,
            10,
            "a commit past the stale events",
        )
    assert handled(out).keys() == set(fresh)
    forwarded = read_topic(broker.bootstrap_servers, f"{topic}.stale", 5)
    assert sorted(dict(m.headers())["event_id"].decode() for m in forwarded) == sorted(stale)
    assert all(int(dict(m.headers())["stale.age_ms"]) >= 3_600_000 for m in forwarded)


def test_a_poisoned_event_is_retried_then_dead_lettered_with_error_headers(
    broker: LocalBroker, topic_factory: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    topic = topic_factory(1)
    values = [b"ok-0", b"poison-1", b"ok-2"]
    ids = produce(broker.bootstrap_servers, topic, values, keys=[b"k"] * 3)
    out = tmp_path / "handled"
    consumer = make_consumer(
        broker,
        topic,
        functools.partial(fail_on_poison, out),
        max_attempts=3,
        retry_backoff_s=0.05,
        commit_every_s=0.1,
    )
    with caplog.at_level(logging.WARNING, logger="eventspool.consumer"), consumer:
        wait_for(lambda: consumer.status().counters.dead_lettered == 1, 30, "a dead letter")
        wait_for(lambda: consumer.status().counters.processed == 2, 30, "the good events")
        wait_for(
            lambda: partition_0_committed(broker, consumer, topic) == 3,
            10,
            "a commit past the dead letter",
        )
        counters = consumer.status().counters
    assert (counters.failed, counters.retried) == (3, 2)
    assert list(handled(out)) == [ids[0], ids[2]], "key order must hold across retries"
    (letter,) = read_topic(broker.bootstrap_servers, f"{topic}.dlq", 1)
    headers = dict(letter.headers())
    assert letter.value() == b"poison-1"
    assert headers["event_id"].decode() == ids[1]
    assert set(DEAD_LETTER_HEADERS) <= headers.keys()
    assert headers["dlq.error.type"] == b"ValueError"
    assert b"poisoned value" in headers["dlq.error.message"]
    assert b"Traceback" in headers["dlq.error.traceback"]
    assert (headers["dlq.original.offset"], headers["dlq.attempts"]) == (b"1", b"3")
    # The traceback is in the log too, once, with the first failed attempt.
    failures = [r.getMessage() for r in caplog.records if "handler failed on" in r.getMessage()]
    assert len(failures) == 3
    assert "Traceback" in failures[0] and "poisoned value" in failures[0]
    assert not any("Traceback" in line for line in failures[1:])


def _consume_cli(
    broker: LocalBroker,
    group: str,
    topic: str,
    out: Path,
    *,
    sleep: float,
    deadline: float,
    stderr: Any = subprocess.PIPE,
    new_session: bool = False,
) -> Any:
    """`eventspool consume` with the `slow_from_env` handler; `new_session` puts it and its
    workers in a process group of their own, so one killpg takes them all."""
    env = {**os.environ, OUT_ENV: str(out), SLEEP_ENV: str(sleep)}
    return subprocess.Popen(
        [
            sys.executable,
            "-m",
            "eventspool",
            "consume",
            "--group",
            group,
            "--topic",
            topic,
            "--handler",
            "tests.consumer.handlers:slow_from_env",
            "--bootstrap-servers",
            broker.bootstrap_servers,
            "--shutdown-timeout",
            str(deadline),
            *(arg for name, value in GROUP_KAFKA.items() for arg in ("--kafka", f"{name}={value}")),
            "--commit-every-s",
            "0.1",
        ],
        cwd=REPO,
        env=env,
        stderr=stderr,
        text=True,
        start_new_session=new_session,
    )


@pytest.mark.slow
@pytest.mark.parametrize(("deadline", "finished"), [(30.0, True), (0.5, False)])
def test_sigterm_finishes_running_handlers_within_the_deadline_or_abandons_them(
    broker: LocalBroker, topic_factory: Any, tmp_path: Path, deadline: float, finished: bool
) -> None:
    topic = topic_factory(1)
    ids = produce(broker.bootstrap_servers, topic, [b"a", b"b"], partition=0)
    out = tmp_path / "handled"
    group = f"cli-{uuid.uuid4().hex[:8]}"
    process = _consume_cli(broker, group, topic, out, sleep=3.0, deadline=deadline)
    try:
        wait_for(lambda: out.with_suffix(".start").exists(), 60, "a handler to start")
        process.send_signal(signal.SIGTERM)
        _, stderr = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, stderr
    assert "stopped:" in stderr
    offset = committed(broker.bootstrap_servers, group, topic, 1)[0]
    if finished:
        assert handled(out) == Counter(dict.fromkeys(ids, 1))
        assert offset == 2, "what finished must be committed"
    else:
        assert not handled(out), "a handler outlived the shutdown deadline"
        assert offset <= 0, "nothing finished, so nothing may be committed past it"


KILL_EVENTS = 2000


@pytest.mark.slow
@pytest.mark.fault
def test_sigkill_of_the_whole_consumer_then_a_new_member_handles_every_event(
    broker: LocalBroker, topic_factory: Any, tmp_path: Path
) -> None:
    """The member dies with its workers and commits nothing on its way out. The next member
    of the group starts at the last commit: every event is handled at least once, and an
    event is handled again only if it sits at or past the offset committed at the kill."""
    topic = topic_factory(1)
    ids = produce(broker.bootstrap_servers, topic, [b"e"] * KILL_EVENTS, partition=0)
    out = tmp_path / "handled"
    group = f"kill-{uuid.uuid4().hex[:8]}"

    def commit() -> int:
        return committed(broker.bootstrap_servers, group, topic, 1)[0]

    with (tmp_path / "first.stderr").open("w") as log:
        first = _consume_cli(
            broker, group, topic, out, sleep=0.005, deadline=5.0, stderr=log, new_session=True
        )
    try:
        wait_for(lambda: len(handled(out)) >= KILL_EVENTS // 4, 60, "a quarter of the events")
        wait_for(lambda: commit() > 0, 30, "a first commit")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(30)
    at_kill = commit()
    assert len(handled(out)) < KILL_EVENTS, "every event was handled before the kill"

    with (tmp_path / "second.stderr").open("w") as log:
        second = _consume_cli(broker, group, topic, out, sleep=0.0, deadline=5.0, stderr=log)
    try:
        wait_for(lambda: set(ids) <= handled(out).keys(), 120, "every event, after the restart")
    finally:
        second.send_signal(signal.SIGTERM)
        second.wait(60)
    offset_of = {
        line.split()[0]: int(line.split()[1].rsplit("@", 1)[1])
        for line in out.read_text().splitlines()
    }
    again = sorted(offset_of[event_id] for event_id, n in handled(out).items() if n > 1)
    assert not again or again[0] >= at_kill, (
        f"offsets {again[:5]} were handled again although {at_kill} was committed before the kill"
    )


def test_a_handler_that_cannot_be_imported_is_a_clear_error() -> None:
    with pytest.raises(HandlerError, match="no 'missing'"):
        Consumer("g", ["t"], "tests.consumer.handlers:missing")


def test_records_carry_the_envelope_identity() -> None:
    record = Record("t", 0, 5, b"k", b"v", [("event_id", b"a"), ("x", b"1")], 7, "a")
    assert record.header("x") == b"1"
    assert record.header("missing") is None


def test_settling_the_last_held_event_is_published_at_once() -> None:
    consumer = Consumer("g", ["t"], "tests.consumer.handlers:slow_from_env")
    consumer._flow.held = 3
    consumer._publish_status(force=True)
    consumer._board._next_snapshot = float("inf")  # the snapshot period never ends in this test
    consumer._counters.processed = 2
    consumer._publish_status()
    assert consumer.status().counters.processed == 0, "mid-period, still held: not published"
    consumer._flow.held = 0
    consumer._counters.processed = 3
    consumer._publish_status()
    assert (consumer.status().buffered, consumer.status().counters.processed) == (0, 3)


def test_the_collector_is_paused_for_a_poll_and_left_as_it_was() -> None:
    assert gc.isenabled()
    with _collector_paused():
        assert not gc.isenabled()
    assert gc.isenabled()
    gc.disable()
    try:
        with _collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled(), "a collector the application turned off stays off"
    finally:
        gc.enable()
