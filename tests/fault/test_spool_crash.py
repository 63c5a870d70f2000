"""Crash tests: a writer process is SIGKILLed at a random moment, then the queue is reopened.

A SIGKILL leaves every store the writer made into its shared mapping in the page
cache, so nothing it was told is durable may be missing after a reopen, nothing it
never appended may appear, and recovery must not raise. The writers live in
`tests.fault.spool_writer`; each cycle reopens the files the previous cycles left, so
recovery also runs on top of earlier recoveries and generations.
"""

from __future__ import annotations

import os
import random
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from eventspool.envelope import decode
from eventspool.pipeline import Spool
from eventspool.spool.partitioner import partition_for_key
from eventspool.spool.ring import RingQueue
from tests.fault.children import run_and_kill
from tests.fault.spool_writer import (
    ACK_BEGUN,
    ACKED,
    RING,
    RING_CAPACITY,
    SPOOL_PARTITIONS,
    SPOOL_TOPIC,
    headers_for,
    key_for,
    open_segments,
    parse_payload,
    ring_settings,
    spool_settings,
)

pytestmark = [pytest.mark.slow, pytest.mark.fault]

RING_CYCLES = 50
SPOOL_CYCLES = 12


def test_ring_survives_sigkill_at_random_moments(tmp_path: Path) -> None:
    """Every acknowledged append is found intact and in order, nothing more than one in flight."""
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    path = tmp_path / "crash.queue"
    head = 0  # first sequence still queued after the last verification
    next_seq = 0  # the sequence the next writer must start from
    appended_total = 0
    for cycle in range(RING_CYCLES):
        where = f"seed {seed}, cycle {cycle}"
        report = run_and_kill(
            "tests.fault.spool_writer",
            ["ring", str(path), str(rng.getrandbits(32))],
            rng.uniform(0.005, 0.2),
        )
        assert report.start == next_seq, f"{where}: the writer found another queue end"
        done_ack = head - 1
        intent_ack = head - 1
        last_appended = report.start - 1
        for line in report.acknowledged:
            if line.target == RING:
                counter, seq = int(line.event_id), int(line.value)
                assert seq == counter == last_appended + 1, f"{where}: append order {line}"
                last_appended = seq
            elif line.target == ACK_BEGUN:
                intent_ack = int(line.event_id)
            elif line.target == ACKED:
                done_ack = int(line.event_id)
                assert done_ack == intent_ack, f"{where}: ack reported out of order"
            else:
                raise AssertionError(f"{where}: unexpected line {line}")
        appended_total += last_appended + 1 - report.start

        ring = RingQueue.open(path, ring_settings())
        try:
            recovery = ring.recovery
            records = []
            while batch := ring.read_batch(max_records=10_000, max_bytes=1 << 30):
                records.extend(batch)
            stats = ring.stats()
        finally:
            ring.close()

        assert recovery.skipped_records == 0, f"{where}: {recovery}"
        assert recovery.records == len(records), f"{where}: {recovery}"
        for record in records:
            assert parse_payload(record.payload) == record.seq, f"{where}: record {record.seq}"
        seqs = [record.seq for record in records]
        first = seqs[0] if seqs else stats.next_seq
        assert seqs == list(range(first, stats.next_seq)), f"{where}: sequences not contiguous"
        assert done_ack + 1 <= first <= intent_ack + 1, (
            f"{where}: queue starts at {first}, acks reported {done_ack}, begun {intent_ack}"
        )
        assert last_appended + 1 <= stats.next_seq <= last_appended + 2, (
            f"{where}: {last_appended + 1} appends reported but the queue ends at {stats.next_seq}"
        )
        head = first
        next_seq = stats.next_seq
    # The test is only worth something if the writers got going and the ring wrapped a lot.
    assert appended_total > 20 * RING_CYCLES, f"seed {seed}: only {appended_total} appends"
    ring = RingQueue.open(path, ring_settings())
    try:
        laps = ring.stats().tail_position // RING_CAPACITY
    finally:
        ring.close()
    assert laps >= 10, f"seed {seed}: the ring wrapped only {laps} times"


SEGMENT_CYCLES = 50


@pytest.mark.parametrize("kind", ["create", "delete"])
def test_segments_survive_sigkill_while_created_or_deleted(tmp_path: Path, kind: str) -> None:
    """Killed inside a segment's creation or deletion (before, during or after the file
    work): every acknowledged append is found once, in order, nothing acknowledged
    comes back, no leftover file, and the chain still grows and shrinks."""
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    head = next_seq = 0
    most_segments = 0
    for cycle in range(SEGMENT_CYCLES):
        where = f"seed {seed}, {kind}, cycle {cycle}"
        report = run_and_kill(
            "tests.fault.spool_writer",
            ["segments", str(tmp_path), kind, str(rng.randint(1, 4)), str(rng.getrandbits(32))],
            until=lambda _reader, process: process.wait(60),
        )
        assert report.start == next_seq, f"{where}: the writer found another queue end"
        done_ack = intent_ack = head - 1
        last_appended = report.start - 1
        for line in report.acknowledged:
            if line.target == RING:
                seq = int(line.value)
                assert seq == last_appended + 1, f"{where}: append order {line}"
                last_appended = seq
            elif line.target == ACK_BEGUN:
                intent_ack = int(line.event_id)
            elif line.target == ACKED:
                done_ack = int(line.event_id)
            else:
                raise AssertionError(f"{where}: unexpected line {line}")
        with open_segments(tmp_path) as queue:
            recovery = queue.recovery
            queue_files = sorted(p.name for p in tmp_path.iterdir())
            segments = queue.segments
            records = []
            while batch := queue.read_batch(10_000, 1 << 30):
                records.extend(batch)
            end = queue.next_seq
        assert recovery.skipped_records == 0 and not recovery.corrupt_tail, f"{where}: {recovery}"
        assert len(queue_files) == segments, f"{where}: files {queue_files}"  # no spare
        for record in records:
            assert parse_payload(record.payload) == record.seq, f"{where}: record {record.seq}"
        seqs = [record.seq for record in records]
        first = seqs[0] if seqs else end
        assert seqs == list(range(first, end)), f"{where}: sequences not contiguous"
        assert done_ack + 1 <= first <= intent_ack + 1, (
            f"{where}: queue starts at {first}, acks reported {done_ack}, begun {intent_ack}"
        )
        assert last_appended + 1 <= end <= last_appended + 2, (
            f"{where}: {last_appended + 1} appends reported but the queue ends at {end}"
        )
        head, next_seq = first, end
        most_segments = max(most_segments, segments)
    assert next_seq > 200 * SEGMENT_CYCLES // 4, f"seed {seed}: only {next_seq} appends"
    assert most_segments >= 3, f"seed {seed}: the chain never grew"


@dataclass
class _Ledger:
    """The parent's knowledge of the spool: event ids by counter, queued counters by partition."""

    ids: dict[int, str] = field(default_factory=dict)
    queued: dict[int, list[int]] = field(default_factory=lambda: defaultdict(list))
    next_counter: int = 0


def _read_partitions(spool: Spool) -> dict[int, list[tuple[int, str]]]:
    """(counter, event_id) of every queued event, by partition, in queue order; checks each."""
    found: dict[int, list[tuple[int, str]]] = {}
    for ref in spool.queues():
        assert ref.topic == SPOOL_TOPIC
        assert ref.partition is not None, "a pending ring exists although the count is known"
        events: list[tuple[int, str]] = []
        ref.ring.rewind()
        while batch := ref.ring.read_batch(max_records=10_000, max_bytes=1 << 30):
            for record in batch:
                event = decode(record.payload)
                assert event.value is not None
                counter = parse_payload(event.value)
                assert event.key == key_for(counter)
                assert event.headers == headers_for(counter)
                assert partition_for_key(event.key, SPOOL_PARTITIONS) == ref.partition
                events.append((counter, event.event_id))
        found[ref.partition] = events
    return found


def test_spool_survives_sigkill_at_random_moments(tmp_path: Path) -> None:
    """Keyed sends to a 3-partition topic: every returned event_id survives, in key order."""
    seed = int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    directory = tmp_path / "spool"
    ledger = _Ledger()
    for cycle in range(SPOOL_CYCLES):
        where = f"seed {seed}, cycle {cycle}"
        report = run_and_kill(
            "tests.fault.spool_writer",
            ["spool", str(directory), str(ledger.next_counter), str(rng.getrandbits(32))],
            rng.uniform(0.005, 0.2),
        )
        assert report.start == ledger.next_counter
        candidates = {p: list(ledger.queued[p]) for p in range(SPOOL_PARTITIONS)}
        done_ack: dict[int, int] = defaultdict(lambda: -1)
        intent_ack: dict[int, int] = defaultdict(lambda: -1)
        last_sent = report.start - 1
        for line in report.acknowledged:
            if line.target == SPOOL_TOPIC:
                counter = int(line.value)
                assert counter == last_sent + 1, f"{where}: send order {line}"
                last_sent = counter
                ledger.ids[counter] = line.event_id
                candidates[partition_for_key(key_for(counter), SPOOL_PARTITIONS)].append(counter)
            elif line.target == ACK_BEGUN:
                intent_ack[int(line.value)] = int(line.event_id)
            elif line.target == ACKED:
                done_ack[int(line.value)] = int(line.event_id)
            else:
                raise AssertionError(f"{where}: unexpected line {line}")
        in_flight = last_sent + 1
        in_flight_partition = partition_for_key(key_for(in_flight), SPOOL_PARTITIONS)

        with Spool(directory, settings=spool_settings()) as spool:
            for name, recovery in spool.recovery_reports().items():
                assert recovery.skipped_records == 0, f"{where}: {name}: {recovery}"
            found = _read_partitions(spool)

        next_counter = last_sent + 1
        for partition in range(SPOOL_PARTITIONS):
            events = found.get(partition, [])
            counters = [counter for counter, _ in events]
            expected = candidates[partition]
            if counters and counters[-1] == in_flight:
                # Sent but killed before its event_id was reported: allowed, once, at the end.
                assert partition == in_flight_partition
                ledger.ids[in_flight] = events[-1][1]
                next_counter = in_flight + 1
                expected = [*expected, in_flight]
            acked_away = expected[: max(0, len(expected) - len(counters))]
            assert counters == expected[len(acked_away) :], (
                f"{where}: partition {partition} holds {counters[:5]}..{counters[-5:]}, "
                f"expected a suffix of {expected[:5]}..{expected[-5:]}"
            )
            assert all(c <= intent_ack[partition] for c in acked_away), (
                f"{where}: partition {partition} lost events that were never acknowledged"
            )
            assert not counters or counters[0] > done_ack[partition], (
                f"{where}: partition {partition} still holds events acknowledged before the kill"
            )
            for counter, event_id in events:
                assert ledger.ids[counter] == event_id, f"{where}: event {counter} changed id"
            ledger.queued[partition] = counters
        all_ids = [event_id for events in found.values() for _, event_id in events]
        assert len(set(all_ids)) == len(all_ids), f"{where}: duplicate event ids"
        ledger.next_counter = next_counter
    assert ledger.next_counter > 20 * SPOOL_CYCLES, f"seed {seed}: only {ledger.next_counter} sends"
