"""The least a blocking `send()` shared by threads can do against the agent: the second
anchor of the uds bench's one-client lane, beside the hand-off ceiling.

Each caller encodes its event as `Client.send()` does and waits on a lock of its own; one
thread writes everything queued as one SEND frame, reads its SEND_RESULT and wakes those
callers. No reconnects, timeouts, other topics or refusals in words: what one connection
can carry with CPython's thread hand-offs and the agent's own round trips, so the lane's
gap splits into the client's part (ours against this) and the agent's (this against the
ceiling).
"""

from __future__ import annotations

import queue
import threading
from pathlib import Path

from eventspool._core.native import decode_results, encode_wire_event
from eventspool.client.sync_connection import READ_SIZE
from eventspool.errors import AgentError
from eventspool.wire.protocol import Frame, FrameDecoder, encode_send_payloads
from harness.echo import connected


class _Call:
    __slots__ = ("done", "outcome", "payload")

    def __init__(self, payload: bytes) -> None:
        self.payload = payload
        self.done = threading.Lock()
        self.done.acquire()
        self.outcome: str | tuple[int, str] | BaseException = ""


class BareClient:
    """A connection to the agent at `path` and the thread that writes for its callers;
    every `send()` goes to the topic of the first call of its frame."""

    def __init__(self, path: Path) -> None:
        self._sock = connected(path)
        self._queue: queue.SimpleQueue[_Call | None] = queue.SimpleQueue()
        self._topic = ""
        self._thread = threading.Thread(target=self._serve, name="bench-bare-client", daemon=True)
        self._thread.start()

    def send(self, topic: str, value: bytes) -> str:
        self._topic = topic
        call = _Call(encode_wire_event(value, None, None, None))
        self._queue.put(call)
        call.done.acquire()
        if isinstance(call.outcome, str):
            return call.outcome
        raise AgentError(f"the bare client's send failed: {call.outcome}")

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join()
        self._sock.close()

    def _serve(self) -> None:
        """Write what is queued as one frame, wait for its answer, wake its callers."""
        decoder = FrameDecoder()
        request_id = 0
        while True:
            calls: list[_Call] = []
            call = self._queue.get()
            while call is not None:
                calls.append(call)
                try:
                    call = self._queue.get_nowait()
                except queue.Empty:
                    break
            if calls:
                request_id += 1
                try:
                    payloads = [queued.payload for queued in calls]
                    self._sock.sendall(encode_send_payloads(request_id, self._topic, payloads))
                    frames: list[Frame] = []
                    while not frames:
                        if not (data := self._sock.recv(READ_SIZE)):
                            raise ConnectionError("the agent closed the connection")
                        frames = decoder.feed(data)
                    outcomes: list[str | tuple[int, str] | BaseException] = [
                        *decode_results(frames[0].body)
                    ]
                    if len(outcomes) != len(calls):
                        raise ValueError(f"{len(outcomes)} results for {len(calls)} events")
                except Exception as exc:  # every caller of the frame hears of it
                    outcomes = [exc] * len(calls)
                for queued, outcome in zip(calls, outcomes, strict=True):
                    queued.outcome = outcome
                    queued.done.release()
            if call is None:
                return
