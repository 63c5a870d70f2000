"""A bench's child process: a Python script run with arguments, its stderr kept in a file,
stopped when asked (a "stop" line on its stdin, or SIGTERM) or SIGKILLed, and restarted.
`kill` insists the child was still running: a child that died before measures nothing.
A script's own child (`of_script`) that does not stop in time writes every thread's
Python stack to its stderr before it is killed, so the error says where it hung.
"""

from __future__ import annotations

import contextlib
import faulthandler
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import IO

# The hidden first argument that makes a bench script run one of its own children.
CHILD_COMMAND = "_child"
# What makes a child write its threads' stacks to stderr (faulthandler), how long it is
# given to, and how much of what it wrote then an error quotes (the end: faulthandler
# writes the main thread last).
STACKS_SIGNAL = signal.SIGUSR1
STACKS_WAIT_S = 1.0
STACKS_MOST_CHARS = 20_000


class ChildError(RuntimeError):
    """A child process ended when it was not asked to, or did not end when it was."""


class Child:
    """One child process; `piped` gives it a stdin to read "stop" from and a stdout to
    report on, else both are /dev/null and `stop` sends SIGTERM. `dumps_stacks`: the
    child calls `child_arguments`, so STACKS_SIGNAL makes it write its stacks."""

    def __init__(
        self,
        name: str,
        argv: Sequence[str],
        stderr_path: Path,
        *,
        piped: bool = False,
        dumps_stacks: bool = False,
    ) -> None:
        self.name = name
        self.argv = [sys.executable, *argv]
        self.stderr_path = stderr_path
        self.piped = piped
        self.dumps_stacks = dumps_stacks
        self.process: subprocess.Popen[str] | None = None
        # A kill and its restart are one step for `check()` on another thread.
        self._lock = threading.Lock()

    @classmethod
    def of_script(
        cls, name: str, script: str, args: Sequence[str], stderr_path: Path, *, piped: bool = False
    ) -> Child:
        """`script` (a bench script's `__file__`) run as its own child."""
        argv = [os.fspath(Path(script).resolve()), CHILD_COMMAND, *args]
        return cls(name, argv, stderr_path, piped=piped, dumps_stacks=True)

    @property
    def pid(self) -> int:
        return self._running().pid

    def _running(self) -> subprocess.Popen[str]:
        if self.process is None:
            raise ChildError(f"{self.name} was never started")
        return self.process

    def start(self) -> Child:
        pipe = subprocess.PIPE if self.piped else subprocess.DEVNULL
        with self.stderr_path.open("ab") as stderr:
            self.process = subprocess.Popen(
                self.argv, stdin=pipe, stdout=pipe, stderr=stderr, text=True
            )
        return self

    def alive(self) -> bool:
        return self._running().poll() is None

    def tell(self, line: str) -> None:
        """Write `line` to a piped child's stdin, at once."""
        stdin: IO[str] | None = self._running().stdin
        assert stdin is not None, "only a piped child reads its stdin"
        stdin.write(f"{line}\n")
        stdin.flush()

    def read_line(self) -> str:
        """The next line the child printed ("" once it closed its stdout)."""
        stdout: IO[str] | None = self._running().stdout
        assert stdout is not None, "only a piped child reports on its stdout"
        return stdout.readline()

    def check(self) -> None:
        """Raise if the child ended without being asked to."""
        with self._lock:
            if self.process is not None and (code := self.process.poll()) is not None:
                raise ChildError(f"{self.name} exited with {code}: {self.stderr_tail()}")

    def kill(self) -> None:
        """SIGKILL the child, which must still be running."""
        process = self._running()
        if process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
        code = process.wait()
        self._close_pipes()
        if code != -signal.SIGKILL:
            raise ChildError(f"{self.name} ended before its kill ({code}): {self.stderr_tail()}")

    def kill_and_restart(self) -> None:
        self.check()
        with self._lock:
            self.kill()
            self.start()

    def stop(self, timeout: float) -> None:
        """Ask the child to finish its work and wait for it; it must exit with 0. One that
        does not in time is killed, and the error quotes its stacks or its stderr's end."""
        self.check()
        process = self._running()
        if self.piped:
            assert process.stdin is not None
            process.stdin.write("stop\n")
            process.stdin.close()
        else:
            process.send_signal(signal.SIGTERM)
        try:
            code = process.wait(timeout)
        except subprocess.TimeoutExpired:
            said = self._stacks() if self.dumps_stacks else self.stderr_tail()
            self.terminate()
            raise ChildError(f"{self.name} did not stop in {timeout} s:\n{said}") from None
        self._close_pipes()
        if code != 0:
            raise ChildError(f"{self.name} exited with {code}: {self.stderr_tail()}")

    def _stacks(self) -> str:
        """What the running child wrote to stderr once asked for its stacks."""
        process = self._running()
        try:
            before = self.stderr_path.stat().st_size
        except OSError as exc:
            return f"(stderr unreadable: {exc})"
        process.send_signal(STACKS_SIGNAL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            process.wait(STACKS_WAIT_S)
        if process.returncode == -STACKS_SIGNAL:
            return f"(it died of {STACKS_SIGNAL.name}: it had not read its arguments yet)"
        with self.stderr_path.open("rb") as stderr:
            stderr.seek(before)
            written = stderr.read().decode(errors="replace")
        return f"its stacks and what it wrote meanwhile:\n{written[-STACKS_MOST_CHARS:]}"

    def terminate(self) -> None:
        """The last resort on the way out: SIGKILL if it still runs."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
            self._close_pipes()

    def _close_pipes(self) -> None:
        assert self.process is not None
        for pipe in (self.process.stdin, self.process.stdout):
            if pipe is not None and not pipe.closed:
                pipe.close()

    def stderr_tail(self) -> str:
        try:
            return self.stderr_path.read_text(errors="replace")[-3000:]
        except OSError as exc:
            return f"(unreadable: {exc})"


def child_arguments(argv: Sequence[str] | None) -> list[str] | None:
    """The arguments after CHILD_COMMAND when this script runs as a child, else None.

    A child also learns here to dump its stacks on STACKS_SIGNAL, as soon as it reads its
    arguments: `Child.stop` relies on it.
    """
    arguments = list(sys.argv[1:] if argv is None else argv)
    if arguments[:1] != [CHILD_COMMAND]:
        return None
    faulthandler.register(STACKS_SIGNAL, all_threads=True)
    return arguments[1:]
