"""Exchanges and bindings: what they are, how they are checked, how one routes a key.

An exchange routes an event by its routing key to the Kafka topics bound to it:

- `direct`: to the topics whose binding key equals the routing key;
- `fanout`: to every bound topic, whatever the routing key (bindings have no key);
- `topic`: to the topics whose binding key matches the routing key, with RabbitMQ's
  wildcards (`*` one word, `#` zero or more; see trie.py).

A topic bound several times is written once. An event that matches no binding is
unroutable: it goes to the exchange's `alternate_topic`, or is refused when there is
none (UnroutableError), never dropped.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from eventspool.config import validate_topic
from eventspool.errors import InvalidEventError, InvalidExchangeError
from eventspool.routing.trie import TopicTrie

MAX_KEY_BYTES = 255  # AMQP's short string: routing and binding keys stay interchangeable
MAX_EXCHANGE_NAME = 249  # a Kafka topic name's limit: names share the same rules
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")


class ExchangeType(StrEnum):
    DIRECT = "direct"
    FANOUT = "fanout"
    TOPIC = "topic"


_TYPES = ", ".join(repr(member.value) for member in ExchangeType)


def validate_exchange_name(name: object) -> str:
    """Exchange names follow Kafka's topic-name rules: they appear in URLs and files."""
    if not isinstance(name, str):
        raise InvalidExchangeError(f"exchange name must be a str, got {type(name).__name__}")
    if not name or name in (".", ".."):
        raise InvalidExchangeError(f"exchange name {name!r} is not allowed")
    if len(name) > MAX_EXCHANGE_NAME:
        raise InvalidExchangeError(
            f"exchange name is {len(name)} characters long; at most {MAX_EXCHANGE_NAME} allowed"
        )
    bad = sorted(set(name) - _NAME_CHARS)
    if bad:
        raise InvalidExchangeError(
            f"exchange name {name!r} contains {''.join(bad)!r}; "
            "only ASCII letters, digits, '.', '_' and '-' are allowed"
        )
    return name


def validate_routing_key(key: object) -> str:
    """A routing key is any text of at most 255 bytes in UTF-8; raises InvalidEventError."""
    if not isinstance(key, str):
        raise InvalidEventError(f"routing_key must be a str, got {type(key).__name__}")
    routing_key_bytes(key)
    return key


def routing_key_bytes(key: str) -> bytes:
    """A str routing key as UTF-8, checked as `validate_routing_key` checks it."""
    try:
        raw = key.encode()
    except UnicodeEncodeError as exc:
        raise InvalidEventError(f"routing_key is not encodable as UTF-8: {exc.reason}") from None
    if len(raw) > MAX_KEY_BYTES:
        raise InvalidEventError(
            f"routing_key of {len(raw)} bytes; at most {MAX_KEY_BYTES} are allowed"
        )
    return raw


@dataclass(frozen=True, slots=True)
class Binding:
    """Topic `topic` receives the events whose routing key matches `key`."""

    topic: str
    key: str = ""


@dataclass(frozen=True, slots=True)
class Exchange:
    """A declared exchange; checked on construction, so an instance is always usable.

    Duplicate bindings are kept once, in their first order.
    """

    name: str
    type: ExchangeType
    bindings: tuple[Binding, ...] = ()
    alternate_topic: str | None = None

    def __post_init__(self) -> None:
        validate_exchange_name(self.name)
        where = f"exchange {self.name!r}"
        try:
            kind = ExchangeType(self.type)
        except ValueError:
            raise InvalidExchangeError(
                f"{where}: type {self.type!r} is not one of {_TYPES}"
            ) from None
        object.__setattr__(self, "type", kind)
        if isinstance(self.bindings, str | bytes) or not isinstance(self.bindings, Iterable):
            raise InvalidExchangeError(f"{where}: bindings must be a sequence of Binding")
        unique: dict[Binding, None] = {}
        for index, binding in enumerate(self.bindings):
            if not isinstance(binding, Binding):
                raise InvalidExchangeError(
                    f"{where}: binding {index} is a {type(binding).__name__}, not a Binding"
                )
            _check_topic(f"{where}: binding {index}", binding.topic)
            if kind is ExchangeType.FANOUT and binding.key:
                raise InvalidExchangeError(
                    f"{where}: binding {index} to {binding.topic!r} has key {binding.key!r}, "
                    "but a fanout exchange ignores keys; leave it empty"
                )
            try:
                validate_routing_key(binding.key)
            except InvalidEventError as exc:
                raise InvalidExchangeError(
                    f"{where}: binding {index} key: {str(exc).replace('routing_key', 'key')}"
                ) from None
            unique.setdefault(binding)
        object.__setattr__(self, "bindings", tuple(unique))
        if self.alternate_topic is not None:
            _check_topic(f"{where}: alternate_topic", self.alternate_topic)

    def topics(self) -> frozenset[str]:
        """Every topic this exchange can write to, the alternate topic included."""
        bound = {binding.topic for binding in self.bindings}
        if self.alternate_topic is not None:
            bound.add(self.alternate_topic)
        return frozenset(bound)

    def to_json(self) -> dict[str, Any]:
        """The declaration as JSON: what the agent's HTTP interface and the spool file hold."""
        keyed = self.type is not ExchangeType.FANOUT
        bindings = [
            {"topic": b.topic, "key": b.key} if keyed else {"topic": b.topic} for b in self.bindings
        ]
        return {
            "name": self.name,
            "type": self.type.value,
            "bindings": bindings,
            "alternate_topic": self.alternate_topic,
        }

    @classmethod
    def from_json(cls, name: str, document: object) -> Exchange:
        """Parse a declaration; every error is an InvalidExchangeError naming the field."""
        where = f"exchange {name!r}"
        if not isinstance(document, Mapping):
            raise InvalidExchangeError(f"{where}: a declaration must be a JSON object")
        unknown = set(document) - {"name", "type", "bindings", "alternate_topic"}
        if unknown:
            raise InvalidExchangeError(
                f"{where}: unknown fields {', '.join(sorted(map(str, unknown)))}; "
                "known: type, bindings, alternate_topic"
            )
        if document.get("name", name) != name:
            raise InvalidExchangeError(
                f"{where}: the declaration names another exchange, {document['name']!r}"
            )
        if "type" not in document:
            raise InvalidExchangeError(f"{where}: type is missing; use one of {_TYPES}")
        raw_bindings = document.get("bindings", [])
        if not isinstance(raw_bindings, list):
            raise InvalidExchangeError(f"{where}: bindings must be a list of objects")
        bindings = []
        for index, item in enumerate(raw_bindings):
            if not isinstance(item, Mapping) or set(item) - {"topic", "key"} or "topic" not in item:
                raise InvalidExchangeError(
                    f'{where}: binding {index} must be {{"topic": ..., "key": ...}}, got {item!r}'
                )
            key = item.get("key", "")
            if not isinstance(item["topic"], str) or not isinstance(key, str):
                raise InvalidExchangeError(f"{where}: binding {index}: topic and key are strings")
            bindings.append(Binding(item["topic"], key))
        alternate = document.get("alternate_topic")
        if alternate is not None and not isinstance(alternate, str):
            raise InvalidExchangeError(f"{where}: alternate_topic must be a string or null")
        return cls(name, document["type"], tuple(bindings), alternate)


def _check_topic(where: str, topic: object) -> None:
    try:
        validate_topic(topic)
    except InvalidEventError as exc:
        raise InvalidExchangeError(f"{where}: {exc}") from None


@dataclass(frozen=True, slots=True)
class Route:
    """Where one event goes: `topics` in name order; `unroutable` when it matched nothing.

    An unroutable event's only topic is the alternate topic.
    """

    topics: tuple[str, ...]
    unroutable: bool = False


@dataclass(frozen=True, slots=True, eq=False)
class CompiledExchange:
    """An exchange ready to route: a dict, a tuple or a trie, depending on its type."""

    exchange: Exchange
    _direct: Mapping[str, Route] = field(repr=False)
    _fanout: Route | None = field(repr=False)
    _trie: TopicTrie[str] | None = field(repr=False)
    _alternate: Route | None = field(repr=False)

    @classmethod
    def build(cls, exchange: Exchange) -> CompiledExchange:
        direct: dict[str, set[str]] = {}
        fanout = None
        trie = None
        if exchange.type is ExchangeType.DIRECT:
            for binding in exchange.bindings:
                direct.setdefault(binding.key, set()).add(binding.topic)
        elif exchange.type is ExchangeType.FANOUT:
            if exchange.bindings:
                fanout = Route(tuple(sorted({binding.topic for binding in exchange.bindings})))
        else:
            trie = TopicTrie((binding.key, binding.topic) for binding in exchange.bindings)
        alternate = exchange.alternate_topic
        return cls(
            exchange,
            {key: Route(tuple(sorted(topics))) for key, topics in direct.items()},
            fanout,
            trie,
            None if alternate is None else Route((alternate,), unroutable=True),
        )

    def route(self, routing_key: str) -> Route | None:
        """The route of `routing_key`; None when it is unroutable and there is no alternate."""
        if self._trie is not None:
            matched = self._trie.match(routing_key)
            if matched:
                return Route(tuple(sorted(matched)) if len(matched) > 1 else tuple(matched))
            return self._alternate
        if self._fanout is not None:
            return self._fanout
        return self._direct.get(routing_key, self._alternate)
