"""Events/s and round trip through the agent's unix socket, against in-process `Spool.send()`.

Every event is keyless with the same 100-byte value, to a topic of 4 partitions. Each
agent is `eventspool agent` as its own process on its defaults (durability process,
queues of 4 MiB segments, reject when full), shipping to a tansu broker; a pass starts
once the agent holds nothing unacknowledged. Passes are timed (`Profile`), those of a group
alternate their order, each figure is the median over the repetitions, and every pass
keeps the server's and the clients' CPU per event.

- ours: one `Client` shared by 16 threads, each a `send()` loop, from their release to
  the last one's end; `send_async()` the same until every future resolved. Their floor,
  the hand-off ceiling: one CPython thread waking 16 others in turn, no I/O. Beside it,
  the bare client (harness/bare_client.py): the same 16 threads' send() at its least
  against the same agent, which splits the lane's gap into the agent's and the client's.
  And this machine's floor for the lane: the same 16 threads handing off to one that makes
  each batch of them one round trip to the C echo server (a SEND's bytes), while a bare
  producer in a child process ships to the broker as many events/s as ours reached, on
  the sender's settings. A shipping agent cannot do less work than that on the same cores;
  the load is given ours' rate, not the floor's own, so the floor errs high.
- the anchor: `Spool.send()` in this process, one thread, queues of at most 32 MiB, no sender.
- caller processes (this script as its own child), connected beforehand to the agent
  and to a minimal epoll echo server in C (bench/harness/echo_server.c), run each pass
  together: every event over the union of their windows. 8 with their `Client` shared
  by 16 threads; 16 in a blocking `send()` loop against the same processes' 100-byte
  round trips to the echo server, and the agent's CPU per event against the echo
  server's per round trip; short-lived callers (connect, `send()` one event, close)
  against connect, one echo, close. Single-threaded passes last `callers_seconds` at most.
  The 16 processes' floor on this machine: their round trips to the echo server again,
  while the bare producer ships as many events/s as ours reached in the repetition.
- round trip: one thread's sequential `send()` after a warm-up, p50/p99/p99.9, against
  the same round trip to the C echo server, and to a second one whose ends busy-poll for
  the client's default 50 us as ours do (without our backoff), the three sampled in turn
  in blocks of 100 (this machine's speed can change within seconds); beside them, a
  Python echo's.
- access checks: the 16-thread pass on an agent with 10 [[access]] rules of 100 topic
  patterns each (the last for this uid) and 1000 allowed_topics patterns.
- TLS: the 16-thread and `send_async()` passes over loopback TCP with TLS (P-256 server
  certificate) against plaintext.
- instructions (full runs, with valgrind): callgrind's count of user-space instructions
  (the kernel's work is not counted) per blocking `send()` in a second agent, its event
  loop's thread and all of its threads, against the C echo server's per round trip, each
  with one sequential caller (`harness.instructions`).
- the agent's CPU floor: the echo server's CPU per round trip (the socket's part) plus a
  bare producer's CPU per event (the Kafka part): on the sender's settings, the same
  events through the sender's compiled produce loop, in this process, each repetition.

Goals (not asserted): round-trip p50 under 50 us and at most 1.5x the echo's; one shared
client at 200k events/s and 0.8 of the ceiling; caller processes and short-lived callers
at 0.6 of the echo's rate; the agent's CPU at most 3 us per blocking event; access checks
under 5% of the rate.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import socket
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path
from typing import TypeAlias

from confluent_kafka import Producer

from eventspool._core.native import AckTracker, Deliveries, encode_wire_event
from eventspool.broker import create_topic
from eventspool.broker.local import find_free_port
from eventspool.client.sync import Client
from eventspool.config import DEFAULT_BUSY_POLL_US, MIB, QueueSettings, SpoolSettings
from eventspool.errors import EventspoolError
from eventspool.pipeline import Spool
from eventspool.sender.producer import KafkaHeaders
from eventspool.sender.queuestate import KafkaRecord
from eventspool.testing.agent import AgentProcess
from eventspool.testing.tls import Pki
from eventspool.wire.protocol import encode_send_payloads
from harness import instructions
from harness.agent import configured_agent, start_agent
from harness.bare_client import BareClient
from harness.child import Child, child_arguments
from harness.cli import BenchArgs, bench_main
from harness.cpu import process_cpu_s, process_run_s
from harness.echo import EchoServer, connected, polled_round_trip, round_trip
from harness.figures import figure
from harness.output import progress
from harness.producer import sender_producer_config
from harness.rings import expect_emptied, fitting_events
from harness.runs import Runs, alternate, latency_summary_us, safe_ratio
from harness.session import Session
from harness.threads import run_together

FIGURE = "uds_rate_one_batching_client"
TOPIC = "bench-uds"
PARTITIONS = 4
PAYLOAD_BYTES = 100
CLIENT_THREADS = 16
PROCESSES = 8
CALLER_PROCESSES = 16
# Time for every client process to read its order and start its threads before a pass.
PROCESS_LEAD_S = 0.05
CAPACITY_BYTES = 32 * MIB  # the anchor's queue maximum, and what a pass may fill
ACCESS_RULES = 10
ALLOWED_PATTERNS = 1000
# Events per batch of the bare producer, each batch followed by a poll(0).
SENDER_BATCH = 100
# librdkafka's poll() waits in whole milliseconds: a shorter wait is no wait at all, and
# the shipping load spun through the last one before each batch was due.
POLL_RESOLUTION_S = 0.001
# The shipping load's topic.
LOAD_TOPIC = "bench-uds-shipping"
TCP_HOST = "127.0.0.1"
# The same 100 bytes in every process, so every pass sends the same events.
VALUE = random.Random(20240601).randbytes(PAYLOAD_BYTES)


# The one-client lane, the 16 processes' and their floors, in each repetition's progress.
LANE_FLOORS = {
    "16 threads": ("one_client_rate", "handoff_ceiling", "shipping_floor_rate"),
    "16 processes": (
        "processes_16_rate",
        "c_echo_processes_16_rate",
        "processes_16_shipping_floor_rate",
    ),
}
# What callers of a hand-off lane queue for the serving thread: a lock each, None when done.
HandOffs: TypeAlias = "queue.SimpleQueue[threading.Lock | None]"


@dataclass(frozen=True, slots=True)
class Profile:
    """How long to measure: passes are timed, so their size follows whatever rate we get."""

    pass_seconds: float
    warmup_seconds: float
    rtt_samples: int
    rtt_warmup: int
    drain_timeout_s: float
    callers_seconds: float  # so that the quick run's many single-threaded passes fit
    producer_events: int  # the bare producer's, per repetition


QUICK = Profile(  # with 0.8-s passes and the 16 processes' floor it took 60.4 s on 2 cores,
    0.6,  # with 0.7-s ones 58.5 s in the VM's slower mode: too close
    0.3,
    rtt_samples=2_000,
    rtt_warmup=200,
    drain_timeout_s=60,
    callers_seconds=0.3,
    producer_events=20_000,
)
FULL = Profile(
    3.0,
    1.0,
    rtt_samples=20_000,
    rtt_warmup=1_000,
    drain_timeout_s=120,
    callers_seconds=3.0,
    producer_events=100_000,
)


@dataclass(frozen=True, slots=True)
class RatePass:
    """One timed pass: monotonic (system-wide) times, so passes of processes combine."""

    events: int
    errors: int
    first_error: str | None
    start_ns: int
    end_ns: int
    cpu_s: float

    @property
    def rate(self) -> float:
        seconds = (self.end_ns - self.start_ns) / 1e9
        return self.events / seconds if seconds > 0 else 0.0


def timed_rate(
    send: Callable[[str, bytes], object],
    threads: int,
    seconds: float,
    max_events: int | None = None,
    release_at_ns: int | None = None,
) -> RatePass:
    """`threads` threads call `send(TOPIC, VALUE)` until `seconds` are up (or `max_events`);
    an error is counted, not raised, so a refused event shows in the result."""
    stop = threading.Event()
    limit = max_events // threads if max_events is not None else None

    def loop() -> tuple[int, int, str | None]:
        call, topic, value, done = send, TOPIC, VALUE, stop.is_set
        sent = failed = 0
        first_error = None
        while not done() and (limit is None or sent < limit):
            try:
                call(topic, value)
            except EventspoolError as exc:
                failed += 1
                first_error = first_error or f"{type(exc).__name__}: {exc}"
            else:
                sent += 1
        return sent, failed, first_error

    ran = run_together(
        [loop] * threads, stop=stop, stop_after_s=seconds, release_at_ns=release_at_ns
    )
    sent, failed, first_errors = zip(*ran.results, strict=True)
    first_error = next((first for first in first_errors if first), None)
    return RatePass(sum(sent), sum(failed), first_error, ran.start_ns, ran.end_ns, ran.cpu_s)


def async_rate(client: Client, threads: int, seconds: float) -> RatePass:
    """Ends when every future resolved: a rate of events on disk, not of calls returned."""
    futures: list[Future[str]] = []

    def fire(topic: str, payload: bytes) -> None:
        futures.append(client.send_async(topic, payload))

    fired = timed_rate(fire, threads, seconds)
    cpu_before = time.process_time()
    wait(futures)
    end_ns, cpu_s = time.monotonic_ns(), fired.cpu_s + time.process_time() - cpu_before
    refused = [error for future in futures if (error := future.exception()) is not None]
    first = fired.first_error or next((f"{type(e).__name__}: {e}" for e in refused), None)
    events, errors = len(futures) - len(refused), fired.errors + len(refused)
    return RatePass(events, errors, first, fired.start_ns, end_ns, cpu_s)


def anchor_pass(spool: Spool, seconds: float) -> RatePass:
    fits = fitting_events(PARTITIONS, CAPACITY_BYTES, PAYLOAD_BYTES)
    result = timed_rate(spool.send, 1, seconds, fits)
    expect_emptied(spool, result.events)
    return result


def hand_offs(threads: int, seconds: float, serve: Callable[[HandOffs], None]) -> float:
    """Hand-offs/s of `threads` callers, each queueing its own lock on `ready` and waiting
    on it, served by one thread, `serve(ready)`: it takes locks off the queue and
    releases them, until it took a None from each caller (one is done)."""
    ready: HandOffs = queue.SimpleQueue()
    stop = threading.Event()

    def caller() -> int:
        lock, woken = threading.Lock(), 0
        lock.acquire()
        while not stop.is_set():
            ready.put(lock)
            lock.acquire()
            woken += 1
        ready.put(None)  # this caller is done
        return woken

    def server() -> int:
        serve(ready)
        return 0

    ran = run_together([*[caller] * threads, server], stop=stop, stop_after_s=seconds)
    return sum(ran.results) / ran.seconds


def handoff_ceiling(threads: int, seconds: float) -> float:
    """One thread releasing `threads` others in turn, each on its own lock: the most a
    blocking `send()` shared by that many threads can reach in one process."""

    def wake(ready: HandOffs) -> None:
        for _ in range(threads):
            while (lock := ready.get()) is not None:
                lock.release()

    return hand_offs(threads, seconds, wake)


def handoff_echo_rate(threads: int, seconds: float, echo_path: Path) -> float:
    """The ceiling with the socket's part of a shared client: the serving thread takes
    every caller waiting, writes their events as one SEND would carry them to the C echo
    server in one write, reads them back, then wakes them. The most a blocking `send()`
    shared by `threads` can reach through a server that does nothing with its frames."""
    event = encode_wire_event(VALUE, None, None, None)

    def echo_batches(ready: HandOffs) -> None:
        """Serve until every caller is done; a socket that fails still wakes them all
        (none would wake otherwise), then its error is raised."""
        done, failure = 0, None
        with contextlib.ExitStack() as stack:
            try:
                sock = stack.enter_context(connected(echo_path))
            except OSError as exc:
                failure = exc
            while done < threads:
                batch: list[threading.Lock] = []
                waiting: threading.Lock | None = ready.get()
                while True:
                    if waiting is None:
                        done += 1
                    else:
                        batch.append(waiting)
                    try:
                        waiting = ready.get_nowait()
                    except queue.Empty:
                        break
                if batch and failure is None:
                    try:
                        round_trip(sock, encode_send_payloads(0, TOPIC, [event] * len(batch)))
                    except OSError as exc:
                        failure = exc
                for lock in batch:
                    lock.release()
        if failure is not None:
            raise failure

    return hand_offs(threads, seconds, echo_batches)


class BareProducer:
    """A producer on the sender's settings, shipping the agent's events (100 bytes each
    with their event_id header) to `topic` as the sender hands them over: its compiled
    loop (`Deliveries`, one per partition, as one per queue), `SENDER_BATCH` at a time,
    the partitions in turn, a poll(0) after each batch."""

    def __init__(self, bootstrap: str, topic: str) -> None:
        self.producer = Producer(sender_producer_config(bootstrap))
        self.producer.produce(topic, b"connected", partition=0)  # the connections are not timed
        self.producer.flush(30)
        self.topic = topic
        self.failures: list[object] = []
        self.partitions = [
            Deliveries(AckTracker(0), lambda _seq, error, _message: self.failures.append(error))
            for _ in range(PARTITIONS)
        ]
        self.headers: KafkaHeaders = [("event_id", str(uuid.UUID(int=0)).encode())]
        self.shipped = 0

    def records(self, first: int) -> list[KafkaRecord]:
        """The batch of `SENDER_BATCH` events from number `first` on, as queues read them."""
        return [(seq, None, VALUE, 0, self.headers) for seq in range(first, first + SENDER_BATCH)]

    def ship(self, batch: list[KafkaRecord]) -> None:
        """Hand `batch` (the next `records`) to the next partition."""
        partition = (self.shipped // SENDER_BATCH) % PARTITIONS
        self.partitions[partition].produce_batch(
            self.producer.produce, self.topic, partition, batch, 0
        )
        self.producer.poll(0)
        self.shipped += len(batch)

    def finish(self, timeout_s: float) -> None:
        """Wait until the broker acknowledged every event; raise if one failed."""
        if self.producer.flush(timeout_s):
            raise RuntimeError(f"bare producer: events left unacknowledged after {timeout_s} s")
        delivered = sum(deliveries.delivered for deliveries in self.partitions)
        if self.failures or delivered != self.shipped:
            raise RuntimeError(
                f"bare producer: {delivered} of {self.shipped} delivered, {self.failures[:3]}"
            )


def producer_cpu_us_per_event(bootstrap: str, events: int) -> float:
    """CPU per event of a `BareProducer`, all of this process's threads (librdkafka's
    included), until the broker acknowledged them all. What the agent's sender cannot go
    below, whatever it does around the producer."""
    bare = BareProducer(bootstrap, TOPIC)
    batches = [bare.records(first) for first in range(0, events, SENDER_BATCH)]
    cpu = time.process_time()
    for batch in batches:
        bare.ship(batch)
    bare.finish(60)
    return (time.process_time() - cpu) * 1e6 / bare.shipped


def ship_at(bare: BareProducer, rate: float, stop: threading.Event) -> tuple[int, float]:
    """Ship `rate` events/s with `bare`, a batch whenever one is due, until `stop`; then
    wait for the broker's acknowledgements. The events shipped and the seconds it took."""
    start, shipped_before = time.monotonic(), bare.shipped
    while not stop.is_set():
        due = start + (bare.shipped - shipped_before + SENDER_BATCH) / rate
        while (left := due - time.monotonic()) > 0 and not stop.is_set():
            bare.producer.poll(max(left, POLL_RESOLUTION_S))
        bare.ship(bare.records(bare.shipped))
    seconds = time.monotonic() - start
    bare.finish(60)
    return bare.shipped - shipped_before, seconds


def shipping_main(bootstrap: str) -> int:
    """The shipping load, a child process: "ready" once connected, then per "ship RATE"
    line a `BareProducer` ships RATE events/s to LOAD_TOPIC until the next line: "pause"
    is answered with how many events it shipped in how many seconds, as JSON; any other
    line (or none) ends it, as any line but "ship RATE" does between passes."""
    bare = BareProducer(bootstrap, LOAD_TOPIC)
    print("ready", flush=True)
    for line in sys.stdin:
        match line.split():
            case ["ship", rate]:
                with ThreadPoolExecutor(1, "bench-shipping") as shipper:
                    stop = threading.Event()
                    shipping = shipper.submit(ship_at, bare, float(rate), stop)
                    paused = sys.stdin.readline().strip() == "pause"
                    stop.set()
                    shipped, seconds = shipping.result()
                if not paused:
                    break
                print(json.dumps({"shipped": shipped, "seconds": seconds}), flush=True)
            case _:
                break
    return 0


RTT_BLOCK = 100  # samples of one side before the next one's, in `interleaved_round_trips`


@dataclass(slots=True)
class RoundTrips:
    """One side of `interleaved_round_trips`: a caller's exchange with its server, its
    latencies, and the CPU seconds the caller's thread and the server's process spent in
    its blocks (busy polling spends some on both ends)."""

    exchange: Callable[[], object]
    server_pid: int
    samples: list[int] = field(default_factory=list)
    caller_cpu_s: float = 0.0
    server_cpu_s: float = 0.0

    def cpu_us_per_round_trip(self) -> tuple[float, float]:
        """(caller, server) CPU microseconds per round trip."""
        count = len(self.samples)
        return self.caller_cpu_s * 1e6 / count, self.server_cpu_s * 1e6 / count


def interleaved_round_trips(sides: Sequence[RoundTrips], profile: Profile) -> None:
    """Sequential exchanges of each side, after untimed warm-up ones, their samples taken
    in blocks of RTT_BLOCK in turn (the order reversed every other round), so that a
    machine whose speed changes within seconds changes it for all of them."""
    clock = time.perf_counter_ns
    for side in sides:
        for _ in range(profile.rtt_warmup):
            side.exchange()
    for block in range(-(-profile.rtt_samples // RTT_BLOCK)):
        for side in sides if block % 2 == 0 else sides[::-1]:
            exchange, out = side.exchange, side.samples
            count = min(RTT_BLOCK, profile.rtt_samples - len(out))
            server_before = process_run_s(side.server_pid)
            caller_before = time.thread_time()
            for _ in range(count):
                t0 = clock()
                exchange()
                out.append(clock() - t0)
            side.caller_cpu_s += time.thread_time() - caller_before
            side.server_cpu_s += process_run_s(side.server_pid) - server_before


def round_trips_us(exchange: Callable[[], object], profile: Profile) -> dict[str, float]:
    """p50, p99, p99.9 and max of sequential exchanges, after untimed warm-up ones."""
    clock = time.perf_counter_ns
    for _ in range(profile.rtt_warmup):
        exchange()
    out = [0] * profile.rtt_samples
    for i in range(profile.rtt_samples):
        t0 = clock()
        exchange()
        out[i] = clock() - t0
    return latency_summary_us(out)


_ECHO = (
    "import socket\npeer = socket.socket(fileno=0)\n"
    "while data := peer.recv(4096): peer.sendall(data)"
)


def python_echo_rtt_us(profile: Profile) -> float:
    """p50 round trip to an echoing Python process: the C echo's floor as Python pays it."""
    mine, theirs = socket.socketpair()
    child = subprocess.Popen([sys.executable, "-c", _ECHO], stdin=theirs.fileno())
    theirs.close()
    with mine:
        p50 = round_trips_us(partial(round_trip, mine, VALUE), profile)["p50_us"]
    child.wait(10)
    return p50


def child_main(agent_path: str, echo_path: str) -> int:
    """A caller process: connected before it says "ready", then a pass per
    "run LANE THREADS SECONDS RELEASE_AT_NS" line until any other line ("stop")."""

    def send_short_lived(topic: str, value: bytes) -> None:
        with Client(agent_path) as caller:
            caller.send(topic, value)

    def echo_short_lived(_topic: str, value: bytes) -> None:
        with connected(echo_path) as sock:
            round_trip(sock, value)

    with Client(agent_path) as client, connected(echo_path) as echo:
        client.ping()
        lanes: dict[str, Callable[[str, bytes], object]] = {
            "agent": client.send,
            "agent_short_lived": send_short_lived,
            "echo": lambda _topic, value: round_trip(echo, value),
            "echo_short_lived": echo_short_lived,
        }
        print("ready", flush=True)
        for line in sys.stdin:
            match line.split():
                case ["run", lane, threads, seconds, release_at_ns]:
                    result = timed_rate(
                        lanes[lane], int(threads), float(seconds), None, int(release_at_ns)
                    )
                    print(json.dumps(asdict(result)), flush=True)
                case _:
                    break
    return 0


def processes_pass(children: Sequence[Child], lane: str, threads: int, seconds: float) -> RatePass:
    """`lane` in every one of `children` at once, as one pass: all events over the union
    of their windows, their threads released together `PROCESS_LEAD_S` after the orders."""
    release_at_ns = time.monotonic_ns() + int(PROCESS_LEAD_S * 1e9)
    for child in children:
        assert child.process is not None and child.process.stdin is not None
        child.process.stdin.write(f"run {lane} {threads} {seconds} {release_at_ns}\n")
        child.process.stdin.flush()
    passes = []
    for child in children:
        if not (line := child.read_line()):
            raise RuntimeError(f"{child.name} exited mid-pass: {child.stderr_tail()}")
        passes.append(RatePass(**json.loads(line)))
    return RatePass(
        sum(p.events for p in passes),
        sum(p.errors for p in passes),
        next((p.first_error for p in passes if p.first_error), None),
        min(p.start_ns for p in passes),
        max(p.end_ns for p in passes),
        sum(p.cpu_s for p in passes),
    )


def instructions_per_round_trip(
    scratch: Path, bootstrap: str, echo: EchoServer, events: int
) -> dict[str, float]:
    """callgrind's instructions per blocking `send()` in a second agent (its unix
    listener's thread, and all its threads: sender and librdkafka too), and per round
    trip in a second echo server, each with one sequential caller."""
    agent = configured_agent(scratch / "callgrind-agent", bootstrap)
    agent_threads, listener_thread = instructions.per_exchange_by_thread(
        [sys.executable, "-m", "eventspool", "agent", "--config", os.fspath(agent.config)],
        agent.socket_path,
        lambda: _sender(Client(agent.socket_path, timeout=60)),
        events,
        marker=b"UnixIntake",
        ready=partial(_routed, agent.socket_path),
    )
    echo_path = scratch / "callgrind-echo.sock"
    echo_threads, _ = instructions.per_exchange_by_thread(
        [os.fspath(echo.binary), os.fspath(echo_path)],
        echo_path,
        lambda: _round_tripper(echo_path),
        events,
    )
    if listener_thread is None:
        raise RuntimeError("no thread of the agent under callgrind ran its unix listener")
    return {
        "agent_listener_thread": listener_thread,
        "agent": round(sum(agent_threads), 1),
        "c_echo": round(sum(echo_threads), 1),
    }


def _routed(socket_path: Path) -> bool:
    """Whether the agent knows the bench topic's partitions: until then its events wait in
    the topic's pending queue, on the Python path, which is not the one measured."""
    with Client(socket_path, timeout=60) as client:
        queues = client.stats()["queues"]
    assert isinstance(queues, list)
    return {queue["partition"] for queue in queues if queue["topic"] == TOPIC} == set(
        range(PARTITIONS)
    )


@contextlib.contextmanager
def _sender(client: Client) -> Iterator[Callable[[], object]]:
    with client:
        yield partial(client.send, TOPIC, VALUE)


@contextlib.contextmanager
def _round_tripper(path: Path) -> Iterator[Callable[[], object]]:
    with connected(path) as sock:
        yield partial(round_trip, sock, VALUE)


def access_rules_toml() -> str:
    """The last rule grants this process's uid the bench topic, so every rule is checked."""
    allowed = [TOPIC, *(f"other-{n}.*" for n in range(ALLOWED_PATTERNS - 1))]
    lines = [f"allowed_topics = {json.dumps(allowed)}"]
    for n in range(ACCESS_RULES):
        uid = os.getuid() if n == ACCESS_RULES - 1 else 100_000 + n
        topics = [*(f"rule-{n}-{k}.*" for k in range(99)), TOPIC]
        lines.append(
            f'[[access]]\nname = "rule-{n}"\nuids = [{uid}]\ntopics = {json.dumps(topics)}'
        )
    return "\n".join(lines)


def add_pass(runs: Runs, name: str, result: RatePass, server_cpu_s: float | None) -> None:
    progress(f"{name}: {result.rate:,.0f}/s")
    if result.errors:
        progress(f"{name}: {result.errors} sends failed, first: {result.first_error}")
    runs.add(f"{name}_rate", result.rate)
    runs.add(f"{name}_errors", result.errors)
    events = max(1, result.events)
    runs.add(f"{name}_client_cpu_us_per_event", result.cpu_s * 1e6 / events)
    if server_cpu_s is not None:
        runs.add(f"{name}_server_cpu_us_per_event", server_cpu_s * 1e6 / events)


# A pass: its name, the server it measures and how to run it for so many seconds.
Lane = tuple[str, AgentProcess | EchoServer, Callable[[float], RatePass]]


def run(args: BenchArgs) -> dict[str, object]:
    profile = QUICK if args.quick else FULL
    anchor_settings = SpoolSettings(queue=QueueSettings(capacity_bytes=CAPACITY_BYTES))
    plain_port, tls_port = find_free_port(), find_free_port()
    with Session(args, "uds") as session, contextlib.ExitStack() as stack:
        scratch = session.scratch
        progress(f"{args.repeats} repetitions, {profile}")
        pki = Pki(scratch / "pki")
        bootstrap = session.broker().bootstrap_servers
        create_topic(bootstrap, TOPIC, PARTITIONS)
        create_topic(bootstrap, LOAD_TOPIC, PARTITIONS)
        echo = stack.enter_context(contextlib.closing(EchoServer(scratch / "echo")))
        polled_echo = stack.enter_context(
            contextlib.closing(EchoServer(scratch / "polled-echo", DEFAULT_BUSY_POLL_US))
        )

        def started(name: str, toml: str) -> AgentProcess:
            agent = start_agent(scratch / name, bootstrap, toml)
            stack.callback(agent.stop)
            return agent

        agent = started("agent", f'tcp_listen = "{TCP_HOST}:{plain_port}"')
        ruled = started("ruled", access_rules_toml())
        cert, key = (json.dumps(os.fspath(path)) for path in pki.issue("localhost", server=True))
        tls = f"[tls]\ncert_file = {cert}\nkey_file = {key}"
        secure = started("secure", f'tcp_listen = "{TCP_HOST}:{tls_port}"\n{tls}')
        anchor = stack.enter_context(Spool(scratch / "anchor-spool", settings=anchor_settings))
        anchor.set_partition_count(TOPIC, PARTITIONS)
        argv = [os.fspath(agent.socket_path), os.fspath(echo.socket_path)]
        children = [
            Child.of_script(f"client {n}", __file__, argv, scratch / f"client-{n}.err", piped=True)
            for n in range(CALLER_PROCESSES)
        ]
        load = Child.of_script(
            "shipping load", __file__, ["ship", bootstrap], scratch / "shipping.err", piped=True
        )
        for child in [*children, load]:
            stack.callback(child.terminate)
            child.start()
        for child in [*children, load]:
            if child.read_line().strip() != "ready":
                raise RuntimeError(f"{child.name} did not connect: {child.stderr_tail()}")
        progress(
            f"broker, agents, echo, anchor spool, shipping load and {CALLER_PROCESSES} callers "
            "ready"
        )
        batching, single, checked = (
            stack.enter_context(Client(path))
            for path in (agent.socket_path, agent.socket_path, ruled.socket_path)
        )
        bare = BareClient(agent.socket_path)
        stack.callback(bare.close)
        plaintext = stack.enter_context(Client(f"tcp://{TCP_HOST}:{plain_port}"))
        context = pki.client_context()
        encrypted = stack.enter_context(Client(f"tcp://{TCP_HOST}:{tls_port}", ssl_context=context))
        echo_caller = stack.enter_context(connected(echo.socket_path))
        polled_caller = stack.enter_context(connected(polled_echo.socket_path))

        def callers(lane: str) -> Callable[[float], RatePass]:
            at_most = profile.callers_seconds
            return lambda seconds: processes_pass(children, lane, 1, min(seconds, at_most))

        threads = CLIENT_THREADS
        groups: list[list[Lane]] = [
            [
                ("one_client", agent, partial(timed_rate, batching.send, threads)),
                ("bare_client", agent, partial(timed_rate, bare.send, threads)),
                ("access_rules", ruled, partial(timed_rate, checked.send, threads)),
            ],
            [
                ("tcp_plain", agent, partial(timed_rate, plaintext.send, threads)),
                ("tcp_tls", secure, partial(timed_rate, encrypted.send, threads)),
            ],
            [
                ("tcp_async_plain", agent, partial(async_rate, plaintext, threads)),
                ("tcp_async_tls", secure, partial(async_rate, encrypted, threads)),
            ],
            [("async", agent, partial(async_rate, batching, threads))],
            [("processes", agent, partial(processes_pass, children[:PROCESSES], "agent", threads))],
            [
                ("processes_16", agent, callers("agent")),
                ("c_echo_processes_16", echo, callers("echo")),
            ],
            [
                ("short_lived", agent, callers("agent_short_lived")),
                ("c_echo_short_lived", echo, callers("echo_short_lived")),
            ],
        ]

        def while_shipping(lane: str, rate: float, measure: Callable[[], float]) -> None:
            """Adds `measure()` as `{lane}_rate` (a floor), measured while the shipping load
            ships `rate` events/s, and the rate it kept as `{lane}_load_rate`."""
            load.tell(f"ship {rate:.0f}")
            floor = measure()
            load.tell("pause")
            if not (answer := load.read_line()):
                raise RuntimeError(f"the shipping load ended: {load.stderr_tail()}")
            shipped = json.loads(answer)
            runs.add(f"{lane}_rate", floor)
            runs.add(f"{lane}_load_rate", shipped["shipped"] / shipped["seconds"])

        def settle(side: AgentProcess | EchoServer) -> None:
            if isinstance(side, AgentProcess):  # an echo server keeps nothing
                side.wait_until_drained(profile.drain_timeout_s)

        runs = Runs()
        try:
            for name, side, run_pass in (lane for group in groups for lane in group):
                if isinstance(side, AgentProcess):
                    progress(f"warm-up {name}: {run_pass(profile.warmup_seconds).rate:,.0f}/s")
                    settle(side)
            anchor_pass(anchor, profile.warmup_seconds)
            for rep in range(args.repeats):
                for group in groups:
                    for name, side, run_pass in alternate(rep, group):
                        cpu = process_cpu_s(side.pid)
                        sent = run_pass(profile.pass_seconds)
                        add_pass(runs, name, sent, process_cpu_s(side.pid) - cpu)
                        settle(side)
                runs.add("handoff_ceiling", handoff_ceiling(CLIENT_THREADS, profile.pass_seconds))
                while_shipping(
                    "shipping_floor",
                    runs.values["one_client_rate"][-1],
                    partial(handoff_echo_rate, threads, profile.pass_seconds, echo.socket_path),
                )
                while_shipping(
                    "processes_16_shipping_floor",
                    runs.values["processes_16_rate"][-1],
                    lambda: callers("echo")(profile.pass_seconds).rate,
                )
                producer_us = producer_cpu_us_per_event(bootstrap, profile.producer_events)
                runs.add("producer_cpu_us_per_event", producer_us)
                runs.add("echo_rtt_p50_us", python_echo_rtt_us(profile))
                trips = {
                    "rtt": RoundTrips(partial(single.send, TOPIC, VALUE), agent.pid),
                    "c_echo_rtt": RoundTrips(partial(round_trip, echo_caller, VALUE), echo.pid),
                    "polled_echo_rtt": RoundTrips(
                        partial(polled_round_trip, polled_caller, VALUE, DEFAULT_BUSY_POLL_US),
                        polled_echo.pid,
                    ),
                }
                interleaved_round_trips(list(trips.values()), profile)
                rtt = latency_summary_us(trips["rtt"].samples)
                for stat in ("p50_us", "p99_us", "p999_us", "max_us"):
                    runs.add(f"rtt_{stat}", rtt[stat])
                for prefix, trip in trips.items():
                    if prefix != "rtt":
                        runs.add(f"{prefix}_p50_us", latency_summary_us(trip.samples)["p50_us"])
                    caller_us, server_us = trip.cpu_us_per_round_trip()
                    runs.add(f"{prefix}_caller_cpu_us_per_round_trip", caller_us)
                    runs.add(f"{prefix}_server_cpu_us_per_round_trip", server_us)
                settle(agent)
                add_pass(runs, "anchor", anchor_pass(anchor, profile.pass_seconds), None)
                summary = f"p50 {rtt['p50_us']:.0f} us p99 {rtt['p99_us']:.0f} us"
                lanes = "; ".join(
                    f"{lane}: "
                    + ", ".join(f"{name} {runs.values[name][-1]:,.0f}/s" for name in names)
                    for lane, names in LANE_FLOORS.items()
                )
                echo_p50, polled_p50 = (
                    runs.values[f"{prefix}_rtt_p50_us"][-1] for prefix in ("c_echo", "polled_echo")
                )
                progress(
                    f"rep {rep + 1}: round trip {summary}, C echo {echo_p50:.1f} us "
                    f"({polled_p50:.1f} busy-polling), "
                    f"bare producer {producer_us:.2f} us of CPU per event; {lanes}"
                )
        except BaseException:
            progress(f"agent log:\n{agent.log_tail()}")
            raise
        counts = None
        if not args.quick and instructions.available():
            events = instructions.QUICK_EVENTS
            counts = instructions_per_round_trip(scratch, bootstrap, echo, events)
            progress(f"instructions per blocking event ({events:,} events): {counts}")
    return build_result(profile, runs, session, counts)


def build_result(
    profile: Profile, runs: Runs, session: Session, counts: dict[str, float] | None
) -> dict[str, object]:
    m = runs.medians()

    def pair(ours: str, anchor: str, digits: int | None = None) -> tuple[float, float]:
        return round(m[ours], digits), round(m[anchor], digits)

    threads = f"{CLIENT_THREADS} threads"
    callers = f"{CALLER_PROCESSES} single-threaded processes"
    echo = "the same processes at a minimal epoll echo server in C"
    ceiling = f"{CLIENT_THREADS} CPython threads woken in turn by one thread, no I/O"
    shared = f"Client.send() through the agent, one client shared by {threads}"
    in_process = "Spool.send() in the application's own process"
    shipping = (  # beside each lane's floor
        "while a bare producer ships as many events/s as ours reached to the broker, on the "
        "same cores"
    )
    rate = partial(figure, unit="events/s")
    echo_cpu = m["c_echo_processes_16_server_cpu_us_per_event"]
    agent_cpu_floor = round(echo_cpu + m["producer_cpu_us_per_event"], 2)
    floors = {  # each key issue 33 names: its figure, ours against a floor in this run
        "rtt_p50_over_echo": figure(
            "uds_rtt_p50_vs_c_echo",
            *pair("rtt_p50_us", "c_echo_rtt_p50_us", 2),
            unit="us",
            title="round trip p50 of one caller's sequential Client.send()",
            anchor_is="a 100-byte round trip to a minimal epoll echo server in C",
            higher_is_better=False,
        ),
        "one_client_16_threads_over_ceiling": rate(
            "uds_rate_one_client_vs_handoff_ceiling",
            *pair("one_client_rate", "handoff_ceiling"),
            title=shared,
            anchor_is=ceiling,
        ),
        "processes_16_over_echo": rate(
            "uds_rate_16_processes_vs_c_echo",
            *pair("processes_16_rate", "c_echo_processes_16_rate"),
            title=f"Client.send() through the agent, {callers}",
            anchor_is=f"{echo}, 100-byte round trips",
        ),
        "short_lived_over_echo": rate(
            "uds_rate_short_lived_vs_c_echo",
            *pair("short_lived_rate", "c_echo_short_lived_rate"),
            title=f"connect, Client.send() of one event, close, from {callers}",
            anchor_is=f"{echo}: connect, one 100-byte round trip, close",
        ),
        "agent_cpu_us_per_event": figure(
            "uds_agent_cpu_per_blocking_event",
            round(m["processes_16_server_cpu_us_per_event"], 2),
            agent_cpu_floor,
            unit="us of CPU",
            title=f"the agent's CPU per event, Client.send() from {callers}",
            anchor_is="its floor: the echo server's CPU per round trip in the same pass of the "
            "same processes, plus a bare producer's per event on the sender's settings",
            higher_is_better=False,
        ),
    }
    # The figure's ratio where it is ours over the floor; the agent's CPU as it is.
    against_floors = {key: floors[key]["ratio"] for key in floors}
    against_floors["rtt_p50_over_echo"] = safe_ratio(*pair("rtt_p50_us", "c_echo_rtt_p50_us", 2))
    # The same against the echo whose ends busy-poll too: what the socket costs when neither
    # end of it blocks.
    against_floors["rtt_p50_over_polled_echo"] = safe_ratio(
        *pair("rtt_p50_us", "polled_echo_rtt_p50_us", 2)
    )
    against_floors["agent_cpu_us_per_event"] = floors["agent_cpu_us_per_event"]["ours"]
    tls_async_ratio = safe_ratio(m["tcp_async_tls_rate"], m["tcp_async_plain_rate"])
    return {
        **rate(FIGURE, *pair("one_client_rate", "anchor_rate"), title=shared, anchor_is=in_process),
        "figures": [
            rate(
                "uds_rate_send_async_one_client",
                *pair("async_rate", "handoff_ceiling"),
                title=f"Client.send_async() through the agent, {threads}, until every future "
                "resolved",
                anchor_is=f"the ceiling of a blocking send(): {ceiling}",
            ),
            rate(
                "uds_rate_one_client_vs_bare_client",
                *pair("one_client_rate", "bare_client_rate"),
                title=shared,
                anchor_is=f"the least a send() shared by {threads} does against the same agent: "
                "callers queue their encoded events, one thread writes them as one SEND and "
                "wakes them on its answer (harness/bare_client.py)",
            ),
            rate(
                "uds_rate_one_client_vs_shipping_floor",
                *pair("one_client_rate", "shipping_floor_rate"),
                title=shared,
                anchor_is=f"this machine's floor for it: {threads} handing off to one that "
                f"makes each batch of them one round trip to the C echo server, {shipping}",
            ),
            rate(
                "uds_rate_16_processes_vs_shipping_floor",
                *pair("processes_16_rate", "processes_16_shipping_floor_rate"),
                title=f"Client.send() through the agent, {callers}",
                anchor_is=f"this machine's floor for it: {echo}, 100-byte round trips, {shipping}",
            ),
            figure(
                "uds_rtt_p50_vs_polled_c_echo",
                *pair("rtt_p50_us", "polled_echo_rtt_p50_us", 2),
                unit="us",
                title="round trip p50 of one caller's sequential Client.send()",
                anchor_is="a 100-byte round trip to the C echo server, both ends busy-polling "
                f"for {DEFAULT_BUSY_POLL_US:g} us before they block, as ours do",
                higher_is_better=False,
            ),
            rate(
                "uds_rate_with_access_rules",
                *pair("access_rules_rate", "one_client_rate"),
                title=f"Client.send() through the agent, {threads}, with {ACCESS_RULES} "
                f"[[access]] rules and {ALLOWED_PATTERNS} allowed_topics patterns",
                anchor_is="the same pass on an agent without them",
            ),
            rate(
                "uds_rate_tcp_tls",
                *pair("tcp_tls_rate", "tcp_plain_rate"),
                title=f"Client.send() over loopback TCP with TLS, {threads}",
                anchor_is="the same pass over loopback TCP in plaintext",
            ),
            rate(
                "uds_rate_8_processes",
                *pair("processes_rate", "anchor_rate"),
                title=f"Client.send() through the agent, {PROCESSES} client processes",
                anchor_is=f"{in_process}, 1 thread",
            ),
            *floors.values(),
            *(
                []
                if counts is None
                else [
                    instructions.instruction_figure(
                        "uds_agent_instructions_per_blocking_event",
                        counts,
                        "agent",
                        "c_echo",
                        title="user-space instructions per Client.send() in the agent, all its "
                        f"threads (its unix listener's: {counts['agent_listener_thread']:,.0f}), "
                        "one caller",
                        anchor_is="the C echo server's per 100-byte round trip",
                    )
                ]
            ),
        ],
        **against_floors,
        # The one-client lane's gap split: the bare client against the ceiling is the
        # agent's part, ours against the bare client the client's.
        "bare_client_16_threads_over_ceiling": safe_ratio(
            *pair("bare_client_rate", "handoff_ceiling")
        ),
        # This machine's floor for the lane against the ceiling (the socket's round trips
        # and the shipping to Kafka on the same cores), and the rate its load kept up.
        "shipping_floor_over_ceiling": safe_ratio(*pair("shipping_floor_rate", "handoff_ceiling")),
        "shipping_load_rate": round(m["shipping_floor_load_rate"]),
        # The same for the 16 caller processes against their echo: their round trips to
        # the C echo server while the load ships as many events/s as ours reached.
        "processes_16_shipping_floor_over_echo": safe_ratio(
            *pair("processes_16_shipping_floor_rate", "c_echo_processes_16_rate")
        ),
        "processes_16_shipping_load_rate": round(m["processes_16_shipping_floor_load_rate"]),
        # The agent's CPU floor per blocking event, and its parts.
        "agent_cpu_floor_us_per_event": agent_cpu_floor,
        "echo_server_cpu_us_per_event": round(echo_cpu, 2),
        "producer_cpu_us_per_event": round(m["producer_cpu_us_per_event"], 2),
        "socket_echo_rtt_p50_us": round(m["echo_rtt_p50_us"], 1),
        # CPU per round trip on each side of the three timed in turn (busy polling, on by
        # default on both sides of ours, spends some on each).
        "rtt_cpu_us_per_round_trip": {
            name: round(m[key], 2)
            for name, key in (
                ("caller", "rtt_caller_cpu_us_per_round_trip"),
                ("agent", "rtt_server_cpu_us_per_round_trip"),
                ("echo_caller", "c_echo_rtt_caller_cpu_us_per_round_trip"),
                ("echo_server", "c_echo_rtt_server_cpu_us_per_round_trip"),
                ("polled_echo_caller", "polled_echo_rtt_caller_cpu_us_per_round_trip"),
                ("polled_echo_server", "polled_echo_rtt_server_cpu_us_per_round_trip"),
            )
        },
        "instructions_per_blocking_event": counts,
        "rate_tcp_async_plaintext": round(m["tcp_async_plain_rate"]),
        "rate_tcp_async_tls": round(m["tcp_async_tls_rate"]),
        "tls_cost_send_async": None if tls_async_ratio is None else round(1 - tls_async_ratio, 4),
        **{f"rtt_{stat}": m[f"rtt_{stat}"] for stat in ("p50_us", "p99_us", "p999_us")},
        "payload_bytes": PAYLOAD_BYTES,
        "settings": {
            **asdict(profile),
            "topic_partitions": PARTITIONS,
            "client_threads": CLIENT_THREADS,
            "client_processes": PROCESSES,
            "caller_processes": CALLER_PROCESSES,
            "access_rules": ACCESS_RULES,
            "allowed_topics_patterns": ALLOWED_PATTERNS,
            "anchor_ring_bytes": CAPACITY_BYTES,
            "busy_poll_us": DEFAULT_BUSY_POLL_US,
        },
        # every repetition's values: rates, errors, CPU per event of the server and clients
        "runs": runs.listed(),
        **session.provenance(broker=None, packages=()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    match child_arguments(argv):
        case ["ship", bootstrap]:
            return shipping_main(bootstrap)
        case [*arguments]:
            return child_main(*arguments)
    return bench_main(
        "Events/s and round trip through the agent's unix socket vs Spool.send()", run, argv
    )


if __name__ == "__main__":
    sys.exit(main())
