"""The eventspool agent against a log-shipping agent: rsyslog with omkafka.

Both ship keyless 100-byte printable values starting ``id=TAG-CALLER-SEQ `` (so each
record in Kafka is matched to its send) from 8 caller threads to a fresh topic of 4
partitions per run, on one embedded broker (tansu, in memory, this machine).

* ours: ``eventspool agent`` as its own process on its defaults (durability ``process``,
  lz4, idempotent, acks=all); the callers share one `Client`: ``send_async`` in the e2e
  runs (every future checked), ``send`` (returns once the event is on disk) when killed.
* the anchor: ``rsyslogd -n`` on its own config and socket; each caller sends one
  datagram ``<14>Nov 21 08:28:43 bench[PID]: VALUE`` per event on a connected unix
  socket, as syslog(3) does, and omkafka gets the value alone. The config is rsyslog's
  documented reliable forwarding: no rate limit, omkafka with lz4, idempotence and
  acks=all, a disk-assisted queue (LinkedList, 100000, saveOnShutdown) retrying forever;
  it spills to disk only when nearly full or on shutdown, so a SIGKILL takes what it holds
  in memory. It runs on the wheel's librdkafka: Debian's 2.0.2 cannot talk to tansu.

Figures, medians over the repetitions, the sides alternating which goes first:

1. end-to-end rate: N events (N/8 per thread, released together) from the first send
   until a consumer process polling every 20 ms has read every id, after 1,000 warm-up
   events shipped and read.
2. caller latency of those sends (p50, p99, p99.9): a datagram ``send`` returns once the
   kernel queued it, ``send_async`` once the client did; ours also until the event is on
   the agent's disk (its future resolved).
3. SIGKILL loss: the threads stream 2,000 events/s in all; once events are readable in
   Kafka the shipper is SIGKILLed at random moments and restarted at once on the same
   directory and socket. A send that raised is counted as failed (its thread pauses
   10 ms). After the drain (ours: STATS show nothing unacknowledged; rsyslog: no record for
   a few seconds) every acknowledged id is looked up in Kafka. The delivered fraction is
   pooled over all kills; each lost event is charged to the first kill after its ack.

Also reported: the callers' send rate, and CPU per event of the shipper and the broker.
"""

from __future__ import annotations

import contextlib
import glob
import itertools
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
from collections import Counter
from collections.abc import Callable, Collection, Iterator, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import Any, TypeAlias

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
PARTITIONS = 4
PAYLOAD_BYTES = 100
CALLER_THREADS = 8
WARMUP_EVENTS = 1_000
WATCH_POLL_S = 0.02
DELIVERY_TIMEOUT_S = 180.0
PROGRESS_EVENTS = 200  # acknowledged after a restart before the next kill is armed
OMKAFKA_GLOBS = ("/usr/lib/rsyslog/omkafka.so", "/usr/lib/*/rsyslog/omkafka.so")
RSYSLOG = "rsyslog + omkafka, disk-assisted queue"
SIDES = ("ours", "anchor")
FAILURES = {"ours": (EventspoolError,), "anchor": (OSError,)}  # a send to a shipper down
LATENCIES = {"p50": "p50", "p99": "p99", "p999": "p99.9"}  # figure names: their labels
KILL_COUNTS = ("kills", "acknowledged", "delivered", "lost", "duplicates", "failed_sends")

Caller = Callable[[bytes], object]
Shipper: TypeAlias = "AgentProcess | Rsyslogd"
SendAll = tuple[int, int, list[int], list[int]]


@dataclass(frozen=True, slots=True)
class Profile:
    events: int  # per e2e run, split evenly over the caller threads
    kill_runs: int  # per side
    kills_per_run: int
    kill_delay_s: tuple[float, float]  # a kill lands this long after the callers resumed
    idle_s: float  # rsyslog's drain: no record for this long
    stream_rate: int = 2_000  # events/s offered by all callers together in the kill runs


QUICK = Profile(40_000, kill_runs=1, kills_per_run=3, kill_delay_s=(0.2, 1.0), idle_s=2.0)
FULL = Profile(200_000, kill_runs=3, kills_per_run=5, kill_delay_s=(0.2, 2.0), idle_s=4.0)

_FILLER = "".join(random.Random(20240601).choices(string.ascii_letters + string.digits, k=100))
_ID = re.compile(rb"id=([0-9A-Za-z]+-[0-9]+-[0-9]+) ")


def event_id(tag: str, caller: int, seq: int) -> str:
    return f"{tag}-{caller}-{seq}"


def make_payload(tag: str, caller: int, seq: int) -> bytes:
    """`PAYLOAD_BYTES` of printable text (syslog is text) that starts with the event's id."""
    head = f"id={event_id(tag, caller, seq)} "
    return (head + _FILLER[: PAYLOAD_BYTES - len(head)]).encode()


def record_id(message: Any) -> str | None:
    """A consumed record's event id, read from its value on both sides."""
    match = _ID.match(message.value() or b"")
    return match.group(1).decode() if match else None


def syslog_header(when: float, pid: int, ident: bytes = b"bench") -> bytes:
    """glibc's syslog(3) prefix of a LOG_USER|LOG_INFO message: ``<14>%h %e %T IDENT[PID]: ``."""
    stamp = time.strftime("%b %e %H:%M:%S", time.localtime(when)).encode()
    return b"<14>%s %s[%d]: " % (stamp, ident, pid)


class SyslogSocket:
    """One caller's connection to rsyslog, used as syslog(3) uses /dev/log: a failed send
    (rsyslogd is down) drops the socket, the next send reconnects."""

    def __init__(self, path: Path) -> None:
        self._path = os.fspath(path)
        self._sock: socket.socket | None = None
        self._header = (-1, b"")  # the second it was made in, and the header

    def send(self, payload: bytes) -> None:
        now = time.time()
        if int(now) != self._header[0]:
            self._header = (int(now), syslog_header(now, os.getpid()))
        try:
            if self._sock is None:
                self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
                self._sock.connect(self._path)
            self._sock.send(self._header[1] + payload)
        except OSError:
            self.close()
            raise

    def close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None


def _quoted(value: str | Path) -> str:
    """A RainerScript string constant."""
    return '"' + os.fspath(value).replace("\\", "\\\\").replace('"', '\\"') + '"'


def render_rsyslog_config(directory: Path, bootstrap: str, topic: str) -> str:
    """The anchor's rsyslog.conf, every path in `directory`."""
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


def find_rsyslogd() -> str | None:
    """rsyslogd, if both it and its omkafka module are installed."""
    found = shutil.which("rsyslogd") or shutil.which("rsyslogd", path="/usr/sbin:/sbin")
    return found if any(glob.glob(pattern) for pattern in OMKAFKA_GLOBS) else None


def bundled_librdkafka(directory: Path) -> Path:
    """A directory for rsyslogd's LD_LIBRARY_PATH: ``librdkafka.so.1``, the library inside
    the confluent-kafka wheel."""
    libs = Path(confluent_kafka.__file__).resolve().parent.parent / "confluent_kafka.libs"
    [library] = libs.glob("librdkafka*.so*")
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "librdkafka.so.1").symlink_to(library)
    return directory


class Rsyslogd(Child):
    """``rsyslogd -n`` with everything in `directory`, started at once; after a `kill`,
    `start_answering` restarts it on the same queue files, as a supervisor would."""

    def __init__(
        self, executable: str, directory: Path, bootstrap: str, topic: str, library_dir: Path
    ) -> None:
        self.socket_path = directory / "log.sock"
        self.log = directory / "rsyslogd.log"
        (directory / "work").mkdir(parents=True, exist_ok=True)
        config = directory / "rsyslog.conf"
        config.write_text(render_rsyslog_config(directory, bootstrap, topic))
        super().__init__("rsyslogd", [], directory / "rsyslogd.out")
        self.argv = ["env", f"LD_LIBRARY_PATH={library_dir}", executable, "-n", "-f", str(config)]
        self.argv += ["-i", str(directory / "rsyslogd.pid")]
        self.start_answering()

    def start_answering(self) -> float:
        """Start it and wait until its socket takes a connection: the seconds that took."""
        began = time.monotonic()
        self.start()
        while time.monotonic() - began < 30.0:
            self.check()
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as probe:
                try:
                    probe.connect(os.fspath(self.socket_path))
                    return time.monotonic() - began
                except OSError:
                    time.sleep(0.01)
        self.terminate()
        raise RuntimeError(f"rsyslogd did not start:\n{self.log_tail()}")

    def log_tail(self) -> str:
        logged = self.log.read_text(errors="replace")[-2000:] if self.log.exists() else ""
        return f"{self.stderr_tail()}\n{logged}"


class AsyncSend:
    """A caller that fires with `Client.send_async()` and goes on, one callback noting each
    acknowledgement's latency: no closure per event and no future kept once settled, as
    objects alive per event cost the cyclic collector time, not the client."""

    def __init__(self, client: Client, topic: str) -> None:
        self._client = client
        self._topic = topic
        self._fired = 0
        self._started: dict[Future[str], int] = {}
        self._on_done = self._settled  # one bound method for every future
        self.ack_ns: list[int] = []
        self.failures: list[BaseException] = []

    def __call__(self, value: bytes) -> None:
        started = time.perf_counter_ns()
        future = self._client.send_async(self._topic, value)
        self._started[future] = started
        future.add_done_callback(self._on_done)
        self._fired += 1

    def _settled(self, future: Future[str]) -> None:
        started = self._started.pop(future)
        if (error := future.exception()) is None:
            self.ack_ns.append(time.perf_counter_ns() - started)
        else:
            self.failures.append(error)

    def wait(self) -> list[int]:
        """The acknowledgement latencies in ns since the last wait; a failed send raises."""
        deadline = time.monotonic() + DELIVERY_TIMEOUT_S
        while len(self.ack_ns) + len(self.failures) < self._fired and time.monotonic() < deadline:
            time.sleep(0.001)  # outside the timed rates
        if failed := self._fired - len(self.ack_ns):
            raise RuntimeError(f"{failed} async sends failed")
        acks, self._fired, self.ack_ns = self.ack_ns, 0, []
        return acks


def reader_main(bootstrap: str, topic: str, tag: str, events: str) -> int:
    """The e2e reader process: "ready" after its first poll, then as a JSON pair how many
    ids arrived and the monotonic ns when the last one did."""
    expected = batches_for(tag, int(events))[1]
    polls = itertools.count()

    def ready(_count: int) -> None:
        if next(polls) == 0:
            print("ready", flush=True)

    seen = read_ids(bootstrap, topic, expected, progress=ready, poll_timeout=WATCH_POLL_S)
    print(json.dumps([len(expected & seen.keys()), time.monotonic_ns()]), flush=True)
    return 0


def send_all(callers: Sequence[Caller], batches: list[list[bytes]]) -> SendAll:
    """Each caller sends its batch, all released together: the monotonic ns of the start
    and of the last return, every send's latency in ns, and every acknowledgement's."""

    def send_batch(send: Caller, batch: Sequence[bytes]) -> list[int]:
        clock = time.perf_counter_ns
        samples = []
        for value in batch:
            t0 = clock()
            send(value)
            samples.append(clock() - t0)
        return samples

    ran = run_together([partial(send_batch, *pair) for pair in zip(callers, batches, strict=True)])
    acks = [ns for caller in callers if isinstance(caller, AsyncSend) for ns in caller.wait()]
    return ran.start_ns, ran.end_ns, [ns for samples in ran.results for ns in samples], acks


def batches_for(tag: str, events: int) -> tuple[list[list[bytes]], set[str]]:
    """`events` payloads split evenly over the callers, and their ids."""
    seqs = range(events // CALLER_THREADS)
    batches = [[make_payload(tag, slot, seq) for seq in seqs] for slot in range(CALLER_THREADS)]
    return batches, {event_id(tag, slot, seq) for slot in range(CALLER_THREADS) for seq in seqs}


def read_ids(bootstrap: str, topic: str, ids: Collection[str], **kw: Any) -> Counter[str]:
    """Each event id in `topic` with its count, read until every one of `ids` came."""
    return consume_event_ids(bootstrap, [topic], ids, DELIVERY_TIMEOUT_S, id_of=record_id, **kw)


def expect_arrived(bootstrap: str, topic: str, ids: Collection[str], what: str) -> None:
    if not read_ids(bootstrap, topic, ids).keys() >= set(ids):
        raise RuntimeError(f"{what} did not all arrive")


class Stream:
    """Caller threads sending new events at a fixed total rate until `stop` is set (the
    work of `run_together`), noting each acknowledged send."""

    def __init__(self, callers: Sequence[Caller], tag: str, rate: int, side: str) -> None:
        self.tag = tag
        self.acked: dict[str, float] = {}  # event id: when its caller was told
        self.failed = [0] * len(callers)
        self.stop = threading.Event()
        self.work = [partial(self._run, slot, send) for slot, send in enumerate(callers)]
        self._interval = len(callers) / rate
        self._failures = FAILURES[side]

    def _run(self, slot: int, send: Caller) -> None:
        next_at = time.monotonic() + random.random() * self._interval
        seq = 0
        while not self.stop.is_set():
            if (pause := next_at - time.monotonic()) > 0:
                time.sleep(pause)
            try:
                send(make_payload(self.tag, slot, seq))
            except self._failures:
                self.failed[slot] += 1
                time.sleep(0.01)
                next_at = time.monotonic()
            else:
                self.acked[event_id(self.tag, slot, seq)] = time.monotonic()
                # A caller that fell behind (blocked, or the shipper was down) does not burst.
                next_at = max(next_at + self._interval, time.monotonic() - self._interval)
            seq += 1

    def wait_for_progress(self, shipper: Shipper) -> None:
        """Until `PROGRESS_EVENTS` more sends were acknowledged: the callers got through."""
        target = len(self.acked) + PROGRESS_EVENTS
        deadline = time.monotonic() + 30.0
        while len(self.acked) < target:
            if shipper.process is None or shipper.process.poll() is not None:
                raise RuntimeError(f"the shipper exited:\n{shipper.log_tail()}")
            if time.monotonic() > deadline:
                raise RuntimeError("the callers made no progress after a restart")
            time.sleep(0.01)


class Contest:
    """The runs of both sides against one broker, each with a shipper of its own."""

    def __init__(self, session: Session, profile: Profile, rsyslogd: str) -> None:
        self.session = session
        self.profile = profile
        self.scratch = session.scratch
        self.broker = session.broker()
        self.bootstrap = self.broker.bootstrap_servers
        libs = bundled_librdkafka(session.scratch / "lib")
        self.rsyslogd = partial(Rsyslogd, rsyslogd, library_dir=libs)
        self.runs = Runs()
        self.kill_runs: list[dict[str, Any]] = []

    @contextlib.contextmanager
    def launched(
        self, side: str, run: str, *, fire_and_go: bool
    ) -> Iterator[tuple[Shipper, list[Caller], str]]:
        """The side's shipper on a fresh topic and directory, and a caller per thread: ours
        share a `Client`, the anchor's have a socket each, as each syslog(3) caller does."""
        directory, topic = self.scratch / run, f"bench-logship-{run}-{os.getpid()}"
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
                shipper = self.rsyslogd(directory, self.bootstrap, topic)
                stack.callback(shipper.stop, 60.0)  # SIGTERM: it saves its queue
                callers = [
                    stack.enter_context(contextlib.closing(SyslogSocket(shipper.socket_path))).send
                    for _ in range(CALLER_THREADS)
                ]
            try:
                yield shipper, callers, topic
            except BaseException:
                progress(f"{side} log:\n{shipper.log_tail()}")
                raise

    def e2e_run(self, side: str, rep: int) -> None:
        """One timed run, its values added to `runs`."""
        run, tag, events = f"{side[0]}{rep}", f"t{side[0]}{rep}", self.profile.events
        with self.launched(side, run, fire_and_go=True) as (shipper, callers, topic):
            warm, warm_ids = batches_for(f"w{run}", WARMUP_EVENTS)
            send_all(callers, warm)
            expect_arrived(self.bootstrap, topic, warm_ids, f"{side}: the warm-up events")
            timed = batches_for(tag, events)[0]
            shipper_cpu, broker_cpu = process_cpu_s(shipper.pid), process_cpu_s(self.broker.pid)
            # The reader is a process of its own, polling before the window opens: it takes
            # no interpreter lock from the callers, and CLOCK_MONOTONIC is shared.
            argv = [self.bootstrap, topic, tag, str(events)]
            stderr = self.scratch / run / "reader.err"
            reader = Child.of_script("reader", __file__, argv, stderr, piped=True)
            try:
                if reader.start().read_line() != "ready\n":
                    raise RuntimeError(f"the Kafka reader did not start: {reader.stderr_tail()}")
                start, sent, latencies, acks = send_all(callers, timed)
                arrived, done_ns = json.loads(reader.read_line() or "[0, 0]")
            finally:
                reader.terminate()
            shipper_cpu = process_cpu_s(shipper.pid) - shipper_cpu
            broker_cpu = process_cpu_s(self.broker.pid) - broker_cpu
        if arrived != (count := len(latencies)):
            raise RuntimeError(f"{side}: {arrived} of {count} in Kafka: {reader.stderr_tail()}")
        latency = latency_summary_us(latencies)
        ack_latency = latency_summary_us(acks) if acks else {}
        values = {
            "rate": count / ((done_ns - start) / 1e9),
            "send_rate": count / ((sent - start) / 1e9),
            **{f"latency_{p}_us": latency[f"{p}_us"] for p in (*LATENCIES, "max")},
            **{f"ack_latency_{p}_us": ack_latency[f"{p}_us"] for p in LATENCIES if ack_latency},
            "cpu_us_per_event": shipper_cpu * 1e6 / count,
            "broker_cpu_us_per_event": broker_cpu * 1e6 / count,
        }
        for key, value in values.items():
            self.runs.add(f"{side}_{key}", value)
        progress(f"e2e rep {rep + 1} {side}: {values['rate']:,.0f} events/s end to end")

    def kill_run(self, side: str, rep: int) -> None:
        """Stream, SIGKILL and restart the shipper `kills_per_run` times, drain, count: the
        run's ledger, added to `kill_runs`."""
        profile = self.profile
        restarts: list[float] = []
        kill_times: list[float] = []
        run = f"k{side[0]}{rep}"
        with self.launched(side, run, fire_and_go=False) as (shipper, callers, topic):
            stream = Stream(callers, f"k{run}", profile.stream_rate, side)

            def kill_while_streaming() -> None:
                try:
                    # Steady state first: killing a shipper that never delivered would
                    # measure its start-up (connect, metadata, producer id).
                    stream.wait_for_progress(shipper)
                    first = stream.acked.copy()
                    expect_arrived(self.bootstrap, topic, first, f"{side}: the first events")
                    for _ in range(profile.kills_per_run):
                        stream.wait_for_progress(shipper)
                        time.sleep(random.uniform(*profile.kill_delay_s))
                        kill_times.append(time.monotonic())
                        shipper.kill()
                        restarts.append(shipper.start_answering())
                    stream.wait_for_progress(shipper)
                finally:
                    stream.stop.set()

            work: list[Callable[[], None]] = [*stream.work, kill_while_streaming]
            streamed = run_together(work)
            acknowledged = stream.acked
            if isinstance(shipper, AgentProcess):  # rsyslog has no such call: the read idles out
                shipper.wait_until_drained(DELIVERY_TIMEOUT_S)
            seen = read_ids(
                self.bootstrap, topic, acknowledged, poll_timeout=0.1, idle_timeout=profile.idle_s
            )
        counted = ledger.tally(acknowledged, seen)
        missing = acknowledged.keys() - seen.keys()
        lost_per_kill, lost_after_last_kill = ledger.losses_by_kill(
            [acknowledged[event] for event in missing], kill_times
        )
        entry = {
            "side": side,
            "kills": profile.kills_per_run,
            "acknowledged": counted.acknowledged,
            "delivered": counted.delivered,
            "lost": counted.lost,
            "duplicates": counted.duplicated,
            "delivered_unacknowledged": counted.unacknowledged_delivered,
            "failed_sends": sum(stream.failed),
            "acknowledged_rate": round(counted.acknowledged / streamed.seconds, 1),
            "restart_s_max": round(max(restarts), 3),
            "lost_per_kill": [asdict(loss) for loss in lost_per_kill],
            "lost_after_last_kill": lost_after_last_kill,
        }
        self.kill_runs.append(entry)
        progress(f"kill run {rep + 1} {side}: {counted.lost:,} of {counted.acknowledged:,} lost")


def run(args: BenchArgs) -> dict[str, object]:
    profile = QUICK if args.quick else FULL
    if (rsyslogd := find_rsyslogd()) is None:
        raise SystemExit("rsyslogd with omkafka is missing: `make rsyslog` installs them")
    about = subprocess.run([rsyslogd, "-v"], capture_output=True, text=True, check=True).stdout
    version = " ".join(about.split("compiled with")[0].split())  # rsyslogd 8.2302.0 (aka ...)
    bundled = str(confluent_kafka.libversion()[0])  # rsyslogd's too: `bundled_librdkafka`
    progress(f"{args.repeats} e2e repetitions, {profile}; {version}, librdkafka {bundled}")
    with Session(args, "logship") as session:  # short: a socket path holds at most 107 bytes
        contest = Contest(session, profile, rsyslogd)
        for rep in range(args.repeats):
            for side in alternate(rep, SIDES):
                contest.e2e_run(side, rep)
        for rep in range(profile.kill_runs):
            for side in alternate(rep, SIDES):
                contest.kill_run(side, rep)
    librdkafka = {"rsyslog": bundled, "eventspool": bundled}
    return build_result(contest, {"rsyslog": version, "librdkafka": librdkafka, "broker": TANSU})


def build_result(contest: Contest, versions: dict[str, object]) -> dict[str, object]:
    m = contest.runs.medians()
    totals = {side: dict.fromkeys(KILL_COUNTS, 0) for side in SIDES}
    for entry in contest.kill_runs:
        for key in KILL_COUNTS:
            totals[entry["side"]][key] += entry[key]
    delivered = {
        side: round(ledger.delivered_fraction(total["delivered"], total["acknowledged"]), 6)
        for side, total in totals.items()
    }

    def compared(
        name: str, key: str, title: str, unit: str = "us", digits: int | None = 1
    ) -> dict[str, object]:
        """Medians of `key`, ours and the anchor's (its send for our ack); `digits`: a cost."""
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

    waits = [
        compared(f"caller_latency_{p}", f"latency_{p}_us", f"Caller's wait per send, {label}")
        for p, label in LATENCIES.items()
    ]
    on_disk = "Ours: send until on disk, {} (anchor: its send)"
    acks = [
        compared(f"ours_ack_latency_{p}", f"ack_latency_{p}_us", on_disk.format(label))
        for p, label in list(LATENCIES.items())[:2]
    ]
    title = "Events/s from callers into Kafka through the local shipper, 8 threads"
    return {
        **compared(FIGURE, "rate", title, "events/s", None),
        "figures": [
            compared(
                "caller_send_rate", "send_rate", "Callers' send rate, 8 threads", "events/s", None
            ),
            *waits,
            *acks,
            figure(
                "sigkill_delivered_fraction",
                delivered["ours"],
                delivered["anchor"],
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
                "CPU of the shipper process per event",
                "us CPU per event",
                2,
            ),
        ],
        "sigkill": {"totals": totals, "ledgers": contest.kill_runs},
        "settings": {
            **asdict(contest.profile),
            "warmup_events": WARMUP_EVENTS,
            "payload_bytes": PAYLOAD_BYTES,
            "topic_partitions": PARTITIONS,
            "caller_threads": CALLER_THREADS,
            "reader_poll_s": WATCH_POLL_S,
            "progress_events_before_each_kill": PROGRESS_EVENTS,
        },
        "runs": contest.runs.listed(),
        **provenance(
            contest.session.args,
            load_start=contest.session.load_start,
            filesystem=contest.session.filesystem,
            versions=versions,
        ),
    }


def main(argv: Sequence[str] | None = None) -> int:
    if (arguments := child_arguments(argv)) is not None:
        return reader_main(*arguments)
    return bench_main("The eventspool agent against rsyslog + omkafka", run, argv)


if __name__ == "__main__":
    sys.exit(main())
