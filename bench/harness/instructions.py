"""Instructions per event, counted by valgrind's callgrind: a figure a busy machine does not move.

Each lane runs in its own `python -m harness.instructions LANE EVENTS [BOOTSTRAP]` under
callgrind, which dumps its counters whenever `getppid` is entered. The lane calls
`os.getppid()` right before and after its measured loop, so the second dump holds the
loop alone (no start-up, imports or warm-up): its instruction count over the events is
the figure. Every thread of the process is counted, librdkafka's included. The cyclic
garbage collector is off during the loop, as timeit does: whether a collection fell
inside it, walking the harness's own objects, depended on what the harness allocated
before, and moved a lane by up to 30 instructions per event.

A server (the agent, or the C echo server) is counted from outside instead:
`per_exchange_by_thread` runs it under callgrind, zeroes its counters with
`callgrind_control` once a caller warmed it up, and dumps them after the caller's measured
exchanges, one count per thread.

Lanes: `send` (`Spool.send()` of keyless 100-byte values, durability process, 4
partitions), `send_crossing` (the same into one partition, whose 4 MiB segments fill and
chain), `produce` (`Producer.produce()` of the same, nothing sent), `e2e_spool` (send,
then flush to the broker's acknowledgement, keyed, 12 partitions) and `e2e_producer` (an
idempotent producer doing the same with a delivery callback, as bench/e2e.py's anchor).
"""

from __future__ import annotations

import contextlib
import gc
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

from confluent_kafka import Producer

from eventspool.broker.local import create_topic
from eventspool.envelope import EventIdGenerator
from eventspool.pipeline import Spool
from harness.figures import figure
from harness.producer import sender_producer_config

PAYLOAD = b"v" * 100
KEYS = [f"user-{i}".encode() for i in range(10_000)]
WARMUP_EVENTS = 2_000
QUICK_EVENTS = 10_000
FULL_EVENTS = 50_000
_TOTALS = re.compile(rb"^(?:summary|totals): (\d+)", re.MULTILINE)

Send = Callable[[str, bytes, bytes | None], object]


def available() -> bool:
    return shutil.which("valgrind") is not None


def instruction_figure(
    name: str, counts: dict[str, float], ours: str, anchor: str, *, title: str, anchor_is: str
) -> dict[str, object]:
    """A bench figure of instructions per event; lower is better, so the ratio is anchor/ours."""
    return figure(
        name,
        counts[ours],
        counts[anchor],
        unit="instructions per event",
        title=title,
        anchor_is=anchor_is,
        higher_is_better=False,
    )


def per_event(lanes: Sequence[str], events: int, bootstrap: str | None = None) -> dict[str, float]:
    """Instructions per event of each lane, the lanes run side by side (one core each)."""
    with ThreadPoolExecutor(max_workers=2) as pool:
        counts = pool.map(lambda lane: _count(lane, events, bootstrap), lanes)
        return {lane: round(count / events, 1) for lane, count in zip(lanes, counts, strict=True)}


def _count(lane: str, events: int, bootstrap: str | None) -> int:
    with tempfile.TemporaryDirectory(prefix="eventspool-callgrind-") as scratch:
        command = [
            "valgrind",
            "--tool=callgrind",
            "--dump-before=getppid",
            f"--callgrind-out-file={Path(scratch) / 'callgrind.out'}",
            sys.executable,
            "-m",
            "harness.instructions",
            lane,
            str(events),
            *([bootstrap] if bootstrap else []),
        ]
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
        subprocess.run(command, check=True, capture_output=True, cwd=scratch, env=env)
        dumps = sorted(Path(scratch).glob("callgrind.out.*"), key=lambda p: int(p.suffix[1:]))
        if len(dumps) < 2:
            raise RuntimeError(f"callgrind wrote {len(dumps)} dumps for lane {lane}, expected 3")
        return _total(dumps[1])


SERVER_START_TIMEOUT_S = 120.0  # a Python process starts about 50 times slower under it
SERVER_WARMUP_EXCHANGES = 500


def per_exchange_by_thread(
    command: Sequence[str],
    socket_path: Path,
    caller: Callable[[], AbstractContextManager[Callable[[], object]]],
    events: int,
    *,
    marker: bytes | None = None,
    ready: Callable[[], bool] | None = None,
) -> tuple[list[float], float | None]:
    """Instructions per exchange of each thread of the server `command` (the first thread
    first), which listens on `socket_path`, and of the thread whose profile names
    `marker` (a function of it) most often, if one does: `caller()` gives the exchange to
    make, warmed up (and, with `ready`, until the server says it is) before the counters
    are zeroed."""
    with tempfile.TemporaryDirectory(prefix="eventspool-callgrind-") as scratch:
        out = Path(scratch) / "callgrind.out"
        server = subprocess.Popen(
            ["valgrind", "--tool=callgrind", "--separate-threads=yes",
             f"--callgrind-out-file={out}", *command],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            _wait_for_listener(socket_path, server)
            with caller() as exchange:
                for _ in range(SERVER_WARMUP_EXCHANGES):
                    exchange()
                deadline = time.monotonic() + SERVER_START_TIMEOUT_S
                while ready is not None and not ready():
                    if time.monotonic() > deadline:
                        raise RuntimeError(f"{command[0]} was not ready after its warm-up")
                    exchange()
                _callgrind_control("-z", server.pid)
                for _ in range(events):
                    exchange()
                _callgrind_control("-d", server.pid)
        finally:
            server.terminate()
            server.wait(SERVER_START_TIMEOUT_S)
        dumps = sorted(Path(scratch).glob("callgrind.out.1-*"))
        if not dumps:
            raise RuntimeError(f"callgrind dumped nothing for {command[0]}")
        per_thread = [round(_total(dump) / events, 1) for dump in dumps]
        if marker is None:
            return per_thread, None
        mentions = [dump.read_bytes().count(marker) for dump in dumps]
        most = max(mentions)
        return per_thread, per_thread[mentions.index(most)] if most else None


def _wait_for_listener(path: Path, server: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while True:
        if server.poll() is not None:
            raise RuntimeError(f"the server under callgrind exited with {server.returncode}")
        with contextlib.suppress(OSError), socket.socket(socket.AF_UNIX) as probe:
            probe.connect(os.fspath(path))
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"nothing listened on {path} within {SERVER_START_TIMEOUT_S} s")
        time.sleep(0.2)


def _callgrind_control(option: str, pid: int) -> None:
    subprocess.run(["callgrind_control", option, str(pid)], check=True, capture_output=True)


def _total(dump: Path) -> int:
    match = _TOTALS.search(dump.read_bytes())
    if match is None:
        raise RuntimeError(f"no instruction total in {dump.name}")
    return int(match.group(1))


# ---- the lanes, run inside valgrind -------------------------------------------------


def _measured(loop: Callable[[], None]) -> None:
    gc.disable()  # as timeit does: see the module docstring
    os.getppid()
    loop()
    os.getppid()


def _calls(call: Send, events: int) -> None:
    """Warm `call` up, then measure `events` keyless calls: one loop for both sides."""
    for i in range(WARMUP_EVENTS):
        call("ipe", PAYLOAD, KEYS[i % 4])
    keys = [None] * events

    def loop() -> None:
        for key in keys:
            call("ipe", PAYLOAD, key)

    _measured(loop)


def _spool_lane(events: int, partitions: int) -> None:
    with tempfile.TemporaryDirectory() as directory, Spool(directory) as spool:
        spool.set_partition_count("ipe", partitions)
        _calls(spool.send, events)


def _producer_lane(events: int) -> None:
    producer = Producer({"bootstrap.servers": "127.0.0.1:9", "log_level": 0})
    _calls(producer.produce, events)
    producer.purge()


def _fresh_topic(bootstrap: str) -> str:
    topic = f"ipe-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, 12)
    return topic


def _e2e_spool_lane(events: int, bootstrap: str) -> None:
    topic = _fresh_topic(bootstrap)
    with tempfile.TemporaryDirectory() as directory, Spool(directory, bootstrap) as spool:
        send = spool.send
        for i in range(WARMUP_EVENTS):
            send(topic, PAYLOAD, KEYS[i % len(KEYS)])
        if spool.flush(120) != 0:
            raise RuntimeError("the warm-up did not reach the broker")
        keys = [KEYS[i % len(KEYS)] for i in range(events)]

        def loop() -> None:
            for key in keys:
                send(topic, PAYLOAD, key)
            if spool.flush(600) != 0:
                raise RuntimeError("the spool did not drain")

        _measured(loop)


def _e2e_producer_lane(events: int, bootstrap: str) -> None:
    topic = _fresh_topic(bootstrap)
    delivered = [0]

    def on_delivery(_error: Any, _message: Any) -> None:
        delivered[0] += 1

    producer = Producer(
        {
            **sender_producer_config(bootstrap),
            "partitioner": "murmur2_random",
            "on_delivery": on_delivery,
        }
    )
    ids = EventIdGenerator()
    for i in range(WARMUP_EVENTS):
        producer.produce(topic, PAYLOAD, KEYS[i % len(KEYS)], headers=[("event_id", ids.next_id())])
    producer.flush(120)
    work = [(KEYS[i % len(KEYS)], ids.next_id().encode()) for i in range(events)]

    def loop() -> None:
        produce, poll = producer.produce, producer.poll
        for n, (key, event_id) in enumerate(work):
            while True:
                try:
                    produce(topic, PAYLOAD, key, headers=[("event_id", event_id)])
                    break
                except BufferError:
                    poll(0.05)
            if n % 1000 == 999:
                poll(0)
        producer.flush(600)

    _measured(loop)


_LANES: dict[str, Callable[[int, list[str]], None]] = {
    "send": lambda events, _: _spool_lane(events, 4),
    "send_crossing": lambda events, _: _spool_lane(events, 1),
    "produce": lambda events, _: _producer_lane(events),
    "e2e_spool": lambda events, rest: _e2e_spool_lane(events, rest[0]),
    "e2e_producer": lambda events, rest: _e2e_producer_lane(events, rest[0]),
}


def main(argv: Sequence[str]) -> int:
    lane, events, *rest = argv
    _LANES[lane](int(events), rest)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
