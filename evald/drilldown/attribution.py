"""Drop attribution in the manner of Adtributor (Bhagwan et al., NSDI 2014): which label values
and which queries carry a drop, ranked by explanatory power and surprise.

Pure functions over slices. A slice is one value of one dimension (a label key, or ``query``)
with its lists and measure sum now (``n``, ``s``) and at the baseline (``n0``, ``s0``: the
control arm, or the window before). The measure is a mean, so (Adtributor's derived-measure
case) the additive quantity attributed is the sum at current traffic:

* actual ``A = s``; forecast ``F = n x s0 / n0`` (what the slice would have scored now at its
  baseline mean; ``F = A`` when it has no baseline: it explains nothing);
* the drop ``A_total - F_total`` uses the scope's totals the same way (a negative number);
* explanatory power ``EP = (A - F) / (A_total - F_total)``: the slice's share of the drop,
  its traffic times its change of mean over the total;
* surprise: the Jensen-Shannon term of the slice between ``p = F / F_total`` (its expected
  share) and ``q = A / A_total`` (its actual share), ``(p log(2p/(p+q)) + q log(2q/(p+q))) / 2``:
  large when the slice's share moved, i.e. its change is unlike its share of traffic.

Per dimension, the slices are taken in decreasing surprise, those with ``EP >= min_power`` and
``EP >= min_lift x n / n_total`` (the slice's mean fell at least ``min_lift`` times as much as
the scope's: a slice whose share of the drop is its share of traffic is not unlike it, and a
drop spread evenly over a dimension of few values names none of them), until their EP adds
up to ``power``; a dimension that never gets there explains nothing.
Dimensions are ranked by the summed surprise of their slices, and the slices listed in that
order (docs/drilldown.md, "Drop attribution").
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

__all__ = ["ROUNDING", "Explanation", "Slice", "explain"]

#: a drop of the total within this share of its forecast is the sums' rounding, not a drop:
#: slices that rose and fell by as much leave a total 1 ulp below its forecast, and each
#: slice's EP, divided by that, came out near 1e15
ROUNDING = 1e-9


@dataclass(frozen=True, slots=True)
class Slice:
    """One value of a dimension: lists and measure sum now and at the baseline."""

    value: str
    n: float
    s: float
    n0: float
    s0: float

    def forecast(self) -> float:
        return self.n * self.s0 / self.n0 if self.n0 else self.s


@dataclass(frozen=True, slots=True)
class Explanation:
    dimension: str
    value: str
    power: float  # EP: share of the drop
    surprise: float
    lists: int
    mean: float | None
    baseline_mean: float | None

    def to_json(self) -> dict[str, object]:
        return {
            "dimension": self.dimension,
            "value": self.value,
            "explanatory_power": self.power,
            "surprise": self.surprise,
            "lists": self.lists,
            "mean": self.mean,
            "baseline_mean": self.baseline_mean,
        }


def _js(p: float, q: float) -> float:
    def term(a: float) -> float:
        return a * math.log(2 * a / (p + q)) if a > 0 else 0.0

    return 0.5 * (term(p) + term(q)) if p + q > 0 else 0.0


def explain(
    dimensions: Mapping[str, Sequence[Slice]],
    total: Slice,
    *,
    min_power: float = 0.1,
    power: float = 0.67,
    min_lift: float = 1.5,
    limit: int = 10,
) -> list[Explanation]:
    """The explanations of the drop of ``total`` (now against its baseline), best first; empty
    when there is no drop (``A_total >= F_total``)."""
    actual, forecast = total.s, total.forecast()
    drop = actual - forecast
    if actual <= 0 or forecast <= 0 or not drop < -ROUNDING * forecast:
        return []
    chosen: list[tuple[float, str, list[tuple[Slice, float, float]]]] = []
    for name, slices in dimensions.items():
        scored = [
            (
                sl,
                (sl.s - sl.forecast()) / drop,
                _js(max(sl.forecast(), 0) / forecast, max(sl.s, 0) / actual),
            )
            for sl in slices
        ]
        scored.sort(key=lambda t: (-t[2], t[0].value))
        picked: list[tuple[Slice, float, float]] = []
        reached = 0.0
        for sl, ep, surprise in scored:
            if ep < min_power or ep < min_lift * sl.n / total.n:
                continue
            picked.append((sl, ep, surprise))
            reached += ep
            if reached >= power:
                break
        if picked and reached >= power:
            chosen.append((sum(t[2] for t in picked), name, picked))
    chosen.sort(key=lambda c: (-c[0], c[1]))
    out = []
    for _, name, picked in chosen:
        for sl, ep, surprise in picked:
            out.append(
                Explanation(
                    name,
                    sl.value,
                    ep,
                    surprise,
                    int(sl.n),
                    sl.s / sl.n if sl.n else None,
                    sl.s0 / sl.n0 if sl.n0 else None,
                )
            )
    return out[:limit]
