"""A client process for the agent SIGKILL test: sends through the agent until it is killed.

Run as ``python -m tests.fault.agent_client_child SOCKET TARGET [THREADS] [SEED]`` from
the repository root. TARGET is a topic, or ``@NAME`` to publish through exchange NAME
(no topic name contains '@'), with routing keys ``key.N``. THREADS threads (default 4)
share one `Client`, so its batching is under test too, and send keyed events in a
loop, as fast as the agent answers.

Each stdout line is one event id whose `send()` returned, written with a single
``os.write`` after the call returned: a pipe write of under PIPE_BUF bytes is atomic, so
lines of different threads never interleave and a kill never leaves half an id behind.
A send that raised AgentError (the agent died under it) is not reported: its event may
or may not have been spooled. The thread retries with a new event, and the client
reconnects on that call. Each failure is one line on stderr, for the parent's report.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time

from eventspool.client.sync import AgentError, Client

KEY_SPACE = 97
DEFAULT_THREADS = 4
_RETRY_PAUSE_S = 0.01


def _emit(fd: int, line: str) -> None:
    os.write(fd, line.encode() + b"\n")


def _send_forever(client: Client, target: str, worker: int, seed: int) -> None:
    """One sending thread: never returns; AgentError is reported and retried."""
    rng = random.Random(seed * 1000 + worker)
    pid = os.getpid()
    exchange = target[1:] if target.startswith("@") else None
    topic = None if exchange else target
    counter = 0
    while True:
        number = rng.randrange(KEY_SPACE)
        key = b"key-%d" % number
        value = b"pid %d thread %d event %d " % (pid, worker, counter) + rng.randbytes(48)
        counter += 1
        try:
            event_id = client.send(
                topic, value, key, exchange=exchange, routing_key=f"key.{number}"
            )
        except AgentError as exc:
            _emit(2, f"AgentError: {exc}")
            time.sleep(_RETRY_PAUSE_S)
            continue
        _emit(1, event_id)


def _worker(client: Client, topic: str, worker: int, seed: int) -> None:
    """Any other error ends the whole process, so the parent sees it instead of a quiet thread."""
    try:
        _send_forever(client, topic, worker, seed)
    except BaseException as exc:
        _emit(2, f"thread {worker} failed: {exc!r}")
        os._exit(3)


def run(socket_path: str, topic: str, threads: int, seed: int) -> None:
    """Start the senders and wait forever: a signal is the only way out."""
    # A long timeout: a restart of the agent must not turn into failed sends.
    client = Client(socket_path, timeout=30.0)
    for worker in range(threads):
        threading.Thread(target=_worker, args=(client, topic, worker, seed), daemon=True).start()
    threading.Event().wait()


def main(argv: list[str]) -> None:
    socket_path, topic, *rest = argv
    threads = int(rest[0]) if rest else DEFAULT_THREADS
    seed = int(rest[1]) if len(rest) > 1 else int.from_bytes(os.urandom(4), "little")
    run(socket_path, topic, threads, seed)


if __name__ == "__main__":
    main(sys.argv[1:])
