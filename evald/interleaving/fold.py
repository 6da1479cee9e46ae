"""The preference test since the start: complete windows folded in window order (pure).

Per (segment, team a, team b) cell the fold keeps the sums since the first window that had its
lists, and at every window holding some of them it looks once (docs/statistics.md,
"Interleaving"):

1. the cell joins the family the first time it has lists: m = cells seen so far;
2. the preference Δ = mean of the per-list outcome d over the compared lists, its variance
   clustered by user (``clustered.mean_variance``: the hashed bootstrap's replicate sums, never
   below the list-level one) and the always-valid confidence sequence on Δ at α/m
   (``sequential.mean_bound``, Bonferroni over the family, so every band of every cell holds
   together at rate α however often it is looked at);
3. the always-valid p-value is the running minimum over the looks; the test *decides* at the
   first look whose band excludes 0, for the team the sign favours (``winner``, kept from then
   on, with the end of that window);
4. the sample-ratio guard (``srm.SampleRatio``) on how often team a led the draft (50/50 under
   a fair coin), its always-valid p-value reported family-wise (× m).

The state depends only on the windows' sums, so any partitioning gives the same state.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from evald.interleaving.sums import PairSums
from evald.interleaving.windows import Cell
from evald.statistics.clustered import mean_variance
from evald.statistics.sequential import SequenceBound, mean_bound
from evald.statistics.srm import SampleRatio

#: the draft's first pick is a fair coin: each team leads half the lists
FAIR = (0.5, 0.5)


@dataclass(frozen=True)
class Settings:
    """What the fold reads of ``interleaving`` (config.InterleavingConfig)."""

    alpha: float = 0.05
    tuning_n: float = 5000.0
    min_n: int = 100
    srm_alpha: float = 0.001
    #: windows starting before it are not folded (``interleaving.start``)
    start: int = 0


@dataclass(frozen=True)
class PairState:
    """One cell since its first window: its sums, the latest look's band, the running
    minimum p-value, the decision, the sample-ratio guard and its last window's sums."""

    total: PairSums
    bound: SequenceBound
    p_value: float = 1.0
    winner: str | None = None
    decided_end: int | None = None
    srm: SampleRatio = field(default_factory=lambda: SampleRatio((0, 0)))
    looks: int = 0
    window: PairSums | None = None
    window_end: int | None = None


@dataclass(frozen=True)
class PreferenceState:
    """Every cell's state and the end of the last window folded."""

    pairs: dict[Cell, PairState] = field(default_factory=dict)
    last_end: int | None = None

    @property
    def family(self) -> int:
        return len(self.pairs)

    def alpha(self, settings: Settings) -> float:
        """The level each cell's sequence runs at: α / family size."""
        return settings.alpha / max(1, self.family)

    def srm_p_value(self, cell: Cell) -> float:
        """The cell's sample-ratio p-value, family-wise (Bonferroni over the cells)."""
        return min(1.0, self.family * self.pairs[cell].srm.p_value)


def fold_window(
    state: PreferenceState, end: int, cells: Mapping[Cell, PairSums], settings: Settings
) -> PreferenceState:
    """Fold one complete window (ending at ``end``, ms) of summed pair sums."""
    pairs = dict(state.pairs)
    for cell in sorted(cells):  # step 1: the family grows first
        if cell not in pairs:
            weighted = cells[cell].weighted
            empty = PairSums.empty(0 if weighted is None else len(weighted))
            pairs[cell] = PairState(empty, _no_bound())
    alpha = settings.alpha / max(1, len(pairs))
    for cell in sorted(cells):
        pairs[cell] = _look(pairs[cell], cell, cells[cell], end, alpha, settings)
    return PreferenceState(pairs, end)


def _look(
    old: PairState, cell: Cell, window: PairSums, end: int, alpha: float, settings: Settings
) -> PairState:
    total = old.total + window
    variance, clustered = mean_variance(total.cluster_sums())
    bound = mean_bound(
        total.preference,
        variance,
        total.compared,
        alpha,
        settings.tuning_n,
        min_n=settings.min_n,
        clustered=clustered,
    )
    winner, decided = old.winner, old.decided_end
    if winner is None and math.isfinite(bound.low) and (bound.low > 0 or bound.high < 0):
        winner, decided = (cell[1] if bound.low > 0 else cell[2]), end
    srm = old.srm.look((window.lead_a, window.lists - window.lead_a), FAIR)
    return replace(
        old,
        total=total,
        bound=bound,
        p_value=min(old.p_value, bound.p_value),
        winner=winner,
        decided_end=decided,
        srm=srm,
        looks=old.looks + 1,
        window=window,
        window_end=end,
    )


def _no_bound() -> SequenceBound:
    return SequenceBound(math.nan, math.nan, math.nan, 1.0, 0, 0)


def window_interval(sums: PairSums, z: float) -> tuple[float, float, float, bool]:
    """(Δ, lower, upper, clustered) of one window's sums: Δ ± z·SE with SE² the variance
    clustered by user (one look at one window: not always valid); NaN bounds below 2 lists."""
    variance, clustered = mean_variance(sums.cluster_sums())
    delta = sums.preference
    half = z * math.sqrt(variance) if math.isfinite(variance) else math.nan
    return delta, delta - half, delta + half, clustered
