"""Request/reply: a service answers requests from a consumer group's worker processes,
and a caller waits for each answer with a timeout.

Runs against an embedded broker and exits after a few calls, one of them to a topic
nobody serves, to show the timeout error.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from eventspool import Spool
from eventspool.broker import LocalBroker, create_topic
from eventspool.consumer import Consumer, ConsumerSettings, Record
from eventspool.rpc import Responder, RpcClient, RpcTimeoutError

QUICK_GROUP = {"session.timeout.ms": 3000, "heartbeat.interval.ms": 300}


def shout(request: Record) -> bytes:
    """The service: its return value is the reply. Keep it idempotent, since a request
    can be delivered, and answered, twice."""
    return (request.value or b"").upper()


def main() -> None:
    with tempfile.TemporaryDirectory() as work, LocalBroker(work) as broker:
        bootstrap = broker.bootstrap_servers
        create_topic(bootstrap, "rpc.shout", partitions=2)
        create_topic(bootstrap, "rpc.nobody", partitions=1)
        service = Consumer(
            "shout-service",
            ["rpc.shout"],
            Responder(shout, bootstrap),
            workers=2,
            bootstrap_servers=bootstrap,
            settings=ConsumerSettings(kafka=QUICK_GROUP),
        )
        with (
            service,
            Spool(Path(work) / "spool", bootstrap_servers=bootstrap) as spool,
            RpcClient(spool, bootstrap) as client,
        ):
            print(client.call("rpc.shout", b"hello", timeout=30).decode())
            futures = [client.call_async("rpc.shout", word) for word in (b"a", b"b", b"c")]
            print(b" ".join(future.result() for future in futures).decode())
            try:
                client.call("rpc.nobody", b"anyone?", timeout=1.0)
            except RpcTimeoutError as error:
                print(f"timeout: {error}")


if __name__ == "__main__":
    main()
