"""The consumer's Record, built by the compiled core: a value that handlers may compare,
hash (without headers), pickle and keep, and that nobody can change under them."""

from __future__ import annotations

import pickle

import pytest

from eventspool.consumer import Record

HEADERS = [("event_id", b"a"), ("x", b"1"), ("x", b"2"), ("gone", None)]


def make(**changes: object) -> Record:
    fields: dict[str, object] = {
        "topic": "t",
        "partition": 3,
        "offset": 5,
        "key": b"k",
        "value": b"v",
        "headers": HEADERS,
        "create_time_ms": 7,
        "event_id": "a",
    }
    fields.update(changes)
    return Record(**fields)  # type: ignore[arg-type]


def test_fields_keywords_and_the_first_attempt() -> None:
    record = make()
    assert (record.topic, record.partition, record.offset) == ("t", 3, 5)
    assert (record.key, record.value, record.headers) == (b"k", b"v", HEADERS)
    assert (record.create_time_ms, record.event_id, record.attempt) == (7, "a", 1)
    assert Record("t", 3, 5, b"k", b"v", HEADERS, 7, "a", 2).attempt == 2


def test_header_is_the_last_value_of_its_name() -> None:
    record = make()
    assert record.header("x") == b"2"
    assert record.header("gone") is None
    assert record.header("missing") is None
    assert make(headers=None).header("x") is None


def test_equal_by_value_and_hashable_without_headers() -> None:
    assert make() == make()
    assert make() != make(offset=6)
    assert make() != make().with_attempt(2)
    fields: object = ("t", 3, 5)
    assert make() != fields
    assert hash(make(headers=None)) == hash(make(headers=None))
    with pytest.raises(TypeError):
        hash(make())


def test_with_attempt_changes_only_the_attempt() -> None:
    again = make().with_attempt(3)
    assert again.attempt == 3
    assert again == Record("t", 3, 5, b"k", b"v", HEADERS, 7, "a", attempt=3)


def test_fields_cannot_be_set() -> None:
    record = make()
    with pytest.raises(AttributeError):
        record.offset = 9  # type: ignore[misc]
    with pytest.raises(AttributeError):
        record.extra = 1  # type: ignore[attr-defined]


def test_pickle_and_repr_round_trip() -> None:
    record = make(create_time_ms=None, event_id=None, key=None).with_attempt(4)
    assert pickle.loads(pickle.dumps(record)) == record
    assert eval(repr(record), {"Record": Record}) == record


@pytest.mark.parametrize(
    "changes",
    [
        {"topic": b"t"},
        {"topic": None},
        {"offset": "5"},
        {"partition": 1.5},
        {"attempt": 2.9},
    ],
)
def test_wrong_field_types_are_refused(changes: dict[str, object]) -> None:
    with pytest.raises(TypeError):
        make(**changes)


def test_match_by_position() -> None:
    match make():
        case Record(topic, partition, offset):
            assert (topic, partition, offset) == ("t", 3, 5)
        case _:
            pytest.fail("a Record matches its fields by position")
