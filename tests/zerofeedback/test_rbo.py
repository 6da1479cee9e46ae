"""RBO_ext against the paper's formula written out plainly, and against the values of the
reference package ``rbo`` (PyPI, 0.1.3, ``RankingSimilarity(a, b).rbo_ext(p)``)."""

from __future__ import annotations

import math

import numpy as np
import pytest

from evald.zerofeedback.rbo import rbo_ext


def plain_rbo_ext(a: list[int], b: list[int], p: float) -> float:
    """Webber, Moffat & Zobel 2010, eq. 32, term by term: S the shorter list (length s), L the
    longer (length l), X_d the overlap of the depth-d prefixes (of all of S past s)."""
    short, long_ = (a, b) if len(a) <= len(b) else (b, a)
    s, l = len(short), len(long_)  # noqa: E741

    def overlap(d: int) -> int:
        return len(set(short[: min(d, s)]) & set(long_[:d]))

    x_s, x_l = overlap(s), overlap(l)
    first = sum(overlap(d) / d * p**d for d in range(1, l + 1))
    second = sum(x_s * (d - s) / (s * d) * p**d for d in range(s + 1, l + 1))
    return (1 - p) / p * (first + second) + ((x_l - x_s) / l + x_s / s) * p**l


def letters(text: str) -> list[int]:
    return [ord(c) for c in text]


#: (a, b, p, the rbo package's rbo_ext)
PACKAGE = [
    ("abcdefghij", "jihgfedcba", 0.9, 0.5116075656428573),
    ("abcdefghij", "jihgfedcba", 0.5, 0.01629154265873016),
    ("abcdefghij", "jihgfedcba", 0.98, 0.8780443726553534),
    ("abcdefghij", "bacdefghij", 0.9, 0.8999999999999999),
    ("abcdefg", "xaybzc", 0.9, 0.429939),
    ("abcdefg", "xaybzc", 0.5, 0.22604166666666667),
    ("abcd", "dcbaefgh", 0.9, 0.7830000000000001),
    ("abcd", "dcbaefgh", 0.98, 0.9539973333333334),
    ("abcdefghij", "klmnopqrst", 0.9, 0.0),
]


@pytest.mark.parametrize(("a", "b", "p", "want"), PACKAGE)
def test_equals_the_reference_package(a: str, b: str, p: float, want: float) -> None:
    assert rbo_ext(letters(a), letters(b), p) == pytest.approx(want, abs=1e-12)
    assert rbo_ext(letters(b), letters(a), p) == pytest.approx(want, abs=1e-12)


def test_equals_the_plain_formula_on_random_lists() -> None:
    rng = np.random.default_rng(7)
    for _ in range(500):
        a = rng.choice(40, size=int(rng.integers(1, 15)), replace=False).tolist()
        b = rng.choice(40, size=int(rng.integers(1, 15)), replace=False).tolist()
        p = float(rng.uniform(0.05, 0.99))
        assert rbo_ext(a, b, p) == pytest.approx(plain_rbo_ext(a, b, p), abs=1e-12)


def test_identical_disjoint_and_empty_lists() -> None:
    assert rbo_ext([1, 2, 3], [1, 2, 3], 0.9) == pytest.approx(1.0, abs=1e-15)
    assert rbo_ext([1, 2, 3], [4, 5, 6], 0.9) == 0.0
    assert rbo_ext([], [4, 5, 6], 0.9) == 0.0
    assert math.isnan(rbo_ext([], [], 0.9))


def test_a_repeated_item_counts_once() -> None:
    assert rbo_ext([1, 1, 2], [1, 2, 3], 0.9) == pytest.approx(
        plain_rbo_ext([1, 1, 2], [1, 2, 3], 0.9), abs=1e-12
    )
    assert rbo_ext([1, 1, 1], [1, 1, 1], 0.9) < 1.0


def test_the_equal_length_path_gives_the_general_loop_s_bits() -> None:
    """Lists of one length take a shorter loop; its values must be the general loop's exactly
    (a restore compares sums bit for bit), not merely close."""
    from evald.zerofeedback.rbo import _rbo_ext_any

    rng = np.random.default_rng(7)
    for _ in range(3_000):
        n = int(rng.integers(1, 12))
        a, b = (rng.integers(0, 14, size=n).tolist() for _ in range(2))
        p = float(rng.choice([0.1, 0.5, 0.9, 0.98]))
        assert rbo_ext(a, b, p) == _rbo_ext_any(a, b, p), (a, b, p)


def test_many_rows_at_once_are_the_same_bits_as_one_at_a_time() -> None:
    """The engine computes a batch's RBO of equal lengths with ``rbo_ext_rows``: the values
    must be ``rbo_ext``'s to the bit (the window sums and the results are compared with ==),
    repeated items, every overlap and lengths 1 to 12 included."""
    from evald.zerofeedback.rbo import rbo_ext_rows

    rng = np.random.default_rng(11)
    for length in range(1, 13):
        for _ in range(20):
            m = int(rng.integers(1, 30))
            universe = int(rng.integers(1, 3 * length + 2))
            a = rng.integers(0, universe, (m, length))
            b = rng.integers(0, universe, (m, length))
            b[: m // 3] = a[: m // 3]  # identical prefixes: 1
            p = float(rng.uniform(0.05, 0.99))
            want = [rbo_ext(x, y, p) for x, y in zip(a.tolist(), b.tolist(), strict=True)]
            assert rbo_ext_rows(a, b, p).tolist() == want
