"""From Kafka records to events: the envelope's id and time, and the JSON fields we use.

The spool puts the event's id in the ``event_id`` header and its create time in the
record timestamp. A record without that header (written by some other producer) gets
``topic-partition-offset`` as its id, so a redelivered offset is still one event.
"""

from __future__ import annotations

from collections.abc import Iterable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as sf

from eventspool.spark.jobs.rules import AMOUNT_PATTERN

# Fields every event may carry and the archive keeps as columns.
STANDARD_FIELDS = ("type", "user_id", "amount_cents")


def field_column(name: str) -> str:
    """The column holding a top-level JSON field as text (json_tuple's output)."""
    return f"f_{name}"


def as_amount(text: Column) -> Column:
    """An integer amount, or null when the field is missing or not an integer."""
    return sf.when(text.rlike(f"^{AMOUNT_PATTERN}$"), text.cast("bigint"))


def parse_events(records: DataFrame, extra_fields: Iterable[str] = ()) -> DataFrame:
    """Kafka records (with headers) to one row per event, one parse of each JSON value."""
    fields = list(STANDARD_FIELDS) + sorted(set(extra_fields) - set(STANDARD_FIELDS))
    header_id = sf.expr("filter(headers, h -> h.key = 'event_id')[0].value").cast("string")
    fallback_id = sf.concat_ws("-", "topic", sf.col("partition").cast("string"), "offset")
    text = records.select(
        sf.coalesce(header_id, fallback_id).alias("event_id"),
        sf.col("timestamp").alias("event_time"),
        "topic",
        "partition",
        "offset",
        sf.col("key").cast("string").alias("key"),
        sf.col("value").cast("string").alias("value"),
    )
    parsed = text.select(
        "*", sf.json_tuple(sf.col("value"), *fields).alias(*[field_column(f) for f in fields])
    )
    return parsed.select(
        "*",
        sf.col(field_column("type")).alias("event_type"),
        sf.col(field_column("user_id")).alias("user_id"),
        as_amount(sf.col(field_column("amount_cents"))).alias("amount_cents"),
        sf.to_date("event_time").alias("date"),
    )
