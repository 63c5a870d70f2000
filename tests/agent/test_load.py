"""200 concurrent clients next to slowloris connections and clients that never read answers.

One agent serves every producer on a host, so a few bad clients must not cost the good
ones their throughput, and no client may make the agent's memory grow without bound: the
agent must close a connection whose frame trickles in, and stop reading from one that
does not read its answers (backpressure) rather than buffer the answers for it.
"""

from __future__ import annotations

import os
import selectors
import socket
import statistics
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from eventspool.broker import LocalBroker
from eventspool.client.sync import Client
from eventspool.verify import consume_event_ids, ledger
from eventspool.wire.protocol import FrameType, WireEvent, encode_frame, encode_send
from tests.agent.conftest import AgentFactory

pytestmark = pytest.mark.slow

RecordProperty = Callable[[str, object], None]

CLIENTS = 200
FRAME_TIMEOUT_S = 3.0
WARMUP_S = 3.0
BASELINE_S = 5.0  # before the bad clients come, and again after they left
LOADED_S = 10.0
STILL_S = 3.0  # the non-reader may not get a byte in during the last seconds of LOADED_S
RSS_LIMIT = 300 * 1024 * 1024
# The anonymous memory of the last third of the run may exceed the middle third's by this
# much at most: enough for allocator noise, far below what a per-event leak adds.
GROWTH_MARGIN = 16 * 1024 * 1024
MIN_THROUGHPUT_RATIO = 0.5
MIB = 1024 * 1024


@dataclass
class _Producer:
    """One of the concurrent clients: its own Client, connection and thread."""

    ids: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)

    def run(self, path: Path, topic: str, number: int, stop: threading.Event) -> None:
        with Client(path, timeout=30) as client:
            sequence = 0
            while not stop.is_set():
                try:
                    event_id = client.send(
                        topic, b"load %d %d" % (number, sequence), key=b"c%d" % number
                    )
                except Exception as exc:
                    self.errors.append(f"client {number} event {sequence}: {exc!r}")
                else:
                    self.ids.append(event_id)
                sequence += 1


def _status_kib(pid: int) -> dict[str, int]:
    """The memory lines of /proc/<pid>/status, in bytes."""
    values: dict[str, int] = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        name, _, rest = line.partition(":")
        if rest.strip().endswith("kB"):
            values[name] = int(rest.split()[0]) * 1024
    return values


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class _Memory:
    """Samples the agent's resident memory ten times a second."""

    pid: int
    samples: list[tuple[float, int, int]] = field(default_factory=list)  # (time, rss, anon)

    def run(self, stop: threading.Event) -> None:
        while not stop.wait(0.1):
            status = _status_kib(self.pid)
            self.samples.append((time.monotonic(), status["VmRSS"], status["RssAnon"]))

    def thirds(self) -> tuple[float, float]:
        """Median anonymous RSS of the middle and of the last third of the samples.

        Anonymous, because VmRSS also counts the pages of the memory-mapped ring files,
        which rise as the writes advance through a ring until it wraps: bounded by the
        queue capacity, and no leak.
        """
        anon = [a for _, _, a in self.samples]
        third = len(anon) // 3
        return statistics.median(anon[third : 2 * third]), statistics.median(anon[2 * third :])


@dataclass
class _Slowloris:
    """Sends a valid request one byte a second; notes when the agent hangs up."""

    path: Path
    payload: bytes
    closed_after: float | None = None
    bytes_sent: int = 0

    def run(self, stop: threading.Event) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(self.path))
            started = time.monotonic()
            with selectors.DefaultSelector() as selector:
                selector.register(sock, selectors.EVENT_READ)
                for byte in self.payload:
                    if stop.is_set():
                        return
                    try:
                        sock.send(bytes((byte,)))
                    except OSError:
                        self.closed_after = time.monotonic() - started
                        return
                    self.bytes_sent += 1
                    next_byte = time.monotonic() + 1.0
                    while (wait := next_byte - time.monotonic()) > 0:
                        if selector.select(wait) and not self._alive(sock):
                            self.closed_after = time.monotonic() - started
                            return

    @staticmethod
    def _alive(sock: socket.socket) -> bool:
        try:
            return bool(sock.recv(4096))
        except OSError:
            return False


@dataclass
class _NonReader:
    """Writes request frames back to back and never reads an answer."""

    path: Path
    frames: bytes
    bytes_sent: int = 0
    stalled_after: float | None = None  # when the agent first took nothing for a second

    def run(self, stop: threading.Event) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.connect(str(self.path))
            sock.setblocking(False)
            started = time.monotonic()
            with selectors.DefaultSelector() as selector:
                selector.register(sock, selectors.EVENT_WRITE)
                view = memoryview(self.frames)
                pos = 0
                while not stop.is_set():
                    if not selector.select(1.0):
                        if self.stalled_after is None:
                            self.stalled_after = time.monotonic() - started
                        continue
                    try:
                        sent = sock.send(view[pos:])
                    except BlockingIOError:
                        continue
                    self.bytes_sent += sent
                    pos = (pos + sent) % len(self.frames)


def _rate(producers: list[_Producer]) -> int:
    return sum(len(p.ids) for p in producers)


def test_200_clients_keep_their_throughput_next_to_bad_clients(
    agent_factory: AgentFactory,
    broker: LocalBroker,
    topic_factory: Callable[[int], str],
    record_property: RecordProperty,
) -> None:
    """200 clients alone, with a slowloris (binary and HTTP) and a non-reader, then alone again.

    The baseline is the mean of the windows before and after, so a drift of the machine's
    load (other tests run beside this one) does not pass for the bad clients' doing.
    """
    topic = topic_factory(2)
    agent = agent_factory(f"frame_timeout_s = {FRAME_TIMEOUT_S}")
    process = agent.start()
    memory = _Memory(process.pid)
    stop_memory = threading.Event()
    sampler = threading.Thread(target=memory.run, args=(stop_memory,))
    sampler.start()
    stop = threading.Event()
    stop_bad = threading.Event()
    producers = [_Producer() for _ in range(CLIENTS)]
    threads = [
        threading.Thread(target=p.run, args=(agent.socket_path, topic, n, stop))
        for n, p in enumerate(producers)
    ]
    frame = encode_send(7, topic, [WireEvent(b"x" * 200)])
    body = b'{"value": "' + b"x" * 200 + b'"}'
    head = f"POST /v1/topics/{topic} HTTP/1.1\r\nHost: agent\r\nContent-Length: {len(body)}\r\n\r\n"
    http = head.encode() + body
    slow_binary = _Slowloris(agent.socket_path, frame)
    slow_http = _Slowloris(agent.socket_path, http)
    # SENDs are answered slowly next to 200 clients, so the agent would read this one slowly
    # even without backpressure; PINGs with a body are answered at once, in full, so only
    # backpressure stops the agent from buffering their echoes without end.
    pipeliner = _NonReader(
        agent.socket_path,
        b"".join(encode_send(n, topic, [WireEvent(b"pipelined %d" % n)]) for n in range(1, 2001)),
    )
    echoes = _NonReader(
        agent.socket_path,
        b"".join(encode_frame(FrameType.PING, n, b"p" * 1000) for n in range(1, 201)),
    )
    non_readers = {"pipeliner": pipeliner, "ping_flood": echoes}
    bad = [
        threading.Thread(target=slow_binary.run, args=(stop_bad,)),
        threading.Thread(target=slow_http.run, args=(stop_bad,)),
        threading.Thread(target=pipeliner.run, args=(stop_bad,)),
        threading.Thread(target=echoes.run, args=(stop_bad,)),
    ]
    try:
        for thread in threads:
            thread.start()
        time.sleep(WARMUP_S)
        cpu0, count0 = _cpu_seconds(process.pid), _rate(producers)
        time.sleep(BASELINE_S)
        cpu1, count1 = _cpu_seconds(process.pid), _rate(producers)
        for thread in bad:
            thread.start()
        time.sleep(LOADED_S - STILL_S)
        taken = {name: r.bytes_sent for name, r in non_readers.items()}
        time.sleep(STILL_S)
        cpu2, count2 = _cpu_seconds(process.pid), _rate(producers)
        taken_later = {name: r.bytes_sent for name, r in non_readers.items()}
        stop_bad.set()
        for thread in bad:
            thread.join()
        cpu3, count3 = _cpu_seconds(process.pid), _rate(producers)
        time.sleep(BASELINE_S)
        cpu4, count4 = _cpu_seconds(process.pid), _rate(producers)
    finally:
        stop.set()
        stop_bad.set()
        for thread in threads + bad:
            if thread.ident is not None:
                thread.join()
        stop_memory.set()
        sampler.join()
    assert process.poll() is None, agent.log.read_text()[-3000:]
    peak = _status_kib(process.pid)["VmHWM"]
    before = (count1 - count0) / BASELINE_S
    loaded = (count2 - count1) / LOADED_S
    after = (count4 - count3) / BASELINE_S
    baseline = (before + after) / 2
    middle, last = memory.thirds()
    errors = [e for p in producers for e in p.errors]
    ids = [event_id for p in producers for event_id in p.ids]
    figures = {
        "peak_rss_mib": round(peak / MIB, 1),
        "rss_anon_middle_third_mib": round(middle / MIB, 1),
        "rss_anon_last_third_mib": round(last / MIB, 1),
        "baseline_before_events_per_s": round(before),
        "loaded_events_per_s": round(loaded),
        "baseline_after_events_per_s": round(after),
        "agent_cpu_before": round((cpu1 - cpu0) / BASELINE_S, 2),
        "agent_cpu_loaded": round((cpu2 - cpu1) / LOADED_S, 2),
        "agent_cpu_after": round((cpu4 - cpu3) / BASELINE_S, 2),
        "events_acknowledged": len(ids),
        **{f"{name}_bytes_sent": r.bytes_sent for name, r in non_readers.items()},
        **{f"{name}_stalled_after_s": r.stalled_after for name, r in non_readers.items()},
        **{f"{name}_bytes_taken_at_the_end": taken_later[name] - taken[name] for name in taken},
        "slowloris_binary_closed_after_s": slow_binary.closed_after,
        "slowloris_http_closed_after_s": slow_http.closed_after,
    }
    for name, value in figures.items():
        record_property(name, value)
    assert errors == [], (errors[:5], figures)
    assert peak < RSS_LIMIT, figures
    assert last <= middle + GROWTH_MARGIN, figures
    assert loaded >= MIN_THROUGHPUT_RATIO * baseline, figures
    for slow in (slow_binary, slow_http):
        assert slow.closed_after is not None, figures
        assert FRAME_TIMEOUT_S - 0.5 <= slow.closed_after <= FRAME_TIMEOUT_S + 4, figures
    for name, reader in non_readers.items():
        assert reader.stalled_after is not None, (name, figures)
    assert taken_later == taken, (
        f"the agent kept reading from a client that reads nothing: {figures}"
    )
    assert len(set(ids)) == len(ids), "an event id was handed out twice"
    seen = consume_event_ids(broker.bootstrap_servers, [topic], ids, timeout=120)
    result = ledger(ids, seen)
    assert result.lost == 0, (result, figures)
