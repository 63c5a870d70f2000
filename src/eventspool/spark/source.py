"""A Kafka source for Spark on PySpark's Python Data Source API, batch and streaming.

``spark.readStream.format("eventspool-kafka")`` takes the options of Spark's own Kafka
source and returns its columns (key, value, topic, partition, offset, timestamp,
timestampType and, with includeHeaders, headers), so switching is one line. The JVM
connector is not needed.

Where things run. Spark keeps one stream reader per query in a Python process next to
the driver: it answers initialOffset, latestOffset and partitions from broker metadata.
Each range of offsets is read by ``read`` in a Python worker of an executor, from a
pickled copy of the reader, so ``read`` depends on nothing but its partition and the
options.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from eventspool.spark.extra import SparkExtraMissingError

try:
    from pyspark.sql import SparkSession
    from pyspark.sql.datasource import (
        DataSource,
        DataSourceReader,
        DataSourceStreamReader,
        InputPartition,
    )
    from pyspark.sql.streaming.datasource import (
        ReadAllAvailable,
        ReadLimit,
        ReadMaxRows,
        SupportsTriggerAvailableNow,
    )
    from pyspark.sql.types import (
        ArrayType,
        BinaryType,
        IntegerType,
        LongType,
        StringType,
        StructField,
        StructType,
        TimestampType,
    )
except ModuleNotFoundError as missing:
    raise SparkExtraMissingError(missing.name) from missing

from eventspool.spark.kafka import KafkaSourceError, OffsetReader, read_range, read_range_rows
from eventspool.spark.offsets import (
    EARLIEST,
    LATEST,
    OffsetJson,
    OffsetRange,
    PartitionOffsets,
    TopicPartition,
    from_json,
    partition_change,
    plan_ranges,
    rate_limit,
    split_ranges,
    to_json,
)
from eventspool.spark.options import SourceOptionError, SourceOptions, parse_options

FORMAT = "eventspool-kafka"

_log = logging.getLogger(__name__)


def kafka_schema(include_headers: bool) -> StructType:
    """The columns of Spark's Kafka source, in its order and with its types."""
    fields = [
        StructField("key", BinaryType()),
        StructField("value", BinaryType()),
        StructField("topic", StringType()),
        StructField("partition", IntegerType()),
        StructField("offset", LongType()),
        StructField("timestamp", TimestampType()),
        StructField("timestampType", IntegerType()),
    ]
    if include_headers:
        header = StructType([StructField("key", StringType()), StructField("value", BinaryType())])
        fields.append(StructField("headers", ArrayType(header)))
    return StructType(fields)


class KafkaInputPartition(InputPartition):
    """One Spark task: the records [from_offset, until_offset) of one partition."""

    def __init__(self, offset_range: OffsetRange) -> None:
        super().__init__(offset_range)
        self.range = offset_range


def _read(options: SourceOptions, partition: InputPartition) -> Iterator[Any]:
    # Spark reads a planned empty batch as one InputPartition(None): no records.
    if not isinstance(partition, KafkaInputPartition):
        return iter(())
    if options.arrow:
        return read_range(options, partition.range)
    return read_range_rows(options, partition.range)


def _resolve_start(reader: OffsetReader, options: SourceOptions) -> PartitionOffsets:
    """The offsets named by startingTimestamp or startingOffsets, for today's partitions."""
    tps = reader.partitions()
    if options.starting_timestamp is not None:
        found = reader.offsets_for_timestamp(tps, options.starting_timestamp)
        missing = sorted(str(tp) for tp, offset in found.items() if offset is None)
        if missing and options.timestamp_strategy == "error":
            raise KafkaSourceError(
                f"no record at or after startingTimestamp {options.starting_timestamp} in "
                f"{missing}; set startingOffsetsByTimestampStrategy=latest to start at the end"
            )
        latest = reader.latest([tp for tp, offset in found.items() if offset is None])
        return {tp: latest[tp] if offset is None else offset for tp, offset in found.items()}
    spec = options.starting
    if spec.kind == "earliest":
        return reader.earliest(tps)
    if spec.kind == "latest":
        return reader.latest(tps)
    return _specific(reader, spec.specific or {}, tps, "startingOffsets")


def _resolve_end(
    reader: OffsetReader, options: SourceOptions, tps: list[TopicPartition]
) -> PartitionOffsets:
    if options.ending_timestamp is not None:
        found = reader.offsets_for_timestamp(tps, options.ending_timestamp)
        latest = reader.latest([tp for tp, offset in found.items() if offset is None])
        return {tp: latest[tp] if offset is None else offset for tp, offset in found.items()}
    spec = options.ending
    if spec.kind == "latest":
        return reader.latest(tps)
    return _specific(reader, spec.specific or {}, tps, "endingOffsets")


def _specific(
    reader: OffsetReader,
    specific: Mapping[TopicPartition, int],
    tps: list[TopicPartition],
    option: str,
) -> PartitionOffsets:
    """Per-partition offsets from JSON; like Spark, every partition must be named."""
    if set(specific) != set(tps):
        raise SourceOptionError(
            f"{option} must name every partition of the subscription (-2 earliest, "
            f"-1 latest): it names {sorted(map(str, specific))}, the subscription has "
            f"{sorted(map(str, tps))}"
        )
    earliest = reader.earliest([tp for tp, offset in specific.items() if offset == EARLIEST])
    latest = reader.latest([tp for tp, offset in specific.items() if offset == LATEST])
    return {
        tp: earliest[tp] if offset == EARLIEST else latest[tp] if offset == LATEST else offset
        for tp, offset in specific.items()
    }


class KafkaBatchReader(DataSourceReader):
    """``spark.read``: offsets are resolved once, when Spark plans the read."""

    def __init__(self, options: SourceOptions) -> None:
        self._options = options

    def partitions(self) -> Sequence[InputPartition]:
        offsets = OffsetReader(self._options)
        try:
            start = _resolve_start(offsets, self._options)
            end = _resolve_end(offsets, self._options, sorted(start))
        finally:
            offsets.close()
        ranges, losses = plan_ranges(start, end, {})
        _report(self._options, losses)
        return [KafkaInputPartition(r) for r in split_ranges(ranges, self._options.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self._options, partition)


class KafkaStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """``spark.readStream``: admission control, Trigger.AvailableNow, new partitions.

    The first offsets of a query are written to `initialOffsetsLocation` when that
    option is set (the jobs set it inside their checkpoint): a query killed before its
    first batch was logged must restart from the same offsets, not from a newer
    "latest". Spark does not tell Python sources where the checkpoint is.
    """

    def __init__(self, options: SourceOptions) -> None:
        self._options = options
        self._offsets: OffsetReader | None = None
        self._target: PartitionOffsets | None = None
        self._latest: PartitionOffsets | None = None

    def __getstate__(self) -> dict[str, Any]:
        # Spark pickles the reader to run `read` on executors; the broker client stays.
        return {"_options": self._options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["_options"])  # type: ignore[misc]

    @property
    def _reader(self) -> OffsetReader:
        if self._offsets is None:
            self._offsets = OffsetReader(self._options)
        return self._offsets

    def initialOffset(self) -> OffsetJson:
        location = self._options.initial_offsets_location
        if location is not None:
            path = Path(location)
            if path.exists():
                stored: OffsetJson = json.loads(path.read_text(encoding="utf-8"))
                return stored
        offsets = to_json(_resolve_start(self._reader, self._options))
        if location is not None:
            _write_atomically(Path(location), json.dumps(offsets))
        return offsets

    def getDefaultReadLimit(self) -> ReadLimit:
        limit = self._options.max_offsets_per_trigger
        return ReadAllAvailable() if limit is None else ReadMaxRows(limit)

    def prepareForTriggerAvailableNow(self) -> None:
        self._target = self._reader.latest(self._reader.partitions())

    def latestOffset(self, start: OffsetJson, limit: ReadLimit) -> OffsetJson:
        begin = from_json(start)
        current = self._reader.partitions()
        if self._target is not None:
            # Trigger.AvailableNow: nothing that appeared after the query started.
            current = [tp for tp in current if tp in self._target or tp in begin]
        change = partition_change(begin, current)
        if change.added:
            _log.info("new partitions: %s", ", ".join(map(str, sorted(change.added))))
            begin.update(self._reader.earliest(change.added))
        latest = self._reader.latest(current)
        self._latest = dict(latest)
        if self._target is not None:
            latest = {tp: min(end, self._target.get(tp, end)) for tp, end in latest.items()}
        if isinstance(limit, ReadMaxRows):
            latest = rate_limit(begin, latest, limit.max_rows)
        return to_json(latest)

    def reportLatestOffset(self) -> OffsetJson | None:
        return None if self._latest is None else to_json(self._latest)

    def partitions(self, start: OffsetJson, end: OffsetJson) -> Sequence[InputPartition]:
        begin, until = from_json(start), from_json(end)
        new = [tp for tp in until if tp not in begin]
        ranges, losses = plan_ranges(begin, until, self._reader.earliest(new) if new else {})
        _report(self._options, losses)
        return [KafkaInputPartition(r) for r in split_ranges(ranges, self._options.min_partitions)]

    def read(self, partition: InputPartition) -> Iterator[Any]:
        return _read(self._options, partition)

    def commit(self, end: OffsetJson) -> None:
        """Nothing to do: offsets are kept in Spark's checkpoint, never in Kafka."""

    def stop(self) -> None:
        if self._offsets is not None:
            self._offsets.close()


def _report(options: SourceOptions, losses: list[str]) -> None:
    if not losses:
        return
    text = "; ".join(losses)
    if options.fail_on_data_loss:
        raise KafkaSourceError(
            f"{text}. Some data may have been lost; set failOnDataLoss=false to go on"
        )
    _log.warning("data loss, going on (failOnDataLoss=false): %s", text)


def _write_atomically(path: Path, text: str) -> None:
    """Write, fsync and rename: a crash leaves the old file or the whole new one."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with tmp.open("w", encoding="utf-8") as handle:
        handle.write(text)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


class KafkaDataSource(DataSource):
    """The data source Spark instantiates from the options of each read."""

    @classmethod
    def name(cls) -> str:
        return FORMAT

    def schema(self) -> StructType:
        include = str(self.options.get("includeheaders", "false")).strip().lower() == "true"
        return kafka_schema(include)

    def reader(self, schema: StructType) -> DataSourceReader:
        return KafkaBatchReader(parse_options(self.options, streaming=False))

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        return KafkaStreamReader(parse_options(self.options, streaming=True))


def register(spark: SparkSession) -> None:
    """Make ``format("eventspool-kafka")`` available in this session."""
    spark.dataSource.register(KafkaDataSource)
