"""The PostgreSQL side of the pipeline: statistics and rewards, written exactly once.

A micro-batch is applied in one transaction that first records (query id, batch id) in
``eventspool_batches``. Spark replays a batch whose commit it did not record (after a
crash between our commit and its own); the replay finds its row already there and
changes nothing. The query id is Spark's, kept in the checkpoint, so a new checkpoint
starts a new sequence of batch ids instead of being mistaken for a replay.

Inside the transaction the batch adds its per-minute counts to ``event_stats`` and its
per-(user, day, rule) sums to ``reward_totals``, then recomputes ``rewards`` for every
(user, day) it touched from those totals: the reward is an upsert of a value computed
from the day's totals, never an increment, so the daily cap holds across batches.

A backfill replaces whole days instead: it deletes what the days held and writes the
totals it computed over all of their events, in one transaction.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import date, datetime
from typing import Any

from eventspool.spark.extra import SparkExtraMissingError

try:
    import psycopg
except ModuleNotFoundError as missing:
    raise SparkExtraMissingError(missing.name) from missing

from eventspool.spark.jobs.rules import RuleSet

SCHEMA = """
CREATE TABLE IF NOT EXISTS eventspool_batches (
    query_id     text        NOT NULL,
    batch_id     bigint      NOT NULL,
    committed_at timestamptz NOT NULL DEFAULT now(),
    PRIMARY KEY (query_id, batch_id)
);
CREATE TABLE IF NOT EXISTS event_stats (
    minute       timestamptz NOT NULL,
    event_type   text        NOT NULL,
    events       bigint      NOT NULL,
    amount_cents bigint      NOT NULL,
    PRIMARY KEY (minute, event_type)
);
CREATE TABLE IF NOT EXISTS reward_totals (
    user_id      text   NOT NULL,
    day          date   NOT NULL,
    rule         text   NOT NULL,
    events       bigint NOT NULL,
    amount_cents bigint NOT NULL,
    PRIMARY KEY (user_id, day, rule)
);
CREATE TABLE IF NOT EXISTS rewards (
    user_id           text   NOT NULL,
    day               date   NOT NULL,
    reward_cents      bigint NOT NULL,
    qualifying_events bigint NOT NULL,
    PRIMARY KEY (user_id, day)
);
"""


@dataclass(frozen=True, slots=True)
class StatRow:
    """Events of one type in one minute (UTC), and the sum of their amounts."""

    minute: datetime
    event_type: str
    events: int
    amount_cents: int


@dataclass(frozen=True, slots=True)
class TotalRow:
    """What one rule matched for one user on one day: count and amount."""

    user_id: str
    day: date
    rule: str
    events: int
    amount_cents: int


def connect(dsn: str) -> psycopg.Connection[tuple[object, ...]]:
    """A connection with the tables created (idempotent)."""
    conn = psycopg.connect(dsn, autocommit=True)
    with conn.transaction():
        conn.execute("SELECT pg_advisory_xact_lock(7242001)")
        conn.execute(SCHEMA)
    return conn


def _load(
    cur: psycopg.Cursor[tuple[object, ...]], stats: Sequence[StatRow], totals: Sequence[TotalRow]
) -> None:
    """COPY the rows into temporary tables dropped at commit."""
    cur.execute(
        "CREATE TEMP TABLE batch_stats (minute timestamptz, event_type text, events bigint,"
        " amount_cents bigint) ON COMMIT DROP"
    )
    cur.execute(
        "CREATE TEMP TABLE batch_totals (user_id text, day date, rule text, events bigint,"
        " amount_cents bigint) ON COMMIT DROP"
    )
    with cur.copy("COPY batch_stats FROM STDIN") as copy:
        for s in stats:
            copy.write_row((s.minute, s.event_type, s.events, s.amount_cents))
    with cur.copy("COPY batch_totals FROM STDIN") as copy:
        for t in totals:
            copy.write_row((t.user_id, t.day, t.rule, t.events, t.amount_cents))


def _recompute_rewards(cur: psycopg.Cursor[tuple[object, ...]], rules: RuleSet) -> None:
    """Upsert rewards for every (user, day) in batch_totals from all of their totals."""
    values = ", ".join(["(%s, %s::bigint, %s::bigint, %s::bigint)"] * len(rules.rules))
    params: list[object] = []
    for rule in rules.rules:
        params += [rule.name, rule.basis_points, rule.fixed_cents, rule.cap_cents_per_day]
    cur.execute(
        f"""
        INSERT INTO rewards (user_id, day, reward_cents, qualifying_events)
        SELECT t.user_id, t.day,
               SUM(LEAST(COALESCE(r.cap, 9223372036854775807),
                         FLOOR(t.amount_cents::numeric * r.bp / 10000)::bigint
                         + r.fixed * t.events)),
               SUM(t.events)
        FROM reward_totals t
        JOIN (VALUES {values}) AS r (rule, bp, fixed, cap) ON r.rule = t.rule
        WHERE (t.user_id, t.day) IN (SELECT DISTINCT user_id, day FROM batch_totals)
        GROUP BY t.user_id, t.day
        ON CONFLICT (user_id, day) DO UPDATE
            SET reward_cents = EXCLUDED.reward_cents,
                qualifying_events = EXCLUDED.qualifying_events
        """,
        params,
    )


def apply_batch(
    conn: psycopg.Connection[tuple[object, ...]],
    *,
    query_id: str,
    batch_id: int,
    stats: Sequence[StatRow],
    totals: Sequence[TotalRow],
    rules: RuleSet,
) -> bool:
    """Apply one micro-batch; False (and no change) when it was applied before."""
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(
            "INSERT INTO eventspool_batches (query_id, batch_id) VALUES (%s, %s)"
            " ON CONFLICT DO NOTHING",
            (query_id, batch_id),
        )
        if cur.rowcount == 0:
            return False
        _load(cur, stats, totals)
        cur.execute(
            """
            INSERT INTO event_stats AS s SELECT * FROM batch_stats
            ON CONFLICT (minute, event_type) DO UPDATE
                SET events = s.events + EXCLUDED.events,
                    amount_cents = s.amount_cents + EXCLUDED.amount_cents
            """
        )
        cur.execute(
            """
            INSERT INTO reward_totals AS t SELECT * FROM batch_totals
            ON CONFLICT (user_id, day, rule) DO UPDATE
                SET events = t.events + EXCLUDED.events,
                    amount_cents = t.amount_cents + EXCLUDED.amount_cents
            """
        )
        _recompute_rewards(cur, rules)
    return True


def replace_days(
    conn: psycopg.Connection[tuple[object, ...]],
    *,
    days: Iterable[date],
    stats: Sequence[StatRow],
    totals: Sequence[TotalRow],
    rules: RuleSet,
) -> None:
    """Replace everything the given UTC days hold with a backfill's complete totals."""
    day_list = sorted(set(days))
    with conn.transaction(), conn.cursor() as cur:
        cur.execute(
            "DELETE FROM event_stats WHERE (minute AT TIME ZONE 'UTC')::date = ANY(%s)",
            (day_list,),
        )
        cur.execute("DELETE FROM reward_totals WHERE day = ANY(%s)", (day_list,))
        cur.execute("DELETE FROM rewards WHERE day = ANY(%s)", (day_list,))
        _load(cur, stats, totals)
        cur.execute("INSERT INTO event_stats SELECT * FROM batch_stats")
        cur.execute("INSERT INTO reward_totals SELECT * FROM batch_totals")
        _recompute_rewards(cur, rules)


def stats_of_days(
    conn: psycopg.Connection[tuple[object, ...]], days: Iterable[date]
) -> list[StatRow]:
    rows: list[Any] = conn.execute(
        "SELECT minute, event_type, events, amount_cents FROM event_stats"
        " WHERE (minute AT TIME ZONE 'UTC')::date = ANY(%s) ORDER BY minute, event_type",
        (sorted(set(days)),),
    ).fetchall()
    return [StatRow(*row) for row in rows]


def rewards_of_days(
    conn: psycopg.Connection[tuple[object, ...]], days: Iterable[date]
) -> list[tuple[str, date, int, int]]:
    rows: list[Any] = conn.execute(
        "SELECT user_id, day, reward_cents, qualifying_events FROM rewards"
        " WHERE day = ANY(%s) ORDER BY day, user_id",
        (sorted(set(days)),),
    ).fetchall()
    return [(str(u), d, int(r), int(q)) for u, d, r, q in rows]
