"""The eventspool agent against a log-shipping agent: rsyslog with omkafka.

Both ship the same events to the same embedded broker (tansu, in memory, this machine):
100-byte values that start with ``id=TAG-CALLER-SEQ `` and are padded with fixed
printable filler, so every record in Kafka is matched to its send by id. Keyless, to a
fresh topic of 4 partitions per run. The same number of caller threads on both sides.

* ours: ``eventspool agent`` as its own process, default settings (durability
  ``process``, 32 MiB rings, lz4, idempotent, acks=all); the callers share one
  `eventspool.client.sync.Client`. In the end-to-end runs they fire and go, as syslog
  callers do, with ``send_async(topic, value)``: it returns once the event is queued for
  the agent, and its future resolves once the agent has it on disk (every future is
  checked). In the SIGKILL runs they call ``send(topic, value)``, which returns only then.
* the anchor: ``rsyslogd -n`` with its own config, pid file, work directory and socket.
  Each caller thread writes syslog datagrams as syslog(3) does: a connected unix datagram
  socket, one blocking ``send`` per message ``<14>Nov 21 08:28:43 bench[PID]: VALUE``; a
  template hands omkafka the value alone. The config is what a user who cares about
  reliability writes (the rsyslog documentation's pattern for reliable forwarding):
  imuxsock on its own socket with rate limiting off (nothing dropped silently), omkafka
  with lz4, idempotence and acks=all, and a disk-assisted LinkedList action queue
  (queue.filename, size 100000, maxDiskSpace 1g, saveOnShutdown on) that retries forever
  (resumeRetryCount -1, resubmitOnFailure, keepFailedMessages); `render_rsyslog_config`
  writes it, ``rsyslogd -N1`` checks it. Such a queue spills to disk only above its high
  watermark (90%) or on a clean shutdown: what it holds in memory, the socket's buffer
  and librdkafka's queue die with a SIGKILL. That is what the kill figure measures.
  Debian 12's librdkafka 2.0.2 cannot read tansu's ApiVersion v3 answer, so rsyslogd runs
  on the librdkafka inside the confluent-kafka wheel (``LD_LIBRARY_PATH``, same ABI).

Figures (medians over the repetitions; ours and the anchor alternate, the first one too):

1. end-to-end rate: N events (8 threads x N/8 each, released together) from the first
   send until a consumer in a process of its own, polling every 20 ms (its fetches wait
   as long at the broker), has read all N ids. Before the window each side ships 1,000
   warm-up events and waits for them (connections open).
2. caller latency: every send of those runs timed with ``perf_counter_ns``; p50, p99,
   p99.9. A datagram ``send`` returns once the kernel queued it on rsyslogd's socket, our
   ``send_async`` once the event is queued in the client; ours also reports the
   acknowledgement latency: until its future resolved, the event in the agent's spool.
3. SIGKILL loss: 8 threads stream events at 2,000 events/s in total (below both sides'
   capacity). Once the first events are readable in Kafka, the shipper process gets
   SIGKILL at random moments and is restarted at once on the same spool / queue
   directory and socket; the callers carry on (reconnecting). A send counts as
   acknowledged only if it returned without error; a failed one is counted and the
   thread moves on after 10 ms. Then the callers stop, the shipper drains (ours: until
   its STATS show nothing unacknowledged; rsyslog: until no record arrived for a few
   seconds), and acknowledged ids are compared with the ids in Kafka. The figure is the
   delivered fraction pooled over every kill of every run (a median of a few runs would
   hide the one kill that lands while a restarted shipper is still connecting). Each
   lost event is charged to the first kill after its acknowledgement. syslog(3) returns
   nothing; the raw ``send`` result used here is kinder to the anchor.

Also reported: the callers' own send rate, and CPU per event of the shipper process and
of the broker over the e2e window.
"""

from __future__ import annotations

import contextlib
import ctypes
import glob
import json
import os
import random
import re
import shutil
import socket
import string
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any

import confluent_kafka

from eventspool.broker import create_topic
from eventspool.client.sync import Client
from eventspool.errors import EventspoolError
from eventspool.testing.agent import AgentProcess
from eventspool.verify import consume_event_ids
from harness import ledger
from harness.agent import start_agent
from harness.child import Child, child_arguments
from harness.cli import BenchArgs, bench_main
from harness.cpu import process_cpu_s
from harness.figures import figure
from harness.output import progress, provenance
from harness.runs import Runs, alternate, latency_summary_us
from harness.session import TANSU, Session
from harness.threads import run_together

FIGURE = "agent_e2e_rate_vs_rsyslog"
TOPIC_PREFIX = "bench-logship"
PARTITIONS = 4
PAYLOAD_BYTES = 100
CALLER_THREADS = 8
WARMUP_EVENTS = 1_000
SYSLOG_IDENT = b"bench"
SYSLOG_PRI = 14  # facility user (1) * 8 + severity info (6), syslog(3)'s LOG_USER|LOG_INFO
WATCH_POLL_S = 0.02
DELIVERY_TIMEOUT_S = 180.0
# How often `AsyncSend.wait()` looks whether every callback ran; outside the timed rates.
SETTLE_POLL_S = 0.001
START_TIMEOUT_S = 30.0
STOP_TIMEOUT_S = 60.0
RETRY_PAUSE_S = 0.01
PROGRESS_EVENTS = 200  # acknowledged after a restart before the next kill is armed
PROGRESS_TIMEOUT_S = 30.0
OMKAFKA_GLOBS = ("/usr/lib/rsyslog/omkafka.so", "/usr/lib/*/rsyslog/omkafka.so")
RSYSLOG = "rsyslog + omkafka, disk-assisted queue"
SIDES = ("ours", "anchor")
LATENCY_STATS = {"p50_us": "p50", "p99_us": "p99", "p999_us": "p99.9"}
KILL_COUNTS = ("kills", "acknowledged", "delivered", "lost", "duplicates", "failed_sends")

Caller = Callable[[bytes], object]


@dataclass(frozen=True, slots=True)
class Profile:
    """How much to measure."""

    events: int  # per e2e run, split evenly over the caller threads
    kill_runs: int  # per side
    kills_per_run: int
    kill_delay_s: tuple[float, float]  # a kill lands this long after the callers resumed
    stream_rate: int  # events/s offered by all callers together in the kill runs
    idle_s: float  # rsyslog's drain: no record for this long


QUICK = Profile(
    40_000, kill_runs=1, kills_per_run=3, kill_delay_s=(0.2, 1.0), stream_rate=2_000, idle_s=2.0
)
FULL = Profile(
    200_000, kill_runs=3, kills_per_run=5, kill_delay_s=(0.2, 2.0), stream_rate=2_000, idle_s=4.0
)


# ---- the events ---------------------------------------------------------------------------

_FILLER = "".join(random.Random(20240601).choices(string.ascii_letters + string.digits, k=100))
_ID = re.compile(rb"id=([0-9A-Za-z]+-[0-9]+-[0-9]+) ")


def event_id(tag: str, caller: int, seq: int) -> str:
    return f"{tag}-{caller}-{seq}"


def make_payload(tag: str, caller: int, seq: int) -> bytes:
    """`PAYLOAD_BYTES` of printable text that starts with the event's id (syslog is text)."""
    head = f"id={event_id(tag, caller, seq)} "
    if len(head) > PAYLOAD_BYTES // 2:
        raise ValueError(f"event id {head!r} leaves too little room for the payload")
    return (head + _FILLER[: PAYLOAD_BYTES - len(head)]).encode()


def payload_id(value: bytes | None) -> str | None:
    """The event id at the start of a value made by `make_payload`, else None."""
    match = None if value is None else _ID.match(value)
    return match.group(1).decode() if match else None


def record_id(message: Any) -> str | None:
    """The event id of a consumed Kafka record: read from its value, on both sides."""
    return payload_id(message.value())


def syslog_header(when: float, pid: int, ident: bytes = SYSLOG_IDENT) -> bytes:
    """What glibc's syslog(3) puts before the message on /dev/log: ``<PRI>%h %e %T IDENT[PID]: ``.

    The timestamp is local time without year (RFC 3164), the day padded with a space.
    """
    stamp = time.strftime("%b %e %H:%M:%S", time.localtime(when)).encode()
    return b"<%d>%s %s[%d]: " % (SYSLOG_PRI, stamp, ident, pid)


class SyslogSocket:
    """One application thread's connection to rsyslog, used as syslog(3) uses /dev/log; a
    failed send (rsyslogd died or is not back yet) drops the socket, the next reconnects."""

    def __init__(self, path: Path) -> None:
        self._path = os.fspath(path)
        self._sock: socket.socket | None = None
        self._pid = os.getpid()
        self._second = -1
        self._header = b""

    def send(self, payload: bytes) -> None:
        now = time.time()
        if int(now) != self._second:
            self._second = int(now)
            self._header = syslog_header(now, self._pid)
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
            try:
                sock.connect(self._path)
            except OSError:
                sock.close()
                raise
            self._sock = sock
        try:
            self._sock.send(self._header + payload)
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


# ---- rsyslog ------------------------------------------------------------------------------


def _quoted(value: str | Path) -> str:
    """A RainerScript string constant (backslash and double quote escaped)."""
    return '"' + os.fspath(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_rsyslog_config(directory: Path, bootstrap: str, topic: str) -> str:
    """The anchor's rsyslog.conf, every path in `directory` (the module docstring explains
    its choices)."""
    brokers = ", ".join(_quoted(server) for server in bootstrap.split(","))
    return f"""\
global(workDirectory={_quoted(directory / "work")})
module(load="imuxsock" SysSock.Use="off")
module(load="omkafka")
input(type="imuxsock" Socket={_quoted(directory / "log.sock")} RateLimit.Interval="0"
      Ruleset="to_kafka")
template(name="bench_value" type="list") {{
  property(name="msg" position.from="2")
}}
ruleset(name="to_kafka") {{
  action(type="omkafka" name="to_kafka" broker=[{brokers}] topic={_quoted(topic)}
         template="bench_value" partitions.auto="on"
         confParam=["compression.codec=lz4", "enable.idempotence=true"]
         topicConfParam=["acks=all"]
         resubmitOnFailure="on" keepFailedMessages="on"
         failedMsgFile={_quoted(directory / "work" / "omkafka-failed.data")}
         action.resumeRetryCount="-1"
         queue.type="LinkedList" queue.filename="to_kafka"
         queue.size="100000" queue.maxDiskSpace="1g" queue.saveOnShutdown="on")
}}
action(type="omfile" file={_quoted(directory / "rsyslogd.log")})
"""


def rsyslog_version_line(output: str) -> str:
    """``rsyslogd 8.2302.0 (aka 2023.02)`` from the first line of ``rsyslogd -v``."""
    first = output.strip().splitlines()[0] if output.strip() else ""
    return " ".join(first.replace("compiled with:", "").split())


def find_rsyslogd() -> str | None:
    """rsyslogd, if both it and its omkafka module are installed."""
    found = shutil.which("rsyslogd") or shutil.which("rsyslogd", path="/usr/sbin:/sbin")
    return found if any(glob.glob(pattern) for pattern in OMKAFKA_GLOBS) else None


def ensure_rsyslog() -> str:
    """The rsyslogd executable; without it or omkafka the run stops and says what to do."""
    if (rsyslogd := find_rsyslogd()) is None:
        raise SystemExit(
            "this benchmark needs rsyslogd with omkafka: `make rsyslog` installs the Debian "
            "packages rsyslog and rsyslog-kafka"
        )
    return rsyslogd


def bundled_librdkafka(directory: Path) -> Path | None:
    """A directory holding ``librdkafka.so.1`` -> the library inside the confluent-kafka
    wheel, for rsyslogd's LD_LIBRARY_PATH; None when the wheel uses a system library."""
    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    found = sorted(libs.glob("librdkafka*.so*"))
    if not found:
        return None
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "librdkafka.so.1").symlink_to(found[0])
    return directory


def librdkafka_version(library: str) -> str | None:
    """``rd_kafka_version_str()`` of a librdkafka shared library, or None if it won't load."""
    try:
        lib = ctypes.CDLL(library)
    except OSError:
        return None
    lib.rd_kafka_version_str.restype = ctypes.c_char_p
    raw: bytes = lib.rd_kafka_version_str()
    return raw.decode()


class Rsyslogd(Child):
    """``rsyslogd -n`` on its own config, pid file, work directory and socket, all in
    `directory`: a bench child that runs rsyslogd, not Python, through env(1) for its
    LD_LIBRARY_PATH.

    Started by the constructor; `kill` and `start_answering` restart it on the same work
    directory (its queue files) and socket, as a supervisor would after a crash.
    """

    def __init__(
        self, executable: str, directory: Path, bootstrap: str, topic: str, library_dir: Path | None
    ) -> None:
        self.socket_path = directory / "log.sock"
        self.log = directory / "rsyslogd.log"
        (directory / "work").mkdir(parents=True, exist_ok=True)
        config = directory / "rsyslog.conf"
        config.write_text(render_rsyslog_config(directory, bootstrap, topic))
        env = [] if library_dir is None else ["env", f"LD_LIBRARY_PATH={library_dir}"]
        command = [*env, executable, "-N1", "-f", os.fspath(config)]
        check = subprocess.run(command, capture_output=True, text=True, check=False)
        if check.returncode != 0:
            raise RuntimeError(f"rsyslogd -N1 rejected the config:\n{check.stderr}")
        super().__init__("rsyslogd", [], directory / "rsyslogd.out")
        pid_file = directory / "rsyslogd.pid"
        self.argv = [*env, executable, "-n", "-f", os.fspath(config), "-i", os.fspath(pid_file)]
        self.start_answering()

    def start_answering(self) -> float:
        """Start it (again, after `kill`) and wait until its socket takes a connection (a
        killed rsyslogd leaves its socket file); the seconds that took."""
        began = time.monotonic()
        self.start()
        while time.monotonic() - began < START_TIMEOUT_S:
            self.check()
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
                try:
                    probe.connect(os.fspath(self.socket_path))
                    return time.monotonic() - began
                except OSError:
                    time.sleep(0.01)
        self.terminate()
        raise RuntimeError(f"rsyslogd did not start:\n{self.log_tail()}")

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """SIGTERM, if it still runs (it saves its queue), and wait for it to exit."""
        if self.process is not None and self.process.poll() is None:
            super().stop(timeout)

    def log_tail(self) -> str:
        """Its own output, then the end of what it logged."""
        logged = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        return f"{self.stderr_tail()}\n{logged}"


# ---- the two sides ----------------------------------------------------------------------

Shipper = AgentProcess | Rsyslogd
# What a send raises while the side's shipper is down.
FAILURES: dict[str, tuple[type[BaseException], ...]] = {
    "ours": (EventspoolError,),
    "anchor": (OSError,),
}


class AsyncSend:
    """A caller that hands its event over with `Client.send_async()` and goes on.

    One callback for all its futures notes when the agent had the event on disk (the
    acknowledgement time, from the call) or that it failed; `wait()` waits until every
    callback ran. The caller keeps no future and makes no closure per event, as one that
    fires and goes does not: objects kept per event cost the cyclic collector time that
    grows with how many are alive (it walks each of them again and again), not with the
    client's work.
    """

    def __init__(self, client: Client, topic: str) -> None:
        self._client = client
        self._topic = topic
        self._fired = 0
        self._started: dict[Future[str], int] = {}
        self._on_done = self._settled
        self._failures = threading.Lock()  # callbacks run on whichever thread read the answer
        self.ack_ns: list[int] = []
        self.failed = 0

    def __call__(self, value: bytes) -> object:
        started = time.perf_counter_ns()
        future = self._client.send_async(self._topic, value)
        self._started[future] = started
        future.add_done_callback(self._on_done)
        self._fired += 1
        return None

    def _settled(self, future: Future[str]) -> None:
        started = self._started.pop(future)
        if future.exception() is None:
            self.ack_ns.append(time.perf_counter_ns() - started)
        else:
            with self._failures:
                self.failed += 1

    def wait(self) -> list[int]:
        """The acknowledgement latencies in ns of every send since the last wait; a send
        that failed, or whose future did not resolve within the delivery timeout, is an
        error here, as a failed send is."""
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while len(self.ack_ns) + self.failed < self._fired and time.monotonic() < deadline:
            time.sleep(SETTLE_POLL_S)
        acks, failed = self.ack_ns, self._fired - len(self.ack_ns)
        self._fired, self.ack_ns, self.failed = 0, [], 0
        if failed:
            raise RuntimeError(f"{failed} async sends failed")
        return acks


def settle_async(callers: Sequence[Caller]) -> list[int] | None:
    """Wait for the acknowledgements of async callers: their latencies in ns (None: not async)."""
    waiting = [caller for caller in callers if isinstance(caller, AsyncSend)]
    return [ns for caller in waiting for ns in caller.wait()] if waiting else None


# ---- figure 1 and 2: end-to-end rate and caller latency ---------------------------------


def start_reader(bootstrap: str, topic: str, tag: str, events: int, directory: Path) -> Child:
    """Start reading the topic until every id of `batches_for(tag, events)` is there;
    returns once the reader polled the topic once.

    In a process of its own, started and polling before the window opens: a reader in
    the callers' process would take their interpreter lock for every record it reads,
    and the reader of Kafka is no part of the application whose calls are measured. Its
    time is CLOCK_MONOTONIC, which every process shares.
    """
    argv = [bootstrap, topic, tag, str(events)]
    reader = Child.of_script("reader", __file__, argv, directory / "reader.err", piped=True)
    if reader.start().read_line() != "ready\n":
        reader.terminate()
        raise RuntimeError(f"the Kafka reader did not start: {reader.stderr_tail()}")
    return reader


def reader_main(bootstrap: str, topic: str, tag: str, events: str) -> int:
    """The reader process: "ready" after its first poll, then how many of the ids
    arrived and the monotonic ns when the last one did, as a JSON pair."""
    expected = batches_for(tag, int(events))[1]
    polled = threading.Event()

    def ready(_count: int) -> None:
        if not polled.is_set():
            polled.set()
            print("ready", flush=True)

    seen = consume_event_ids(
        bootstrap,
        [topic],
        expected,
        timeout=DELIVERY_TIMEOUT_S,
        progress=ready,
        id_of=record_id,
        poll_timeout=WATCH_POLL_S,
    )
    print(json.dumps([len(expected & seen.keys()), time.monotonic_ns()]), flush=True)
    return 0


def send_all(
    callers: Sequence[Caller], batches: Sequence[Sequence[bytes]]
) -> tuple[int, int, list[int]]:
    """Each caller sends its batch, all released together; (start, last return, latencies).

    Times are monotonic ns; latencies are per send, in ns. A failed send is an error here.
    """

    def send_batch(send: Caller, batch: Sequence[bytes]) -> list[int]:
        clock = time.perf_counter_ns
        samples = []
        for value in batch:
            t0 = clock()
            send(value)
            samples.append(clock() - t0)
        return samples

    ran = run_together([partial(send_batch, *pair) for pair in zip(callers, batches, strict=True)])
    return ran.start_ns, ran.end_ns, [ns for samples in ran.results for ns in samples]


def batches_for(tag: str, events: int) -> tuple[list[list[bytes]], set[str]]:
    """`events` payloads split evenly over the callers (the remainder is dropped), and
    their ids."""
    seqs = range(events // CALLER_THREADS)
    batches = [[make_payload(tag, slot, seq) for seq in seqs] for slot in range(CALLER_THREADS)]
    return batches, {event_id(tag, slot, seq) for slot in range(CALLER_THREADS) for seq in seqs}


def expect_arrived(bootstrap: str, topic: str, ids: set[str], what: str) -> None:
    """Wait until each of `ids` is readable in `topic`; raise, naming `what`, if one is not."""
    seen = consume_event_ids(bootstrap, [topic], ids, timeout=DELIVERY_TIMEOUT_S, id_of=record_id)
    if not ids <= seen.keys():
        raise RuntimeError(f"{what} did not all arrive")


# ---- figure 3: SIGKILL loss --------------------------------------------------------------


class Stream:
    """Caller threads sending new events at a fixed total rate until `stop` is set: the
    work of `run_together`, its acknowledged sends noted as they come."""

    def __init__(
        self,
        callers: Sequence[Caller],
        tag: str,
        rate: int,
        failures: tuple[type[BaseException], ...],
    ) -> None:
        self.tag = tag
        # Per caller: (seq, when its caller was told) of each acknowledged send.
        self.acked: list[list[tuple[int, float]]] = [[] for _ in callers]
        self.failed = [0] * len(callers)
        self.stop = threading.Event()
        self.work: list[Callable[[], None]] = [
            partial(self._run, slot, send) for slot, send in enumerate(callers)
        ]
        self._interval = len(callers) / rate
        self._failures = failures

    def _run(self, slot: int, send: Caller) -> None:
        acked = self.acked[slot]
        seq = 0
        next_at = time.monotonic() + random.random() * self._interval
        while not self.stop.is_set():
            pause = next_at - time.monotonic()
            if pause > 0:
                time.sleep(pause)
            value = make_payload(self.tag, slot, seq)
            seq += 1
            try:
                send(value)
            except self._failures:
                self.failed[slot] += 1
                time.sleep(RETRY_PAUSE_S)
                next_at = time.monotonic()
                continue
            acked.append((seq - 1, time.monotonic()))
            # A caller that fell behind (blocked, or the shipper was down) does not burst.
            next_at = max(next_at + self._interval, time.monotonic() - self._interval)

    def acknowledged(self) -> int:
        return sum(len(acked) for acked in self.acked)

    def wait_for_progress(self, events: int, shipper: Shipper) -> None:
        """Until `events` more sends were acknowledged: the callers got through again."""
        target = self.acknowledged() + events
        deadline = time.monotonic() + PROGRESS_TIMEOUT_S
        while self.acknowledged() < target:
            if shipper.process is None or shipper.process.poll() is not None:
                raise RuntimeError(f"the shipper exited:\n{shipper.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError("the callers made no progress after a restart")
            time.sleep(0.01)

    def acknowledged_at(self, events: Collection[str]) -> list[float]:
        """When each of `events` (ids of this stream) was acknowledged to its caller."""
        return [
            when
            for slot, acked in enumerate(self.acked)
            for seq, when in acked
            if event_id(self.tag, slot, seq) in events
        ]

    def acknowledged_ids(self) -> set[str]:
        return {
            event_id(self.tag, slot, seq)
            for slot, acked in enumerate(self.acked)
            for seq, _ in acked
        }


class Contest:
    """The runs of both sides against one broker, each with a shipper of its own."""

    def __init__(
        self, session: Session, start_rsyslogd: Callable[[Path, str, str], Rsyslogd]
    ) -> None:
        self.scratch = session.scratch
        self.broker = session.broker()
        self.bootstrap = self.broker.bootstrap_servers
        self.start_rsyslogd = start_rsyslogd
        self.rng = random.Random(int.from_bytes(os.urandom(4), "little"))

    @contextlib.contextmanager
    def launched(
        self, side: str, run: str, *, fire_and_go: bool
    ) -> Iterator[tuple[Shipper, list[Caller], str]]:
        """The side's shipper for a fresh topic in a fresh directory, and its callers, one
        per caller thread, all closed at the end; the shipper's log shown on a failure.

        Ours share one `Client` with default settings, each thread sending with
        `send_async()` when they `fire_and_go`. The anchor's have a socket each, as each
        process calling syslog(3) has one; a datagram send always fires and goes.
        `run` names its directory and topic; the topic is yielded with them.
        """
        directory, topic = self.scratch / run, f"{TOPIC_PREFIX}-{run}-{os.getpid()}"
        create_topic(self.bootstrap, topic, PARTITIONS)
        with contextlib.ExitStack() as stack:
            shipper: Shipper
            if side == "ours":
                shipper = start_agent(directory, self.bootstrap)
                stack.callback(shipper.stop)
                client = stack.enter_context(Client(shipper.socket_path))
                callers: list[Caller] = [
                    AsyncSend(client, topic) if fire_and_go else partial(client.send, topic)
                    for _ in range(CALLER_THREADS)
                ]
            else:
                shipper = self.start_rsyslogd(directory, self.bootstrap, topic)
                stack.callback(shipper.stop)
                sockets = [SyslogSocket(shipper.socket_path) for _ in range(CALLER_THREADS)]
                for sock in sockets:
                    stack.callback(sock.close)
                callers = [sock.send for sock in sockets]
            try:
                yield shipper, callers, topic
            except BaseException:
                progress(f"{side} log:\n{shipper.log_tail()}")
                raise

    def e2e_run(self, side: str, rep: int, events: int) -> dict[str, float]:
        """One timed run on a fresh shipper process and a fresh topic: its values by name."""
        run, bootstrap, broker = f"{side[0]}{rep}", self.bootstrap, self.broker
        with self.launched(side, run, fire_and_go=True) as (shipper, callers, topic):
            warm, warm_ids = batches_for(f"w{run}", WARMUP_EVENTS)
            send_all(callers, warm)
            settle_async(callers)
            expect_arrived(bootstrap, topic, warm_ids, f"{side}: the warm-up events")
            tag = f"t{run}"
            timed = batches_for(tag, events)[0]
            shipper_cpu, broker_cpu = process_cpu_s(shipper.pid), process_cpu_s(broker.pid)
            reader = start_reader(bootstrap, topic, tag, events, self.scratch / run)
            try:
                start, sent, latencies = send_all(callers, timed)
                acks = settle_async(callers)
                arrived, done_ns = json.loads(reader.read_line() or "[0, 0]")
            finally:
                reader.terminate()
            shipper_cpu = process_cpu_s(shipper.pid) - shipper_cpu
            broker_cpu = process_cpu_s(broker.pid) - broker_cpu
        count = len(latencies)
        if arrived != count:
            raise RuntimeError(
                f"{side}: only {arrived} of {count} events reached Kafka within "
                f"{DELIVERY_TIMEOUT_S} s: {reader.stderr_tail()}"
            )
        latency = latency_summary_us(latencies)
        # ours also until its future resolved: the event on disk in the agent
        ack_latency = {} if acks is None else latency_summary_us(acks)
        return {
            "rate": count / ((done_ns - start) / 1e9),  # until all readable in Kafka
            "send_rate": count / ((sent - start) / 1e9),  # until the last send returned
            **{f"latency_{stat}": latency[stat] for stat in (*LATENCY_STATS, "max_us")},
            **{f"ack_latency_{stat}": ack_latency[stat] for stat in LATENCY_STATS if ack_latency},
            "cpu_us_per_event": shipper_cpu * 1e6 / count,
            "broker_cpu_us_per_event": broker_cpu * 1e6 / count,
        }

    def kill_run(self, side: str, rep: int, profile: Profile) -> dict[str, Any]:
        """Stream, SIGKILL the shipper `kills_per_run` times, restart it each time, then count:
        the run's ledger as the result lists it."""
        restarts: list[float] = []
        kill_times: list[float] = []
        run, bootstrap = f"k{side[0]}{rep}", self.bootstrap
        with self.launched(side, run, fire_and_go=False) as (shipper, callers, topic):
            stream = Stream(callers, f"k{run}", profile.stream_rate, FAILURES[side])

            def kill_while_streaming() -> None:
                try:
                    # Steady state first: a kill of a shipper that never delivered measures its
                    # start-up (connect, metadata, producer id), not its design.
                    stream.wait_for_progress(PROGRESS_EVENTS, shipper)
                    first = stream.acknowledged_ids()
                    expect_arrived(bootstrap, topic, first, f"{side}: the first events")
                    for _ in range(profile.kills_per_run):
                        stream.wait_for_progress(PROGRESS_EVENTS, shipper)
                        time.sleep(self.rng.uniform(*profile.kill_delay_s))
                        kill_times.append(time.monotonic())
                        shipper.kill()
                        restarts.append(shipper.start_answering())
                    stream.wait_for_progress(PROGRESS_EVENTS, shipper)
                finally:
                    stream.stop.set()

            streamed = run_together([*stream.work, kill_while_streaming])
            drain_began = time.monotonic()
            expected = stream.acknowledged_ids()
            if isinstance(shipper, AgentProcess):  # rsyslog has no such call: the read idles out
                shipper.wait_until_drained(DELIVERY_TIMEOUT_S)
            seen = consume_event_ids(
                bootstrap,
                [topic],
                expected,
                timeout=DELIVERY_TIMEOUT_S,
                id_of=record_id,
                poll_timeout=0.1,
                idle_timeout=profile.idle_s,
            )
            drain_s = round(time.monotonic() - drain_began, 2)
        counted = ledger.tally(expected, seen)
        missing = expected - seen.keys()
        lost_per_kill, lost_after_last_kill = ledger.losses_by_kill(
            stream.acknowledged_at(missing), kill_times
        )
        return {
            "side": side,
            "kills": profile.kills_per_run,
            "acknowledged": counted.acknowledged,
            "delivered": counted.delivered,
            "lost": counted.lost,
            "duplicates": counted.duplicated,
            # a send failed by a kill whose event got through
            "delivered_unacknowledged": counted.unacknowledged_delivered,
            "delivered_fraction": round(counted.delivered_fraction, 6),
            "failed_sends": sum(stream.failed),
            "offered_rate": profile.stream_rate,
            "acknowledged_rate": round(counted.acknowledged / streamed.seconds, 1),
            "restart_s_max": round(max(restarts), 3),
            "drain_s": drain_s,
            "lost_per_kill": [asdict(loss) for loss in lost_per_kill],
            "lost_after_last_kill": lost_after_last_kill,
            "lost_examples": sorted(missing)[:3],
        }


# ---- main -------------------------------------------------------------------------------


def run(args: BenchArgs) -> dict[str, object]:
    profile = QUICK if args.quick else FULL
    rsyslogd = ensure_rsyslog()
    version = rsyslog_version_line(
        subprocess.run([rsyslogd, "-v"], capture_output=True, text=True, check=True).stdout
    )
    session = Session(args, "logship")  # short: a unix socket path holds at most 107 bytes
    library_dir = bundled_librdkafka(session.scratch / "lib")
    librdkafka = {
        "rsyslog": librdkafka_version(
            os.fspath(library_dir / "librdkafka.so.1") if library_dir else "librdkafka.so.1"
        ),
        "system": librdkafka_version("librdkafka.so.1"),
        "eventspool": str(confluent_kafka.libversion()[0]),
    }
    progress(
        f"{args.repeats} e2e repetitions, {profile}; {version}, librdkafka {librdkafka['rsyslog']}"
    )
    runs = Runs()
    kill_runs: list[dict[str, Any]] = []
    with session:
        contest = Contest(session, partial(Rsyslogd, rsyslogd, library_dir=library_dir))
        for rep in range(args.repeats):
            for name in alternate(rep, SIDES):
                result = contest.e2e_run(name, rep, profile.events)
                for key, value in result.items():
                    runs.add(f"{name}_{key}", value)
                progress(
                    f"e2e rep {rep + 1}/{args.repeats} {name:6}: {result['rate']:>8,.0f} events/s "
                    f"end to end, callers {result['send_rate']:>8,.0f}/s, send p50 "
                    f"{result['latency_p50_us']:.0f} us p99 {result['latency_p99_us']:.0f} us"
                )
        for rep in range(profile.kill_runs):
            for name in alternate(rep, SIDES):
                entry = contest.kill_run(name, rep, profile)
                kill_runs.append(entry)
                runs.add(f"{name}_delivered_fraction", entry["delivered_fraction"])
                progress(
                    f"kill run {rep + 1}/{profile.kill_runs} {name:6}: "
                    + ", ".join(f"{entry[key]:,} {key}" for key in KILL_COUNTS)
                    + f"; lost per kill {[loss['lost'] for loss in entry['lost_per_kill']]}"
                )
    versions = {"rsyslog": version, "librdkafka": librdkafka, "broker": TANSU}
    return build_result(profile, runs, kill_runs=kill_runs, session=session, versions=versions)


def build_result(
    profile: Profile,
    runs: Runs,
    *,
    kill_runs: list[dict[str, Any]],
    session: Session,
    versions: dict[str, Any],
) -> dict[str, object]:
    m = runs.medians()
    by_side = {side: [k for k in kill_runs if k["side"] == side] for side in SIDES}
    totals = {
        side: {key: sum(int(k[key]) for k in runs_of) for key in KILL_COUNTS}
        for side, runs_of in by_side.items()
    }
    # Loss is pooled over every kill, not the median of runs: one kill that lands while a
    # restarted shipper is still connecting can take most of a run's loss, and a median
    # of a few runs would hide exactly that.
    pooled = {
        side: ledger.delivered_fraction(total["delivered"], total["acknowledged"])
        for side, total in totals.items()
    }

    def compared(
        name: str, key: str, unit: str, title: str, digits: int | None = None
    ) -> dict[str, object]:
        """The figure `name`: the median of ours' `key` against the anchor's (for the
        acknowledgement latency, the anchor's send latency); with `digits`, a cost, where
        lower is better."""
        ours, anchor = m[f"ours_{key}"], m[f"anchor_{key.removeprefix('ack_')}"]
        return figure(
            name,
            round(ours, digits),
            round(anchor, digits),
            unit=unit,
            title=title,
            anchor_is=RSYSLOG,
            higher_is_better=digits is None,
        )

    latencies = [
        (f"latency_{stat.removesuffix('_us')}", f"latency_{stat}", label)
        for stat, label in LATENCY_STATS.items()
    ]
    # (figure, key, title): every caller's wait, and ours until the event is on disk
    waits = [
        (f"caller_{name}", key, f"Caller's wait per send, {label}")
        for name, key, label in latencies
    ] + [
        (f"ours_ack_{name}", f"ack_{key}", f"Ours: send until on disk, {label} (anchor: its send)")
        for name, key, label in latencies[:2]
    ]
    figures = [
        compared("caller_send_rate", "send_rate", "events/s", "Callers' send rate, 8 threads"),
        *(compared(name, key, "us", title, 1) for name, key, title in waits),
        figure(
            "sigkill_delivered_fraction",
            round(pooled["ours"], 6),
            round(pooled["anchor"], 6),
            unit="fraction",
            title="Acknowledged events found in Kafka after SIGKILLs of the shipper",
            anchor_is=RSYSLOG,
        )
        | {"random_anchor": True},
        ledger.lost_figure(
            "sigkill_acknowledged_lost",
            totals["ours"]["lost"],
            totals["anchor"]["lost"],
            title="Acknowledged events lost to SIGKILLs of the shipper",
            anchor_is=RSYSLOG,
        )
        | {"unit": "events, all kills"},
        compared(
            "shipper_cpu_us_per_event",
            "cpu_us_per_event",
            "us CPU per event",
            "CPU of the shipper process per event",
            2,
        ),
    ]
    title = "Events/s from callers into Kafka through the local shipper, 8 threads"
    return {
        **compared(FIGURE, "rate", "events/s", title),
        "figures": figures,
        "latency_us": {
            side: {
                stat: round(m[f"{side}_latency_{stat}"], 1) for stat in (*LATENCY_STATS, "max_us")
            }
            for side in SIDES
        },
        "ack_latency_us": {stat: round(m[f"ours_ack_latency_{stat}"], 1) for stat in LATENCY_STATS},
        "sigkill": {
            "totals": totals,
            "lost_per_kill": {
                side: ledger.loss_spread(
                    [loss["lost"] for k in runs_of for loss in k["lost_per_kill"]]
                )
                for side, runs_of in by_side.items()
            },
            "delivered_fraction_median_of_runs": {
                side: round(m[f"{side}_delivered_fraction"], 6) for side in SIDES
            },
            "ledgers": kill_runs,
        },
        "broker_cpu_us_per_event": {
            side: round(m[f"{side}_broker_cpu_us_per_event"], 2) for side in SIDES
        },
        "settings": {
            **asdict(profile),
            "warmup_events": WARMUP_EVENTS,
            "payload_bytes": PAYLOAD_BYTES,
            "topic_partitions": PARTITIONS,
            "caller_threads": CALLER_THREADS,
            "reader_poll_s": WATCH_POLL_S,
            "progress_events_before_each_kill": PROGRESS_EVENTS,
        },
        "runs": runs.listed(),
        **provenance(
            session.args,
            load_start=session.load_start,
            filesystem=session.filesystem,
            versions=versions,
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    if (arguments := child_arguments(argv)) is not None:
        return reader_main(*arguments)
    return bench_main("The eventspool agent against rsyslog + omkafka", run, argv)


if __name__ == "__main__":
    sys.exit(main())
