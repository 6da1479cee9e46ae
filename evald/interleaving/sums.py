"""The sums of one pair of teams over some interleaved lists: plain sums, merged by addition.

Every statistic of a pair comes from them (docs/statistics.md, "Interleaving"): the lists both
teams were in and how often team a led the draft (the sample-ratio guard), the wins of each
team and the ties (the preference Δ = (wins_a − wins_b) / (wins_a + wins_b + ties), a mean of
the per-list outcome d ∈ {+1, −1, 0} over the compared lists), and the hashed bootstrap's
replicate sums Σ w·d, Σ w over the compared lists (the variance clustered by user). So any
partitioning of the stream and any order give the same sums.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from evald.statistics.clustered import ClusterSums
from evald.statistics.intervals import Moments


def _zeros(replicates: int) -> NDArray[np.float64] | None:
    return np.zeros(replicates) if replicates else None


@dataclass(eq=False)
class PairSums:
    """Sums of one pair (a, b) of teams; ``weighted`` / ``weights`` are None without replicates."""

    lists: int = 0
    lead_a: int = 0
    wins_a: int = 0
    wins_b: int = 0
    ties: int = 0
    users: int = 0
    weighted: NDArray[np.float64] | None = field(default=None)
    weights: NDArray[np.float64] | None = field(default=None)

    @classmethod
    def empty(cls, replicates: int) -> PairSums:
        return cls(weighted=_zeros(replicates), weights=_zeros(replicates))

    @property
    def compared(self) -> int:
        """Lists in which a or b earned credit: the preference's sample size."""
        return self.wins_a + self.wins_b + self.ties

    @property
    def preference(self) -> float:
        """Δ_ab = (wins_a − wins_b) / compared; NaN with nothing compared."""
        n = self.compared
        return (self.wins_a - self.wins_b) / n if n else float("nan")

    def cluster_sums(self) -> ClusterSums:
        """The per-list outcome's sums (n, Σd, Σd²; users; replicates) for the statistics."""
        moments = Moments(
            self.compared, float(self.wins_a - self.wins_b), float(self.wins_a + self.wins_b)
        )
        return ClusterSums(moments, self.users, self.weighted, self.weights)

    def add(self, other: PairSums) -> None:
        """Add ``other`` into these sums (in place)."""
        self.lists += other.lists
        self.lead_a += other.lead_a
        self.wins_a += other.wins_a
        self.wins_b += other.wins_b
        self.ties += other.ties
        self.users += other.users
        if self.weighted is not None and other.weighted is not None:
            if self.weighted.shape != other.weighted.shape:
                raise ValueError("replicate sums of different sizes do not merge")
            self.weighted = self.weighted + other.weighted
            self.weights = self.weights + other.weights  # type: ignore[operator]
        elif other.weighted is not None or self.weighted is not None:
            raise ValueError("sums with and without replicates do not merge")

    def __add__(self, other: PairSums) -> PairSums:
        out = self.copy()
        out.add(other)
        return out

    def copy(self) -> PairSums:
        return PairSums(
            self.lists,
            self.lead_a,
            self.wins_a,
            self.wins_b,
            self.ties,
            self.users,
            None if self.weighted is None else self.weighted.copy(),
            None if self.weights is None else self.weights.copy(),
        )

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, PairSums):
            return NotImplemented
        counts = ("lists", "lead_a", "wins_a", "wins_b", "ties", "users")
        return all(getattr(self, k) == getattr(other, k) for k in counts) and all(
            _same(getattr(self, k), getattr(other, k)) for k in ("weighted", "weights")
        )

    __hash__ = None  # type: ignore[assignment]


def _same(a: NDArray[np.float64] | None, b: NDArray[np.float64] | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return bool(np.array_equal(a, b))
