"""Events/s and round trip through the agent's unix socket, against in-process `Spool.send()`.

What one run measures (each figure is the median over the repetitions):

1. ours: events/s from one client shared by `CLIENT_THREADS` threads released together,
   each calling `send()` in a loop for a fixed time (the client pipelines their requests
   over one connection): events acknowledged / wall time from the release to the last
   thread's end. The same with `send_async()`, until every future resolved. Beside them
   two facts of this machine that bound a blocking `send()`: the rate at which one
   CPython thread can wake `CLIENT_THREADS` others in turn (every answered `send()` is
   one such wake-up), and the round trip of 20 bytes through a socket pair to an echo
   process.
2. The same from `PROCESSES` client processes at once (this script with ``--child``,
   started and connected before the first pass), each one `Client` shared by
   `CLIENT_THREADS` threads.
3. Round trip: one thread, sequential `send()` on its own `Client`, `perf_counter_ns`
   around every call; p50/p99/p99.9.
4. The anchor: `Spool.send()` in this process, one thread, on a spool with the agent's
   defaults (durability `process`, 32 MiB rings) and no sender, emptied between passes.
5. The access checks: pass 1 on a second agent whose agent.toml has `ACCESS_RULES`
   [[access]] rules of 100 topic patterns each and `ALLOWED_PATTERNS` allowed_topics
   patterns, alternating with pass 1; the figure is its rate against pass 1's.
6. TLS: pass 1 over loopback TCP, in plaintext to the first agent and with TLS to a third
   (certificates made with openssl), alternating; the figure is TLS against plaintext.

Every event is keyless with the same 100-byte value, to a topic of `PARTITIONS`
partitions. Each agent is `eventspool agent` as its own process with a generated
agent.toml; its sender ships to a tansu broker during the passes, as in production, and
every pass starts once the agent's STATS show no unacknowledged event. The agent's CPU
per event (from /proc, all its threads) is reported for each pass. Goals from the
issues, reported and not asserted: >= 200k events/s from one client shared by 16
threads, round-trip p50 < 50 us, access checks costing under 5% of the rate.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import random
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from concurrent.futures import wait as futures_wait
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import IO, Any

from eventspool.broker import create_topic
from eventspool.broker.local import find_free_port
from eventspool.client.sync import Client
from eventspool.config import MIB, QueueSettings, SpoolSettings
from eventspool.errors import EventspoolError
from eventspool.pipeline import Spool
from eventspool.testing.agent import AgentProcess
from eventspool.testing.tls import Pki, have_openssl
from harness.cli import BenchArgs, bench_main
from harness.cpu import process_cpu_s
from harness.figures import figure
from harness.output import progress
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
CAPACITY_BYTES = 32 * MIB  # the default ring capacity, of the agent and of the anchor
GOAL_RATE = 200_000
GOAL_RTT_P50_US = 50.0
# The access checks ([[access]] rules, allowed_topics) may cost at most this share of the rate.
GOAL_ACCESS_COST = 0.05
ACCESS_RULES = 10
ALLOWED_PATTERNS = 1000
TCP_HOST = "127.0.0.1"
CHILD_FLAG = "--child"
_START_TIMEOUT_S = 30.0

SendFn = Callable[[str, bytes], object]


@dataclass(frozen=True, slots=True)
class Profile:
    """How long to measure: passes are timed, so their size follows whatever rate we get."""

    pass_seconds: float
    warmup_seconds: float
    rtt_samples: int
    rtt_warmup: int
    drain_timeout_s: float


QUICK = Profile(
    pass_seconds=1.0, warmup_seconds=0.5, rtt_samples=2_000, rtt_warmup=200, drain_timeout_s=60
)
FULL = Profile(
    pass_seconds=3.0, warmup_seconds=1.0, rtt_samples=20_000, rtt_warmup=1_000, drain_timeout_s=120
)


def payload() -> bytes:
    """The same 100 bytes in every process, so every pass sends the same events."""
    return random.Random(20240601).randbytes(PAYLOAD_BYTES)


# ---- timed passes ---------------------------------------------------------------------


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
    send: SendFn, value: bytes, threads: int, seconds: float, max_events: int | None = None
) -> RatePass:
    """`threads` threads call `send(TOPIC, value)` until `seconds` are up (or `max_events`).

    An error is counted, not raised: a refused event must not stop the pass, and shows in
    the result.
    """
    stop = threading.Event()
    limit = max_events // threads if max_events is not None else None

    def loop() -> tuple[int, int, str | None]:
        call, topic, done = send, TOPIC, stop.is_set
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

    ran = run_together([loop] * threads, stop=stop, stop_after_s=seconds)
    first_errors = [first for _, _, first in ran.results if first]
    return RatePass(
        events=sum(sent for sent, _, _ in ran.results),
        errors=sum(failed for _, failed, _ in ran.results),
        first_error=first_errors[0] if first_errors else None,
        start_ns=ran.start_ns,
        end_ns=ran.end_ns,
        cpu_s=ran.cpu_s,
    )


def round_trips(client: Client, value: bytes, samples: int, warmup: int) -> list[int]:
    """Nanoseconds of each of `samples` sequential sends, after `warmup` untimed ones."""
    send = client.send
    topic = TOPIC
    clock = time.perf_counter_ns
    for _ in range(warmup):
        send(topic, value)
    out = [0] * samples
    for i in range(samples):
        t0 = clock()
        send(topic, value)
        out[i] = clock() - t0
    return out


def async_rate(client: Client, value: bytes, threads: int, seconds: float) -> RatePass:
    """`threads` threads fire `send_async()` for `seconds`; the pass ends when every future
    resolved, so the rate is of events on disk in the agent, not of calls returned."""
    futures: list[Future[str]] = []

    def fire(topic: str, payload: bytes) -> None:
        futures.append(client.send_async(topic, payload))

    fired = timed_rate(fire, value, threads, seconds)
    cpu_before = time.process_time()
    futures_wait(futures)
    end_ns = time.monotonic_ns()
    refused = [future.exception() for future in futures if future.exception() is not None]
    first = fired.first_error or (f"{type(refused[0]).__name__}: {refused[0]}" if refused else None)
    return RatePass(
        events=len(futures) - len(refused),
        errors=fired.errors + len(refused),
        first_error=first,
        start_ns=fired.start_ns,
        end_ns=end_ns,
        cpu_s=fired.cpu_s + time.process_time() - cpu_before,
    )


def handoff_ceiling(threads: int, seconds: float) -> float:
    """Hand-offs/s when each of `threads` threads waits on its own lock and one more thread
    releases them in turn, with no I/O at all: the most a blocking `send()` shared by that
    many threads can reach in one CPython process on this machine, since every answered
    send wakes its caller."""
    locks = [threading.Lock() for _ in range(threads)]
    for lock in locks:
        lock.acquire()
    ready: queue.SimpleQueue[int] = queue.SimpleQueue()
    stop = threading.Event()
    counts = [0] * threads

    def caller(slot: int) -> None:
        while not stop.is_set():
            ready.put(slot)
            locks[slot].acquire()
            counts[slot] += 1

    def waker() -> None:
        while (slot := ready.get()) >= 0:
            with contextlib.suppress(RuntimeError):  # released by the clean-up below
                locks[slot].release()

    workers = [threading.Thread(target=caller, args=(n,), daemon=True) for n in range(threads)]
    releaser = threading.Thread(target=waker, daemon=True)
    started = time.monotonic()
    for thread in [*workers, releaser]:
        thread.start()
    time.sleep(seconds)
    stop.set()
    elapsed = time.monotonic() - started
    total = sum(counts)
    ready.put(-1)
    releaser.join(5)
    for lock in locks:  # a caller that queued itself after the stop is still waiting
        with contextlib.suppress(RuntimeError):
            lock.release()
    for thread in workers:
        thread.join(5)
    return total / elapsed


_ECHO = (
    "import os, socket, sys\n"
    "peer = socket.socket(fileno=int(sys.argv[1]))\n"
    "while data := peer.recv(64):\n"
    "    peer.sendall(data)\n"
)


def socket_echo_rtt_us(samples: int) -> float:
    """p50 round trip of 20 bytes through a unix socket pair to an echoing process: the
    floor of any request-answer exchange between two processes here (two wake-ups)."""
    mine, theirs = socket.socketpair()
    child = subprocess.Popen(
        [sys.executable, "-c", _ECHO, str(theirs.fileno())], pass_fds=[theirs.fileno()]
    )
    theirs.close()
    try:
        times = []
        for _ in range(samples):
            t0 = time.perf_counter_ns()
            mine.sendall(b"x" * 20)
            mine.recv(64)
            times.append(time.perf_counter_ns() - t0)
    finally:
        mine.close()
        child.wait(10)
    return latency_summary_us(times)["p50_us"]


# ---- client processes -------------------------------------------------------------------


def child_main(argv: Sequence[str]) -> int:
    """``--child SOCKET THREADS``: connect, say "ready", then run a pass per "run SECONDS"."""
    socket_path, threads = argv[0], int(argv[1])
    value = payload()
    with Client(socket_path) as client:
        client.ping()
        print("ready", flush=True)
        for line in sys.stdin:
            command = line.split()
            if not command or command[0] != "run":
                break
            result = timed_rate(client.send, value, threads, float(command[1]))
            print(json.dumps(asdict(result)), flush=True)
    return 0


class ClientProcesses:
    """`count` client processes, each connected to the agent and waiting for "run"."""

    def __init__(self, socket_path: Path, count: int, threads: int) -> None:
        self._processes: list[subprocess.Popen[str]] = []
        for _ in range(count):
            self._processes.append(
                subprocess.Popen(
                    [sys.executable, __file__, CHILD_FLAG, os.fspath(socket_path), str(threads)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    text=True,
                )
            )
        for process in self._processes:
            if self._stdout(process).readline().strip() != "ready":
                raise RuntimeError(f"client process {process.pid} did not become ready")

    @staticmethod
    def _stdin(process: subprocess.Popen[str]) -> IO[str]:
        assert process.stdin is not None
        return process.stdin

    @staticmethod
    def _stdout(process: subprocess.Popen[str]) -> IO[str]:
        assert process.stdout is not None
        return process.stdout

    def run(self, seconds: float) -> list[RatePass]:
        """One pass in every process at once; their results, in process order."""
        for process in self._processes:
            stdin = self._stdin(process)
            stdin.write(f"run {seconds}\n")
            stdin.flush()
        results = []
        for process in self._processes:
            line = self._stdout(process).readline()
            if not line:
                raise RuntimeError(f"client process {process.pid} exited mid-pass")
            results.append(RatePass(**json.loads(line)))
        return results

    def close(self) -> None:
        for process in self._processes:
            if process.poll() is None and process.stdin is not None:
                with contextlib.suppress(BrokenPipeError):
                    process.stdin.close()
        for process in self._processes:
            try:
                process.wait(10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
            if process.stdout is not None:
                process.stdout.close()


def combine(passes: Sequence[RatePass]) -> RatePass:
    """Passes that ran at once, as one: all events over the union of their windows."""
    errors = [p.first_error for p in passes if p.first_error]
    return RatePass(
        events=sum(p.events for p in passes),
        errors=sum(p.errors for p in passes),
        first_error=errors[0] if errors else None,
        start_ns=min(p.start_ns for p in passes),
        end_ns=max(p.end_ns for p in passes),
        cpu_s=sum(p.cpu_s for p in passes),
    )


# ---- the agent --------------------------------------------------------------------------


def start_agent(directory: Path, bootstrap: str, extra: str = "") -> AgentProcess:
    """`eventspool agent` on its defaults (the spool's own max_event_bytes too), `extra`
    being more [agent] keys, then tables such as [[access]]; returns once it answers."""
    directory.mkdir(parents=True, exist_ok=True)
    agent = AgentProcess(
        directory,
        bootstrap,
        extra,
        spool_dir=directory / "agent-spool",
        max_event_bytes=SpoolSettings().max_event_bytes,
    )
    agent.start_answering(_START_TIMEOUT_S)
    return agent


def tcp_listener_toml(port: int, tls: tuple[Path, Path] | None = None) -> str:
    """A loopback TCP listener, with TLS when given the server's (certificate, key)."""
    listen = f'tcp_listen = "{TCP_HOST}:{port}"\n'
    if tls is None:
        return listen
    cert, key = (json.dumps(os.fspath(path)) for path in tls)
    return f"{listen}[tls]\ncert_file = {cert}\nkey_file = {key}\n"


def access_rules_toml() -> str:
    """ACCESS_RULES [[access]] rules and ALLOWED_PATTERNS allowed_topics patterns, the
    last rule granting this process's uid the bench topic among its patterns."""
    allowed = [TOPIC, *(f"other-{n}.*" for n in range(ALLOWED_PATTERNS - 1))]
    lines = [f"allowed_topics = {json.dumps(allowed)}"]
    for n in range(ACCESS_RULES):
        uid = os.getuid() if n == ACCESS_RULES - 1 else 100_000 + n
        topics = [*(f"rule-{n}-{k}.*" for k in range(99)), TOPIC]
        lines.append(
            f'[[access]]\nname = "rule-{n}"\nuids = [{uid}]\ntopics = {json.dumps(topics)}'
        )
    return "\n".join(lines)


# ---- the anchor ---------------------------------------------------------------------------


def anchor_pass(spool: Spool, value: bytes, seconds: float) -> RatePass:
    fits = fitting_events(PARTITIONS, CAPACITY_BYTES, PAYLOAD_BYTES)
    result = timed_rate(spool.send, value, 1, seconds, fits)
    expect_emptied(spool, result.events)
    return result


# ---- main -------------------------------------------------------------------------------


def add_pass(runs: Runs, name: str, result: RatePass, agent_cpu_s: float | None) -> None:
    """The pass's rate, errors and CPU per event (agent's, and the clients')."""
    if result.errors:
        progress(f"{name}: {result.errors} sends failed, first: {result.first_error}")
    runs.add(f"{name}_rate", result.rate)
    runs.add(f"{name}_errors", result.errors)
    events = max(1, result.events)
    runs.add(f"{name}_client_cpu_us_per_event", result.cpu_s * 1e6 / events)
    if agent_cpu_s is not None:
        runs.add(f"{name}_agent_cpu_us_per_event", agent_cpu_s * 1e6 / events)


def run(args: BenchArgs) -> dict[str, object]:
    if not have_openssl():
        raise SystemExit("the TLS pass makes its certificates with openssl, and none was found")
    profile = QUICK if args.quick else FULL
    value = payload()
    runs = Runs()
    facts: dict[str, Any] = {}
    anchor_settings = SpoolSettings(queue=QueueSettings(capacity_bytes=CAPACITY_BYTES))
    plain_port, tls_port = find_free_port(), find_free_port()
    with Session(args, "uds") as session, contextlib.ExitStack() as stack:
        scratch = session.scratch
        progress(
            f"profile {'quick' if args.quick else 'full'}: {args.repeats} repetitions, passes "
            f"of {profile.pass_seconds}s, {profile.rtt_samples} round trips"
        )
        pki = Pki(scratch / "pki")
        bootstrap = session.broker().bootstrap_servers
        create_topic(bootstrap, TOPIC, PARTITIONS)

        def stopped_at_end(agent: AgentProcess) -> AgentProcess:
            stack.callback(agent.stop)
            return agent

        agent = stopped_at_end(start_agent(scratch, bootstrap, tcp_listener_toml(plain_port)))
        ruled = stopped_at_end(start_agent(scratch / "ruled", bootstrap, access_rules_toml()))
        server_tls = pki.issue("localhost", server=True)
        secure = stopped_at_end(
            start_agent(scratch / "secure", bootstrap, tcp_listener_toml(tls_port, server_tls))
        )
        tcp = TcpTargets(
            f"tcp://{TCP_HOST}:{plain_port}", f"tcp://{TCP_HOST}:{tls_port}", pki.client_context()
        )
        anchor = stack.enter_context(Spool(scratch / "anchor-spool", settings=anchor_settings))
        anchor.set_partition_count(TOPIC, PARTITIONS)
        progress(f"broker, agent (pid {agent.pid}) and anchor spool ready")
        processes = ClientProcesses(agent.socket_path, PROCESSES, CLIENT_THREADS)
        stack.callback(processes.close)
        progress(f"{PROCESSES} client processes connected")
        try:
            measure(
                agent,
                ruled,
                processes,
                anchor,
                secure=secure,
                tcp=tcp,
                value=value,
                profile=profile,
                repeats=args.repeats,
                runs=runs,
                facts=facts,
            )
        except BaseException:
            progress(f"agent log:\n{agent.log_tail()}")
            raise
    return build_result(args, profile, runs, facts, session)


@dataclass(frozen=True, slots=True)
class TcpTargets:
    """The first agent's plaintext TCP listener, the third's TLS one and a client context
    that trusts it."""

    plain: str
    tls: str
    context: ssl.SSLContext


def measure(
    agent: AgentProcess,
    ruled: AgentProcess,
    processes: ClientProcesses,
    anchor: Spool,
    *,
    secure: AgentProcess,
    tcp: TcpTargets,
    value: bytes,
    profile: Profile,
    repeats: int,
    runs: Runs,
    facts: dict[str, Any],
) -> None:
    """Warm every path once, then each repetition runs every pass, in the same order."""
    drains: list[float] = []
    with (
        Client(agent.socket_path) as batching,
        Client(agent.socket_path) as single,
        Client(ruled.socket_path) as checked,
        Client(tcp.plain) as plaintext,
        Client(tcp.tls, ssl_context=tcp.context) as encrypted,
    ):
        warm = timed_rate(batching.send, value, CLIENT_THREADS, profile.warmup_seconds)
        timed_rate(checked.send, value, CLIENT_THREADS, profile.warmup_seconds)
        drains.append(ruled.wait_until_drained(profile.drain_timeout_s))
        for side, client in ((agent, plaintext), (secure, encrypted)):
            timed_rate(client.send, value, CLIENT_THREADS, profile.warmup_seconds)
            drains.append(side.wait_until_drained(profile.drain_timeout_s))
        warm_processes = combine(processes.run(profile.warmup_seconds))
        anchor_pass(anchor, value, profile.warmup_seconds)
        drains.append(agent.wait_until_drained(profile.drain_timeout_s))
        progress(
            f"warm-up: one client {warm.rate:,.0f}/s, {PROCESSES} processes "
            f"{warm_processes.rate:,.0f}/s"
        )
        rates: dict[str, float] = {}

        def both(
            rep: int, sides: list[tuple[AgentProcess, str]], run: Callable[[str], RatePass]
        ) -> None:
            """Run the pass of each side, in alternating order from one repetition to the
            next, and record its rate and the agent's CPU."""
            for side, name in alternate(rep, sides):
                cpu = process_cpu_s(side.pid)
                sent = run(name)
                add_pass(runs, name, sent, process_cpu_s(side.pid) - cpu)
                drains.append(side.wait_until_drained(profile.drain_timeout_s))
                rates[name] = sent.rate

        clients = {
            "one_client": batching,
            "access_rules": checked,
            "tcp_plain": plaintext,
            "tcp_tls": encrypted,
            "tcp_async_plain": plaintext,
            "tcp_async_tls": encrypted,
        }

        pass_args = (value, CLIENT_THREADS, profile.pass_seconds)

        def blocking(name: str) -> RatePass:
            return timed_rate(clients[name].send, *pass_args)

        def firing(name: str) -> RatePass:
            return async_rate(clients[name], *pass_args)

        for rep in range(repeats):
            # The same pass with and without the access checks.
            both(rep, [(agent, "one_client"), (ruled, "access_rules")], blocking)
            # The same pass over loopback TCP, in plaintext and with TLS.
            both(rep, [(agent, "tcp_plain"), (secure, "tcp_tls")], blocking)
            # send_async() over both: frames of many events, where TLS costs per record.
            both(rep, [(agent, "tcp_async_plain"), (secure, "tcp_async_tls")], firing)

            both(rep, [(agent, "async")], lambda _: async_rate(batching, *pass_args))

            runs.add("handoff_ceiling", handoff_ceiling(CLIENT_THREADS, profile.pass_seconds))
            runs.add("echo_rtt_p50_us", socket_echo_rtt_us(profile.rtt_samples))

            both(rep, [(agent, "processes")], lambda _: combine(processes.run(pass_args[2])))

            cpu = process_cpu_s(agent.pid)
            samples = round_trips(single, value, profile.rtt_samples, profile.rtt_warmup)
            agent_cpu = process_cpu_s(agent.pid) - cpu
            summary = latency_summary_us(samples)
            for stat in ("p50_us", "p99_us", "p999_us", "max_us"):
                runs.add(f"rtt_{stat}", summary[stat])
            runs.add(
                "rtt_agent_cpu_us_per_event",
                agent_cpu * 1e6 / (profile.rtt_samples + profile.rtt_warmup),
            )
            drains.append(agent.wait_until_drained(profile.drain_timeout_s))

            spool = anchor_pass(anchor, value, profile.pass_seconds)
            add_pass(runs, "anchor", spool, None)
            progress(
                f"rep {rep + 1}/{repeats}: one client {rates['one_client']:,.0f}/s (send_async "
                f"{rates['async']:,.0f}/s), {PROCESSES} processes "
                f"{rates['processes']:,.0f}/s, round trip p50 {summary['p50_us']:.0f} us "
                f"p99 {summary['p99_us']:.0f} us, Spool.send() {spool.rate:,.0f}/s, "
                f"TCP {rates['tcp_plain']:,.0f}/s, TLS {rates['tcp_tls']:,.0f}/s (send_async "
                f"{rates['tcp_async_plain']:,.0f}/s, {rates['tcp_async_tls']:,.0f}/s)"
            )
    facts["drain_wait_s_max"] = round(max(drains), 3)
    stats = agent.stats()
    facts["agent_sender"] = stats["sender"]
    facts["agent_protocol_errors"] = stats["protocol_errors"]


def build_result(
    args: BenchArgs, profile: Profile, runs: Runs, facts: dict[str, Any], session: Session
) -> dict[str, object]:
    figures = runs.medians()
    ours = figures["one_client_rate"]
    access_ratio = safe_ratio(figures["access_rules_rate"], ours)
    tls_ratio = safe_ratio(figures["tcp_tls_rate"], figures["tcp_plain_rate"])
    tls_async_ratio = safe_ratio(figures["tcp_async_tls_rate"], figures["tcp_async_plain_rate"])
    anchor = figures["anchor_rate"]
    return {
        **figure(
            FIGURE,
            round(ours),
            round(anchor),
            unit="events/s",
            title=f"Client.send() through the agent, one client shared by {CLIENT_THREADS} threads",
            anchor_is="Spool.send() in the application's own process",
        ),
        "figures": [
            figure(
                "uds_rate_send_async_one_client",
                round(figures["async_rate"]),
                round(figures["handoff_ceiling"]),
                unit="events/s",
                title=f"Client.send_async() through the agent, {CLIENT_THREADS} threads, "
                "until every future resolved",
                anchor_is=f"the ceiling of a blocking send(): {CLIENT_THREADS} CPython threads "
                "woken in turn by one thread, no I/O",
            ),
            figure(
                "uds_rate_with_access_rules",
                round(figures["access_rules_rate"]),
                round(ours),
                unit="events/s",
                title=f"Client.send() through the agent, {CLIENT_THREADS} threads, with "
                f"{ACCESS_RULES} [[access]] rules and {ALLOWED_PATTERNS} allowed_topics patterns",
                anchor_is="the same pass on an agent without them",
            ),
            figure(
                "uds_rate_tcp_tls",
                round(figures["tcp_tls_rate"]),
                round(figures["tcp_plain_rate"]),
                unit="events/s",
                title=f"Client.send() over loopback TCP with TLS, {CLIENT_THREADS} threads",
                anchor_is="the same pass over loopback TCP in plaintext",
            ),
            figure(
                "uds_rate_8_processes",
                round(figures["processes_rate"]),
                round(anchor),
                unit="events/s",
                title=f"Client.send() through the agent, {PROCESSES} client processes",
                anchor_is="Spool.send() in the application's own process, 1 thread",
            ),
        ],
        "rate_send_async_one_client": round(figures["async_rate"]),
        "handoff_ceiling_per_s": round(figures["handoff_ceiling"]),
        "socket_echo_rtt_p50_us": round(figures["echo_rtt_p50_us"], 1),
        "rate_8_processes": round(figures["processes_rate"]),
        "access_rules_cost": None if access_ratio is None else round(1 - access_ratio, 4),
        "rate_tcp_plaintext": round(figures["tcp_plain_rate"]),
        "rate_tcp_tls": round(figures["tcp_tls_rate"]),
        "tcp_tls_ratio": tls_ratio,
        "tls_cost": None if tls_ratio is None else round(1 - tls_ratio, 4),
        "rate_tcp_async_plaintext": round(figures["tcp_async_plain_rate"]),
        "rate_tcp_async_tls": round(figures["tcp_async_tls_rate"]),
        "tls_cost_send_async": None if tls_async_ratio is None else round(1 - tls_async_ratio, 4),
        "rtt_p50_us": figures["rtt_p50_us"],
        "rtt_p99_us": figures["rtt_p99_us"],
        "rtt_p999_us": figures["rtt_p999_us"],
        "payload_bytes": PAYLOAD_BYTES,
        "goals": {
            "rate_one_batching_client": GOAL_RATE,
            "rate_met": ours >= GOAL_RATE,
            "rtt_p50_us": GOAL_RTT_P50_US,
            "rtt_p50_met": figures["rtt_p50_us"] < GOAL_RTT_P50_US,
            "access_rules_cost_below": GOAL_ACCESS_COST,
            "access_rules_met": access_ratio is not None and access_ratio >= 1 - GOAL_ACCESS_COST,
        },
        "cpu_us_per_event": {
            "agent_one_client": round(figures["one_client_agent_cpu_us_per_event"], 2),
            "agent_access_rules": round(figures["access_rules_agent_cpu_us_per_event"], 2),
            "agent_tcp_plaintext": round(figures["tcp_plain_agent_cpu_us_per_event"], 2),
            "agent_tcp_tls": round(figures["tcp_tls_agent_cpu_us_per_event"], 2),
            "client_tcp_plaintext": round(figures["tcp_plain_client_cpu_us_per_event"], 2),
            "client_tcp_tls": round(figures["tcp_tls_client_cpu_us_per_event"], 2),
            "agent_send_async": round(figures["async_agent_cpu_us_per_event"], 2),
            "client_send_async": round(figures["async_client_cpu_us_per_event"], 2),
            "client_one_client": round(figures["one_client_client_cpu_us_per_event"], 2),
            "agent_8_processes": round(figures["processes_agent_cpu_us_per_event"], 2),
            "clients_8_processes": round(figures["processes_client_cpu_us_per_event"], 2),
            "agent_round_trip": round(figures["rtt_agent_cpu_us_per_event"], 2),
            "anchor_spool_send": round(figures["anchor_client_cpu_us_per_event"], 2),
        },
        "failed_sends_total": {
            name: round(sum(runs.values[f"{name}_errors"]))
            for name in (
                "one_client",
                "access_rules",
                "tcp_plain",
                "tcp_tls",
                "tcp_async_plain",
                "tcp_async_tls",
                "async",
                "processes",
                "anchor",
            )
        },
        "settings": {
            "topic_partitions": PARTITIONS,
            "keys": "none (keyless, sticky partitioning)",
            "one_client": f"{CLIENT_THREADS} threads sharing one Client, each calling send() "
            "in a loop (the client pipelines their requests on one connection)",
            "access_rules": "the one_client pass on a second agent whose agent.toml has "
            f"{ACCESS_RULES} [[access]] rules of 100 topic patterns each (the last for this "
            f"uid) and {ALLOWED_PATTERNS} allowed_topics patterns",
            "tcp": f"the one_client pass over loopback TCP ({TCP_HOST}): in plaintext to the "
            "first agent's TCP listener, and with TLS (server certificate only, P-256, made "
            "at start by openssl) to a third agent with the same settings; alternating, "
            "one connection each, its TLS handshake before the pass; then the send_async "
            "pass over both the same way",
            "send_async": f"{CLIENT_THREADS} threads sharing one Client, each calling "
            "send_async() in a loop; the pass ends when every future resolved",
            "handoff_ceiling": f"{CLIENT_THREADS} threads each blocked on its own lock, "
            "released in turn by one more thread: wake-ups/s of CPython threads here",
            "socket_echo": "p50 of a 20-byte round trip through a unix socket pair to an "
            "echoing process: the machine's floor for one request and its answer",
            "processes": f"{PROCESSES} processes, each {CLIENT_THREADS} threads sharing one "
            "Client, all released at once",
            "round_trip": "one thread, sequential Client.send(), its own connection; "
            f"{profile.rtt_samples} timed after {profile.rtt_warmup} untimed",
            "agent": "eventspool agent process, agent.toml with [agent] spool_dir, socket "
            "and [kafka] bootstrap_servers only (defaults: durability process, 32 MiB rings, "
            "reject when full); its sender ships to a local tansu during the passes",
            "anchor": "Spool.send() in the bench process, 1 thread, durability process, "
            f"{CAPACITY_BYTES // MIB} MiB rings, no sender; emptied between passes",
            "between_passes": "wait until the agent's STATS show no unacknowledged event",
            "pass_seconds": profile.pass_seconds,
            "warmup_seconds": profile.warmup_seconds,
            "rate": "events acknowledged / (last thread end - first thread start), "
            "time.monotonic_ns, across processes too",
            "cpu": "agent: /proc utime+stime of all its threads over the pass; clients: "
            "process_time() over the pass",
        },
        "runs": runs.listed("_rate", "p50_us", "p99_us"),
        "agent_sender_counters": facts["agent_sender"],
        "agent_protocol_errors": facts["agent_protocol_errors"],
        "drain_wait_s_max": facts["drain_wait_s_max"],
        **session.provenance(broker=None, packages=()),
    }


def main(argv: Sequence[str] | None = None) -> int:
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] == [CHILD_FLAG]:
        return child_main(arguments[1:])
    return bench_main(
        "Events/s and round trip through the agent's unix socket vs Spool.send()", run, arguments
    )


if __name__ == "__main__":
    sys.exit(main())
