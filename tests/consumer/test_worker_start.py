"""A consumer whose workers cannot start stops with their error at once; it never
replaces them in a loop, nor dead-letters good events as "worker process died"."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time
from collections.abc import Callable
from pathlib import Path

from confluent_kafka.admin import AdminClient

from eventspool.broker import LocalBroker
from tests.consumer.conftest import GROUP_KAFKA, produce


def test_a_consumer_started_at_import_time_stops_with_the_workers_error(
    broker: LocalBroker, topic_factory: Callable[[int], str], tmp_path: Path
) -> None:
    """The README's snippet pasted into a script without a __main__ guard: each worker
    re-imports the script and fails in multiprocessing's bootstrapping."""
    topic = topic_factory(1)
    produce(broker.bootstrap_servers, topic, [b"a good event"])
    script = tmp_path / "unguarded.py"
    script.write_text(
        textwrap.dedent(
            f"""
            from eventspool.consumer import Consumer, ConsumerSettings

            def handle(record):
                print("handled", record.value, flush=True)

            Consumer("unguarded", [{topic!r}], handle, workers=2,
                     bootstrap_servers={broker.bootstrap_servers!r},
                     settings=ConsumerSettings(kafka={GROUP_KAFKA!r})).run()
            """
        )
    )
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=60, check=False
    )
    assert time.monotonic() - started < 30
    assert done.returncode != 0
    assert "before it could run the handler" in done.stderr
    assert 'if __name__ == "__main__":' in done.stderr
    assert "OSError" not in done.stderr, "the abort itself failed"
    assert "handled" not in done.stdout
    topics = AdminClient({"bootstrap.servers": broker.bootstrap_servers}).list_topics(timeout=10)
    assert f"{topic}.dlq" not in topics.topics
