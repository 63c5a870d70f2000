"""Whether a topic's broker settings can keep an event the broker acknowledged.

The spool removes an event once the broker acknowledged it, so from then on the event
is only as safe as the cluster keeps it. Kafka's "no data loss" recipe is replication
factor 3, `min.insync.replicas=2`, unclean leader election off, and `acks=all` (which
the sender always uses); docs/semantics.md says what a user sees when one is missing.
The sender checks each topic once, when it first sees it in metadata.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Mapping

from confluent_kafka import KafkaException

from eventspool.sender.metadata import MetadataClient

log = logging.getLogger(__name__)

MIN_REPLICATION = 3
MIN_INSYNC = 2


def durability_problems(replication: int, configs: Mapping[str, str] | None) -> list[str]:
    """What in a topic's settings can lose an acknowledged event; `configs` is None when
    the broker did not answer DescribeConfigs (then only the replication is judged)."""
    problems = []
    if replication < MIN_REPLICATION:
        problems.append(
            f"replication factor {replication} (below {MIN_REPLICATION}): losing one "
            "broker's disk loses the events it acknowledged"
        )
    if configs is None:
        return problems
    insync = configs.get("min.insync.replicas")
    if insync is not None and insync.isdigit() and int(insync) < MIN_INSYNC:
        problems.append(
            f"min.insync.replicas={insync} (below {MIN_INSYNC}): acks=all is met by the "
            "leader alone"
        )
    if configs.get("unclean.leader.election.enable", "").lower() == "true":
        problems.append(
            "unclean.leader.election.enable=true: an out-of-sync replica may become "
            "leader and drop acknowledged events"
        )
    return problems


class TopicSettingsCheck:
    """Each topic's settings checked once, off the sender's loop (DescribeConfigs may
    take its timeout); `warnings` holds the topics that cannot keep an acknowledged event,
    with why."""

    def __init__(self) -> None:
        self.warnings: dict[str, list[str]] = {}
        self._checked: set[str] = set()
        self._configs_unreadable_logged = False

    def check_once(self, metadata: MetadataClient, topic: str, replication: int) -> None:
        """Check `topic` in a thread of its own, unless it was checked already."""
        if topic in self._checked:
            return
        self._checked.add(topic)
        threading.Thread(
            target=self._check,
            args=(metadata, topic, replication),
            name="eventspool-topic-settings",
            daemon=True,
        ).start()

    def _check(self, metadata: MetadataClient, topic: str, replication: int) -> None:
        """Warn when the cluster cannot keep what it acknowledges."""
        try:
            configs = metadata.topic_configs([topic]).get(topic)
        except KafkaException as exc:
            log.debug("cannot describe topic %s: %s", topic, exc)
            configs = None
        if configs is None and not self._configs_unreadable_logged:
            self._configs_unreadable_logged = True
            log.warning(
                "the brokers do not describe topic settings (DescribeConfigs): "
                "min.insync.replicas and unclean.leader.election.enable are not checked"
            )
        problems = durability_problems(replication, configs)
        if problems:
            self.warnings[topic] = problems
            log.warning(
                "topic %s may lose events the broker acknowledged: %s", topic, "; ".join(problems)
            )
