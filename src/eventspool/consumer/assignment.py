"""What the poll thread tracks of each partition assigned to this member: shared by the
consumer's collaborators, which all look a partition up by its (topic, partition)."""

from __future__ import annotations

from dataclasses import dataclass

from eventspool.consumer.offsets import PartitionOffsets
from eventspool.consumer.scheduler import TopicPartitionKey


@dataclass(slots=True)
class PartitionState:
    """One assigned partition: its offsets, the events of it held, and whether it is
    still ours (`active`). A state let go stays inactive for good: outcomes that come
    back for it afterwards change nothing, since its next owner redelivers them."""

    offsets: PartitionOffsets
    held: int = 0
    active: bool = True
    # The workers were told to drop its events (revoke, shutdown): none is resent.
    dropping: bool = False


Assignment = dict[TopicPartitionKey, PartitionState]
