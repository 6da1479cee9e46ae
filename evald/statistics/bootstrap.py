"""Hashed Poisson bootstrap clustered by user: an interval that holds when one user's lists agree.

Chamandy, Muralidharan, Najmi, Naidu, "Estimating uncertainty for massive data streams" (Google,
2012). Replicate b gives cluster u the weight w(u, b), the Poisson(1) quantile of a uniform drawn
from a hash of (seed, b, u). The weight depends on nothing else, so every list of a user gets the
same weight in replicate b wherever and whenever it is scored, and the state, B pairs
(Σ w·y, Σ w), is a plain sum: any partitioning and any order give the same state.
"""

from __future__ import annotations

import functools
import hashlib
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import ArrayLike, NDArray
from scipy.stats import norm

from evald.input_rule import blank
from evald.statistics.clustered import few_users
from evald.statistics.intervals import DEFAULT_MIN_N, Interval, Moments

__all__ = [
    "DEFAULT_REPLICATES",
    "DEFAULT_SEED",
    "BootstrapState",
    "cluster_key",
    "list_cluster",
    "list_clusters",
    "poisson_weights",
    "replicate_sums",
    "request_clusters",
    "user_cluster",
]

#: 100 replicates estimate a standard error to about ±7% (1/√(2B)): enough for a 95% interval.
DEFAULT_REPLICATES = 100
DEFAULT_SEED = 0x5EED

_MASK = (1 << 64) - 1
_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_MIX1 = np.uint64(0xBF58476D1CE4E5B9)
_MIX2 = np.uint64(0x94D049BB133111EB)


def _poisson1_cdf() -> NDArray[np.float64]:
    """P(Poisson(1) <= k) for k = 0, 1, ... until it is 1 in double precision."""
    pmf, cdf, k = math.exp(-1.0), [], 0
    total = 0.0
    while total < 1.0 and k < 40:
        total += pmf
        cdf.append(total)
        k += 1
        pmf /= k
    return np.asarray(cdf)


_CDF = _poisson1_cdf()


def cluster_key(cluster: str) -> int:
    """A stable 64-bit key of a cluster name: BLAKE2b, not Python's per-process salted hash()."""
    return int.from_bytes(hashlib.blake2b(cluster.encode(), digest_size=8).digest(), "little")


def list_cluster(user_id: str | None, request_id: str) -> int:
    """The cluster of one list: its user, or the list alone when it has no user id (none, or
    blank: docs/semantics.md, "Identifiers").

    The prefixes keep a user id and a request id that happen to be equal apart.
    """
    named = user_id is not None and not blank(user_id)  # a blank user id is none
    return cluster_key(f"u:{user_id}" if named else f"r:{request_id}")


def user_cluster(user_id: str) -> int:
    """``list_cluster`` of a list that has the user id ``user_id`` (not blank)."""
    return cluster_key(f"u:{user_id}")


def list_clusters(user_keys: ArrayLike, request_ids: Sequence[str]) -> NDArray[np.uint64]:
    """``list_cluster`` of each list from its user's key (``user_cluster``; 0: no user id)
    and its request id: the keys of lists without a user are hashed here."""
    keys = np.array(user_keys, dtype=np.uint64)
    alone = np.flatnonzero(keys == 0)
    if alone.size:
        keys[alone] = request_clusters([request_ids[i] for i in alone.tolist()])
    return keys


def request_clusters(request_ids: Sequence[str]) -> NDArray[np.uint64]:
    """The cluster keys of lists known by their request id only (``list_cluster(None, rid)``):
    each list is its own cluster. A restart re-adds a result read back from the results topic
    without a ``"cluster"`` field this way (docs/statistics.md "Clusters")."""
    blake = hashlib.blake2b
    # the digests joined and read as little-endian words: no int object per key
    raw = b"".join([blake(b"r:" + rid.encode(), digest_size=8).digest() for rid in request_ids])
    return np.frombuffer(raw, dtype="<u8").astype(np.uint64)


def _splitmix64(x: NDArray[np.uint64]) -> NDArray[np.uint64]:
    """SplitMix64's finalizer: a bijection of 64-bit words whose output bits look uniform."""
    x = x ^ (x >> np.uint64(30))
    x = x * _MIX1
    x = x ^ (x >> np.uint64(27))
    x = x * _MIX2
    return x ^ (x >> np.uint64(31))


def _splitmix64_inplace(x: NDArray[np.uint64], scratch: NDArray[np.uint64]) -> None:
    """``_splitmix64`` in place (``scratch``: a buffer of x's shape): no temporaries over the
    n × B words, which is most of the cost of the weights."""
    for shift, mix in ((30, _MIX1), (27, _MIX2)):
        np.right_shift(x, np.uint64(shift), out=scratch)
        np.bitwise_xor(x, scratch, out=x)
        np.multiply(x, mix, out=x)
    np.right_shift(x, np.uint64(31), out=scratch)
    np.bitwise_xor(x, scratch, out=x)


#: U >= CDF[k] with U = (x >> 11) / 2^53 is x >= ceil(CDF[k] · 2^53) · 2^11, exactly (scaling a
#: double by a power of two is exact): the weight is the count of these thresholds x reaches.
_THRESHOLDS = np.asarray(
    [math.ceil(c * 2.0**53) << 11 for c in _CDF.tolist() if c < 1.0], dtype=np.uint64
)
_COMMON = 4  # thresholds compared on every word; beyond (P(w >= 4) = 1.9%) only the rare ones


def poisson_weights(
    keys: ArrayLike, replicates: int = DEFAULT_REPLICATES, seed: int = DEFAULT_SEED
) -> NDArray[np.uint8]:
    """(len(keys), replicates) Poisson(1) weights, a pure function of (seed, replicate, key):
    the Poisson(1) quantile of U = top 53 bits of splitmix64(splitmix64(key ^ salt) + b·φ)/2^53
    (docs/statistics.md §2), by integer comparisons with the quantile thresholds. uint8: a
    weight is at most the number of thresholds (below 40), and adding comparisons into bytes
    costs half what it does into int64."""
    key = np.asarray(keys, dtype=np.uint64).reshape(-1, 1)
    b = np.arange(1, replicates + 1, dtype=np.uint64).reshape(1, -1)
    salt = np.uint64((seed * 0xD1B54A32D192ED03) & _MASK)
    with np.errstate(over="ignore"):
        x = _splitmix64(key ^ salt) + b * _GOLDEN
        _splitmix64_inplace(x, np.empty_like(x))
    weights = np.zeros(x.shape, dtype=np.uint8)
    reached = np.empty(x.shape, dtype=np.bool_)
    for threshold in _THRESHOLDS[:_COMMON]:
        np.greater_equal(x, threshold, out=reached)
        np.add(weights, reached, out=weights, casting="unsafe")
    flat_x = x.reshape(-1)
    rare = np.flatnonzero(reached)  # x >= the last common threshold: the few to look at again
    rare = rare[flat_x[rare] >= _THRESHOLDS[_COMMON]]
    if rare.size:
        weights.reshape(-1)[rare] = np.searchsorted(_THRESHOLDS, flat_x[rare], side="right")
    return weights


def replicate_sums(y: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Σ_i y[i] ⊗ w[i] for ``y`` (n,) or (n, m) and replicate weights ``w`` (n, B): each
    product rounded alone and the rows added in order, so the bits are the same on every
    machine. A BLAS product (``y.T @ w``) is faster, but its rounding depends on the kernel
    the CPU selects (fused multiply-adds, blocking): a checkpoint written on one machine and
    the same run's on another differed in the last digits of these sums."""
    if y.ndim == 1:
        return (y[:, None] * w).sum(axis=0)
    return (y[:, :, None] * w[:, None, :]).sum(axis=0)


def _poisson_weights_reference(
    keys: ArrayLike, replicates: int = DEFAULT_REPLICATES, seed: int = DEFAULT_SEED
) -> NDArray[np.int64]:
    """The definition, as written in docs/statistics.md: what ``poisson_weights`` must equal."""
    key = np.asarray(keys, dtype=np.uint64).reshape(-1, 1)
    b = np.arange(1, replicates + 1, dtype=np.uint64).reshape(1, -1)
    salt = np.uint64((seed * 0xD1B54A32D192ED03) & _MASK)
    with np.errstate(over="ignore"):
        x = _splitmix64(_splitmix64(key ^ salt) + b * _GOLDEN)
    uniform = (x >> np.uint64(11)).astype(np.float64) * (1.0 / (1 << 53))
    return np.searchsorted(_CDF, uniform, side="right").astype(np.int64)


@functools.lru_cache(maxsize=64)
def normal_quantile(q: float) -> float:
    """``norm.ppf(q)``, computed once per q: scipy's ppf costs tens of µs, and a scrape asks
    for the same few levels once per segment, measure and window."""
    return float(norm.ppf(q))


@dataclass(frozen=True)
class BootstrapState:
    """Per replicate Σ w·y and Σ w, plus the unweighted moments; ``a + b`` merges two streams."""

    replicates: int = DEFAULT_REPLICATES
    seed: int = DEFAULT_SEED
    weighted_sum: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    weight_sum: NDArray[np.float64] = field(default_factory=lambda: np.zeros(0))
    moments: Moments = field(default_factory=Moments)

    def __post_init__(self) -> None:
        if self.weighted_sum.size == 0:
            object.__setattr__(self, "weighted_sum", np.zeros(self.replicates))
            object.__setattr__(self, "weight_sum", np.zeros(self.replicates))
        if self.weighted_sum.shape != (self.replicates,) or self.weight_sum.shape != (
            self.replicates,
        ):
            raise ValueError(f"a bootstrap state needs {self.replicates} replicate sums")

    @classmethod
    def of(
        cls,
        keys: ArrayLike,
        values: ArrayLike,
        replicates: int = DEFAULT_REPLICATES,
        seed: int = DEFAULT_SEED,
    ) -> BootstrapState:
        """The state of lists with cluster ``keys`` and measure ``values`` (NaNs skipped)."""
        y = np.asarray(values, dtype=np.float64).ravel()
        k = np.asarray(keys, dtype=np.uint64).ravel()
        if k.shape != y.shape:
            raise ValueError("one cluster key per value")
        finite = np.isfinite(y)
        y, k = y[finite], k[finite]
        # one weight row per distinct cluster: a user's lists share it, and hashing is the cost
        uniq, inverse = np.unique(k, return_inverse=True)
        per_cluster_y = np.bincount(inverse, weights=y, minlength=uniq.size)
        per_cluster_n = np.bincount(inverse, minlength=uniq.size).astype(np.float64)
        w = poisson_weights(uniq, replicates, seed).astype(np.float64)
        return cls(
            replicates,
            seed,
            replicate_sums(per_cluster_y, w),
            replicate_sums(per_cluster_n, w),
            Moments.of(y),
        )

    def __add__(self, other: BootstrapState) -> BootstrapState:
        if (self.replicates, self.seed) != (other.replicates, other.seed):
            raise ValueError("bootstrap states of different replicates or seeds do not merge")
        return BootstrapState(
            self.replicates,
            self.seed,
            self.weighted_sum + other.weighted_sum,
            self.weight_sum + other.weight_sum,
            self.moments + other.moments,
        )

    def standard_error(self) -> float:
        """The standard deviation over replicates of Σwy/Σw (replicates with Σw = 0 skipped)."""
        used = self.weight_sum > 0
        if used.sum() < 2:
            return math.nan
        return float(np.std(self.weighted_sum[used] / self.weight_sum[used], ddof=1))

    def interval(self, level: float = 0.95, min_n: int = DEFAULT_MIN_N) -> Interval:
        """Mean ± z·SE with the bootstrap SE; bounds NaN when n < min_n or the lists are worth
        too few users (``clustered.few_users``; one user's lists alone: every replicate mean
        is that user's, and the SE 0)."""
        mean = self.moments.mean
        n = self.moments.n
        if n < max(min_n, 2) or few_users(n, self.weight_sum):
            return Interval(mean, math.nan, math.nan, self.moments.n)
        half = normal_quantile(0.5 + level / 2.0) * self.standard_error()
        return Interval(mean, mean - half, mean + half, self.moments.n)

    def to_json(self) -> dict[str, object]:
        return {
            "replicates": self.replicates,
            "seed": self.seed,
            "weighted_sum": self.weighted_sum.tolist(),
            "weight_sum": self.weight_sum.tolist(),
            "moments": self.moments.to_json(),
        }

    @classmethod
    def from_json(cls, data: dict[str, object]) -> BootstrapState:
        moments = data["moments"]
        assert isinstance(moments, dict)
        return cls(
            int(data["replicates"]),  # type: ignore[call-overload]
            int(data["seed"]),  # type: ignore[call-overload]
            np.asarray(data["weighted_sum"], dtype=np.float64),
            np.asarray(data["weight_sum"], dtype=np.float64),
            Moments.from_json(moments),
        )
