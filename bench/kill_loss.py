"""What a SIGKILL takes from events the application was told were acknowledged: a
`Spool` against a bare `confluent_kafka.Producer` and its safe-but-slow fix.

Each lane is a child process that sends keyless 100-byte events (the value starts with
its sequence number; the producer lanes add a UUIDv7 `event_id` header, as the spool
does) as fast as it can to a fresh one-partition topic, recording each acknowledged id in
a memory-mapped ledger that a SIGKILL cannot cut short. Once the child's first event is
delivered, the parent sleeps a random delay (the same for each lane of a repetition;
lanes rotate order) and SIGKILLs it. Lanes: spool (ours), `Spool.send()` on default
settings (a full queue retried after 1 ms), acknowledged when it returned, the spool
reopened (`backlog_at_reopen`) and flushed after the kill; producer (the anchor),
`produce()` with acks=all, idempotence and lz4, acknowledged when it returned; wait-1
and wait-100, the same producer flushed every N events, acknowledged by delivery reports.

After the kill (and 0.5 s), the parent writes a marker event, reads the partition up to
it and compares event ids: per kill, acknowledged, delivered, lost, duplicated, delivered
but never acknowledged, and the acknowledged rate until the kill. Each figure is the
median over kills. The broker is tansu (in memory) on the same machine.
"""

from __future__ import annotations

import functools
import os
import random
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, NoReturn

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

OURS = "spool"
ANCHOR = "producer"
WAIT_EACH = "wait-1"
WAIT_BATCH = 100
WAIT_LANE = f"wait-{WAIT_BATCH}"
LANES = (OURS, ANCHOR, WAIT_EACH, WAIT_LANE)
QUICK_DELAY_S = (0.3, 1.2)
FULL_DELAY_S = (0.5, 3.0)
PAYLOAD_BYTES = 100
READY_TIMEOUT_S = 60.0
SETTLE_S = 0.5
FLUSH_TIMEOUT_S = 300.0
ANCHOR_IS = "a bare Producer: produce() returned"
_PADDING = b"." * (PAYLOAD_BYTES - 12)
_POLL_EVERY = 1000
SAFE_PRODUCER = {"acks": "all", "enable.idempotence": True, "compression.type": "lz4"}

# The acknowledged rate is compared with each other lane's: lane -> (figure, what it is).
RATE_FIGURES = {
    WAIT_EACH: (
        "acknowledged_rate_vs_producer_waiting_for_each_delivery",
        "a Producer waiting for each delivery report",
    ),
    WAIT_LANE: (
        f"acknowledged_rate_vs_producer_waiting_per_{WAIT_BATCH}",
        f"a Producer waiting for delivery every {WAIT_BATCH} events",
    ),
    ANCHOR: (
        "acknowledged_rate_vs_bare_producer",
        "a bare Producer: produce() returned (loses its buffer)",
    ),
}

Acked = Callable[[str], None]


def value_of(sequence: int) -> bytes:
    return b"%012d" % sequence + _PADDING


def safe_producer(bootstrap: str) -> Any:
    """A producer as users configure one for safety; librdkafka's defaults otherwise."""
    return confluent_kafka.Producer({"bootstrap.servers": bootstrap, **SAFE_PRODUCER})


def deliver_one(producer: Any, topic: str, value: bytes, event_id: str) -> str:
    """Produce one event and wait for its delivery report: a child's first, or the marker."""
    failures: list[object] = []

    def on_delivery(error: Any, _message: Any) -> None:
        if error is not None:
            failures.append(error)

    producer.produce(topic, value, headers=[("event_id", event_id)], on_delivery=on_delivery)
    if producer.flush(READY_TIMEOUT_S) or failures:
        raise RuntimeError(f"{topic}: event {event_id} not delivered: {failures}")
    return event_id


def run_spool(acked: Acked, spool: Spool, topic: str) -> NoReturn:
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
                time.sleep(0.001)
        acked(event_id)
        sequence += 1


def run_producer(acked: Acked, producer: Any, topic: str, ids: EventIdGenerator) -> NoReturn:
    produce = producer.produce
    poll = producer.poll
    sequence = 1
    while True:
        event_id = ids.next_id()
        value = value_of(sequence)
        while True:
            try:
                produce(topic, value, headers=[("event_id", event_id)])
                break
            except BufferError:
                poll(0.01)
        acked(event_id)
        if not sequence % _POLL_EVERY:
            poll(0)
        sequence += 1


def run_wait(
    acked: Acked, producer: Any, topic: str, ids: EventIdGenerator, batch: int
) -> NoReturn:
    delivered: list[str] = []

    def on_delivery(event_id: str, error: Any, _message: Any) -> None:
        if error is None:
            delivered.append(event_id)

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


def child_main(argv: Sequence[str]) -> NoReturn:
    """Run one lane until the parent kills it."""
    lane, ledger_path, bootstrap, topic, directory = argv
    writer = LedgerWriter(Path(ledger_path))

    def acked(event_id: str) -> None:
        writer.append(event_id, topic)

    if lane == OURS:
        run_spool(acked, Spool(directory, bootstrap), topic)
    producer = safe_producer(bootstrap)
    ids = EventIdGenerator()
    acked(deliver_one(producer, topic, value_of(0), ids.next_id()))
    if lane == ANCHOR:
        run_producer(acked, producer, topic, ids)
    run_wait(acked, producer, topic, ids, int(lane.removeprefix("wait-")))


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
    lost = lost_figure(
        "sigkill_acknowledged_events_lost_per_kill",
        ours["lost"],
        summaries[ANCHOR]["lost"],
        title="Acknowledged events lost per SIGKILL (median)",
        anchor_is=ANCHOR_IS,
    )
    rates = [
        figure(
            name,
            ours["rate"],
            summaries[lane]["rate"],
            unit="events/s",
            title="Acknowledged events/s until the SIGKILL",
            anchor_is=anchor_is,
        )
        # The rate until a random kill is noisy.
        | {"tolerance": 0.6, "anchor_lost_per_kill": summaries[lane]["lost"]}
        for lane, (name, anchor_is) in RATE_FIGURES.items()
    ]
    return [lost, *rates]


def one_kill(
    lane: str, repetition: int, bootstrap: str, scratch: Path, delay_s: float
) -> KillLedger:
    """Start the lane's child on a fresh topic, SIGKILL it `delay_s` after its first
    acknowledgement, and tally what the topic holds against what it acknowledged."""
    topic = f"bench-kill-{lane}-{repetition}-{os.getpid()}"
    create_topic(bootstrap, topic, 1)
    directory = scratch / f"{lane}-{repetition}"
    directory.mkdir()
    ledger_path = directory / f"{lane}.ids"
    args = [lane, os.fspath(ledger_path), bootstrap, topic, str(directory / "spool")]
    child = Child.of_script(f"{lane} child", __file__, args, directory / f"{lane}.stderr").start()
    try:
        deadline = time.monotonic() + READY_TIMEOUT_S
        while not (first := committed_lines(ledger_path)):
            if not child.alive() or time.monotonic() > deadline:
                raise RuntimeError(f"{lane} child acknowledged nothing: {child.stderr_tail()}")
            time.sleep(0.001)
        started = time.perf_counter()
        time.sleep(delay_s)
        last = committed_lines(ledger_path)
        window = time.perf_counter() - started
    finally:
        child.kill()
    acknowledged = LedgerReader(directory, ledger_path.name)
    acknowledged.poll()
    backlog = None
    if lane == OURS:
        with Spool(directory / "spool", bootstrap) as spool:
            backlog = spool.unacknowledged()
            if left := spool.flush(FLUSH_TIMEOUT_S):
                raise RuntimeError(f"{left} spooled events not acknowledged in {FLUSH_TIMEOUT_S} s")
    time.sleep(SETTLE_S)
    marker = deliver_one(safe_producer(bootstrap), topic, b"marker", EventIdGenerator().next_id())
    seen = consume_topic(bootstrap, topic, marker, timeout=300.0)
    return KillLedger(
        **asdict(tally(acknowledged.ids(topic), seen, ignore={marker})),
        lane=lane,
        repetition=repetition,
        kill_after_s=round(window, 3),
        rate=round((last - first) / window, 1),
        backlog_at_reopen=backlog,
    )


def run(args: BenchArgs) -> dict[str, object]:
    rng = random.Random()
    delay_range = QUICK_DELAY_S if args.quick else FULL_DELAY_S
    progress(f"{args.repeats} kills per lane, {delay_range} s after the first acknowledgement")
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
                    f"rep {rep + 1}/{args.repeats} {lane:9}: {kill.acknowledged:,} acknowledged, "
                    f"{kill.lost:,} lost, {kill.rate:,.0f} acknowledged/s"
                )
    summaries = {lane: lane_summary([k for k in ledgers if k.lane == lane]) for lane in LANES}
    return {
        **figure(
            "sigkill_acknowledged_delivered_fraction",
            summaries[OURS]["delivered_fraction"] or 0.0,
            summaries[ANCHOR]["delivered_fraction"] or 0.0,
            unit="fraction",
            title="Acknowledged events found in Kafka after a SIGKILL",
            anchor_is=ANCHOR_IS,
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
            "producer": {"bootstrap.servers": "BOOTSTRAP", **SAFE_PRODUCER},
            "wait_batches": [1, WAIT_BATCH],
        },
        **session.provenance(),
    }


def main(argv: Sequence[str] | None = None) -> int:
    if (child_argv := child_arguments(argv)) is not None:
        return child_main(child_argv)
    return bench_main("Acknowledged events lost to a SIGKILL: Spool vs Producer", run, argv)


if __name__ == "__main__":
    sys.exit(main())
