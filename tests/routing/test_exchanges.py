"""Exchange declarations: what is refused and why, and how each type routes."""

from __future__ import annotations

from typing import Any

import pytest

from eventspool.errors import InvalidEventError, InvalidExchangeError
from eventspool.routing.exchanges import (
    Binding,
    CompiledExchange,
    Exchange,
    ExchangeType,
    Route,
    validate_exchange_name,
    validate_routing_key,
)


def route(exchange: Exchange, routing_key: str) -> Route | None:
    return CompiledExchange.build(exchange).route(routing_key)


def test_direct_routes_by_equal_key_to_every_topic_bound_with_it() -> None:
    exchange = Exchange(
        "logs",
        ExchangeType.DIRECT,
        (Binding("errors", "error"), Binding("all", "error"), Binding("all", "info")),
    )
    assert route(exchange, "error") == Route(("all", "errors"))
    assert route(exchange, "info") == Route(("all",))
    assert route(exchange, "error.x") is None
    assert route(exchange, "") is None


def test_fanout_ignores_the_routing_key() -> None:
    exchange = Exchange("fan", ExchangeType.FANOUT, (Binding("c"), Binding("a"), Binding("b")))
    assert route(exchange, "") == Route(("a", "b", "c"))
    assert route(exchange, "anything.at.all") == Route(("a", "b", "c"))


def test_topic_writes_a_topic_matched_by_several_bindings_once() -> None:
    exchange = Exchange(
        "animals", ExchangeType.TOPIC, (Binding("q2", "*.*.rabbit"), Binding("q2", "lazy.#"))
    )
    assert route(exchange, "lazy.pink.rabbit") == Route(("q2",))


@pytest.mark.parametrize("kind", list(ExchangeType))
def test_unroutable_goes_to_the_alternate_topic(kind: ExchangeType) -> None:
    key = "" if kind is ExchangeType.FANOUT else "bound"
    bindings = () if kind is ExchangeType.FANOUT else (Binding("t", key),)
    exchange = Exchange("x", kind, bindings, alternate_topic="lost")
    assert route(exchange, "other") == Route(("lost",), unroutable=True)
    assert route(Exchange("x", kind, bindings), "other") is None


def test_duplicate_bindings_are_kept_once_in_order() -> None:
    exchange = Exchange("x", "topic", [Binding("b", "k"), Binding("a", "k"), Binding("b", "k")])  # type: ignore[arg-type]
    assert exchange.type is ExchangeType.TOPIC
    assert exchange.bindings == (Binding("b", "k"), Binding("a", "k"))


def test_topics_includes_the_alternate() -> None:
    exchange = Exchange("x", ExchangeType.DIRECT, (Binding("a", "k"), Binding("b", "k")), "z")
    assert exchange.topics() == {"a", "b", "z"}


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"name": "bad name"}, "contains ' '"),
        ({"name": ""}, "not allowed"),
        ({"name": "x" * 250}, "at most 249"),
        ({"type": "headers"}, "type 'headers' is not one of 'direct', 'fanout', 'topic'"),
        ({"bindings": [Binding("no spaces", "k")]}, "binding 0: topic name 'no spaces'"),
        ({"bindings": [Binding("t", "k" * 256)]}, "binding 0 key: key of 256 bytes"),
        ({"bindings": ["t"]}, "binding 0 is a str, not a Binding"),
        ({"bindings": "t"}, "bindings must be a sequence of Binding"),
        ({"alternate_topic": "a/b"}, "alternate_topic: topic name 'a/b' contains '/'"),
        (
            {"type": "fanout", "bindings": [Binding("t", "k")]},
            "a fanout exchange ignores keys",
        ),
    ],
)
def test_bad_declarations_name_what_is_wrong(kwargs: dict[str, Any], message: str) -> None:
    fields: dict[str, Any] = {"name": "x", "type": "topic", "bindings": (), **kwargs}
    with pytest.raises(InvalidExchangeError, match=message) as info:
        Exchange(**fields)
    assert isinstance(info.value, ValueError)


def test_routing_keys_are_text_of_at_most_255_bytes() -> None:
    assert validate_routing_key("é" * 127) == "é" * 127
    with pytest.raises(InvalidEventError, match="256 bytes"):
        validate_routing_key("é" * 128)
    with pytest.raises(InvalidEventError, match="must be a str, got bytes"):
        validate_routing_key(b"a")
    with pytest.raises(InvalidEventError, match="not encodable"):
        validate_routing_key("\ud800")
    with pytest.raises(InvalidExchangeError, match="must be a str"):
        validate_exchange_name(None)


def test_json_round_trip() -> None:
    exchanges = [
        Exchange("a", ExchangeType.TOPIC, (Binding("t", "x.#"),), "alt"),
        Exchange("b", ExchangeType.FANOUT, (Binding("t"), Binding("u"))),
        Exchange("c", ExchangeType.DIRECT),
    ]
    for exchange in exchanges:
        assert Exchange.from_json(exchange.name, exchange.to_json()) == exchange
    assert exchanges[1].to_json()["bindings"] == [{"topic": "t"}, {"topic": "u"}]


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ([], "must be a JSON object"),
        ({"bindings": []}, "type is missing"),
        ({"type": "topic", "extra": 1}, "unknown fields extra"),
        ({"type": "topic", "name": "other"}, "names another exchange, 'other'"),
        ({"type": "topic", "bindings": {"t": "k"}}, "bindings must be a list"),
        ({"type": "topic", "bindings": [{"key": "k"}]}, "binding 0 must be"),
        ({"type": "topic", "bindings": [{"topic": "t", "key": 1}]}, "are strings"),
        ({"type": "topic", "alternate_topic": 5}, "alternate_topic must be a string"),
        ({"type": "nope"}, "type 'nope' is not one of"),
    ],
)
def test_bad_json_declarations(document: object, message: str) -> None:
    with pytest.raises(InvalidExchangeError, match=message):
        Exchange.from_json("x", document)
