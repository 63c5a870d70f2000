"""What mypy sees of the compiled core (native.pyx and the .pxi files it includes).

Kept by hand; `make lint` runs mypy's stubtest, which imports the built module and
fails on any name, signature or class property here that the runtime does not have
(stubtest_allowlist.txt lists the few it cannot see, each with why).
"""

import random
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from concurrent.futures import Future
from enum import IntEnum
from typing import Any, Self, final, type_check_only
from uuid import UUID

from typing_extensions import Buffer, disjoint_base

# The envelope layer imports this module at run time; this stub imports its HeadersInput
# for typing only.
from eventspool.clock import Clock
from eventspool.envelope import HeadersInput

_Headers = list[tuple[str, bytes | None]]
_KafkaHeaders = list[tuple[str, str | bytes | None]]
_SlotFields = tuple[int, int, int, int, int, int]

APPEND_FULL: int
APPEND_CLOSED: int
APPEND_BAD_LENGTH: int
ACK_DONE: int
ACK_NOTHING: int
ACK_NOT_HANDED_OUT: int

# The formats' numbers that the Python modules share with the compiled code.
RING_HEADER_SIZE: int
RING_PAGE: int
RING_FRAME_HEADER_SIZE: int
RING_SLOT_OFFSETS: tuple[int, int]
ENVELOPE_FIXED_SIZE: int
ENVELOPE_MAX_HEADERS: int
EVENT_ID_SIZE: int
EVENT_ID_HEADER: str
WIRE_MAX_EVENTS_PER_SEND: int
WIRE_FRAME_HEADER_SIZE: int
WIRE_SEND: int
WIRE_PUBLISH: int
WIRE_SEND_RESULT: int
WIRE_STATUS_OK: int
WIRE_FLAG_KEY: int
WIRE_FLAG_VALUE: int
WIRE_FLAG_HEADERS: int
WIRE_FLAG_EVENT_ID: int

def crc32c(data: Buffer, value: int = 0) -> int: ...
def crc32c_portable(data: Buffer, value: int = 0) -> int: ...
def crc32c_hardware() -> bool: ...
def murmur2(data: Buffer) -> int: ...
def partition_for_key(key: bytes, partition_count: int) -> int: ...
def encode_headers(headers: _Headers) -> bytes: ...
def encode(
    event_id: bytes,
    create_time_ms: int,
    key: bytes | None,
    value: bytes | None,
    headers: _Headers | None,
) -> bytes: ...
def decode_fields(
    payload: Buffer,
) -> tuple[str, int, bytes | None, bytes | None, _Headers | None]: ...
def decode_for_kafka(
    payload: bytes,
) -> tuple[bytes, int, bytes | None, bytes | None, _Headers | None]: ...

@disjoint_base
class EventIdGenerator:
    def __init__(self, clock: Clock | None = None) -> None: ...
    def reseed(self) -> None: ...
    def next_id(self, now_ms: int | None = None) -> str: ...

@disjoint_base
class RingCore:
    capacity: int
    head: int
    head_seq: int
    tail: int
    next_seq: int
    read: int
    read_seq: int
    slot_counter: int
    dropped: int
    skipped: int
    generation: int
    max_payload: int
    writable: bool
    closed: bool
    sealed: bool
    drop_oldest: bool
    def __new__(
        cls,
        mm: Buffer,
        capacity: int,
        slot: _SlotFields,
        max_payload: int,
        drop_oldest: bool,
        fast: bool,
        writable: bool,
    ) -> Self: ...
    def acquire(self) -> None: ...
    def release(self) -> None: ...
    def scan(self) -> tuple[int, bool, int, int]: ...
    def start_writing(self, skipped: int, scrub: bool) -> None: ...
    def append(self, payload: bytes, timestamp_ms: int) -> int: ...
    def append_many(self, payloads: list[bytes], timestamp_ms: int) -> tuple[int, int, int]: ...
    def write_locked(self, payload: bytes, timestamp_ms: int) -> int: ...
    def fits(self, size: int) -> bool: ...
    def fits_locked(self, size: int) -> bool: ...
    def seal(self) -> int: ...
    def start_fault_in(self) -> bool: ...
    def wait_fault_in(self) -> None: ...
    def restart(self, head_seq: int, dropped: int, skipped: int) -> None: ...
    def add_counts(self, dropped: int, skipped: int) -> None: ...
    def read_records(self, max_records: int, max_bytes: int) -> list[tuple[int, int, bytes]]: ...
    def read_for_kafka(
        self, max_records: int, max_bytes: int
    ) -> list[tuple[int, bytes | None, bytes | None, int, _KafkaHeaders | None]]: ...
    def rewind(self) -> None: ...
    def ack(self, up_to_seq: int) -> int: ...
    def oldest_timestamp(self) -> int: ...
    def close(self) -> None: ...

# The step of MappedFile.create that failed.
MAP_CREATE: int
MAP_RESERVE: int
MAP_MAP: int

@disjoint_base
class MappedFile:
    size: int
    fd: int
    allocated: int
    def create(self, path: bytes, header: bytes, size: int) -> tuple[int, int]: ...
    def __buffer__(self, flags: int, /) -> memoryview: ...
    def __release_buffer__(self, buffer: memoryview, /) -> None: ...
    def close(self) -> None: ...

def rename_holding_gil(source: bytes, target: bytes) -> int: ...

@disjoint_base
class StickyPartitioner:
    batch_bytes: int
    def __init__(self, batch_bytes: int = 16384, rng: random.Random | None = None) -> None: ...
    def partition(
        self, partition_count: int, size: int, available: Collection[int] | None = None
    ) -> int: ...

@disjoint_base
class TopicRoute:
    name: str
    partition_count: int | None
    available: frozenset[int] | None
    sticky: StickyPartitioner
    def __init__(
        self,
        name: str,
        partition_count: int | None,
        sticky: StickyPartitioner,
        ids: EventIdGenerator,
        max_event_bytes: int,
    ) -> None: ...
    def set_ring(self, partition: int, ring: RingCore | None) -> None: ...
    def choose(self, key: bytes | None, size: int) -> int: ...
    def send(self, key: bytes | None, value: bytes | None) -> str | None: ...

@disjoint_base
class SpoolFront:
    _routes: dict[str, TopicRoute]
    def send(
        self,
        topic: str | None,
        value: bytes | None,
        key: bytes | str | None = None,
        headers: Mapping[str, bytes | str | None]
        | Sequence[tuple[str, bytes | str | None]]
        | None = None,
        exchange: str | None = None,
        routing_key: str = "",
        event_id: str | UUID | None = None,
    ) -> str: ...
    # The Python path, which eventspool.pipeline.Spool (a subclass) defines.
    @type_check_only
    def _send_python(
        self,
        topic: str | None,
        value: bytes | None,
        key: bytes | str | None,
        headers: Mapping[str, bytes | str | None] | Sequence[tuple[str, bytes | str | None]] | None,
        exchange: str | None,
        routing_key: str,
        event_id: str | UUID | None,
    ) -> str: ...

def intake_send(
    front: SpoolFront,
    request_id: int,
    body: bytes,
    fallback: Callable[[str, bytes | None, bytes | None], tuple[int, bytes]],
) -> tuple[bytes, int] | None: ...
def intake_frames(
    front: SpoolFront,
    data: bytes,
    max_frame: int,
    inline: set[bytes],
    learn: Callable[[bytes], bool],
    fallback: Callable[[str, bytes | None, bytes | None], tuple[int, bytes]],
) -> tuple[bytes, int, int]: ...
def decode_results(body: bytes) -> list[str | tuple[int, str]]: ...

FRAME_FAULT_NONE: int
FRAME_FAULT_TOO_LARGE: int
FRAME_FAULT_TOO_SMALL: int
FRAME_FAULT_UNKNOWN_TYPE: int

@disjoint_base
class Frame:
    # An eventspool.wire.protocol.FrameType, which this layer does not import.
    @property
    def type(self) -> Any: ...
    @property
    def request_id(self) -> int: ...
    @property
    def body(self) -> bytes: ...
    def __init__(self, type: Any, request_id: int, body: bytes) -> None: ...
    def __eq__(self, value: object, /) -> bool: ...
    def __hash__(self) -> int: ...

def split_frames(
    data: bytes | bytearray, max_frame: int, types: tuple[IntEnum | None, ...], frames: list[Frame]
) -> tuple[int, int, int]: ...
def encode_batch_frame(
    frame_type: int, request_id: int, raw_name: bytes, payloads: list[bytes]
) -> bytes | None: ...

CALL_ANSWERED: int
CALL_UNWRITTEN: int
CALL_READ: int

def block_with_timeout(fd: int, timeout: float) -> None: ...
def connect_unix(path: str, timeout: float) -> int: ...

@disjoint_base
class CoreLock:
    def acquire(self, blocking: bool = True, timeout: float = -1.0) -> bool: ...
    def release(self) -> None: ...
    def locked(self) -> bool: ...
    def __enter__(self) -> bool: ...
    def __exit__(self, *exc_info: object) -> None: ...

@disjoint_base
class SendCall:
    _payload: bytes
    @property
    def _topic(self) -> str | None: ...
    @property
    def _exchange(self) -> str | None: ...
    # An Outcome of eventspool.wire.checks once settled: the event_id, or the error
    # that refused it; None before.
    @property
    def outcome(self) -> Any: ...
    def done(self) -> bool: ...

class InPerson(SendCall):
    def __init__(self, topic: str, payload: bytes) -> None: ...
    @property
    def _topic(self) -> str: ...
    @property
    def _exchange(self) -> None: ...
    def _settle(self, outcome: Any) -> None: ...

@disjoint_base
class QueuedCall(SendCall):
    def __init__(self, topic: str | None, exchange: str | None, payload: bytes) -> None: ...
    def _settle(self, outcome: Any) -> None: ...
    def _wait_done(self, timeout: float) -> bool: ...

@disjoint_base
class ConnectionCore:
    fd: int
    max_frame: int
    buffer: bytearray | None
    # Request ids to the client's requests (eventspool.client.sync_requests.Request).
    in_flight: dict[int, Any]
    targets: dict[tuple[str | None, str | None], int]
    unsent: bytes
    # The client's Tls, which this layer does not import.
    tls: Any
    closed: bool
    answered: bool
    reading: bool
    reader_busy: bool
    reader: threading.Thread | None
    reader_wanted: threading.Condition | None
    reader_ident: int | None
    def __init__(self, fd: int, max_frame: int, tls: Any = None) -> None: ...
    # The call in person's request while it is made (a list of the client's events).
    alone: list[Any] | None
    def idle(self) -> bool: ...
    def take_in_flight(self) -> list[Any]: ...
    def note_in_flight(self, requests: dict[int, Any]) -> None: ...
    def take_answered(self, request_id: int) -> Any: ...
    def awaiting(self) -> bool: ...
    def keep_read(self, data: bytes) -> None: ...
    # `reply`: what the reader waits for (the client's Reply, future or call), or None.
    def read_answers(self, reply: Any, deadline: float, others: bool) -> bytes | None: ...

@disjoint_base
class PipelineCore:
    _lock: CoreLock
    _writer: CoreLock
    _pending: Any
    _connection: Any
    # The client's Target, which this layer does not import.
    _target: Any
    target: str
    _closed: bool
    timeout: float
    reconnect_backoff_s: float
    _backoff: float
    max_batch: int
    max_frame_bytes: int
    _last_request_id: int
    def __init__(
        self,
        target: Any,
        timeout: float,
        max_batch: int,
        reconnect_backoff_s: float,
        max_frame_bytes: int,
        busy_poll_s: float,
    ) -> None: ...
    def _next_id(self) -> int: ...
    @property
    def busy_poll_s(self) -> float: ...
    @busy_poll_s.setter
    def busy_poll_s(self, value: float) -> None: ...
    @property
    def _busy_poll_skip(self) -> int: ...
    def has_queued(self) -> bool: ...
    def _keep(self, connection: ConnectionCore) -> bool: ...
    def _mark_closed(self) -> tuple[Any, bool]: ...
    # The requests of eventspool.client.sync_requests, which this layer does not import.
    def submit(self, items: list[Any], control: bool = False) -> None: ...
    def wait(self, reply: Any) -> None: ...
    def _flush(self) -> None: ...
    def _take(self, most: int) -> list[Any]: ...
    def _frames(self, connection: ConnectionCore, batch: list[Any]) -> bytes: ...
    def _frame_of(self, request_id: int, request: Any) -> bytes | None: ...
    def _answer_all(self, connection: ConnectionCore, frames: list[Frame]) -> None: ...

@disjoint_base
class ClientCore:
    _pipeline: PipelineCore
    # The client's Outstanding, which this layer does not import.
    _outstanding: Any
    max_queued: int
    def send(
        self,
        topic: str | None,
        value: bytes | None,
        key: bytes | str | None = None,
        headers: HeadersInput | None = None,
        *,
        exchange: str | None = None,
        routing_key: str = "",
        event_id: str | UUID | None = None,
    ) -> str: ...
    def send_async(
        self,
        topic: str | None,
        value: bytes | None,
        key: bytes | str | None = None,
        headers: HeadersInput | None = None,
        *,
        exchange: str | None = None,
        routing_key: str = "",
        event_id: str | UUID | None = None,
    ) -> Future[str]: ...

def settle_results(
    request: list[Any], body: bytes, refusal_error: Callable[[tuple[int, str]], Any]
) -> None: ...

CHECKED_TOPICS: set[str]

def common_event_payload(
    topic: object, value: object, key: object, headers: object, event_id: object
) -> bytes | None: ...
def frame_cuts(
    sizes: list[int], overhead: int, max_frame_bytes: int, max_events: int
) -> list[slice]: ...
def encode_wire_event(
    value: bytes | None,
    key: bytes | None,
    headers: Sequence[tuple[str, bytes | None]] | None,
    event_id: str | None,
) -> bytes: ...

@disjoint_base
class AckTracker:
    acked_until: int
    in_flight: int
    failed: bool
    def __init__(self, first_seq: int) -> None: ...
    def reset(self, first_seq: int) -> None: ...
    def sent(self, seq: int) -> None: ...
    def completed(self, seq: int) -> bool: ...
    def failed_transiently(self) -> None: ...

@disjoint_base
class Deliveries:
    tracker: AckTracker
    advanced: bool
    delivered: int
    stopped_at: int
    def __init__(
        self, tracker: AckTracker, on_failure: Callable[[int, Any, Any], None]
    ) -> None: ...
    def __call__(self, error: Any, message: Any) -> None: ...
    def queued(self, seq: int) -> None: ...
    def produce_batch(
        self,
        produce: Callable[..., None],
        topic: str,
        partition: int,
        batch: list[tuple[int, bytes | None, bytes | None, int, _KafkaHeaders | None]],
        start: int,
    ) -> int: ...

# (offset, key, value, headers, (timestamp type, timestamp)): eventspool.consumer.record.RawRecord
_RawRecord = tuple[int, bytes | None, bytes | None, _Headers | None, tuple[int, int]]
# (topic, partition, first offset, end offset, count, per worker (blob, records) or None, stale)
KeyedRun = tuple[str, int, int, int, int, list[tuple[bytes, int] | None], list[_RawRecord]]

def calls_getters_directly(message_type: type) -> bool:
    """Whether split_keyed calls every getter of `message_type` through its C function."""

def split_keyed(
    messages: list[Any],
    workers: int,
    cap: int,
    ends: dict[tuple[str, int], int | None],
    oldest_ms: float | None,
) -> list[Any]: ...
def decode_records(blob: bytes) -> list[_RawRecord]: ...
def decode_part(blob: bytes, topic: str, partition: int) -> list[Record]: ...

@final
class PartRecords:
    """A packed part's Records, made one at a time as they are taken."""

    def __new__(cls, blob: bytes, topic: str, partition: int) -> Self: ...
    @property
    def count(self) -> int: ...
    def __iter__(self) -> PartRecords: ...
    def __length_hint__(self) -> int: ...
    def __next__(self) -> Record: ...

@final
class Record:
    """One event as a handler sees it (eventspool.consumer.Record)."""

    __match_args__ = (
        "topic",
        "partition",
        "offset",
        "key",
        "value",
        "headers",
        "create_time_ms",
        "event_id",
        "attempt",
    )
    @property
    def topic(self) -> str: ...
    @property
    def partition(self) -> int: ...
    @property
    def offset(self) -> int: ...
    @property
    def key(self) -> bytes | None: ...
    @property
    def value(self) -> bytes | None: ...
    @property
    def headers(self) -> _Headers | None: ...
    @property
    def create_time_ms(self) -> int | None: ...
    @property
    def event_id(self) -> str | None: ...
    @property
    def attempt(self) -> int: ...
    def __init__(
        self,
        topic: str,
        partition: int,
        offset: int,
        key: bytes | None,
        value: bytes | None,
        headers: _Headers | None,
        create_time_ms: int | None,
        event_id: str | None,
        attempt: int = 1,
    ) -> None: ...
    def header(self, name: str) -> bytes | None: ...
    def with_attempt(self, attempt: int) -> Record: ...
    def __hash__(self) -> int: ...

@disjoint_base
class Handoff:
    """One side of a byte ring in shared memory, with one writer and one reader."""

    @property
    def capacity(self) -> int: ...
    def __new__(cls, buffer: Buffer) -> Self: ...
    def put(self, blob: bytes) -> int | None: ...
    def take(self, start: int, size: int) -> bytes: ...

LISTENER_ACCEPT_RETRY_S: float

@disjoint_base
class UnixIntake:
    def __init__(
        self,
        listen_fd: int,
        front: SpoolFront,
        max_frame: int,
        frame_timeout_s: float,
        inline: set[bytes],
        learn: Callable[[bytes], bool],
        fallback: Callable[[str, bytes | None, bytes | None], tuple[int, bytes]],
        hand_over: Callable[[int, bytes, bytes, bool], None],
        counters: object,
        failed: Callable[[str, BaseException], None],
        busy_poll_s: float,
    ) -> None: ...
    @property
    def connections(self) -> int: ...
    def stop(self) -> None: ...
    def run(self) -> None: ...
