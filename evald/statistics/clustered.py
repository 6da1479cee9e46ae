"""The variance of a difference of means when users come back: clustered by user, from sums
that merge across partitions, instances and windows.

A user's lists correlate (one user clicks more than another), so the variance of a mean over
lists is the cluster-robust (sandwich) one over users u with Y_u = Σ y and N_u lists:
V = Σ_u (Y_u − ȳ·N_u)² / N² (Liang & Zeger, Biometrika 1986; for a ratio mean it is the
delta-method variance, Cochran, "Sampling Techniques", 1977, §6.4). Σ_u of a square of per-user
totals is not a sum over lists: a user's lists land in several partitions and windows, so no
place holds Y_u. The hashed bootstrap's replicate sums are sums over lists (bootstrap.py): with
w_ub the Poisson(1) weight of user u in replicate b (a pure function of the user's key),
T_b = Σ w·y and W_b = Σ w add up wherever the lists are scored, and

    D_b = (T_b − ȳ·W_b)/N = Σ_u (w_ub − 1)(Y_u − ȳ·N_u)/N     (because Σ_u (Y_u − ȳ·N_u) = 0)

has mean 0 and variance exactly V over the weights (E w = 1, Var w = 1, users independent).
For a contrast of two means (treatment − control, or a window − its baseline) the replicate
contrasts D_b(plus) − D_b(minus) use the same weights, so a user in both terms is counted with
its covariance. The estimate is V̂ = (1/B) Σ_b (contrast_b)² (docs/statistics.md §3 has the
proof sketch), never below the list-level variance: V̂ = max(V_list, V̂) keeps the sketch's
noise (relative sd √(2/B)) from shrinking a band below what independent lists give.

The sandwich needs many users, none of whom holds most of the lists (Cameron & Miller 2015,
§VI: with few effective clusters it is biased low). One heavy user (a crawler, a monitoring
account) holding most of an arm makes that arm's mean its own, and the sketch then sees almost
no spread: an A/A comparison flagged 89% of streams so. The same sums give the number of users
the lists are worth, Kish's N²/Σ_u N_u², since E[(W_b − N)²] = Σ_u N_u² (``effective_users``);
below ``MIN_USERS`` = 10 (and half the lists, ``few_users``; with ``MIN_REPLICATES`` replicates
or more) in either term the variance is unknown (NaN): no band, no CUSUM step.

Lists without a user id are their own cluster (their request id's key). Sums of lists none of
which had a user id use the list-level variance itself — exactly the sequence gbstats computes
— and say so (``clustered`` False): the request-level fallback.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from numpy.typing import ArrayLike, NDArray

from evald.statistics.intervals import Moments

__all__ = [
    "MIN_REPLICATES",
    "MIN_USERS",
    "ClusterSums",
    "Contrast",
    "as_sums",
    "centred_replicates",
    "contrast",
    "effective_users",
    "few_users",
    "mean_variance",
    "replicates_of",
    "row_width",
    "sketch_variance",
    "sums_of_rows",
]

#: a row of sums: n, Σy, Σy² (``LIST_COLUMNS``, what list-level statistics need), then, when
#: the replicates are kept, the lists with a user id, B sums Σ w·y and B sums Σ w
LIST_COLUMNS = 3
#: users a term of a clustered statistic must be worth (``effective_users``): below, a few
#: users hold the lists, the sandwich cannot see their own effect and its variance is not
#: published. Ordinary heavy-tailed traffic has windows of 60 to 80 lists worth 20 to 30 users
#: (docs/statistics.md §3): at 30 most of its windows went dark; a crawler's are worth about 2
MIN_USERS = 10
#: replicates below which ``effective_users`` is too noisy to withhold anything (relative sd
#: √(2/B): at B = 5, 8% of windows of 20 independent lists looked worth fewer than 10 users)
MIN_REPLICATES = 20


def centred_replicates(
    weighted: ArrayLike, weights: ArrayLike, n: ArrayLike, total: ArrayLike
) -> NDArray[np.float64]:
    """D_b = (T_b − ȳ·W_b)/n with ȳ = total/n, element-wise over leading axes (replicates on
    the last); NaN where n is 0."""
    n_ = np.asarray(n, dtype=np.float64)[..., None]
    with np.errstate(divide="ignore", invalid="ignore"):
        mean = np.asarray(total, dtype=np.float64)[..., None] / n_
        return (np.asarray(weighted) - mean * np.asarray(weights)) / n_


def effective_users(n: ArrayLike, weights: ArrayLike) -> NDArray[np.float64]:
    """N²/mean_b (W_b − N)², the users N lists are worth (Kish's N²/Σ_u N_u²: W_b − N =
    Σ_u (w_ub − 1)·N_u has mean square Σ_u N_u² over the weights), element-wise (replicates on
    the last axis of ``weights``); +inf when no replicate moved."""
    n_ = np.asarray(n, dtype=np.float64)
    spread = np.mean(np.square(np.asarray(weights, dtype=np.float64) - n_[..., None]), axis=-1)
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(spread > 0, n_ * n_ / spread, np.inf)


def few_users(n: ArrayLike, weights: ArrayLike) -> NDArray[np.bool_]:
    """Whether n lists are worth fewer than ``MIN_USERS`` users and fewer than half their
    number, element-wise; never with fewer than ``MIN_REPLICATES`` replicates. The estimate is
    noisy (±14% at B = 100, ±63% at B = 5): without the second condition a handful of lists
    that are each their own user would be withheld, and with few replicates any would."""
    n_ = np.asarray(n, dtype=np.float64)
    w = np.asarray(weights, dtype=np.float64)
    if w.shape[-1] < MIN_REPLICATES:
        return np.zeros(np.broadcast_shapes(n_.shape, w.shape[:-1]), dtype=np.bool_)
    return np.asarray(effective_users(n_, w) < np.fmin(MIN_USERS, n_ / 2.0))


def sketch_variance(list_level: ArrayLike, contrasts: ArrayLike) -> NDArray[np.float64]:
    """max(V_list, (1/B) Σ_b contrast_b²): the clustered variance of a contrast, element-wise
    (replicates on the last axis of ``contrasts``)."""
    sketch = np.mean(np.square(np.asarray(contrasts, dtype=np.float64)), axis=-1)
    return np.fmax(np.asarray(list_level, dtype=np.float64), sketch)


@dataclass(frozen=True, eq=False)
class ClusterSums:
    """Sums over some lists of one measure: the ``Moments``, how many of them had a user id,
    and the B replicate pairs (Σ w·y, Σ w) of the hashed bootstrap (None: not known, as in a
    share written before they were kept, or with ``bootstrap_replicates`` 0). ``a + b`` merges;
    an empty side (no list) adds nothing, an unknown one makes the sum unknown, and so do sums of
    another B (``bootstrap_replicates`` changed between two runs), as in ``shares.add_sums``."""

    moments: Moments = field(default_factory=Moments)
    users: int = 0
    weighted: NDArray[np.float64] | None = None
    weights: NDArray[np.float64] | None = None

    @property
    def n(self) -> int:
        return self.moments.n

    @property
    def total(self) -> float:
        return self.moments.total

    @property
    def squares(self) -> float:
        return self.moments.squares

    @property
    def mean(self) -> float:
        return self.moments.mean

    @property
    def variance(self) -> float:
        return self.moments.variance

    @property
    def known(self) -> bool:
        """Whether the replicate sums are known (an empty state counts as known)."""
        return self.weighted is not None or self._empty

    @property
    def _empty(self) -> bool:
        return self.moments.n == 0 and self.users == 0 and self.weighted is None

    def __add__(self, other: ClusterSums) -> ClusterSums:
        if other._empty:
            return self
        if self._empty:
            return other
        weighted = weights = None
        mine, theirs = self.weighted, other.weighted
        if mine is not None and theirs is not None and mine.shape == theirs.shape:
            weighted = mine + theirs
            weights = self.weights + other.weights  # type: ignore[operator]
        moments, users = self.moments + other.moments, self.users + other.users
        return ClusterSums(moments, users, weighted, weights)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClusterSums):
            return NotImplemented
        return (
            self.moments == other.moments
            and self.users == other.users
            and _same(self.weighted, other.weighted)
            and _same(self.weights, other.weights)
        )

    __hash__ = None  # type: ignore[assignment]

    def few_users(self) -> bool:
        """``few_users`` of these lists; False when the replicates are unknown or no list had a
        user id."""
        if self.weights is None or self.users == 0:
            return False
        return bool(few_users(self.moments.n, self.weights))

    def centred(self) -> NDArray[np.float64] | None:
        """The replicate deviations D_b of the mean; None when unknown or empty."""
        if self.weighted is None or self.weights is None or self.moments.n == 0:
            return None
        return centred_replicates(self.weighted, self.weights, self.moments.n, self.moments.total)

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {**self.moments.to_json(), "users": self.users}
        if self.weighted is not None and self.weights is not None:
            doc["weighted"] = self.weighted.tolist()
            doc["weights"] = self.weights.tolist()
        return doc

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> ClusterSums:
        """The ``to_json`` form, or a plain ``Moments`` one (written before replicates were
        kept: unknown replicates)."""
        moments = Moments.from_json(data)
        weighted, weights = data.get("weighted"), data.get("weights")
        if weighted is None or weights is None:
            return cls(moments, int(data.get("users", 0)))
        return cls(
            moments,
            int(data.get("users", 0)),
            np.asarray(weighted, dtype=np.float64),
            np.asarray(weights, dtype=np.float64),
        )


def _same(a: NDArray[np.float64] | None, b: NDArray[np.float64] | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return bool(np.array_equal(a, b))


@dataclass(frozen=True)
class Contrast:
    """mean(plus) − mean(minus) with its variance: clustered by user (``clustered``) or list
    level; ``replicates`` are the contrast's replicate deviations (None at list level). The
    variance is NaN when a term has ``few_users``."""

    difference: float
    variance: float
    clustered: bool
    replicates: NDArray[np.float64] | None = None


def as_sums(value: ClusterSums | Moments) -> ClusterSums:
    return value if isinstance(value, ClusterSums) else ClusterSums(value)


def contrast(minus: ClusterSums | Moments, plus: ClusterSums | Moments) -> Contrast:
    """The contrast mean(plus) − mean(minus) of two sums and its variance.

    List level: V = s²_plus/n_plus + s²_minus/n_minus (NaN below 2 lists a side). Clustered,
    when both sides' replicate sums are known and some list of either had a user id:
    max(V_list, (1/B) Σ_b (D_b(plus) − D_b(minus))²), NaN when either side has ``few_users``.
    """
    a, b = as_sums(minus), as_sums(plus)
    difference = b.mean - a.mean
    if a.n < 2 or b.n < 2:
        return Contrast(difference, math.nan, False)
    list_level = b.variance / b.n + a.variance / a.n
    if a.users + b.users == 0:
        return Contrast(difference, list_level, False)
    da, db = a.centred(), b.centred()
    if da is None or db is None or da.shape != db.shape:  # unknown, or of two B
        return Contrast(difference, list_level, False)
    replicates = db - da
    if a.few_users() or b.few_users():
        return Contrast(difference, math.nan, True, replicates)
    return Contrast(difference, float(sketch_variance(list_level, replicates)), True, replicates)


def mean_variance(sums: ClusterSums | Moments) -> tuple[float, bool]:
    """The variance of one mean (a one-sample statistic, such as an interleaving preference)
    and whether it is clustered by user: max(s²/n, (1/B) Σ_b D_b²) when the replicate sums are
    known and some list had a user id (NaN when they have ``few_users``), else the list-level
    s²/n (NaN below 2 lists)."""
    s = as_sums(sums)
    if s.n < 2:
        return math.nan, False
    list_level = s.variance / s.n
    centred = s.centred() if s.users else None
    if centred is None:
        return list_level, False
    if s.few_users():
        return math.nan, True
    return float(sketch_variance(list_level, centred)), True


def row_width(replicates: int) -> int:
    """Columns of a row of sums with ``replicates`` bootstrap replicates (0: list level)."""
    return LIST_COLUMNS if replicates == 0 else LIST_COLUMNS + 1 + 2 * replicates


def replicates_of(width: int) -> int:
    """B of a row of ``width`` columns (``row_width``'s inverse; 0: list level)."""
    return (width - LIST_COLUMNS - 1) // 2 if width > LIST_COLUMNS else 0


def sums_of_rows(rows: NDArray[np.float64]) -> list[ClusterSums]:
    """One ``ClusterSums`` per row of an (M, columns) array of sums (``row_width``); rows of 3
    columns (list level, or written before the replicates were kept) have unknown replicates."""
    width = rows.shape[1]
    replicates = replicates_of(width)
    if width != row_width(replicates):
        raise ValueError(f"a row of sums has 3 or 4 + 2B columns, not {width}")
    out = []
    for row in rows:
        moments = Moments(round(row[0]), float(row[1]), float(row[2]))
        if replicates == 0:
            out.append(ClusterSums(moments))
            continue
        lo = LIST_COLUMNS + 1
        out.append(
            ClusterSums(
                moments,
                round(row[LIST_COLUMNS]),
                row[lo : lo + replicates].copy(),
                row[lo + replicates :].copy(),
            )
        )
    return out
