"""A client process for the agent SIGKILL test: sends through the agent until it is killed.

Run as ``python -m tests.fault.agent_client_child LEDGER SOCKET TARGET [THREADS] [SEED]
[PAUSE_S]`` from the repository root. TARGET is a topic, or ``@NAME`` to publish through
exchange NAME (no topic name contains '@'), with routing keys ``key.N``. THREADS threads
(default 4) share one `Client`, so its batching is under test too, and send keyed
events in a loop, as fast as the agent answers, or PAUSE_S apart (many callers on two
cores must leave the rest of a test suite some CPU).

Each event id whose `send()` returned is appended to LEDGER (`eventspool.testing.ledger`)
as ``<event_id> TARGET`` after the call returned; the threads share the writer, and a
kill never leaves half a line behind. A send that raised AgentError (the agent died
under it) is not recorded: its event may or may not have been spooled. The thread
retries with a new event, and the client reconnects on that call. Each failure is one
line on stderr, for the parent's report.
"""

from __future__ import annotations

import os
import random
import sys
import threading
import time
from pathlib import Path

from eventspool.client.sync import AgentError, Client
from eventspool.testing.ledger import LedgerWriter

KEY_SPACE = 97
DEFAULT_THREADS = 4
_RETRY_PAUSE_S = 0.01


def _complain(line: str) -> None:
    """One stderr line in one `os.write`, so the threads' lines never interleave."""
    os.write(2, line.encode() + b"\n")


def _send_forever(  # noqa: PLR0917  # run()'s own parameters, in its order
    client: Client, ledger: LedgerWriter, target: str, worker: int, seed: int, pause_s: float
) -> None:
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
            _complain(f"AgentError: {exc}")
            time.sleep(_RETRY_PAUSE_S)
            continue
        ledger.append(event_id, target)
        if pause_s:
            time.sleep(pause_s)


def _worker(  # noqa: PLR0917  # run()'s own parameters, in its order
    client: Client, ledger: LedgerWriter, target: str, worker: int, seed: int, pause_s: float
) -> None:
    """Any other error ends the whole process, so the parent sees it instead of a quiet thread."""
    try:
        _send_forever(client, ledger, target, worker, seed, pause_s)
    except BaseException as exc:
        _complain(f"thread {worker} failed: {exc!r}")
        os._exit(3)


def run(  # noqa: PLR0917  # main()'s arguments, in their order
    ledger: LedgerWriter, socket_path: str, target: str, threads: int, seed: int, pause_s: float
) -> None:
    """Start the senders and wait forever: a signal is the only way out."""
    # A long timeout: a restart of the agent must not turn into failed sends.
    client = Client(socket_path, timeout=30.0)
    for worker in range(threads):
        threading.Thread(
            target=_worker, args=(client, ledger, target, worker, seed, pause_s), daemon=True
        ).start()
    threading.Event().wait()


def main(argv: list[str]) -> None:
    ledger_path, socket_path, target, *rest = argv
    threads = int(rest[0]) if rest else DEFAULT_THREADS
    seed = int(rest[1]) if len(rest) > 1 else int.from_bytes(os.urandom(4), "little")
    pause_s = float(rest[2]) if len(rest) > 2 else 0.0
    run(LedgerWriter(Path(ledger_path)), socket_path, target, threads, seed, pause_s)


if __name__ == "__main__":
    main(sys.argv[1:])
