"""What a SIGKILL takes from events the application was told were acknowledged: a
`Spool` against a bare `confluent_kafka.Producer` and its safe-but-slow fix.

Each lane runs in a child process that produces keyless 100-byte events (the value
starts with the event's sequence number, zero-padded to 12 digits; the producer lanes
add an `event_id` header, a UUIDv7 as the spool does) as fast as it can to a fresh
one-partition topic, and records each acknowledged event's id in a ledger file
(`eventspool.testing.ledger`, memory-mapped), which a SIGKILL cannot cut short. Each
child first delivers one event and waits for it, so the kill lands in full flight rather
than during start-up (a bare idempotent producer's first delivery here takes about
0.5 s, and a kill before it costs its whole queue). The parent waits for that first
acknowledgement, sleeps a random delay (the same for every lane of a repetition; lanes
rotate order), then SIGKILLs the child. Lanes:

* spool (ours): `Spool.send()` with default settings (durability `process`, 32 MiB rings,
  reject when full: the child retries after 1 ms). Acknowledged = `send()` returned.
  After the kill the parent reopens the spool directory and `flush()`es it. A ring holds
  174,762 events of this size; at full speed it fills within about a second, and from
  then on `send()` is paced by the sender thread (`backlog_at_reopen` is then about the
  ring's capacity).
* producer (the anchor): `Producer.produce()` with acks=all, enable.idempotence=true,
  compression.type=lz4 and librdkafka's defaults otherwise (linger.ms 5, a queue of
  100,000 messages; BufferError -> poll(0.01) and retry; poll(0) every 1,000 events).
  Acknowledged = `produce()` returned, which is when an application moves on.
* wait-1 and wait-N (the way users make the anchor safe): the same producer, N events
  produced, then `flush()`; acknowledged = a delivery report without error.

After the kill (and 0.5 s for a request the broker already received), the parent writes
a marker event and reads the partition up to it (`eventspool.verify.consume_topic`):
everything the topic will ever hold from the child. The ids are compared
(`eventspool.verify.ledger`): per kill, acknowledged, delivered, lost, duplicates,
found-but-never-acknowledged, and the acknowledged rate between the first
acknowledgement and the kill. Each figure is the median over kills. The broker is tansu
(in memory) on the same machine.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import confluent_kafka

from eventspool.broker.local import create_topic
from eventspool.envelope import EventIdGenerator
from eventspool.errors import SpoolFullError
from eventspool.pipeline import Spool
from eventspool.testing.ledger import LedgerReader, LedgerWriter, committed_lines
from eventspool.verify import consume_topic
from harness.child import Child, child_arguments
from harness.cli import BenchArgs, bench_main
from harness.figures import figure
from harness.ledger import Tally, lost_figure, summary, tally
from harness.output import progress
from harness.producer import compared_settings
from harness.runs import median
from harness.session import Session

FIGURE = "sigkill_acknowledged_delivered_fraction"
OURS = "spool"
ANCHOR = "producer"
WAIT_LANE_PREFIX = "wait-"
WAIT_EACH = f"{WAIT_LANE_PREFIX}1"
WAIT_BATCH = 100
WAIT_LANE = f"{WAIT_LANE_PREFIX}{WAIT_BATCH}"
LANES = (OURS, ANCHOR, WAIT_EACH, WAIT_LANE)
QUICK_DELAY_S = (0.3, 1.2)
FULL_DELAY_S = (0.5, 3.0)
PAYLOAD_BYTES = 100
READY_TIMEOUT_S = 60.0
SETTLE_S = 0.5
FLUSH_TIMEOUT_S = 300.0
CONSUME_TIMEOUT_S = 300.0
_PADDING = b"." * (PAYLOAD_BYTES - 12)
_POLL_EVERY = 1000
_FULL_RETRY_S = 0.001
_BUFFER_RETRY_S = 0.01


def value_of(sequence: int) -> bytes:
    return b"%012d" % sequence + _PADDING


def producer_config(bootstrap: str) -> dict[str, object]:
    """A producer as users configure one for safety; librdkafka's defaults otherwise."""
    return {
        "bootstrap.servers": bootstrap,
        "acks": "all",
        "enable.idempotence": True,
        "compression.type": "lz4",
    }


def deliver_one(producer: Any, topic: str, value: bytes, event_id: str) -> str:
    """Produce one event and wait for its delivery report: a child's first event, so the
    measured loop starts connected (a bare idempotent producer's first delivery takes
    about 0.5 s here), or the marker."""
    failures: list[object] = []

    def on_delivery(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    producer.produce(topic, value, headers=[("event_id", event_id)], on_delivery=on_delivery)
    if producer.flush(READY_TIMEOUT_S) or failures:
        raise RuntimeError(f"{topic}: event {event_id} not delivered: {failures}")
    return event_id


def run_spool(acked: Callable[[str], None], bootstrap: str, topic: str, directory: str) -> None:
    """Acknowledged = `send()` returned; a full queue is retried after 1 ms."""
    spool = Spool(directory, bootstrap)
    send = spool.send
    first = send(topic, value_of(0))
    if spool.flush(READY_TIMEOUT_S):
        raise RuntimeError(f"the first event was not acknowledged in {READY_TIMEOUT_S} s")
    acked(first)
    sequence = 1
    while True:
        value = value_of(sequence)
        while True:
            try:
                event_id = send(topic, value)
                break
            except SpoolFullError:
                time.sleep(_FULL_RETRY_S)
        acked(event_id)
        sequence += 1


def run_producer(acked: Callable[[str], None], bootstrap: str, topic: str) -> None:
    """Acknowledged = `produce()` returned; BufferError is answered by poll(0.01), retry."""
    producer: Any = confluent_kafka.Producer(producer_config(bootstrap))
    produce = producer.produce
    poll = producer.poll
    ids = EventIdGenerator()
    acked(deliver_one(producer, topic, value_of(0), ids.next_id()))
    sequence = 1
    while True:
        event_id = ids.next_id()
        value = value_of(sequence)
        while True:
            try:
                produce(topic, value, headers=[("event_id", event_id)])
                break
            except BufferError:
                poll(_BUFFER_RETRY_S)
        acked(event_id)
        if not sequence % _POLL_EVERY:
            poll(0)
        sequence += 1


def run_wait(acked: Callable[[str], None], bootstrap: str, topic: str, batch: int) -> None:
    """Acknowledged = a delivery report without error, after `batch` produced and flush()."""
    producer: Any = confluent_kafka.Producer(producer_config(bootstrap))
    ids = EventIdGenerator()
    delivered: list[str] = []

    def on_delivery(event_id: str, error: Any, _message: Any) -> None:
        if error is None:
            delivered.append(event_id)

    acked(deliver_one(producer, topic, value_of(0), ids.next_id()))
    sequence = 1
    while True:
        for _ in range(batch):
            event_id = ids.next_id()
            producer.produce(
                topic,
                value_of(sequence),
                headers=[("event_id", event_id)],
                on_delivery=functools.partial(on_delivery, event_id),
            )
            sequence += 1
        producer.flush()
        for event_id in delivered:
            acked(event_id)
        delivered.clear()


def child_main(argv: Sequence[str]) -> int:
    lane, ledger_path, bootstrap, topic, directory = argv
    writer = LedgerWriter(Path(ledger_path))

    def acked(event_id: str) -> None:
        writer.append(event_id, topic)

    if lane == OURS:
        run_spool(acked, bootstrap, topic, directory)
    elif lane == ANCHOR:
        run_producer(acked, bootstrap, topic)
    elif lane.startswith(WAIT_LANE_PREFIX):
        run_wait(acked, bootstrap, topic, int(lane.removeprefix(WAIT_LANE_PREFIX)))
    else:
        raise SystemExit(f"unknown lane {lane!r}")
    return 0


@dataclass(frozen=True, slots=True)
class KillLedger(Tally):
    """What one SIGKILLed child of a lane had acknowledged and what of it reached the topic."""

    lane: str
    repetition: int
    kill_after_s: float
    rate: float
    backlog_at_reopen: int | None = None


def lane_summary(ledgers: Sequence[KillLedger]) -> dict[str, float | int | None]:
    """`harness.ledger.summary` over the kills of one lane, plus its rate and backlog."""
    backlogs = [k.backlog_at_reopen for k in ledgers if k.backlog_at_reopen is not None]
    return {
        **summary(ledgers),
        "rate": round(median(k.rate for k in ledgers), 1),
        "backlog_at_reopen": median(backlogs) if backlogs else None,
    }


def figures(summaries: Mapping[str, Mapping[str, Any]]) -> list[dict[str, object]]:
    """The secondary figures; each ratio is above 1 when the spool is ahead."""
    ours = summaries[OURS]
    rates = [
        figure(
            name,
            ours["rate"],
            summaries[lane]["rate"],
            unit="events/s",
            title="Acknowledged events/s until the SIGKILL",
            anchor_is=anchor_is,
        )
        # Until a random kill: the spool's rate drops once its ring is full.
        | {"tolerance": 0.6, "anchor_lost_per_kill": summaries[lane]["lost"]}
        for lane, name, anchor_is in (
            (
                WAIT_EACH,
                "acknowledged_rate_vs_producer_waiting_for_each_delivery",
                "a Producer waiting for each delivery report",
            ),
            (
                WAIT_LANE,
                f"acknowledged_rate_vs_producer_waiting_per_{WAIT_BATCH}",
                f"a Producer waiting for delivery every {WAIT_BATCH} events",
            ),
            (
                ANCHOR,
                "acknowledged_rate_vs_bare_producer",
                "a bare Producer: produce() returned (loses its buffer)",
            ),
        )
    ]
    lost = lost_figure(
        "sigkill_acknowledged_events_lost_per_kill",
        ours["lost"],
        summaries[ANCHOR]["lost"],
        title="Acknowledged events lost per SIGKILL (median)",
        anchor_is="a bare Producer: produce() returned",
    )
    return [lost, *rates]


def one_kill(
    lane: str, repetition: int, bootstrap: str, scratch: Path, delay_s: float
) -> KillLedger:
    """Start the lane's child on a fresh topic, SIGKILL it `delay_s` after its first
    acknowledgement (reopen and flush the spool lane's spool), write a marker after
    everything the child will ever put in the topic, and read the topic up to it."""
    topic = f"bench-kill-{lane}-{repetition}-{os.getpid()}"
    create_topic(bootstrap, topic, 1)
    directory = scratch / f"{lane}-{repetition}"
    directory.mkdir()
    ledger_path = directory / f"{lane}.ids"
    args = [lane, os.fspath(ledger_path), bootstrap, topic, str(directory / "spool")]
    stderr = directory / f"{lane}.stderr"
    child = Child.of_script(f"{lane} child", __file__, args, stderr).start()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not (first := committed_lines(ledger_path)):
            if not child.alive() or time.monotonic() > deadline:
                break
            time.sleep(0.001)
        started = time.perf_counter()
        if first:
            time.sleep(delay_s)
        last = committed_lines(ledger_path)
        window = time.perf_counter() - started
    finally:
        child.kill()
    if not first:
        raise RuntimeError(f"{lane} child acknowledged nothing: {child.stderr_tail()}")
    acknowledged = LedgerReader(directory, ledger_path.name)
    acknowledged.poll()
    backlog = None
    if lane == OURS:
        with Spool(directory / "spool", bootstrap) as spool:
            backlog = spool.unacknowledged()
            if left := spool.flush(FLUSH_TIMEOUT_S):
                raise RuntimeError(f"{left} spooled events not acknowledged in {FLUSH_TIMEOUT_S} s")
    time.sleep(SETTLE_S)
    producer = confluent_kafka.Producer(producer_config(bootstrap))
    marker = deliver_one(producer, topic, b"marker", EventIdGenerator().next_id())
    seen = consume_topic(bootstrap, topic, marker, CONSUME_TIMEOUT_S)
    return KillLedger(
        **asdict(tally(acknowledged.ids(topic), seen, ignore={marker})),
        lane=lane,
        repetition=repetition,
        kill_after_s=round(window, 3),
        rate=round((last - first) / window, 1),
        backlog_at_reopen=backlog,
    )


def run(args: BenchArgs) -> dict[str, object]:
    seed_arg: int | None = args.namespace.seed
    seed = seed_arg if seed_arg is not None else int.from_bytes(os.urandom(4), "little")
    rng = random.Random(seed)
    delay_range = QUICK_DELAY_S if args.quick else FULL_DELAY_S
    progress(
        f"{'quick' if args.quick else 'full'}: {args.repeats} kills per lane of {list(LANES)}, "
        f"{delay_range[0]}-{delay_range[1]} s after the first acknowledgement; seed {seed}"
    )
    ledgers: list[KillLedger] = []
    with Session(args, "kill") as session:
        bootstrap = session.broker().bootstrap_servers
        for rep in range(args.repeats):
            delay = rng.uniform(*delay_range)
            shift = rep % len(LANES)
            for lane in LANES[shift:] + LANES[:shift]:
                kill = one_kill(lane, rep, bootstrap, session.scratch, delay)
                ledgers.append(kill)
                progress(
                    f"rep {rep + 1}/{args.repeats} {lane:9} killed after "
                    f"{kill.kill_after_s:.2f} s: {kill.acknowledged:,} acknowledged, "
                    f"{kill.lost:,} lost, {kill.duplicated:,} duplicated, "
                    f"{kill.rate:,.0f} acknowledged/s"
                )
    summaries = {lane: lane_summary([k for k in ledgers if k.lane == lane]) for lane in LANES}
    return {
        **figure(
            FIGURE,
            summaries[OURS]["delivered_fraction"] or 0.0,
            summaries[ANCHOR]["delivered_fraction"] or 0.0,
            unit="fraction",
            title="Acknowledged events found in Kafka after a SIGKILL",
            anchor_is="a bare Producer: produce() returned",
        ),
        "random_anchor": True,
        "figures": figures(summaries),
        "lanes": summaries,
        "kills": [{**asdict(k), "delivered_fraction": k.delivered_fraction} for k in ledgers],
        "settings": {
            "payload_bytes": PAYLOAD_BYTES,
            "partitions": 1,
            "keys": None,
            "kill_delay_s": list(delay_range),
            "spool": compared_settings()["spool"],
            "producer": producer_config("BOOTSTRAP"),
            "wait_batches": [1, WAIT_BATCH],
        },
        "seed": seed,
        **session.provenance(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    if (child_argv := child_arguments(argv)) is not None:
        return child_main(child_argv)

    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--seed", type=int, help="seed of the kill delays")

    description = "Acknowledged events lost to a SIGKILL: Spool.send() vs a bare Producer"
    return bench_main(description, run, argv, extra)


if __name__ == "__main__":
    sys.exit(main())
