"""Shared fixtures: one real local broker per test session (per xdist worker)."""

from __future__ import annotations

import os
import re
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import settings

from eventspool.broker import LocalBroker, create_topic
from eventspool.broker.mock import MockCluster
from eventspool.testing.disk import DiskUnavailableError, SmallDisk

SmallDiskFactory = Callable[[Path, int], SmallDisk]

# Hypothesis's per-example deadline measures the machine's load as much as the code: the
# suite runs beside brokers, Spark and SIGKILLed processes on two cores.
settings.register_profile("eventspool", deadline=None)
settings.load_profile("eventspool")

# Every Spark JVM the tests start (drivers, in-process or the commands' own, and the shared
# session's executors) runs the JIT's first tier only and the serial collector: a test's
# Spark job is over before C2's compiles pay off, and G1's concurrent threads only compete
# with the other workers on two cores. The source tests' machine CPU: 94 s (two runs)
# with neither, 77 s with the first tier on executors too, 66 s with both.
os.environ.setdefault("SPARK_SUBMIT_OPTS", "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC")


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Slow tests first, so that the workers end the run on short ones: collected in path
    order, the wheel and the quickstart (minutes each) started last and ran alone.

    And refuse a run whose xdist_group marks do not group: each worker would start its own
    Spark session and the suite would outgrow its time (pytest 9.2 with xdist 3.8 did)."""
    items.sort(key=lambda item: item.get_closest_marker("slow") is None)
    if not getattr(config.option, "loadgroup", False):
        return
    ungrouped = [
        item.nodeid
        for item in items
        if item.get_closest_marker("xdist_group") and "@" not in item.nodeid
    ]
    if ungrouped:
        raise pytest.UsageError(
            f"--dist loadgroup did not group {len(ungrouped)} tests (first: {ungrouped[0]}): "
            "this pytest-xdist does not work with this pytest; see the pin in pyproject.toml"
        )


@pytest.fixture(scope="session")
def broker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LocalBroker]:
    """A running tansu on a free port; each xdist worker has its own session, so its own broker.

    Memory-only: topics from every test of the session accumulate until it ends.
    """
    with LocalBroker(tmp_path_factory.mktemp("broker")) as local:
        yield local


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[MockCluster]:
    """A fresh 3-broker mock cluster per test (it starts in well under a second): each
    test moves leaders, downs brokers and injects errors of its own."""
    with MockCluster(3, log_path=tmp_path / "mock-cluster.log") as started:
        yield started


@pytest.fixture
def topic_factory(broker: LocalBroker, request: pytest.FixtureRequest) -> Callable[[int], str]:
    """Create a fresh topic with the given partition count and return its name.

    Names carry the test's name for readable broker logs and a random suffix, because
    every test in the session shares one broker.
    """
    stem = re.sub(r"[^A-Za-z0-9._-]+", "-", request.node.name)[:180]

    def make(partitions: int = 1) -> str:
        name = f"{stem}-{uuid.uuid4().hex[:8]}"
        create_topic(broker.bootstrap_servers, name, partitions)
        return name

    return make


@pytest.fixture
def small_disk() -> Iterator[SmallDiskFactory]:
    """Make a real tmpfs of a given size at a path (unmounted after the test), or skip.

    Only a real file system gives ENOSPC where posix_fallocate and mmap meet it.
    """
    disks: list[SmallDisk] = []

    def make(mountpoint: Path, size_bytes: int) -> SmallDisk:
        try:
            disk = SmallDisk(mountpoint, size_bytes)
        except DiskUnavailableError as exc:
            pytest.skip(str(exc))
        disks.append(disk)
        return disk

    yield make
    for disk in disks:
        disk.close()
