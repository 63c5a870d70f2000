"""Handlers that the consumer tests run in worker processes.

Each appends one line per handled event to a file with a single O_APPEND write, so lines
from concurrent workers never interleave and a SIGKILL cannot leave half a line.
"""

from __future__ import annotations

import asyncio
import os
import time
import zlib
from pathlib import Path

from eventspool.consumer import Record


def record_to(path: Path, record: Record) -> None:
    """Line: event id, offset, worker pid, attempt."""
    line = f"{record.event_id} {record.topic}/{record.partition}@{record.offset} "
    line += f"{os.getpid()} {record.attempt}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)


def slow_record_to(path: Path, seconds: float, record: Record) -> None:
    time.sleep(seconds)
    record_to(path, record)


def fail_on_poison(path: Path, record: Record) -> None:
    """Raise on values starting with b"poison"; record the rest."""
    if record.value is not None and record.value.startswith(b"poison"):
        raise ValueError(f"poisoned value {record.value!r}")
    record_to(path, record)


def hang_on_victim(path: Path, started: Path, record: Record) -> None:
    """The first attempt on b"victim" announces its pid and hangs until killed."""
    if record.value == b"victim" and record.attempt == 1:
        started.write_text(str(os.getpid()))
        time.sleep(600)
    record_to(path, record)


def hang_once_on_victim(path: Path, started: Path, record: Record) -> None:
    """The first run of b"victim" in any process announces its pid and hangs until killed;
    later runs, whatever their attempt, only record."""
    if record.value == b"victim" and not started.exists():
        started.write_text(str(os.getpid()))
        time.sleep(600)
    record_to(path, record)


OUT_ENV = "EVENTSPOOL_TEST_HANDLER_OUT"
SLEEP_ENV = "EVENTSPOOL_TEST_HANDLER_SLEEP"


def slow_from_env(record: Record) -> None:
    """For the command line, which takes `module:function` only: the output file and the
    sleep come from the environment the workers inherit. A `.start` line marks the start."""
    path = Path(os.environ[OUT_ENV])
    fd = os.open(path.with_suffix(".start"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{record.event_id}\n".encode())
    finally:
        os.close(fd)
    time.sleep(float(os.environ[SLEEP_ENV]))
    record_to(path, record)


async def async_record_to(path: Path, slow_value: bytes, slow_s: float, record: Record) -> None:
    """I/O-bound: 10 ms of waiting per event, `slow_s` for the first attempt on
    `slow_value`. A `.start` line per event marks when its handler began."""
    fd = os.open(path.with_suffix(".start"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{record.event_id} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    slow = record.value == slow_value and record.attempt == 1
    await asyncio.sleep(slow_s if slow else 0.01)
    record_to(path, record)


async def async_hang_first_attempt(path: Path, seconds: float, record: Record) -> None:
    """Every first attempt waits `seconds` (long enough to be killed in), later ones 10 ms."""
    fd = os.open(path.with_suffix(".start"), os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, f"{record.event_id} {os.getpid()}\n".encode())
    finally:
        os.close(fd)
    await asyncio.sleep(seconds if record.attempt == 1 else 0.01)
    record_to(path, record)


def fails_first(record: Record) -> bool:
    """About one event in 40 fails its first attempt: the same ones in every process."""
    return zlib.crc32((record.key or b"") + b"/" + (record.value or b"")) % 40 == 0


def record_sequence(path: Path, record: Record) -> None:
    """Line: key, the sequence number in the value, worker pid, attempt. The first attempt
    of the events `fails_first` picks raises, so their key's later events must wait."""
    if record.attempt == 1 and fails_first(record):
        raise ValueError("first attempt fails")
    line = f"{(record.key or b'').decode()} {int(record.value or b'-1')} {os.getpid()} "
    line += f"{record.attempt}\n"
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line.encode())
    finally:
        os.close(fd)
