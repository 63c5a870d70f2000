"""The figure format of a bench result: declared once by the script, read back by the report.

A result is one JSON object whose first keys are its headline figure ("figure", "ours",
"anchor", "ratio"); further figures are listed under "figures", each with the same four
keys plus "unit", "higher_is_better" and optionally "title", "anchor_is", "tolerance" (a
band wider than the default for a noisy figure) and "random_anchor" (a count the anchor
reaches by chance, such as events lost where a random SIGKILL lands: a rerun must give
our own value again, the ratio on the same side of 1). Above 1, eventspool is ahead.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from harness.runs import safe_ratio

JsonObject = Mapping[str, Any]


def figure(
    name: str,
    ours: float,
    anchor: float,
    *,
    unit: str,
    title: str,
    anchor_is: str,
    higher_is_better: bool = True,
) -> dict[str, object]:
    """One figure entry; where lower is better (a latency, a cost) the ratio is anchor/ours."""
    return {
        "figure": name,
        "ours": ours,
        "anchor": anchor,
        "ratio": safe_ratio(ours, anchor) if higher_is_better else safe_ratio(anchor, ours),
        "unit": unit,
        "higher_is_better": higher_is_better,
        "title": title,
        "anchor_is": anchor_is,
    }


@dataclass(frozen=True, slots=True)
class Figure:
    """One measured figure of one bench script: ours, the anchor's, their ratio."""

    script: str
    name: str
    ours: float
    anchor: float
    ratio: float | None
    unit: str
    higher_is_better: bool
    title: str
    anchor_is: str
    tolerance: float | None = None
    random_anchor: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.script, self.name)


def figures_of(script: str, result: JsonObject) -> list[Figure]:
    """The headline figure of `result` followed by the ones it lists under "figures"."""
    listed = result.get("figures", [])
    if not isinstance(listed, list):
        raise ValueError(f"{script}: 'figures' must be a list, not {type(listed).__name__}")
    return [_figure(script, result), *(_figure(script, item) for item in listed)]


def _figure(script: str, item: JsonObject) -> Figure:
    missing = [key for key in ("figure", "ours", "anchor", "ratio") if key not in item]
    if missing:
        raise ValueError(f"{script}: a figure lacks {', '.join(missing)}: {dict(item)!r}")
    ratio = item["ratio"]
    return Figure(
        script=script,
        name=str(item["figure"]),
        ours=float(item["ours"]),
        anchor=float(item["anchor"]),
        ratio=None if ratio is None else float(ratio),
        unit=str(item.get("unit", "")),
        higher_is_better=bool(item.get("higher_is_better", True)),
        title=str(item.get("title", "")) or str(item["figure"]).replace("_", " "),
        anchor_is=str(item.get("anchor_is", "")),
        tolerance=None if item.get("tolerance") is None else float(item["tolerance"]),
        random_anchor=bool(item.get("random_anchor", False)),
    )


@dataclass(frozen=True, slots=True)
class Comparison:
    """A published figure's ratio beside the ratio of a fresh run of the same figure."""

    published: Figure
    fresh: Figure | None
    tolerance: float

    @property
    def change(self) -> float | None:
        """fresh ratio / published ratio, or None when either has no ratio."""
        if self.fresh is None or self.fresh.ratio is None or not self.published.ratio:
            return None
        return self.fresh.ratio / self.published.ratio

    @property
    def within(self) -> bool:
        """Whether the fresh ratio lies in the (multiplicative) band around the published one."""
        if self.fresh is None:
            return False
        published, fresh = self.published.ratio, self.fresh.ratio
        if self.fresh.random_anchor:
            same_side = (
                published is not None and fresh is not None and (published > 1) == (fresh > 1)
            )
            return self.fresh.ours == self.published.ours and same_side
        if published is None or fresh is None:
            return published is None and fresh is None
        change = self.change
        if change is None:
            return fresh == published
        return 1.0 / (1.0 + self.band) <= change <= 1.0 + self.band

    @property
    def band(self) -> float:
        """The tolerance that applies: the figure's own, when its script declares one."""
        declared = None if self.fresh is None else self.fresh.tolerance
        return self.tolerance if declared is None else max(declared, self.tolerance)


def compare(published: list[Figure], fresh: list[Figure], tolerance: float) -> Iterator[Comparison]:
    """Pair each published figure with the fresh run's figure of the same script and name."""
    if tolerance < 0:
        raise ValueError(f"tolerance must not be negative, got {tolerance}")
    by_key = {figure.key: figure for figure in fresh}
    for figure in published:
        yield Comparison(figure, by_key.get(figure.key), tolerance)
