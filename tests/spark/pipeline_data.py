"""Events for the pipeline tests, and what the outputs must hold, computed independently.

The expectation is built from the records read back from Kafka with a plain consumer and
from the rules written out here in plain Python, not from the pipeline's own code.
"""

from __future__ import annotations

import json
import random
import sys
from collections import Counter, defaultdict
from dataclasses import dataclass
from datetime import UTC, date, datetime
from pathlib import Path
from typing import Any

import psycopg
import pyarrow.dataset as ds

from eventspool.demo import business_event
from eventspool.pipeline import Spool
from tests.spark.conftest import produce, read_back

PARTITIONS = 4  # the sender's default for topics it creates

RULES_TOML = """
[[rule]]
name = "cashback"
event_type = "order_created"
match = { status = "paid" }
amount_field = "amount_cents"
percent = 2.5
cap_cents_per_day = 300

[[rule]]
name = "card"
event_type = "payment_captured"
match = { method = "card" }
fixed_cents = 7
cap_cents_per_day = 20
"""


@dataclass(frozen=True)
class Expected:
    event_ids: set[str]
    stats: dict[tuple[datetime, str], tuple[int, int]]
    rewards: dict[tuple[str, date], int]


def send_events(
    spool_dir: Path, bootstrap: str, topics: dict[str, str], count: int, seed: int
) -> list[str]:
    """`count` demo events through the spool (topic names mapped), all acknowledged."""
    rng = random.Random(seed)
    ids: list[str] = []
    with Spool(spool_dir, bootstrap) as spool:
        for sequence in range(count):
            topic, user, body = business_event(rng, sequence)
            # Few users, so daily caps are reached and a day's rewards span batches.
            body["user_id"] = user = f"user-{rng.randrange(40)}"
            ids.append(spool.send(topics[topic], json.dumps(body).encode(), key=user))
        assert spool.flush(60) == 0
    return ids


def duplicate_some(bootstrap: str, topic: str, how_many: int) -> None:
    """Send records again as at-least-once delivery would: same id, key, value, time."""
    again = read_back(bootstrap, topic, PARTITIONS, count=-1)[:how_many]
    produce(
        bootstrap,
        topic,
        [(m.partition(), m.key(), m.value()) for m in again],
        timestamps=[m.timestamp()[1] for m in again],
        headers=[list(m.headers()) for m in again],
    )


def expected(bootstrap: str, topics: list[str], records: int) -> Expected:
    messages: list[Any] = []
    for topic in topics:
        messages += read_back(bootstrap, topic, PARTITIONS, count=-1)
    assert len(messages) == records
    events: dict[str, tuple[int, dict[str, Any]]] = {}
    for message in messages:
        event_id = dict(message.headers())["event_id"].decode()
        events.setdefault(event_id, (message.timestamp()[1], json.loads(message.value())))
    counts: Counter[tuple[datetime, str]] = Counter()
    amounts: Counter[tuple[datetime, str]] = Counter()
    cashback: dict[tuple[str, date], int] = defaultdict(int)
    cards: dict[tuple[str, date], int] = defaultdict(int)
    for stamp, body in events.values():
        moment = datetime.fromtimestamp(stamp // 60_000 * 60, UTC)
        counts[(moment, body["type"])] += 1
        amounts[(moment, body["type"])] += body.get("amount_cents", 0)
        day = moment.date()
        if body["type"] == "order_created" and body["status"] == "paid":
            cashback[(body["user_id"], day)] += body["amount_cents"]
        if body["type"] == "payment_captured" and body["method"] == "card":
            cards[(body["user_id"], day)] += 1
    rewards: dict[tuple[str, date], int] = defaultdict(int)
    for key, amount in cashback.items():
        rewards[key] += min(300, amount * 25 // 1000)
    for key, paid_by_card in cards.items():
        rewards[key] += min(20, 7 * paid_by_card)
    return Expected(
        set(events),
        {key: (counts[key], amounts[key]) for key in counts},
        dict(rewards),
    )


def archive_ids(output: Path) -> list[str]:
    """Every event id in the archive, read with pyarrow rather than Spark."""
    table = ds.dataset(output / "archive", format="parquet", partitioning="hive").to_table(
        columns=["event_id"]
    )
    return [str(v) for v in table.column("event_id").to_pylist()]


def table_stats(dsn: str) -> dict[tuple[datetime, str], tuple[int, int]]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT minute, event_type, events, amount_cents FROM event_stats")
        return {(m.astimezone(UTC), t): (int(n), int(a)) for m, t, n, a in rows}


def table_rewards(dsn: str) -> dict[tuple[str, date], int]:
    with psycopg.connect(dsn) as conn:
        rows = conn.execute("SELECT user_id, day, reward_cents FROM rewards WHERE reward_cents > 0")
        return {(str(u), d): int(r) for u, d, r in rows}


def parquet_rewards(output: Path) -> dict[tuple[str, date], int]:
    table = ds.dataset(output / "rewards", format="parquet", partitioning="hive").to_table(
        columns=["user_id", "day", "reward_cents"]
    )
    return {
        (r["user_id"], r["day"]): r["reward_cents"]
        for r in table.to_pylist()
        if r["reward_cents"] > 0
    }


def pipeline_command(  # noqa: PLR0917  # the command line's parts, in its order
    bootstrap: str, topics: list[str], out: Path, dsn: str, rules: Path, master: str, per_batch: int
) -> list[str]:
    """`eventspool pipeline run --once` over `topics`, as an operator types it."""
    command = [
        sys.executable,
        "-m",
        "eventspool",
        "pipeline",
        "run",
        "--once",
        "--bootstrap-servers",
        bootstrap,
        "--output",
        str(out),
        "--dsn",
        dsn,
        "--rules",
        str(rules),
        "--master",
        master,
        "--max-offsets-per-trigger",
        str(per_batch),
    ]
    for topic in topics:
        command += ["--topic", topic]
    return command
