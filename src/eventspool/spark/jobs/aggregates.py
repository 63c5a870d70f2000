"""Per-batch aggregates: per-minute statistics per event type, and what each reward rule
matched per user and day. Both are sums, so batches add up and a day's rewards are
computed from its totals (see eventspool.spark.postgres)."""

from __future__ import annotations

from datetime import UTC, datetime
from functools import reduce

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as sf

from eventspool.spark.jobs.parse import as_amount, field_column
from eventspool.spark.jobs.rules import Rule, RuleSet
from eventspool.spark.postgres import StatRow, TotalRow

UNKNOWN_TYPE = "unknown"


def minute_stats(events: DataFrame) -> list[StatRow]:
    """Count and amount per (minute, event type); events without a type count as
    "unknown" and a missing amount as 0."""
    rows = (
        events.groupBy(
            sf.unix_seconds(sf.date_trunc("minute", "event_time")).alias("minute"),
            sf.coalesce("event_type", sf.lit(UNKNOWN_TYPE)).alias("event_type"),
        )
        .agg(
            sf.count(sf.lit(1)).alias("events"),
            sf.sum(sf.coalesce("amount_cents", sf.lit(0))).cast("bigint").alias("amount_cents"),
        )
        .collect()
    )
    return [
        StatRow(
            datetime.fromtimestamp(r.minute, UTC), r.event_type, int(r.events), int(r.amount_cents)
        )
        for r in rows
    ]


def _matches(rule: Rule) -> Column:
    condition = (sf.col("event_type") == rule.event_type) & sf.col("user_id").isNotNull()
    for name, expected in rule.match:
        condition = condition & (sf.col(field_column(name)) == expected)
    return condition


def rule_totals(events: DataFrame, rules: RuleSet) -> list[TotalRow]:
    """Per (user, day, rule): the matching events and the sum of their amounts."""
    parts = []
    for rule in rules.rules:
        amount = (
            sf.coalesce(as_amount(sf.col(field_column(rule.amount_field))), sf.lit(0))
            if rule.amount_field is not None
            else sf.lit(0)
        )
        parts.append(
            events.where(_matches(rule))
            .groupBy("user_id", "date")
            .agg(
                sf.count(sf.lit(1)).alias("events"),
                sf.sum(amount).cast("bigint").alias("amount_cents"),
            )
            .withColumn("rule", sf.lit(rule.name))
        )
    rows = reduce(DataFrame.unionByName, parts).collect()
    return [TotalRow(r.user_id, r.date, r.rule, int(r.events), int(r.amount_cents)) for r in rows]
