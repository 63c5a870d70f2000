"""The registry lists its queues once and keeps the list until a queue is opened or let
go (the sender asks every round). Whatever the spool does in between, the list it gives
is the one listing the topics afresh would."""

from __future__ import annotations

import tempfile
from pathlib import Path

from hypothesis import given, settings
from hypothesis import strategies as st

from eventspool.pipeline import Spool
from eventspool.spool.registry import QueueRef, QueueRegistry

TOPICS = ("a", "b", "c")

# What a spool does that may open or let go of queues: an event keyless or keyed to a
# topic (a pending queue while its partition count is unknown, else its partition's),
# or a partition count for a topic (which only grows, moving pending events out).
step_st = st.one_of(
    st.tuples(st.just("send"), st.sampled_from(TOPICS), st.none() | st.binary(max_size=4)),
    st.tuples(st.just("count"), st.sampled_from(TOPICS), st.integers(1, 6)),
)


def listed_afresh(registry: QueueRegistry) -> tuple[QueueRef, ...]:
    return tuple(ref for topic in registry.topics() for ref in topic.refs())


@settings(max_examples=60, deadline=None)
@given(steps=st.lists(step_st, max_size=25))
def test_the_listed_queues_follow_every_queue_opened_or_moved(
    steps: list[tuple[str, str, object]],
) -> None:
    with tempfile.TemporaryDirectory() as directory, Spool(Path(directory)) as spool:
        registry = spool._registry
        assert registry.refs() == listed_afresh(registry)
        for kind, topic, argument in steps:
            if kind == "send":
                assert argument is None or isinstance(argument, bytes)
                spool.send(topic, b"v", key=argument)
            else:
                assert isinstance(argument, int)
                spool.set_partition_count(topic, argument)  # a smaller count changes nothing
            assert registry.refs() == listed_afresh(registry)
