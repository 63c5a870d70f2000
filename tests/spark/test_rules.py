"""Reward rules: parsing, and the plain-Python computation the main job checks against."""

from __future__ import annotations

from datetime import date
from pathlib import Path

import pytest

from eventspool.spark.jobs.rules import DEFAULT_RULES, RuleError, daily_rewards, load_rules

RULES = """
[[rule]]
name = "cashback"
event_type = "order_created"
match = { status = "paid" }
amount_field = "amount_cents"
percent = 2.5
cap_cents_per_day = 300

[[rule]]
name = "card-bonus"
event_type = "payment_captured"
match = { method = "card" }
fixed_cents = 7
"""

DAY_MS = 86_400_000


def test_rule_file(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(RULES)
    rules = load_rules(path)
    assert [r.name for r in rules.rules] == ["cashback", "card-bonus"]
    assert rules.rules[0].basis_points == 250
    assert rules.fields() == {"status", "amount_cents", "method"}
    assert load_rules(None) == DEFAULT_RULES


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "at least one"),
        ('[[rule]]\nname = "A"\nevent_type = "x"', "lowercase"),
        ('[[rule]]\nname = "a"', "event_type"),
        ('[[rule]]\nname = "a"\nevent_type = "x"\npercent = 1.234\namount_field = "m"', "two dec"),
        ('[[rule]]\nname = "a"\nevent_type = "x"\npercent = 1', "amount_field"),
        ('[[rule]]\nname = "a"\nevent_type = "x"\ncap = 1', "unknown keys"),
        ('[[rule]]\nname = "a"\nevent_type = "x"\nfixed_cents = -1', "non-negative"),
        ('[[rule]]\nname = "a"\nevent_type = "x"\n[[rule]]\nname = "a"\nevent_type = "y"', "uniq"),
        ("[[rule", "rules.toml"),
    ],
)
def test_bad_rule_files_name_the_problem(tmp_path: Path, text: str, message: str) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(text)
    with pytest.raises(RuleError, match=message):
        load_rules(path)


def test_daily_rewards_cap_each_rule_per_user_and_day(tmp_path: Path) -> None:
    path = tmp_path / "rules.toml"
    path.write_text(RULES)
    rules = load_rules(path)
    paid = {"type": "order_created", "user_id": "u1", "status": "paid", "amount_cents": 5_999}
    events: list[tuple[int, dict[str, object]]] = [
        (0, paid),
        (1_000, paid),  # 2.5% of 11998 = 299.95 -> 299, under the cap of 300
        (DAY_MS, paid),
        (DAY_MS, {**paid, "amount_cents": 20_000}),  # 649 -> capped at 300
        (DAY_MS, {**paid, "status": "pending"}),
        (DAY_MS, {"type": "payment_captured", "user_id": "u1", "method": "card"}),
        (DAY_MS, {"type": "payment_captured", "user_id": "u2", "method": "sepa"}),
        (DAY_MS, {"type": "order_created", "status": "paid", "amount_cents": 100}),  # no user
        (DAY_MS, {**paid, "user_id": "u3", "amount_cents": "1000"}),  # amount as a string
        (DAY_MS, {**paid, "user_id": "u4", "amount_cents": 10.5}),  # not an integer
    ]
    assert daily_rewards(events, rules) == {
        ("u1", date(1970, 1, 1)): 299,
        ("u1", date(1970, 1, 2)): 300 + 7,
        ("u3", date(1970, 1, 2)): 25,
        ("u4", date(1970, 1, 2)): 0,
    }
