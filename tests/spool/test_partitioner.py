"""Tests for Kafka-compatible partition selection.

Known vectors come from Kafka's and librdkafka's own test suites, so a pass
means keys land where the Java client and librdkafka's murmur2_random put them.
"""

from __future__ import annotations

import random
from collections import Counter
from itertools import pairwise

import pytest
from hypothesis import given
from hypothesis import strategies as st

from eventspool.spool.partitioner import (
    StickyPartitioner,
    murmur2,
    partition_for_key,
)

# Source: apache/kafka, clients/src/test/java/org/apache/kafka/common/utils/UtilsTest.java
# (testMurmur2): key -> Utils.murmur2(key) as a signed Java int.
KAFKA_MURMUR2_VECTORS: list[tuple[bytes, int]] = [
    (b"21", -973932308),
    (b"foobar", -790332482),
    (b"a-little-bit-long-string", -985981536),
    (b"a-little-bit-longer-string", -1486304829),
    (b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8", -58897971),
    (b"abc", 479470107),
]

# Source: confluentinc/librdkafka, src/rdmurmur2.c (unittest_murmurhashneutral2,
# "java_murmur2_results"): these are the Java hash with the sign bit masked off.
LIBRDKAFKA_POSITIVE_HASH_VECTORS: list[tuple[bytes, int]] = [
    (b"kafka", 1348980580),
    (b"amqp", 767747138),
    (b"giberish123456789", 257239820),
]

# Source: confluentinc/librdkafka, tests/0048-partitioner.c (do_test_partitioners),
# expectations of the Java-compatible "murmur2_random" partitioner: the expected
# partition is HASH % part_cnt, with part_cnt 7 (quick mode) or 17. The NULL key
# (random partition) is left out; "23456" is the test's `unaligned + 1`.
LIBRDKAFKA_PARTITIONER_VECTORS: list[tuple[bytes, int]] = [
    (b"", 0x106E08D9),
    (b"23456", 0x058D780F),
    (b"this is another string with more length to it perhaps", 0x4F7703DA),
    (b"hejsan", 0x5EC19395),
]
LIBRDKAFKA_PARTITION_COUNTS = (7, 17)

PARTITION_COUNTS = (1, 2, 3, 6, 7, 12, 17, 32, 100, 1000)


def _i32(x: int) -> int:
    x &= 0xFFFFFFFF
    return x - (1 << 32) if x & 0x80000000 else x


def _java_murmur2(data: bytes) -> int:
    """Line-by-line port of the Java code with explicit int wraparound, as an oracle."""
    length = len(data)
    m = 0x5BD1E995
    h = _i32(0x9747B28C ^ length)
    for i in range(length // 4):
        i4 = i * 4
        k = _i32(data[i4] + (data[i4 + 1] << 8) + (data[i4 + 2] << 16) + (data[i4 + 3] << 24))
        k = _i32(k * m)
        k = _i32(k ^ ((k & 0xFFFFFFFF) >> 24))
        k = _i32(k * m)
        h = _i32(h * m)
        h = _i32(h ^ k)
    rest = length % 4
    base = length & ~3
    if rest == 3:
        h = _i32(h ^ (data[base + 2] << 16))
    if rest >= 2:
        h = _i32(h ^ (data[base + 1] << 8))
    if rest >= 1:
        h = _i32(h ^ data[base])
        h = _i32(h * m)
    h = _i32(h ^ ((h & 0xFFFFFFFF) >> 13))
    h = _i32(h * m)
    return _i32(h ^ ((h & 0xFFFFFFFF) >> 15))


def to_positive(n: int) -> int:
    """Kafka's `Utils.toPositive`: the sign bit cleared (abs() would differ for negative
    hashes, and Java's overflows on MIN_VALUE); the compiled partitioner does the same."""
    return n & 0x7FFFFFFF


# --- murmur2 / to_positive / partition_for_key: known vectors ---------------


@pytest.mark.parametrize(("key", "expected"), KAFKA_MURMUR2_VECTORS)
def test_murmur2_matches_kafka_utils_test(key: bytes, expected: int) -> None:
    assert murmur2(key) == expected


@pytest.mark.parametrize(("key", "expected"), LIBRDKAFKA_POSITIVE_HASH_VECTORS)
def test_positive_murmur2_matches_librdkafka_unit_test(key: bytes, expected: int) -> None:
    assert to_positive(murmur2(key)) == expected


@pytest.mark.parametrize(("key", "expected"), LIBRDKAFKA_PARTITIONER_VECTORS)
def test_positive_murmur2_matches_librdkafka_partitioner_test(key: bytes, expected: int) -> None:
    assert to_positive(murmur2(key)) == expected


@pytest.mark.parametrize("partition_count", LIBRDKAFKA_PARTITION_COUNTS)
@pytest.mark.parametrize(("key", "positive_hash"), LIBRDKAFKA_PARTITIONER_VECTORS)
def test_partition_for_key_matches_librdkafka_murmur2_random(
    key: bytes, positive_hash: int, partition_count: int
) -> None:
    assert partition_for_key(key, partition_count) == positive_hash % partition_count


@pytest.mark.parametrize("partition_count", PARTITION_COUNTS)
@pytest.mark.parametrize(
    ("key", "signed_hash"), KAFKA_MURMUR2_VECTORS + LIBRDKAFKA_PARTITIONER_VECTORS
)
def test_partition_for_key_is_kafka_default_partitioner(
    key: bytes, signed_hash: int, partition_count: int
) -> None:
    # BuiltInPartitioner.partitionForKey: toPositive(murmur2(key)) % numPartitions.
    expected = (signed_hash & 0x7FFFFFFF) % partition_count
    assert partition_for_key(key, partition_count) == expected


def test_partition_for_key_spot_values() -> None:
    # Literal values so a mistake shared by code and test arithmetic still shows:
    # -973932308 & 0x7fffffff = 1173551340 (Kafka "21"), 0x106e08d9 = 275646681 (librdkafka "").
    assert partition_for_key(b"21", 1) == 0
    assert partition_for_key(b"21", 2) == 0
    assert partition_for_key(b"21", 3) == 0
    assert partition_for_key(b"21", 7) == 3
    assert partition_for_key(b"21", 12) == 0
    assert partition_for_key(b"21", 17) == 13
    assert partition_for_key(b"", 7) == 2
    assert partition_for_key(b"", 12) == 9
    assert partition_for_key(b"", 17) == 11


def test_to_positive_masks_like_java() -> None:
    assert to_positive(0) == 0
    assert to_positive(-1) == 0x7FFFFFFF
    assert to_positive(-(2**31)) == 0  # Java abs() would overflow here
    assert to_positive(2**31 - 1) == 2**31 - 1
    assert to_positive(-973932308) == 1173551340


@pytest.mark.parametrize("bad", [0, -1, -100])
def test_partition_for_key_rejects_bad_partition_count(bad: int) -> None:
    with pytest.raises(ValueError, match="partition_count"):
        partition_for_key(b"k", bad)


# --- murmur2 / partition_for_key: properties --------------------------------


@given(st.binary(max_size=200))
def test_murmur2_matches_java_port(data: bytes) -> None:
    assert murmur2(data) == _java_murmur2(data)


@given(st.binary(max_size=64))
def test_murmur2_is_signed_32_bit(data: bytes) -> None:
    assert -(2**31) <= murmur2(data) < 2**31


@given(st.integers(min_value=-(2**31), max_value=2**31 - 1))
def test_to_positive_is_non_negative_and_keeps_low_bits(n: int) -> None:
    result = to_positive(n)
    assert 0 <= result < 2**31
    assert result == (n & 0xFFFFFFFF) & 0x7FFFFFFF
    if n >= 0:
        assert result == n


@given(st.binary(max_size=64), st.integers(min_value=1, max_value=100_000))
def test_partition_for_key_in_range_and_deterministic(key: bytes, partition_count: int) -> None:
    first = partition_for_key(key, partition_count)
    assert 0 <= first < partition_count
    assert partition_for_key(key, partition_count) == first
    assert partition_for_key(bytes(key), partition_count) == first  # equal, not identical


# --- StickyPartitioner -------------------------------------------------------


def _expected_switches(sizes: list[int], batch_bytes: int) -> list[bool]:
    """Model of KIP-480 stickiness: switch once the current partition got batch_bytes."""
    switches: list[bool] = []
    produced = 0
    for i, size in enumerate(sizes):
        switch = i > 0 and produced >= batch_bytes
        if switch:
            produced = 0
        switches.append(switch)
        produced += size
    return switches


@given(
    batch_bytes=st.integers(min_value=1, max_value=20_000),
    partition_count=st.integers(min_value=2, max_value=50),
    sizes=st.lists(st.integers(min_value=0, max_value=6_000), min_size=1, max_size=80),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_sticky_stays_until_batch_bytes_then_switches(
    batch_bytes: int, partition_count: int, sizes: list[int], seed: int
) -> None:
    sticky = StickyPartitioner(batch_bytes, random.Random(seed))
    chosen = [sticky.partition(partition_count, size) for size in sizes]
    assert all(0 <= p < partition_count for p in chosen)
    for i, switch in enumerate(_expected_switches(sizes, batch_bytes)):
        if i == 0:
            continue
        if switch:
            assert chosen[i] != chosen[i - 1], "a switch must move to another partition"
        else:
            assert chosen[i] == chosen[i - 1], "must stick until batch_bytes is reached"


@given(
    batch_bytes=st.integers(min_value=1, max_value=5_000),
    sizes=st.lists(st.integers(min_value=0, max_value=6_000), min_size=1, max_size=50),
)
def test_sticky_single_partition_always_zero(batch_bytes: int, sizes: list[int]) -> None:
    sticky = StickyPartitioner(batch_bytes, random.Random(0))
    assert [sticky.partition(1, size) for size in sizes] == [0] * len(sizes)


@given(
    data=st.data(),
    partition_count=st.integers(min_value=1, max_value=40),
    batch_bytes=st.integers(min_value=1, max_value=3_000),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_sticky_only_chooses_available_partitions(
    data: st.DataObject, partition_count: int, batch_bytes: int, seed: int
) -> None:
    sticky = StickyPartitioner(batch_bytes, random.Random(seed))
    partitions = st.integers(min_value=0, max_value=partition_count - 1)
    for _ in range(data.draw(st.integers(min_value=1, max_value=6), label="rounds")):
        available = data.draw(st.lists(partitions, min_size=1, max_size=10), label="available")
        for size in data.draw(st.lists(st.integers(0, 2_000), max_size=20), label="sizes"):
            assert sticky.partition(partition_count, size, available) in available


@given(
    data=st.data(),
    partition_count=st.integers(min_value=1, max_value=12),
    batch_bytes=st.integers(min_value=1, max_value=3_000),
    seed=st.integers(min_value=0, max_value=2**32),
    in_place=st.booleans(),
)
def test_sticky_chooses_alike_whether_available_is_kept_or_changed_in_place(
    data: st.DataObject, partition_count: int, batch_bytes: int, seed: int, in_place: bool
) -> None:
    """The partitioner remembers the frozenset found to hold its current partition; a
    new frozenset, or a set changed in place, is looked at again, as a fresh list is."""
    fresh = StickyPartitioner(batch_bytes, random.Random(seed))
    kept = StickyPartitioner(batch_bytes, random.Random(seed))
    partitions = st.integers(min_value=0, max_value=partition_count - 1)
    changing: set[int] = set()
    for _ in range(data.draw(st.integers(min_value=1, max_value=6), label="rounds")):
        chosen = data.draw(st.frozensets(partitions, min_size=1), label="available")
        given: frozenset[int] | set[int] = chosen
        if in_place:
            changing.clear()
            changing.update(chosen)
            given = changing
        for size in data.draw(st.lists(st.integers(0, 2_000), max_size=20), label="sizes"):
            expected = fresh.partition(partition_count, size, sorted(chosen))
            assert kept.partition(partition_count, size, given) == expected


@given(
    partition_count=st.integers(min_value=1, max_value=40),
    seed=st.integers(min_value=0, max_value=2**32),
    sizes=st.lists(st.integers(min_value=0, max_value=500), min_size=1, max_size=40),
)
def test_sticky_empty_or_missing_available_means_any(
    partition_count: int, seed: int, sizes: list[int]
) -> None:
    with_none = StickyPartitioner(256, random.Random(seed))
    with_empty = StickyPartitioner(256, random.Random(seed))
    for size in sizes:
        a = with_none.partition(partition_count, size, None)
        b = with_empty.partition(partition_count, size, [])
        assert a == b
        assert 0 <= a < partition_count


def test_sticky_switches_immediately_when_current_becomes_unavailable() -> None:
    sticky = StickyPartitioner(10_000, random.Random(7))
    first = sticky.partition(6, 10)
    assert sticky.partition(6, 10) == first  # far below batch_bytes: sticks
    others = [p for p in range(6) if p != first]
    moved = sticky.partition(6, 10, others)
    assert moved in others
    assert sticky.partition(6, 10, others) == moved  # sticks to the new one


def test_sticky_ignores_out_of_range_available_entries() -> None:
    sticky = StickyPartitioner(1, random.Random(3))
    for _ in range(200):
        assert sticky.partition(4, 1, [2, 9, -1, 2]) == 2
    # Nothing usable listed: fall back to every partition rather than failing.
    for _ in range(50):
        assert 0 <= sticky.partition(4, 1, [10, 11]) < 4


@given(
    before=st.integers(min_value=1, max_value=30),
    grow_by=st.integers(min_value=1, max_value=30),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_sticky_handles_partition_count_growth(before: int, grow_by: int, seed: int) -> None:
    after = before + grow_by
    sticky = StickyPartitioner(100, random.Random(seed))
    for _ in range(20):
        assert 0 <= sticky.partition(before, 40) < before
    for _ in range(40):
        assert 0 <= sticky.partition(after, 40) < after


def test_sticky_growth_makes_new_partitions_reachable() -> None:
    sticky = StickyPartitioner(1, random.Random(11))
    assert {sticky.partition(3, 1) for _ in range(300)} == {0, 1, 2}
    assert {sticky.partition(8, 1) for _ in range(800)} == set(range(8))


@given(
    data=st.data(),
    before=st.integers(min_value=2, max_value=30),
    seed=st.integers(min_value=0, max_value=2**32),
)
def test_sticky_switches_immediately_when_partition_count_shrinks(
    data: st.DataObject, before: int, seed: int
) -> None:
    sticky = StickyPartitioner(10**9, random.Random(seed))  # never fills on its own
    current = sticky.partition(before, 1)
    after = data.draw(st.integers(min_value=1, max_value=before - 1), label="after")
    moved = sticky.partition(after, 1)
    assert 0 <= moved < after
    if current < after:
        assert moved == current  # still exists and batch not full: keep sticking


def test_sticky_switch_is_uniform_over_other_partitions() -> None:
    sticky = StickyPartitioner(1, random.Random(2024))
    chosen = [sticky.partition(5, 1) for _ in range(20_001)]
    assert all(a != b for a, b in pairwise(chosen))
    transitions = Counter((a, b) for a, b in pairwise(chosen))
    assert len(transitions) == 5 * 4
    # Each of the 20 transitions should occur ~1000 times.
    assert all(700 < n < 1300 for n in transitions.values())


def test_sticky_default_rng_and_batch_bytes() -> None:
    sticky = StickyPartitioner()
    assert sticky.batch_bytes == 16384
    first = sticky.partition(10, 16383)
    assert sticky.partition(10, 1) == first  # 16383 < 16384: still sticky
    assert sticky.partition(10, 1) != first  # 16384 reached: switched


@pytest.mark.parametrize("bad", [0, -5])
def test_sticky_rejects_bad_batch_bytes(bad: int) -> None:
    with pytest.raises(ValueError, match="batch_bytes"):
        StickyPartitioner(bad)


def test_sticky_rejects_bad_arguments() -> None:
    sticky = StickyPartitioner()
    with pytest.raises(ValueError, match="partition_count"):
        sticky.partition(0, 10)
    with pytest.raises(ValueError, match="size"):
        sticky.partition(3, -1)
