"""Whether a topic's broker settings can keep an event the broker acknowledged.

The spool removes an event once the broker acknowledged it, so from then on the event
is only as safe as the cluster keeps it. Kafka's "no data loss" recipe is replication
factor 3, `min.insync.replicas=2`, unclean leader election off, and `acks=all` (which
the sender always uses); docs/semantics.md says what a user sees when one is missing.
"""

from __future__ import annotations

from collections.abc import Mapping

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
