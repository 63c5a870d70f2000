"""A throwaway PostgreSQL server in a temporary directory, for the main job and the tests.

Users point the pipeline at their own database with a DSN; this exists so a fresh machine
can run everything without one. It needs PostgreSQL's server binaries, which it finds
and never installs: installing a system package is the set-up's job (`make postgres`).
PostgreSQL refuses to run as root, so as root the data directory belongs to, and the
server runs as, the ``postgres`` user (created by the package) or ``nobody``.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from types import TracebackType
from typing import Self

from eventspool.spark.extra import SparkExtraMissingError

try:
    import psycopg
except ModuleNotFoundError as missing:
    raise SparkExtraMissingError(missing.name) from missing

_READY_TIMEOUT_S = 30.0
_USER = "eventspool"


class PostgresUnavailableError(RuntimeError):
    """No PostgreSQL server binaries, or the server would not start."""


def find_bin_dir() -> Path | None:
    """The directory holding initdb and postgres: on PATH, else Debian's newest version."""
    on_path = shutil.which("initdb")
    if on_path is not None:
        return Path(on_path).resolve().parent
    versions = sorted(
        Path("/usr/lib/postgresql").glob("*/bin/initdb"),
        key=lambda p: int(p.parent.parent.name) if p.parent.parent.name.isdigit() else 0,
    )
    return versions[-1].parent if versions else None


def require_bin_dir() -> Path:
    """The server binaries' directory, or an error that says how to install them."""
    found = find_bin_dir()
    if found is None:
        raise PostgresUnavailableError(
            "PostgreSQL's server binaries (initdb, postgres) were not found: install "
            "PostgreSQL's server (apt-get install postgresql, or make postgres in a checkout "
            "of eventspool), or pass the DSN of an existing server"
        )
    return found


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


def _server_user() -> str | None:
    """None when not root (run as ourselves), else an unprivileged account."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            pwd.getpwnam(name)
            return name
    raise PostgresUnavailableError("running as root and neither 'postgres' nor 'nobody' exists")


class LocalPostgres:
    """initdb + postgres on a free port of 127.0.0.1, its socket in the same temp dir."""

    def __init__(self, parent: str | os.PathLike[str] | None = None) -> None:
        self._parent = parent
        self._root: Path | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self.port = 0

    @property
    def dsn(self) -> str:
        return f"host=127.0.0.1 port={self.port} user={_USER} dbname=postgres"

    def start(self) -> None:
        bin_dir = require_bin_dir()
        user = _server_user()
        # Not under a 0700 directory of root's: the server's user must reach its files.
        self._root = Path(tempfile.mkdtemp(prefix="eventspool-pg-", dir=self._parent))
        data = self._root / "data"
        log = self._root / "postgres.log"
        if user is not None:
            self._root.chmod(0o755)
            entry = pwd.getpwnam(user)
            os.chown(self._root, entry.pw_uid, entry.pw_gid)
        subprocess.run(
            [bin_dir / "initdb", "-D", data, "-U", _USER, "-A", "trust", "-E", "UTF8", "--no-sync"],
            user=user,
            capture_output=True,
            check=True,
            cwd=self._root,
        )
        self.port = _free_port()
        with log.open("wb") as out:
            self._process = subprocess.Popen(
                [
                    bin_dir / "postgres",
                    "-D",
                    data,
                    "-p",
                    str(self.port),
                    "-h",
                    "127.0.0.1",
                    "-k",
                    self._root,
                    "-c",
                    "fsync=off",
                    "-c",
                    "full_page_writes=off",
                ],
                user=user,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                cwd=self._root,
            )
        self._wait_ready(log)

    def _wait_ready(self, log: Path) -> None:
        deadline = time.monotonic() + _READY_TIMEOUT_S
        while True:
            assert self._process is not None
            if self._process.poll() is not None:
                raise PostgresUnavailableError(
                    f"postgres exited ({self._process.returncode}): "
                    f"{log.read_text(errors='replace')[-2000:]}"
                )
            try:
                with psycopg.connect(self.dsn, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise PostgresUnavailableError(
                        f"postgres did not accept connections in {_READY_TIMEOUT_S:.0f}s"
                    ) from None
                time.sleep(0.1)

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then remove the directory."""
        if self._process is not None:
            self._process.send_signal(2)
            try:
                self._process.wait(15)
            except subprocess.TimeoutExpired:
                self._process.kill()
                self._process.wait()
            self._process = None
        if self._root is not None:
            shutil.rmtree(self._root, ignore_errors=True)
            self._root = None

    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()
