"""Sample-ratio guard: an always-valid test that the arm counts follow the configured split.

Lindon & Malek, "Anytime-valid inference for multinomial count data" (NeurIPS 2022): the
Dirichlet-multinomial mixture over the split, divided by the likelihood of the configured split,
is a test martingale under that split, so the chance it *ever* reaches 1/α is at most α. A broken
split (a bucketing bug, one arm's feedback lost) biases every comparison of those arms, so a
comparison is not trusted while its guard has fired.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.special import gammaln

__all__ = ["DEFAULT_CONCENTRATION", "SampleRatio", "srm_log_evalue", "srm_log_evalues"]

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
