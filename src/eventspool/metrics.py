"""Prometheus metrics: read from the spool and the sender when scraped, never on the hot path.

Only the fsync latency is observed as it happens (it is already a slow path); every
other figure is derived from queue and sender state at scrape time, so `send()` pays
nothing for being observable.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from eventspool.pipeline import Spool

PROCESS_REGISTRY = CollectorRegistry()
FSYNC_SECONDS = Histogram(
    "eventspool_fsync_seconds",
    "Duration of one fdatasync of a queue file (shared by every writer waiting on it).",
    buckets=(0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.5, 1.0),
    registry=PROCESS_REGISTRY,
)


class SpoolCollector(Collector):
    def __init__(
        self,
        spool: Spool,
        extra: Callable[[], dict[str, float]] | None = None,
        labelled: Callable[[], dict[str, tuple[str, str, dict[str, float]]]] | None = None,
    ) -> None:
        self._spool = spool
        self._extra = extra or dict
        self._labelled = labelled or dict

    def collect(self) -> Iterator[GaugeMetricFamily | CounterMetricFamily]:
        labels = ["topic", "partition"]
        depth = GaugeMetricFamily(
            "eventspool_queue_depth", "Events not yet acknowledged.", labels=labels
        )
        size = GaugeMetricFamily(
            "eventspool_queue_bytes", "Bytes held by unacknowledged events.", labels=labels
        )
        files = GaugeMetricFamily(
            "eventspool_queue_file_bytes",
            "Bytes the queue's segment files take on disk (counted in the disk budget).",
            labels=labels,
        )
        segments = GaugeMetricFamily(
            "eventspool_queue_segments",
            "Segment files of the queue: one at rest, more while it holds a backlog.",
            labels=labels,
        )
        age = GaugeMetricFamily(
            "eventspool_queue_oldest_unsent_seconds",
            "Age of the oldest unacknowledged event.",
            labels=labels,
        )
        enqueued = CounterMetricFamily(
            "eventspool_events_enqueued",
            "Events written to the queue over its files' life.",
            labels=labels,
        )
        acked = CounterMetricFamily(
            "eventspool_events_acknowledged",
            "Events removed after the broker acknowledged them.",
            labels=labels,
        )
        dropped = CounterMetricFamily(
            "eventspool_events_dropped",
            "Events lost on purpose, by reason.",
            labels=[*labels, "reason"],
        )
        for ref in self._spool.queues():
            stats = ref.ring.stats()
            key = [ref.topic, "pending" if ref.partition is None else str(ref.partition)]
            depth.add_metric(key, stats.depth)
            size.add_metric(key, stats.bytes)
            files.add_metric(key, stats.allocated_bytes)
            segments.add_metric(key, stats.segments)
            age.add_metric(key, (stats.oldest_age_ms or 0) / 1000)
            enqueued.add_metric(key, stats.next_seq)
            acked.add_metric(key, stats.head_seq - stats.dropped)
            dropped.add_metric([*key, "drop_oldest"], stats.dropped)
            dropped.add_metric([*key, "recovery_skipped"], stats.skipped_total)
        yield from (depth, size, files, segments, age, enqueued, acked, dropped)
        routed = CounterMetricFamily(
            "eventspool_exchange_routed",
            "Events an exchange wrote to the topics bound to it (once per event, not per topic).",
            labels=["exchange"],
        )
        unroutable = CounterMetricFamily(
            "eventspool_events_unroutable",
            "Events that matched no binding of their exchange: written to its alternate "
            "topic, or refused to the caller when it has none.",
            labels=["exchange", "outcome"],
        )
        counts_by_name = {info.exchange.name: info.counts for info in self._spool.exchanges()}
        counts_by_name.update(self._spool.exchange_counts())  # deleted exchanges too
        for name, counts in sorted(counts_by_name.items()):
            routed.add_metric([name], counts.routed)
            unroutable.add_metric([name, "alternate"], counts.alternate)
            unroutable.add_metric([name, "refused"], counts.refused)
        yield from (routed, unroutable)
        budget = self._spool.budget()
        yield GaugeMetricFamily(
            "eventspool_spool_file_bytes",
            "Bytes of queue files on disk, all preallocated (counted in the disk budget).",
            value=budget.used_bytes,
        )
        if budget.max_bytes is not None:
            yield GaugeMetricFamily(
                "eventspool_spool_budget_bytes",
                "The disk budget: queue-file bytes the spool may hold (max_spool_bytes).",
                value=budget.max_bytes,
            )
        yield GaugeMetricFamily(
            "eventspool_spool_topics", "Topics with queue files.", value=budget.topics
        )
        yield CounterMetricFamily(
            "eventspool_spool_budget_refusals",
            "Sends refused because a new queue would go over the disk budget or max_topics.",
            value=budget.refusals,
        )
        sender = self._spool.sender
        connected = GaugeMetricFamily(
            "eventspool_broker_connected", "1 while a broker answers metadata."
        )
        connected.add_metric([], 1 if sender and sender.connected else 0)
        yield connected
        if sender is not None:
            yield CounterMetricFamily(
                "eventspool_dead_letters",
                "Events moved to the dead-letter file.",
                value=sender.dead_letters.count,
            )
            yield CounterMetricFamily(
                "eventspool_broker_errors",
                "Client-level errors reported by librdkafka.",
                value=sender.counters.broker_errors,
            )
            yield CounterMetricFamily(
                "eventspool_broker_reconnects",
                "Times the brokers answered again after being unreachable.",
                value=sender.counters.reconnects,
            )
            yield CounterMetricFamily(
                "eventspool_produce_requests",
                "Produce requests sent to the brokers (with statistics_interval_ms set).",
                value=sender.counters.produce_requests,
            )
            yield CounterMetricFamily(
                "eventspool_retried_batches",
                "Queue rewinds after a transient delivery failure.",
                value=sender.counters.retried_batches,
            )
            yield CounterMetricFamily(
                "eventspool_producer_resets",
                "New producers after a fatal error or lasting producer-state errors.",
                value=sender.counters.producer_resets,
            )
            yield CounterMetricFamily(
                "eventspool_failover_moved",
                "Keyless events moved off a partition without an available leader.",
                value=sender.counters.failover_moved,
            )
            stalled = GaugeMetricFamily(
                "eventspool_queue_stalled_seconds",
                "How long a queue holding events has not advanced (only stalled queues).",
                labels=labels,
            )
            for queue in sender.stalled_queues():
                partition = "pending" if queue.partition is None else str(queue.partition)
                stalled.add_metric([queue.topic, partition], queue.stalled_s)
            yield stalled
        for name, value in self._extra().items():
            yield CounterMetricFamily(f"eventspool_{name}", name.replace("_", " "), value=value)
        for name, (documentation, label, values) in self._labelled().items():
            family = CounterMetricFamily(f"eventspool_{name}", documentation, labels=[label])
            for label_value, value in values.items():
                family.add_metric([label_value], value)
            yield family


def render(
    spool: Spool,
    extra: Callable[[], dict[str, float]] | None = None,
    labelled: Callable[[], dict[str, tuple[str, str, dict[str, float]]]] | None = None,
) -> bytes:
    """The Prometheus text exposition of `spool` plus the process-wide histograms.

    `extra` adds plain counters by name; `labelled` adds counters with one label:
    name -> (help, label name, value per label value).
    """
    registry = CollectorRegistry()
    registry.register(SpoolCollector(spool, extra, labelled))
    return generate_latest(registry) + generate_latest(PROCESS_REGISTRY)
