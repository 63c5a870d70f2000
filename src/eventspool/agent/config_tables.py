"""Readers of the agent configuration's tables that are more than scalar settings.

`[[access]]` rules (users and groups looked up, token digests decoded), `[exchanges.NAME]`
with their bindings, `[kafka.config]` (librdkafka's own settings, passed through), and
`[quotas.topics]`. Their keys are declared here; values are checked by the generic
loader where a key is a plain setting, and here where a table has a shape of its own.
"""

from __future__ import annotations

import grp
import pwd
import re
from collections.abc import Mapping
from typing import Any

from eventspool.agent.access import PeerRule
from eventspool.agent.config_loader import (
    ConfigError,
    Setting,
    SettingsLoader,
    dotted,
    one_of,
    positive,
    toml_type,
)
from eventspool.config import KafkaConfigValue
from eventspool.errors import InvalidExchangeError
from eventspool.routing.exchanges import (
    Binding,
    Exchange,
    ExchangeType,
    validate_exchange_name,
)
from eventspool.sender.producer import FORCED_SETTINGS, TYPED_SETTINGS

ACCESS_SETTINGS = (
    Setting("name", "name", "the rule's name in logs and metrics; access[N] when not set"),
    Setting("uids", "ids", "local uids it matches"),
    Setting("users", "names", "local user names it matches, looked up at start"),
    Setting("gids", "ids", "primary gids it matches"),
    Setting("groups", "names", "primary group names it matches, looked up at start"),
    Setting("cert_cns", "names", "common names of verified client certificates it matches"),
    Setting("token_sha256", "names", "SHA-256 digests (hex) of the tokens it matches"),
    Setting("topics", "names", "glob patterns of the topics it grants"),
    Setting("exchanges", "names", "glob patterns of the exchanges it grants"),
)
EXCHANGE_KEYS = ("type", "bindings", "alternate_topic")
_BINDING_KEYS = ("topic", "key")
_EXCHANGE_TYPES = tuple(member.value for member in ExchangeType)


def access_rule(loader: SettingsLoader, index: int, body: Mapping[str, Any]) -> PeerRule:
    """One [[access]] table: the uids/users and gids/groups it matches (or, on TCP, the
    certificate names and tokens), and the topic and exchange patterns it grants them."""
    prefix = f"access[{index}]"
    loader.check_keys(prefix, body, (setting.name for setting in ACCESS_SETTINGS))
    values = loader.values(prefix, body, ACCESS_SETTINGS)
    uids = set(values.get("uids", []))
    gids = set(values.get("gids", []))
    for user in values.get("users", []):
        try:
            uids.add(pwd.getpwnam(user).pw_uid)
        except KeyError:
            raise loader.error(f"{prefix}.users", user, "no such user on this host") from None
    for group in values.get("groups", []):
        try:
            gids.add(grp.getgrnam(group).gr_gid)
        except KeyError:
            raise loader.error(f"{prefix}.groups", group, "no such group on this host") from None
    cert_cns = frozenset(values.get("cert_cns", []))
    digests = tuple(
        _token_digest(loader, f"{prefix}.token_sha256", value)
        for value in values.get("token_sha256", [])
    )
    if not uids and not gids and not cert_cns and not digests:
        raise ConfigError(
            f"{loader.where(prefix)}: matches nobody; give uids, users, gids, groups, "
            "cert_cns or token_sha256",
            key=prefix,
        )
    return PeerRule(
        values.get("name", prefix),
        frozenset(uids),
        frozenset(gids),
        tuple(values.get("topics", [])),
        tuple(values.get("exchanges", [])),
        cert_cns,
        digests,
    )


def _token_digest(loader: SettingsLoader, key: str, value: str) -> bytes:
    if not re.fullmatch(r"[0-9a-fA-F]{64}", value):
        raise loader.error(
            key,
            value,
            'expected the SHA-256 of a token as 64 hex digits (printf %s "$TOKEN" | sha256sum)',
        )
    return bytes.fromhex(value)


def kafka_config(loader: SettingsLoader, table: Mapping[str, Any]) -> dict[str, KafkaConfigValue]:
    """Flatten unquoted dotted keys (security.protocol = ...) back into librdkafka's names."""
    out: dict[str, KafkaConfigValue] = {}

    def walk(prefix: str, node: Mapping[str, Any]) -> None:
        for name, value in node.items():
            setting = f"{prefix}.{name}" if prefix else name
            if isinstance(value, dict):
                walk(setting, value)
                continue
            key = dotted("kafka", "config", setting)
            if setting in TYPED_SETTINGS:
                raise loader.error(key, value, f"set kafka.{TYPED_SETTINGS[setting]} instead")
            if setting in FORCED_SETTINGS:
                raise loader.error(
                    key, value, "eventspool sets this itself, because delivery depends on it"
                )
            if not isinstance(value, str | int | float):  # bool is an int
                raise loader.error(
                    key,
                    value,
                    f"expected a string, number or boolean, got {toml_type(value)}",
                )
            out[setting] = value

    walk("", table)
    return out


def exchanges(loader: SettingsLoader, table: Mapping[str, Any]) -> tuple[Exchange, ...]:
    """[exchanges.NAME] tables: type, bindings = [{topic, key}], alternate_topic."""
    return tuple(_exchange(loader, name, body) for name, body in table.items())


def _exchange(loader: SettingsLoader, name: str, body: Any) -> Exchange:
    prefix = dotted("exchanges", name)
    try:
        validate_exchange_name(name)
    except InvalidExchangeError as exc:
        raise ConfigError(f"{loader.where(prefix)}: {exc}", key=prefix) from exc
    if not isinstance(body, dict):
        raise loader.error(prefix, body, f"expected a table, got {toml_type(body)}")
    loader.check_keys(prefix, body, EXCHANGE_KEYS)
    if "type" not in body:
        raise ConfigError(
            f"{loader.where(prefix)}: type is missing; use one of {one_of(_EXCHANGE_TYPES)}",
            key=f"{prefix}.type",
        )
    kind = body["type"]
    if kind not in _EXCHANGE_TYPES:
        raise loader.error(f"{prefix}.type", kind, f"must be one of {one_of(_EXCHANGE_TYPES)}")
    alternate = body.get("alternate_topic")
    if alternate is not None:
        if not isinstance(alternate, str):
            raise loader.error(
                f"{prefix}.alternate_topic",
                alternate,
                f"expected a topic name, got {toml_type(alternate)}",
            )
        loader.topic_name(f"{prefix}.alternate_topic", alternate)
    try:
        return Exchange(name, ExchangeType(kind), _bindings(loader, prefix, body), alternate)
    except InvalidExchangeError as exc:
        raise ConfigError(f"{loader.where(prefix)}: {exc}", key=prefix) from exc


def _bindings(loader: SettingsLoader, prefix: str, body: Mapping[str, Any]) -> tuple[Binding, ...]:
    raw = body.get("bindings", [])
    key = f"{prefix}.bindings"
    if not isinstance(raw, list):
        raise loader.error(
            key,
            raw,
            f'expected an array like [{{ topic = "t", key = "a.*" }}], got {toml_type(raw)}',
        )
    bindings = []
    for index, item in enumerate(raw):
        where = f"{key}[{index}]"
        if not isinstance(item, dict):
            raise loader.error(
                where,
                item,
                f'expected a table like {{ topic = "t", key = "a.*" }}, got {toml_type(item)}',
            )
        loader.check_keys(where, item, _BINDING_KEYS, suggest=False)
        topic = item.get("topic")
        if not isinstance(topic, str):
            raise ConfigError(
                f"{loader.where(where)}: topic is missing or not a string", key=f"{where}.topic"
            )
        loader.topic_name(f"{where}.topic", topic)
        binding_key = item.get("key", "")
        if not isinstance(binding_key, str):
            raise loader.error(
                f"{where}.key", binding_key, f"expected a string, got {toml_type(binding_key)}"
            )
        bindings.append(Binding(topic, binding_key))
    return tuple(bindings)


def topic_quotas(loader: SettingsLoader, table: Mapping[str, Any]) -> dict[str, int]:
    """[quotas.topics]: a positive byte rate per topic name."""
    out: dict[str, int] = {}
    for topic, value in table.items():
        key = dotted("quotas", "topics", topic)
        loader.topic_name(key, topic)
        if isinstance(value, bool) or not isinstance(value, int):
            raise loader.error(key, value, f"expected an integer, got {toml_type(value)}")
        problem = positive(value)
        if problem is not None:
            raise loader.error(key, value, problem)
        out[topic] = value
    return out
