"""The pure offset logic: JSON forms, the read limit, range planning, partition changes."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspool.spark.offsets import (
    OffsetRange,
    OffsetSpecError,
    TopicPartition,
    from_json,
    parse_assign,
    parse_offset_spec,
    partition_change,
    plan_ranges,
    rate_limit,
    split_ranges,
    to_json,
)

TP = TopicPartition
partitions = st.builds(TP, st.sampled_from(["a", "b", "orders"]), st.integers(0, 5))


@st.composite
def backlogs(draw: st.DrawFn) -> tuple[dict[TP, int], dict[TP, int]]:
    tps = draw(st.sets(partitions, min_size=1, max_size=8))
    start = {tp: draw(st.integers(0, 10_000)) for tp in tps}
    latest = {tp: start[tp] + draw(st.integers(0, 5_000)) for tp in tps}
    return start, latest


def test_json_form_is_sparks() -> None:
    offsets = {TP("orders", 1): 7, TP("orders", 0): 3, TP("pay", 0): 0}
    assert to_json(offsets) == {"orders": {"0": 3, "1": 7}, "pay": {"0": 0}}
    assert from_json(to_json(offsets)) == offsets


@pytest.mark.parametrize(
    ("bad", "message"),
    [
        ({"t": [1]}, "partition -> offset"),
        ({"t": {"x": 1}}, "not a number"),
        ({"t": {"0": "1"}}, "integer"),
        ({"t": {"0": True}}, "integer"),
    ],
)
def test_malformed_offsets_are_refused(bad: dict[str, object], message: str) -> None:
    with pytest.raises(OffsetSpecError, match=message):
        from_json(bad)  # type: ignore[arg-type]


def test_offset_spec_forms() -> None:
    assert parse_offset_spec(" Earliest ", "startingOffsets").kind == "earliest"
    assert parse_offset_spec("latest", "startingOffsets").kind == "latest"
    spec = parse_offset_spec('{"t":{"0":23,"1":-2,"2":-1}}', "startingOffsets")
    assert spec.kind == "specific"
    assert spec.specific == {TP("t", 0): 23, TP("t", 1): -2, TP("t", 2): -1}
    with pytest.raises(OffsetSpecError, match="neither -2"):
        parse_offset_spec('{"t":{"0":-3}}', "startingOffsets")
    with pytest.raises(OffsetSpecError, match="'earliest', 'latest' or JSON"):
        parse_offset_spec("first", "startingOffsets")


def test_assign_form() -> None:
    assert parse_assign('{"b":[1,0],"a":[2]}') == [TP("a", 2), TP("b", 0), TP("b", 1)]
    for bad in ("[]", "{}", '{"a":[-1]}', '{"a":"0"}', "nope"):
        with pytest.raises(OffsetSpecError):
            parse_assign(bad)


def test_partition_change_names_added_and_removed() -> None:
    change = partition_change([TP("a", 0), TP("a", 1)], [TP("a", 1), TP("a", 2), TP("b", 0)])
    assert change.added == {TP("a", 2), TP("b", 0)}
    assert change.removed == {TP("a", 0)}


@given(backlogs(), st.integers(1, 20_000))
def test_rate_limit_never_exceeds_and_always_progresses(
    backlog: tuple[dict[TP, int], dict[TP, int]], limit: int
) -> None:
    start, latest = backlog
    end = rate_limit(start, latest, limit)
    total = sum(latest[tp] - start[tp] for tp in start)
    assert set(end) == set(latest)
    assert all(start[tp] <= end[tp] <= latest[tp] for tp in end)
    assert sum(end[tp] - start[tp] for tp in end) == min(limit, total)


@given(backlogs(), st.integers(1, 20_000))
def test_rate_limit_shares_follow_backlog_sizes(
    backlog: tuple[dict[TP, int], dict[TP, int]], limit: int
) -> None:
    start, latest = backlog
    end = rate_limit(start, latest, limit)
    total = sum(latest[tp] - start[tp] for tp in start)
    if total > limit:
        for tp in end:
            share = (latest[tp] - start[tp]) * limit / total
            assert abs((end[tp] - start[tp]) - share) < 1


def test_rate_limit_leaves_a_recreated_partition_to_be_reported() -> None:
    end = rate_limit({TP("a", 0): 50, TP("a", 1): 0}, {TP("a", 0): 10, TP("a", 1): 100}, 10)
    assert end == {TP("a", 0): 10, TP("a", 1): 10}
    with pytest.raises(ValueError, match="at least 1"):
        rate_limit({}, {}, 0)


def test_plan_ranges_reads_new_partitions_from_earliest_and_reports_losses() -> None:
    start = {TP("a", 0): 5, TP("a", 1): 9, TP("gone", 0): 3}
    end = {TP("a", 0): 8, TP("a", 1): 4, TP("a", 2): 6}
    ranges, losses = plan_ranges(start, end, {TP("a", 2): 2})
    assert ranges == [OffsetRange(TP("a", 0), 5, 8), OffsetRange(TP("a", 2), 2, 6)]
    assert len(losses) == 2
    assert "a-1: end offset 4 is below the start offset 9" in losses[0]
    assert "gone-0: the partition is gone" in losses[1]


@given(
    st.lists(st.integers(0, 1_000), min_size=1, max_size=6),
    st.one_of(st.none(), st.integers(1, 40)),
)
def test_split_ranges_covers_every_offset_once(sizes: list[int], minimum: int | None) -> None:
    ranges = [OffsetRange(TP("t", n), 100, 100 + size) for n, size in enumerate(sizes)]
    pieces = split_ranges(ranges, minimum)
    for r in ranges:
        mine = sorted((p for p in pieces if p.tp == r.tp), key=lambda p: p.from_offset)
        covered = [o for p in mine for o in range(p.from_offset, p.until_offset)]
        assert covered == list(range(r.from_offset, r.until_offset))
        assert all(p.size > 0 for p in mine)
    total = sum(sizes)
    if minimum is not None:
        assert len(pieces) >= min(minimum, total)
