"""Prometheus figures of a Consumer, read from its status snapshot when scraped."""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from eventspool.consumer.runner import Consumer


class ConsumerCollector(Collector):
    def __init__(self, consumer: Consumer) -> None:
        self._consumer = consumer

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        status = self._consumer.status()
        group = [status.group]
        lag = GaugeMetricFamily(
            "eventspool_consumer_lag",
            "Events between the first unfinished offset and the true end offset.",
            labels=["group", "topic", "partition"],
        )
        for partition in status.partitions:
            if partition.lag is not None:
                lag.add_metric([*group, partition.topic, str(partition.partition)], partition.lag)
        yield lag
        gauges = {
            "buffered": ("Events held: waiting, running or being forwarded.", status.buffered),
            "running": ("Events in a worker now.", status.in_flight),
            "oldest_running_seconds": (
                "Age of the oldest batch in a worker.",
                status.oldest_in_flight_s or 0.0,
            ),
            "paused": ("1 while partitions are paused for back-pressure.", int(status.paused)),
        }
        for name, (text, value) in gauges.items():
            gauge = GaugeMetricFamily(f"eventspool_consumer_{name}", text, labels=["group"])
            gauge.add_metric(group, value)
            yield gauge
        events = CounterMetricFamily(
            "eventspool_consumer_events", "Events by outcome.", labels=["group", "outcome"]
        )
        for field in dataclasses.fields(status.counters):
            events.add_metric([*group, field.name], getattr(status.counters, field.name))
        yield events


def serve_metrics(consumer: Consumer, port: int, address: str = "127.0.0.1") -> None:
    """Expose the consumer's metrics on http://address:port/metrics (a daemon thread)."""
    registry = CollectorRegistry()
    registry.register(ConsumerCollector(consumer))
    start_http_server(port, addr=address, registry=registry)
