"""The figures a bench result holds and the check of a fresh run against a published one."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from harness.figures import Comparison, Figure, compare, figures_of


def result(ratio: float | None = 2.0, **extra: object) -> dict[str, object]:
    return {"figure": "rate", "ours": 200, "anchor": 100, "ratio": ratio, **extra}


def test_the_headline_comes_first_then_the_listed_figures() -> None:
    listed = {
        "figure": "p99",
        "ours": 5.0,
        "anchor": 10.0,
        "ratio": 2.0,
        "unit": "us",
        "higher_is_better": False,
        "title": "p99 latency",
        "anchor_is": "a bare producer",
    }
    figures = figures_of("e2e", result(unit="events/s", figures=[listed]))
    assert [f.name for f in figures] == ["rate", "p99"]
    assert figures[0].title == "rate" and figures[0].unit == "events/s"
    assert figures[0].higher_is_better
    assert figures[1] == Figure(
        "e2e", "p99", 5.0, 10.0, 2.0, "us", False, "p99 latency", "a bare producer"
    )


def test_a_figure_without_its_four_keys_is_refused_by_name() -> None:
    with pytest.raises(ValueError, match="e2e: a figure lacks anchor, ratio"):
        figures_of("e2e", {"figure": "x", "ours": 1})
    with pytest.raises(ValueError, match="'figures' must be a list"):
        figures_of("e2e", result(figures={"figure": "x"}))


def figure(ratio: float | None, name: str = "rate", script: str = "e2e") -> Figure:
    return Figure(script, name, 1.0, 1.0, ratio, "", True, name, "")


@given(
    published=st.floats(min_value=1e-3, max_value=1e3),
    tolerance=st.floats(min_value=0.0, max_value=2.0),
    change=st.floats(min_value=0.01, max_value=100.0),
)
def test_the_band_is_multiplicative_and_symmetric(
    published: float, tolerance: float, change: float
) -> None:
    up = Comparison(figure(published), figure(published * change), tolerance)
    down = Comparison(figure(published), figure(published / change), tolerance)
    assert up.within == down.within
    inside = 1 / (1 + tolerance) <= change <= 1 + tolerance
    # Far from the edges, rounding cannot decide; at the edges either answer is fine.
    if abs(change - (1 + tolerance)) > 1e-9 and abs(change - 1 / (1 + tolerance)) > 1e-9:
        assert up.within == inside


def test_missing_or_absent_ratios() -> None:
    assert not Comparison(figure(2.0), None, 0.25).within
    assert Comparison(figure(None), figure(None), 0.25).within
    assert not Comparison(figure(None), figure(1.0), 0.25).within
    assert not Comparison(figure(1.0), figure(None), 0.25).within
    assert Comparison(figure(0.0), figure(0.0), 0.25).within


def test_compare_pairs_by_script_and_name() -> None:
    published = [figure(1.0, "a"), figure(2.0, "b"), figure(3.0, "a", script="uds")]
    fresh = [figure(1.1, "a"), figure(9.0, "a", script="uds")]
    pairs = list(compare(published, fresh, 0.25))
    assert [(c.published.key, c.within) for c in pairs] == [
        (("e2e", "a"), True),
        (("e2e", "b"), False),
        (("uds", "a"), False),
    ]
    with pytest.raises(ValueError, match="tolerance"):
        list(compare(published, fresh, -0.1))


def test_a_figure_reached_by_chance_must_keep_our_value_and_its_side() -> None:
    def lost(ours: float, anchor: float) -> Figure:
        return Figure(
            "soak",
            "lost",
            ours,
            anchor,
            (anchor + 1) / (ours + 1),
            "",
            False,
            "",
            "",
            random_anchor=True,
        )

    assert Comparison(lost(0, 18_791), lost(0, 4), 0.25).within
    assert not Comparison(lost(0, 18_791), lost(1, 4), 0.25).within
    assert not Comparison(lost(0, 18_791), lost(0, 0), 0.25).within  # ratio 1: not ahead


def test_a_noisy_figure_declares_a_wider_band_and_never_a_narrower_one() -> None:
    noisy = Figure("kill_loss", "rate", 1.0, 1.0, 0.9, "", True, "", "", tolerance=0.6)
    assert Comparison(figure(1.4), noisy, 0.25).within
    assert Comparison(figure(1.4), noisy, 0.25).band == 0.6
    narrow = Figure("e2e", "rate", 1.0, 1.0, 1.3, "", True, "", "", tolerance=0.1)
    assert Comparison(figure(1.1), narrow, 0.25).within
    parsed = figures_of("x", result(tolerance=0.6, random_anchor=True))[0]
    assert parsed.tolerance == 0.6 and parsed.random_anchor
