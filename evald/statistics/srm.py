"""Sample-ratio guard: an always-valid test that the arm counts follow the configured split.

Lindon & Malek, "Anytime-valid inference for multinomial count data" (NeurIPS 2022): the
Dirichlet-multinomial mixture over the split, divided by the likelihood of the configured split,
is a test martingale under that split, so the chance it *ever* reaches 1/α is at most α. A broken
split (a bucketing bug, one arm's feedback lost) biases every comparison of those arms, so a
comparison is not trusted while its guard has fired.

A comparison split by segment (surfaces, locales) runs one guard per comparison segment and one
pooled over all of them: the pooled one finds a loss spread over every segment sooner, a
segment's own finds a loss confined to it, which the pooled counts dilute (docs/statistics.md,
"Power"). ``family_p_values`` keeps the family-wise rate at α (Bonferroni: α/2 to the pooled
guard, α/(2S) to each of S segments; one guard when there is one segment).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TypeVar

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import gammaln

__all__ = [
    "DEFAULT_CONCENTRATION",
    "SampleRatio",
    "family_p_values",
    "srm_log_evalue",
    "srm_log_evalues",
]

K = TypeVar("K")

#: Σ of the Dirichlet prior's parameters (centred on the configured split): larger finds small
#: imbalances sooner at large counts, smaller finds gross ones sooner at small counts.
DEFAULT_CONCENTRATION = 100.0


def _split(weights: Sequence[float]) -> np.ndarray:
    p = np.asarray(weights, dtype=np.float64)
    if p.ndim != 1 or p.size < 2 or (p <= 0).any() or not np.isfinite(p).all():
        raise ValueError("a split needs two or more positive weights")
    return p / p.sum()


def srm_log_evalue(
    counts: Sequence[int], split: Sequence[float], concentration: float = DEFAULT_CONCENTRATION
) -> float:
    """ln e = ln DirMult(counts; c·p) − ln Mult(counts; p) (the multinomial coefficients cancel)."""
    return float(srm_log_evalues(counts, split, concentration))


def srm_log_evalues(
    counts: ArrayLike, split: Sequence[float], concentration: float = DEFAULT_CONCENTRATION
) -> NDArray[np.float64]:
    """``srm_log_evalue`` over arrays of counts, one arm per element of the last axis."""
    p = _split(split)
    n = np.asarray(counts, dtype=np.float64)
    if n.shape[-1:] != p.shape or (n < 0).any():
        raise ValueError("one non-negative count per arm of the split")
    a = concentration * p
    total = n.sum(axis=-1)
    mixture = gammaln(a.sum()) - gammaln(a.sum() + total) + np.sum(gammaln(a + n) - gammaln(a), -1)
    null = np.sum(np.where(n > 0, n * np.log(p), 0.0), axis=-1)
    return np.asarray(mixture - null, dtype=np.float64)


@dataclass(frozen=True)
class SampleRatio:
    """Arm counts since the comparison start and the running maximum of ln e (window order)."""

    counts: tuple[int, ...]
    max_log_evalue: float = 0.0

    def look(
        self,
        window_counts: Sequence[int],
        split: Sequence[float],
        concentration: float = DEFAULT_CONCENTRATION,
    ) -> SampleRatio:
        counts = tuple(a + int(b) for a, b in zip(self.counts, window_counts, strict=True))
        log_e = srm_log_evalue(counts, split, concentration)
        return SampleRatio(counts, max(self.max_log_evalue, log_e))

    @property
    def p_value(self) -> float:
        """The always-valid p-value min(1, 1/max e)."""
        return min(1.0, math.exp(-self.max_log_evalue))

    def mismatch(self, alpha: float = 0.001) -> bool:
        """True once the split is rejected at ``alpha`` (strict by default: it gates alerts)."""
        return self.max_log_evalue >= -math.log(alpha)

    def to_json(self) -> dict[str, object]:
        return {"counts": list(self.counts), "max_log_evalue": self.max_log_evalue}

    @classmethod
    def from_json(cls, data: dict[str, object]) -> SampleRatio:
        counts = data["counts"]
        assert isinstance(counts, list)
        return cls(tuple(int(c) for c in counts), float(data["max_log_evalue"]))  # type: ignore[arg-type]


def family_p_values(pooled: float, segments: Mapping[K, float]) -> dict[K, float]:
    """Per comparison segment, the family-wise p-value of the guards that hold it:
    min(1, 2S·p_segment, 2·p_pooled) for S > 1 segments (a segment is not trusted when its own
    guard or the pooled one fires), p_segment alone when there is one (it is the pooled one).
    Valid uniformly over time: each always-valid p-value is ever below its share of α with
    chance at most that share."""
    size = len(segments)
    if size <= 1:
        return dict(segments)
    pooled_adjusted = min(1.0, 2.0 * pooled)
    return {key: min(1.0, 2.0 * size * p, pooled_adjusted) for key, p in segments.items()}
