"""A multi-broker Kafka cluster on one machine: librdkafka's mock cluster, in a process of its own.

librdkafka ships the mock cluster its own failover tests run on; the copy inside the
confluent-kafka wheel exports it. It runs in the process that created it, so it lives
in a child process here: a test may SIGKILL the process under test, or the whole
interpreter of a client, and the cluster goes on. The parent steers the child through
its standard input, one JSON command per line, one JSON answer per line.

What the mock cannot do, and so what a test on it cannot judge:
  - no replication and no ISR: a partition has one shared log, whoever leads it;
  - sequence numbers are checked only for transactional producers. A retried batch may
    be appended twice: judge loss on it, not duplicates. And a batch that an injected
    error refused is lost when a later batch of its partition, pipelined behind it, is
    appended: that one's success acknowledges both (librdkafka's implicit ack), where a
    broker refuses it as out of order and the producer sends both again. A producer
    that meets injected produce errors keeps one request in flight per connection
    (`ONE_REQUEST_IN_FLIGHT`);
  - each partition log keeps at most 5 MiB (or 100,000 message sets);
  - no SSL or SASL, no CreateTopics or CreatePartitions (topics are created here, with
    `create_topic`, or on a client's first metadata request);
  - a broker set down refuses connections at once (with the librdkafka of
    confluent-kafka 2.16; older mock brokers kept the port, so connects hung until
    `socket.connection.setup.timeout.ms`, as they do to a host that died): a test of a
    host that swallows connects needs `set_rtt` or a proxy, not `broker_down`;
  - `broker_down` does not move leaders, nor the group coordinator: move them with
    `set_leader` and `set_coordinator`, as a controller would.
"""

from __future__ import annotations

import ctypes
import glob
import json
import os
import subprocess
import sys
import threading
from collections.abc import Sequence
from enum import IntEnum
from pathlib import Path
from types import TracebackType
from typing import IO, Self

import confluent_kafka

from eventspool.broker.local import BrokerError

__all__ = ["ONE_REQUEST_IN_FLIGHT", "ApiKey", "MockCluster"]

#: librdkafka settings under which the mock's acknowledgements mean what a broker's do
#: while produce requests are refused by injected errors (see above).
ONE_REQUEST_IN_FLIGHT = {"max.in.flight.requests.per.connection": 1}

_START_TIMEOUT_S = 20.0
_NO_LEADER = -1


class ApiKey(IntEnum):
    """Kafka protocol request types, for `push_request_errors`."""

    PRODUCE = 0
    FETCH = 1
    LIST_OFFSETS = 2
    METADATA = 3
    OFFSET_COMMIT = 8
    OFFSET_FETCH = 9
    FIND_COORDINATOR = 10
    JOIN_GROUP = 11
    HEARTBEAT = 12
    LEAVE_GROUP = 13
    SYNC_GROUP = 14
    INIT_PRODUCER_ID = 22


class MockCluster:
    """A mock cluster of `brokers` brokers (ids 1..N) in a child process, and its controls.

    Every control call waits for the child's answer, so the fault is in place when it
    returns. `stop()` (or leaving the `with` block) ends the child; so does the parent's
    death, since the child exits when its standard input closes.
    """

    def __init__(self, brokers: int = 3, *, log_path: str | os.PathLike[str] | None = None) -> None:
        if brokers < 1:
            raise ValueError(f"brokers={brokers}: a cluster needs at least one")
        self.brokers = brokers
        self._log_path = Path(log_path) if log_path is not None else None
        self._process: subprocess.Popen[str] | None = None
        self._lock = threading.Lock()
        self._bootstrap_servers = ""

    @property
    def bootstrap_servers(self) -> str:
        if self._process is None:
            raise BrokerError("the mock cluster is not started")
        return self._bootstrap_servers

    @property
    def pid(self) -> int:
        if self._process is None:
            raise BrokerError("the mock cluster is not started")
        return self._process.pid

    def start(self) -> Self:
        log: IO[str] | int = subprocess.DEVNULL
        if self._log_path is not None:
            log = self._log_path.open("a")
        try:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "eventspool.broker.mock", str(self.brokers)],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                text=True,
            )
        finally:
            if not isinstance(log, int):
                log.close()
        answer = self._read_answer()
        self._bootstrap_servers = str(answer["bootstrap_servers"])
        return self

    def stop(self) -> None:
        process, self._process = self._process, None
        if process is None:
            return
        assert process.stdin is not None and process.stdout is not None
        try:
            process.stdin.close()
            process.wait(timeout=10)
        except (OSError, subprocess.TimeoutExpired):
            process.kill()
            process.wait()
        process.stdout.close()

    def __enter__(self) -> Self:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    # ---- controls ----------------------------------------------------------------

    def create_topic(self, topic: str, partitions: int, replication: int = 3) -> None:
        """Create `topic`; leaders are spread over the brokers, as a real cluster does."""
        self._call("topic_create", topic, partitions, min(replication, self.brokers))

    def set_leader(self, topic: str, partition: int, broker: int | None) -> None:
        """Move a partition's leadership to `broker`; None leaves it without a leader."""
        self._call(
            "partition_set_leader", topic, partition, _NO_LEADER if broker is None else broker
        )

    def broker_down(self, broker: int) -> None:
        """Close the broker's connections and refuse new ones; its leaders stay put."""
        self._call("broker_set_down", broker)

    def broker_up(self, broker: int) -> None:
        self._call("broker_set_up", broker)

    def set_rtt(self, broker: int, rtt_ms: int) -> None:
        """Delay every answer of `broker` (-1: every broker) by `rtt_ms`."""
        self._call("broker_set_rtt", broker, rtt_ms)

    def set_coordinator(self, group: str, broker: int) -> None:
        """Make `broker` the coordinator of consumer group `group`."""
        self._call("coordinator_set", "group", group, broker)

    def push_request_errors(self, api_key: ApiKey | int, codes: Sequence[int]) -> None:
        """Answer the next len(codes) requests of `api_key`, on any broker, with these
        error codes, in order (librdkafka's `_TRANSPORT`, -195, disconnects instead)."""
        self._call("push_request_errors_array", int(api_key), [int(code) for code in codes])

    def clear_request_errors(self, api_key: ApiKey | int) -> None:
        self._call("clear_request_errors", int(api_key))

    def add_broker(self, broker: int) -> None:
        """Add a broker with id `broker`; it leads nothing until `set_leader` says so."""
        self._call("broker_add", broker)

    def set_group_initial_rebalance_delay(self, delay_ms: int) -> None:
        """The coordinator's wait for more members before the first rebalance (3 s by
        default in the mock, as in Kafka's `group.initial.rebalance.delay.ms`)."""
        self._call("group_initial_rebalance_delay_ms", delay_ms)

    def _call(self, function: str, *args: object) -> None:
        with self._lock:
            process = self._process
            if process is None or process.stdin is None:
                raise BrokerError("the mock cluster is not started")
            try:
                process.stdin.write(json.dumps([function, *args]) + "\n")
                process.stdin.flush()
            except OSError as exc:
                raise BrokerError(f"the mock cluster process is gone: {exc}") from exc
            answer = self._read_answer()
        error = answer.get("error")
        if error:
            raise BrokerError(f"mock cluster: {function}{args!r} failed: {error}")

    def _read_answer(self) -> dict[str, object]:
        assert self._process is not None and self._process.stdout is not None
        line = self._process.stdout.readline()
        if not line:
            code = self._process.poll()
            raise BrokerError(f"the mock cluster process ended (exit status {code})")
        answer: dict[str, object] = json.loads(line)
        return answer


# ---- the child process --------------------------------------------------------------

_SIGNATURES: dict[str, list[type]] = {
    "topic_create": [ctypes.c_char_p, ctypes.c_int, ctypes.c_int],
    "partition_set_leader": [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32],
    "broker_set_down": [ctypes.c_int32],
    "broker_set_up": [ctypes.c_int32],
    "broker_set_rtt": [ctypes.c_int32, ctypes.c_int],
    "coordinator_set": [ctypes.c_char_p, ctypes.c_char_p, ctypes.c_int32],
    "clear_request_errors": [ctypes.c_int16],
    "broker_add": [ctypes.c_int32],
    "group_initial_rebalance_delay_ms": [ctypes.c_int32],
}
_RETURNS_NOTHING = frozenset({"clear_request_errors", "push_request_errors_array"})


def _librdkafka() -> ctypes.CDLL:
    """The librdkafka that confluent-kafka itself loads, from its wheel's libs folder."""
    package = Path(confluent_kafka.__file__).parent
    found = sorted(glob.glob(str(package.parent / "confluent_kafka.libs" / "librdkafka*.so*")))
    if not found:
        raise BrokerError(
            "no librdkafka found beside confluent-kafka: the mock cluster needs the "
            "confluent-kafka wheel (pip install confluent-kafka)"
        )
    return ctypes.CDLL(found[0])


def _serve(broker_count: int) -> None:
    lib = _librdkafka()
    lib.rd_kafka_conf_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.restype = ctypes.c_void_p
    lib.rd_kafka_new.argtypes = [ctypes.c_int, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_size_t]
    lib.rd_kafka_mock_cluster_new.restype = ctypes.c_void_p
    lib.rd_kafka_mock_cluster_new.argtypes = [ctypes.c_void_p, ctypes.c_int]
    lib.rd_kafka_mock_cluster_bootstraps.restype = ctypes.c_char_p
    lib.rd_kafka_mock_cluster_bootstraps.argtypes = [ctypes.c_void_p]
    lib.rd_kafka_err2str.restype = ctypes.c_char_p
    lib.rd_kafka_err2str.argtypes = [ctypes.c_int]
    errstr = ctypes.create_string_buffer(512)
    handle = lib.rd_kafka_new(0, lib.rd_kafka_conf_new(), errstr, len(errstr))
    if not handle:
        raise BrokerError(f"rd_kafka_new failed: {errstr.value.decode()}")
    cluster = lib.rd_kafka_mock_cluster_new(handle, broker_count)
    if not cluster:
        raise BrokerError("rd_kafka_mock_cluster_new failed")
    functions = {}
    for name, argtypes in _SIGNATURES.items():
        function = getattr(lib, f"rd_kafka_mock_{name}")
        function.argtypes = [ctypes.c_void_p, *argtypes]
        function.restype = None if name in _RETURNS_NOTHING else ctypes.c_int
        functions[name] = function
    push = lib.rd_kafka_mock_push_request_errors_array
    push.argtypes = [ctypes.c_void_p, ctypes.c_int16, ctypes.c_size_t, ctypes.POINTER(ctypes.c_int)]
    push.restype = None

    def answer(message: dict[str, object]) -> None:
        sys.stdout.write(json.dumps(message) + "\n")
        sys.stdout.flush()

    bootstraps = lib.rd_kafka_mock_cluster_bootstraps(cluster).decode()
    answer({"bootstrap_servers": bootstraps})
    for line in sys.stdin:
        name, *args = json.loads(line)
        if name == "push_request_errors_array":
            api_key, codes = args
            push(cluster, api_key, len(codes), (ctypes.c_int * len(codes))(*codes))
            answer({})
            continue
        function = functions.get(name)
        if function is None:
            answer({"error": f"unknown control {name!r}"})
            continue
        encoded = [arg.encode() if isinstance(arg, str) else arg for arg in args]
        code = function(cluster, *encoded)
        if code:
            answer({"error": lib.rd_kafka_err2str(code).decode()})
        else:
            answer({})
    # The parent closed our input: end without tearing down librdkafka's threads.
    os._exit(0)


if __name__ == "__main__":
    _serve(int(sys.argv[1]))
