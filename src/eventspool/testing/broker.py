"""A local broker that clients reach only through a `FaultProxy`, so its outages can be staged.

A Kafka client talks to the address the broker *advertises*, not to the one it was
bootstrapped with: the broker advertises the proxy's port, or a client would go around
the proxy after its first metadata request. Cutting the proxy is how an outage is made
without losing the broker's in-memory data (restarting tansu would lose every record).
"""

from __future__ import annotations

import os
from pathlib import Path
from types import TracebackType
from typing import Self

from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from eventspool.broker.local import HOST, BrokerError, LocalBroker, PortInUseError, find_free_port
from eventspool.testing.proxy import FaultProxy

__all__ = ["ProxiedBroker"]

_START_ATTEMPTS = 3
_CHECK_TIMEOUT_S = 10.0


class ProxiedBroker:
    """tansu behind a `FaultProxy`; `bootstrap_servers` is the proxy, `port` tansu's own."""

    def __init__(self, log_dir: str | os.PathLike[str]) -> None:
        self._log_dir = Path(log_dir)
        self._proxy: FaultProxy | None = None
        self._broker: LocalBroker | None = None

    @property
    def proxy(self) -> FaultProxy:
        if self._proxy is None:
            raise BrokerError("the proxied broker is not started")
        return self._proxy

    @property
    def broker(self) -> LocalBroker:
        if self._broker is None:
            raise BrokerError("the proxied broker is not started")
        return self._broker

    @property
    def bootstrap_servers(self) -> str:
        return self.proxy.address

    @property
    def port(self) -> int:
        """tansu's own listener: only the proxy (or a test that goes around it) connects here."""
        return self.broker.port

    def start(self) -> None:
        """Start a proxy and a tansu advertising it; retry when tansu loses its port to a race.

        The proxy needs tansu's port and tansu the proxy's, so tansu's port is picked
        first and cannot be re-picked by `LocalBroker` itself.
        """
        for attempt in range(1, _START_ATTEMPTS + 1):
            port = find_free_port()
            proxy = FaultProxy(HOST, port)
            broker = LocalBroker(self._log_dir, port=port, advertised_port=proxy.port)
            try:
                broker.start()
            except PortInUseError:
                proxy.close()
                if attempt == _START_ATTEMPTS:
                    raise
                continue
            except BaseException:
                proxy.close()
                raise
            self._proxy, self._broker = proxy, broker
            try:
                self._check_advertised()
            except BaseException:
                self.stop()
                raise
            return

    def _check_advertised(self) -> None:
        try:
            metadata = AdminClient({"bootstrap.servers": self.bootstrap_servers}).list_topics(
                timeout=_CHECK_TIMEOUT_S
            )
        except KafkaException as exc:
            raise BrokerError(f"no metadata through the proxy {self.bootstrap_servers}") from exc
        advertised = {(str(b.host), int(b.port)) for b in metadata.brokers.values()}
        if advertised != {(HOST, self.proxy.port)}:
            raise BrokerError(f"tansu advertises {advertised}, not the proxy {self.proxy.address}")

    def stop(self) -> None:
        """Proxy first: with no client connected, tansu's SIGTERM does not wait 5 s."""
        if self._proxy is not None:
            self._proxy.close()
            self._proxy = None
        if self._broker is not None:
            self._broker.stop()
            self._broker = None

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
