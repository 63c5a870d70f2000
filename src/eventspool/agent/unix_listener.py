"""The unix socket of an agent that judges nothing, served by the compiled core.

With no access rules and no quotas, nothing is judged on a unix client. A thread of the
compiled core (`native.UnixIntake`) then accepts and reads the socket itself, and
answers SENDs to topics that never wait and PINGs straight from the read. asyncio's
per-read path was most of the agent's CPU per blocking send (profiled with 16 blocking
callers). At a connection's first frame that needs more (another request, a topic that
may wait, a fault, HTTP), the connection goes to the asyncio server for good, with the
bytes read from that frame on and the answers not written yet.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import threading
from typing import TYPE_CHECKING, Any

from eventspool._core.native import UnixIntake
from eventspool.agent.connection import FrameConnection, HandedOver
from eventspool.config import busy_poll_seconds

if TYPE_CHECKING:
    from eventspool.agent.server import AgentServer

log = logging.getLogger(__name__)


class UnixListener:
    """The compiled intake on its own thread, and the connections it hands to the loop."""

    def __init__(self, server: AgentServer, sock: socket.socket) -> None:
        self.server = server
        self.sock = sock
        self.loop = asyncio.get_running_loop()
        spooler = server.spooler
        self.intake = UnixIntake(
            sock.fileno(),
            server.spool,
            server.max_frame,
            server.frame_timeout_s,
            spooler.inline_topics,
            spooler.never_waits,
            spooler.send_one,
            self._hand_over,
            server.counters,
            self._failed,
            busy_poll_seconds(server.busy_poll_us),
        )
        self.thread = threading.Thread(target=self._run, name="eventspool-unix-intake", daemon=True)
        self.stopping = False
        # Connections being handed to the loop, and the loop's stand-in server starting.
        self._adoptions: set[asyncio.Task[Any]] = set()

    @property
    def connections(self) -> int:
        return self.intake.connections

    def start(self) -> None:
        self.thread.start()

    async def stop(self) -> None:
        """Close the socket and the connections the thread still serves; every request it
        read was answered, and answers not written yet go to the server to write."""
        self.stopping = True
        self.intake.stop()
        await asyncio.to_thread(self.thread.join)
        self.sock.close()
        for task in list(self._adoptions):
            await asyncio.gather(task, return_exceptions=True)

    def _run(self) -> None:
        """The thread: the intake until `stop()`. Should it end otherwise (an epoll
        failure), the event loop serves the socket from then on."""
        try:
            self.intake.run()
        except BaseException:
            log.exception("unix socket: the compiled listener failed")
        if not self.stopping:
            log.error("unix socket: the compiled listener stopped; the event loop serves it now")
            with contextlib.suppress(RuntimeError):  # the loop is closed: the agent is gone
                self.loop.call_soon_threadsafe(self._serve_on_loop)

    def _serve_on_loop(self) -> None:
        if not self.stopping:
            task = self.loop.create_task(self.server.serve_unix_on_loop(self.sock))
            self._adoptions.add(task)
            task.add_done_callback(self._adopted)

    def _hand_over(self, fd: int, first: bytes, unsent: bytes, answered: bool) -> None:
        """On the intake's thread: the connection is the event loop's from here on."""
        try:
            self.loop.call_soon_threadsafe(self._adopt, fd, HandedOver(first, unsent, answered))
        except RuntimeError:  # the loop is closed: the agent is gone
            os.close(fd)

    def _adopt(self, fd: int, handed: HandedOver) -> None:
        """Also while the agent stops: the server writes the answers handed over, answers
        what follows with SHUTTING_DOWN, and closes the connection once they are out."""
        sock = socket.socket(fileno=fd)
        task = self.loop.create_task(
            self.loop.connect_accepted_socket(lambda: FrameConnection(self.server, handed), sock)
        )
        self._adoptions.add(task)
        task.add_done_callback(self._adopted)

    def _adopted(self, task: asyncio.Task[Any]) -> None:
        self._adoptions.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._failed("taking over a connection", task.exception())

    def _failed(self, what: str, exc: BaseException | None) -> None:
        if isinstance(exc, OSError):
            log.error("unix socket: %s failed: %s", what, exc)
        else:
            log.error("unix socket: %s failed", what, exc_info=exc)
