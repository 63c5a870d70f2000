"""The reward rules: which events earn what, capped per user per day.

A rule file (TOML) lists rules; each user's reward for a UTC day is the sum over rules of::

    min(cap_cents_per_day, floor(sum(amount) * percent / 100) + fixed_cents * count)

where sum and count run over the user's events of that day that the rule matches. The
cap applies to the day's total, so it holds however the day's events are split across
micro-batches. Percentages are exact to the hundredth (integer basis points), so Spark,
PostgreSQL and plain Python compute the same cents::

    [[rule]]
    name = "cashback"
    event_type = "order_created"      # the event's "type" field
    match = { status = "paid" }       # other top-level fields that must be equal
    amount_field = "amount_cents"     # the amount the percentage applies to
    percent = 2
    cap_cents_per_day = 500
"""

from __future__ import annotations

import re
import tomllib
from collections import defaultdict
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from decimal import Decimal, InvalidOperation
from pathlib import Path
from typing import Any

_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyz0123456789_-")
# An amount is an integer of at most 18 digits, as a JSON number or a string of one.
AMOUNT_PATTERN = r"-?[0-9]{1,18}"


class RuleError(ValueError):
    """A rule file that cannot be used, with the rule and key named."""


@dataclass(frozen=True, slots=True)
class Rule:
    name: str
    event_type: str
    match: tuple[tuple[str, str], ...] = ()
    amount_field: str | None = None
    basis_points: int = 0
    fixed_cents: int = 0
    cap_cents_per_day: int | None = None

    def fields(self) -> set[str]:
        """Top-level event fields the rule reads."""
        names = {name for name, _ in self.match}
        if self.amount_field is not None:
            names.add(self.amount_field)
        return names

    def reward(self, amount_cents: int, events: int) -> int:
        """The day's reward for one user from the totals of the events this rule matched."""
        value = (amount_cents * self.basis_points) // 10_000 + self.fixed_cents * events
        return value if self.cap_cents_per_day is None else min(value, self.cap_cents_per_day)


@dataclass(frozen=True, slots=True)
class RuleSet:
    rules: tuple[Rule, ...] = field(default_factory=tuple)

    def fields(self) -> set[str]:
        return set().union(*(rule.fields() for rule in self.rules)) if self.rules else set()


DEFAULT_RULES = RuleSet(
    (
        Rule(
            name="cashback",
            event_type="order_created",
            match=(("status", "paid"),),
            amount_field="amount_cents",
            basis_points=200,
            cap_cents_per_day=500,
        ),
    )
)


def _basis_points(rule: str, raw: object) -> int:
    try:
        value = Decimal(str(raw)) * 100
    except InvalidOperation:
        raise RuleError(f"rule {rule!r}: percent must be a number, got {raw!r}") from None
    if value != value.to_integral_value() or value < 0:
        raise RuleError(
            f"rule {rule!r}: percent must be non-negative with at most two decimals, got {raw!r}"
        )
    return int(value)


def _int(rule: str, key: str, raw: object, default: int | None) -> int | None:
    if raw is None:
        return default
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise RuleError(f"rule {rule!r}: {key} must be a non-negative integer, got {raw!r}")
    return raw


def parse_rules(data: Mapping[str, Any]) -> RuleSet:
    """Rules from the parsed TOML document (a list under ``rule``)."""
    entries = data.get("rule")
    if not isinstance(entries, list) or not entries:
        raise RuleError("the rule file must define at least one [[rule]]")
    rules: list[Rule] = []
    for entry in entries:
        if not isinstance(entry, dict):
            raise RuleError(f"each [[rule]] must be a table, got {entry!r}")
        unknown = set(entry) - {
            "name",
            "event_type",
            "match",
            "amount_field",
            "percent",
            "fixed_cents",
            "cap_cents_per_day",
        }
        name = entry.get("name")
        if not isinstance(name, str) or not name or set(name) - _NAME_CHARS:
            raise RuleError(f"rule name {name!r} must be lowercase letters, digits, '_' or '-'")
        if unknown:
            raise RuleError(f"rule {name!r}: unknown keys {sorted(unknown)}")
        event_type = entry.get("event_type")
        if not isinstance(event_type, str) or not event_type:
            raise RuleError(f"rule {name!r}: event_type must be a non-empty string")
        match = entry.get("match", {})
        if not isinstance(match, dict) or not all(isinstance(v, str) for v in match.values()):
            raise RuleError(f"rule {name!r}: match must map field names to strings")
        amount_field = entry.get("amount_field")
        if amount_field is not None and not isinstance(amount_field, str):
            raise RuleError(f"rule {name!r}: amount_field must be a field name")
        basis_points = _basis_points(name, entry.get("percent", 0))
        if basis_points and amount_field is None:
            raise RuleError(f"rule {name!r}: percent needs an amount_field")
        rules.append(
            Rule(
                name=name,
                event_type=event_type,
                match=tuple(sorted(match.items())),
                amount_field=amount_field,
                basis_points=basis_points,
                fixed_cents=_int(name, "fixed_cents", entry.get("fixed_cents"), 0) or 0,
                cap_cents_per_day=_int(
                    name, "cap_cents_per_day", entry.get("cap_cents_per_day"), None
                ),
            )
        )
    names = [rule.name for rule in rules]
    if len(set(names)) != len(names):
        raise RuleError(f"rule names must be unique: {names}")
    return RuleSet(tuple(rules))


def load_rules(path: Path | None) -> RuleSet:
    """The rules of a TOML file, or the default cashback rule without one."""
    if path is None:
        return DEFAULT_RULES
    try:
        return parse_rules(tomllib.loads(path.read_text(encoding="utf-8")))
    except tomllib.TOMLDecodeError as exc:
        raise RuleError(f"{path}: {exc}") from None


def _as_text(value: object) -> str | None:
    """A field as Spark's json_tuple returns it: strings bare, scalars as JSON text."""
    if value is None or isinstance(value, dict | list):
        return None
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def matches(rule: Rule, body: Mapping[str, object]) -> bool:
    """Whether an event body (the parsed JSON value) counts for the rule."""
    if _as_text(body.get("type")) != rule.event_type:
        return False
    return all(_as_text(body.get(name)) == expected for name, expected in rule.match)


def amount_of(rule: Rule, body: Mapping[str, object]) -> int:
    if rule.amount_field is None:
        return 0
    text = _as_text(body.get(rule.amount_field))
    if isinstance(body.get(rule.amount_field), float) or text is None:
        return 0
    return int(text) if re.fullmatch(AMOUNT_PATTERN, text) else 0


def daily_rewards(
    events: Iterable[tuple[int, Mapping[str, object]]], rules: RuleSet
) -> dict[tuple[str, date], int]:
    """(user, day) -> reward cents, computed in plain Python from (create time ms, body)
    pairs of distinct events; the main job checks Spark's result against it."""
    totals: dict[tuple[str, date, str], list[int]] = defaultdict(lambda: [0, 0])
    for create_ms, body in events:
        user = _as_text(body.get("user_id"))
        if user is None:
            continue
        day = datetime.fromtimestamp(create_ms / 1000, UTC).date()
        for rule in rules.rules:
            if matches(rule, body):
                entry = totals[(user, day, rule.name)]
                entry[0] += amount_of(rule, body)
                entry[1] += 1
    by_name = {rule.name: rule for rule in rules.rules}
    rewards: dict[tuple[str, date], int] = defaultdict(int)
    for (user, day, name), (amount, count) in totals.items():
        rewards[(user, day)] += by_name[name].reward(amount, count)
    return dict(rewards)
