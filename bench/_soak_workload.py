"""The soak's workload: its topics, its events, and the processes that send and consume them.

Run as ``python bench/_soak_workload.py KIND [options]`` by bench/soak.py; KIND is one of

* ``sync``: a blocking `Client`, several threads sharing it (so its batching is in play);
* ``async``: an `AsyncClient`, many sends in flight at once;
* ``http``: HTTP/1.1 JSON on the agent's socket, batches of one to eight events;
* ``anchor``: a bare `confluent_kafka.Producer` with the sender's settings, straight to
  the broker (its events are "acknowledged" once produce() returned);
* ``consumer``: an `eventspool.consumer.Consumer` over the soak's topics, whose handler
  writes every event it handles to a ledger file of its worker process.

Every sender paces itself at `--rate` events/s, appends each acknowledged event to its
ledger file (eventspool.testing.ledger) and counts every refused one by reason; SIGTERM
stops it, and it writes a JSON summary to `--summary` before it exits. Producers are
never killed by the soak, so their ledgers are exact; the anchor is SIGKILLed with the
agent, so its ledger may hold an event acknowledged just before the kill: exactly the
event a killed application loses.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import http.client
import json
import os
import random
import re
import signal
import sys
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

import confluent_kafka

from eventspool.client.aio import AsyncClient
from eventspool.client.sync import AgentError, Client
from eventspool.consumer import Consumer, ConsumerSettings
from eventspool.envelope import EventIdGenerator
from eventspool.errors import EventspoolError, SpoolClosedError, SpoolFullError
from eventspool.testing.agent import UnixHTTPConnection
from eventspool.testing.ledger import HandlerLedger, LedgerWriter
from harness.producer import anchor_config


@dataclass(frozen=True, slots=True)
class SoakTopic:
    """A topic of the soak, with the queue settings the agent gives it."""

    name: str
    durability: str
    full_policy: str
    queue_bytes: int
    share: float  # of the events sent directly to a topic (the rest go to the exchange)


KIB = 1024
# Small queues on purpose: a broker cut of several seconds fills some, so `reject` refuses
# and `block` waits, as they would in production during a long outage.
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
# The embedded broker forms a group in about half of session.timeout.ms: keep it short.
CONSUMER_KAFKA: dict[str, str | int | float | bool] = {
    "session.timeout.ms": 3000,
    "heartbeat.interval.ms": 300,
}
CONSUMER_WORKERS = 2
_CATCH_UP_LIMIT_S = 1.0  # a sender that fell further behind its pace skips the rest
_PIDS_EVERY_S = 0.5
_HTTP_BATCH_MEAN = 4.5  # events per POST: 1-8
_HTTP_ERRORS = (OSError, http.client.HTTPException, ValueError)
_HTTP_REFUSALS = {"internal": "agent_internal_error", "shutting_down": "agent_shutting_down"}


@dataclass(frozen=True, slots=True)
class Event:
    """One event to send: to `topic`, or through exchange `exchange` when topic is None."""

    topic: str | None
    exchange: str | None
    key: bytes | None
    value: bytes

    @property
    def target(self) -> str:
        """How a ledger names where the event went: a topic, or @exchange."""
        return self.topic if self.topic is not None else f"@{self.exchange}"


class EventMaker:
    """Keyed and keyless events over the soak's topics and its fanout exchange, or all to
    `only_topic`."""

    def __init__(self, rng: random.Random, *, only_topic: str | None = None) -> None:
        self._rng = rng
        self._only = only_topic
        self._names = [topic.name for topic in TOPICS if topic.share > 0]
        self._weights = [topic.share for topic in TOPICS if topic.share > 0]
        self._count = 0

    def next(self) -> Event:
        """An event for a target drawn by the workload's shares."""
        if self._only is not None:
            return self.like(self._only, None)
        if self._rng.random() < FANOUT_SHARE:
            return self.like(None, FANOUT)
        return self.like(self._rng.choices(self._names, self._weights)[0], None)

    def like(self, topic: str | None, exchange: str | None) -> Event:
        """An event for this topic or exchange."""
        rng = self._rng
        self._count += 1
        key = b"user-%d" % rng.randrange(KEY_SPACE) if rng.random() < KEYED_SHARE else None
        text = f'{{"n":{self._count},"amt":{rng.randrange(100_000)},"p":"'
        value = text.encode().ljust(PAYLOAD_BYTES - 2, b"x") + b'"}'
        return Event(topic, exchange, key, value)


class Pacer:
    """Send slots at `rate` per second; a sender far behind skips the backlog."""

    def __init__(self, rate: float) -> None:
        self._interval = 1.0 / rate
        self._next = time.monotonic()

    def next_delay(self) -> float:
        """Seconds to wait for the next slot (0 when late), which is then taken."""
        now = time.monotonic()
        if now - self._next > _CATCH_UP_LIMIT_S:
            self._next = now
        delay = self._next - now
        self._next += self._interval
        return max(delay, 0.0)


def refusal_reason(error: BaseException) -> str:
    """Why the agent (or the anchor's producer) did not acknowledge an event, in the words
    of the soak's report."""
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


def _die(error: BaseException) -> NoReturn:
    """An error no send should raise ends the process, so the soak sees it and stops."""
    traceback.print_exception(error, file=sys.stderr)
    sys.stderr.flush()
    os._exit(3)


class Tally:
    """What one sender reports: acknowledged events, and refused ones by reason."""

    def __init__(self, ledger: Path) -> None:
        self.ledger = LedgerWriter(ledger)
        self.acked = 0
        self.refused: Counter[str] = Counter()
        self.examples: dict[str, str] = {}
        self._lock = threading.Lock()

    def settle(self, target: str, send: Callable[..., str], *args: Any, **kwargs: Any) -> None:
        """`send(*args, **kwargs)`: the event id it returns is acknowledged, a refusal
        (an EventspoolError, or BufferError from the anchor) is counted by reason."""
        try:
            event_id = send(*args, **kwargs)
        except (EventspoolError, BufferError) as exc:
            self.refuse(refusal_reason(exc), str(exc))
        except BaseException as exc:
            _die(exc)
        else:
            self.ack(event_id, target)

    def ack(self, event_id: str, target: str) -> None:
        self.ledger.append(event_id, target)
        with self._lock:
            self.acked += 1

    def refuse(self, reason: str, message: str, count: int = 1) -> None:
        with self._lock:
            self.refused[reason] += count
            self.examples.setdefault(reason, message[:300])

    def write(self, path: Path, **extra: object) -> None:
        self.ledger.close()
        # The result is published: no temporary path of this run's machine in it.
        examples = {
            reason: re.sub(r"/\S*/agent\.sock", "agent.sock", message)
            for reason, message in self.examples.items()
        }
        summary = {"acked": self.acked, "refused": dict(self.refused), "examples": examples}
        path.write_text(json.dumps({**summary, **extra}))


def run_sync(args: argparse.Namespace, stop: threading.Event, tally: Tally) -> dict[str, object]:
    """Threads sharing one `Client`; a failed send is counted, never retried."""
    client = Client(args.socket, timeout=10.0)
    rng = random.Random(args.seed)

    def loop(maker: EventMaker, pacer: Pacer) -> None:
        while not stop.wait(pacer.next_delay()):
            e = maker.next()
            tally.settle(e.target, client.send, e.topic, e.value, e.key, exchange=e.exchange)

    threads = [
        threading.Thread(
            target=loop,
            args=(EventMaker(random.Random(rng.getrandbits(64))), Pacer(args.rate / args.threads)),
        )
        for _ in range(args.threads)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    client.close()
    return {}


def run_async(args: argparse.Namespace, stop: threading.Event, tally: Tally) -> dict[str, object]:
    """One `AsyncClient`, each send a task of its own, up to `--in-flight` at once."""
    maker = EventMaker(random.Random(args.seed))
    tasks: set[asyncio.Task[None]] = set()

    async def send(client: AsyncClient, event: Event, slots: asyncio.Semaphore) -> None:
        try:
            event_id = await client.send(
                event.topic, event.value, event.key, exchange=event.exchange
            )
        except EventspoolError as exc:
            tally.refuse(refusal_reason(exc), str(exc))
        else:
            tally.ack(event_id, event.target)
        finally:
            slots.release()

    def finished(task: asyncio.Task[None]) -> None:
        tasks.discard(task)
        if not task.cancelled() and (error := task.exception()) is not None:
            _die(error)

    async def main() -> None:
        client = AsyncClient(args.socket, timeout=10.0)
        slots = asyncio.Semaphore(args.in_flight)
        pacer = Pacer(args.rate)
        while not stop.is_set():
            await asyncio.sleep(pacer.next_delay())
            await slots.acquire()
            task = asyncio.create_task(send(client, maker.next(), slots))
            tasks.add(task)
            task.add_done_callback(finished)
        if tasks:
            await asyncio.wait(tasks)
        await client.close()

    asyncio.run(main())
    return {}


def run_http(args: argparse.Namespace, stop: threading.Event, tally: Tally) -> dict[str, object]:
    """POSTs of 1-8 events to /v1/topics/T or /v1/exchanges/X, on one kept-alive connection."""
    rng = random.Random(args.seed)
    maker = EventMaker(rng)
    pacer = Pacer(args.rate / _HTTP_BATCH_MEAN)
    connection: UnixHTTPConnection | None = None
    while not stop.wait(pacer.next_delay()):
        first = maker.next()
        batch = [first, *(maker.like(first.topic, first.exchange) for _ in range(rng.randrange(8)))]
        path = f"/v1/topics/{first.topic}" if first.topic else f"/v1/exchanges/{first.exchange}"
        events = [
            {"value": e.value.decode(), **({"key": e.key.decode()} if e.key else {})} for e in batch
        ]
        connection = connection or UnixHTTPConnection(args.socket, timeout=10.0)
        try:
            connection.request("POST", path, body=json.dumps({"events": events}).encode())
            response = connection.getresponse()
            answer = json.loads(response.read())
        except _HTTP_ERRORS as exc:
            connection.close()
            connection = None
            tally.refuse("agent_unreachable", repr(exc), len(batch))
            continue
        for event, result in zip(batch, answer.get("results", []), strict=False):
            status, error = result.get("status", ""), result.get("error", "")
            if status == "ok":
                tally.ack(result["event_id"], event.target)
            elif "no space left" in error.lower():
                tally.refuse("disk_full", error)
            else:
                tally.refuse(_HTTP_REFUSALS.get(status, status), error)
        if "results" not in answer:
            tally.refuse(f"http_{response.status}", json.dumps(answer), len(batch))
    if connection is not None:
        connection.close()
    return {}


def run_anchor(args: argparse.Namespace, stop: threading.Event, tally: Tally) -> dict[str, object]:
    """A bare producer: "acknowledged" once produce() returned, as an application sees it."""
    maker = EventMaker(random.Random(args.seed), only_topic=ANCHOR_TOPIC)
    ids = EventIdGenerator()
    reports: Counter[str] = Counter()

    def on_delivery(error: Any, _message: Any) -> None:
        reports["delivered" if error is None else "failed"] += 1

    def on_error(_error: Any) -> None:
        reports["errors"] += 1

    producer: Any = confluent_kafka.Producer(
        {**anchor_config(args.bootstrap, on_error), "on_delivery": on_delivery}
    )

    def produce(event: Event, event_id: str) -> str:
        producer.produce(ANCHOR_TOPIC, event.value, event.key, headers=[("event_id", event_id)])
        return event_id

    pacer = Pacer(args.rate)
    while not stop.wait(pacer.next_delay()):
        tally.settle(ANCHOR_TOPIC, produce, maker.next(), ids.next_id())
        producer.poll(0)
    return {"reports": dict(reports), "unflushed": producer.flush(30.0)}


def run_consumer(args: argparse.Namespace) -> None:
    """A Consumer over every soak topic; its worker pids go to `--pids` for the worker kills."""
    args.ledger_dir.mkdir(parents=True, exist_ok=True)
    consumer = Consumer(
        args.group,
        [topic.name for topic in TOPICS],
        HandlerLedger(args.ledger_dir),
        workers=CONSUMER_WORKERS,
        bootstrap_servers=args.bootstrap,
        settings=ConsumerSettings(kafka=CONSUMER_KAFKA, commit_every_s=1.0),
    )
    done = threading.Event()

    def publish_pids() -> None:
        while not done.wait(_PIDS_EVERY_S):
            tmp = args.pids.with_suffix(".tmp")
            tmp.write_text(json.dumps([pid for pid in consumer.worker_pids() if pid]))
            os.replace(tmp, args.pids)

    threading.Thread(target=publish_pids, daemon=True).start()
    try:
        status = consumer.run()
    finally:
        done.set()
    args.summary.write_text(json.dumps({"status": status.line()}))


_SENDERS: dict[str, Callable[[argparse.Namespace, threading.Event, Tally], dict[str, object]]] = {
    "sync": run_sync,
    "async": run_async,
    "http": run_http,
    "anchor": run_anchor,
}


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("kind", choices=sorted([*_SENDERS, "consumer"]))
    for option in ("--socket", "--ledger", "--ledger-dir", "--pids"):
        parser.add_argument(option, type=Path)
    parser.add_argument("--summary", type=Path, required=True)
    parser.add_argument("--bootstrap")
    parser.add_argument("--group")
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--threads", type=int, default=4)
    parser.add_argument("--in-flight", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    with contextlib.suppress(KeyboardInterrupt):
        if args.kind == "consumer":
            run_consumer(args)
        else:
            stop = threading.Event()
            signal.signal(signal.SIGTERM, lambda _signum, _frame: stop.set())
            tally = Tally(args.ledger)
            tally.write(args.summary, **_SENDERS[args.kind](args, stop, tally))


if __name__ == "__main__":
    main(sys.argv[1:])
