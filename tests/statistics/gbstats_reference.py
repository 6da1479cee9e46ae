"""Writes gbstats_reference.json: GrowthBook's sequential test on fixed inputs, the oracle for
evald.statistics.sequential.

gbstats 0.8 pins numpy < 2 and pandas < 2, so it is not a test dependency; its frequentist code
needs only numpy, scipy and pydantic. Regenerate with the wheel unpacked on the path, no deps:

    pip download gbstats==0.8.0 --no-deps -d DIR && unzip DIR/gbstats-0.8.0-*.whl -d DIR
    PYTHONPATH=DIR python tests/statistics/gbstats_reference.py

test_sequential.py compares against the file, and against gbstats itself (`make venv` installs
it without its dependencies).
"""

from __future__ import annotations

import json
from pathlib import Path

#: (n, sum, sum of squares) of control and treatment, alpha, N*: small and large n, both signs
#: of the difference, unequal arms, several alphas and tunings.
CASES = [
    ((3000, 1200.5, 700.25), (3100, 1300.0, 760.0), 0.05, 5000.0),
    ((150, 45.0, 20.5), (140, 30.0, 11.0), 0.05, 5000.0),
    ((100000, 38000.0, 21000.0), (99000, 37000.0, 20500.0), 0.05, 200000.0),
    ((2500, 900.0, 500.0), (2600, 1050.0, 610.0), 0.01, 1000.0),
    ((500, 250.0, 180.0), (520, 240.0, 170.0), 0.1, 20000.0),
    ((40000, 10000.0, 4000.0), (41000, 10600.0, 4300.0), 0.05 / 12, 5000.0),
]


def compute(case: tuple) -> dict[str, float]:
    from gbstats.frequentist.tests import SequentialConfig, SequentialTwoSidedTTest
    from gbstats.models.statistics import SampleMeanStatistic

    (nc, sc, qc), (nt, st, qt), alpha, tuning = case
    test = SequentialTwoSidedTTest(
        SampleMeanStatistic(n=nc, sum=sc, sum_squares=qc),
        SampleMeanStatistic(n=nt, sum=st, sum_squares=qt),
        SequentialConfig(
            difference_type="absolute", alpha=alpha, sequential_tuning_parameter=tuning
        ),
    )
    low, high = test.confidence_interval
    return {"low": float(low), "high": float(high), "p_value": float(test.p_value)}


def main() -> None:
    import gbstats

    rows = [
        {
            "control": list(c),
            "treatment": list(t),
            "alpha": a,
            "tuning_n": n,
            **compute((c, t, a, n)),
        }
        for c, t, a, n in CASES
    ]
    out = Path(__file__).with_name("gbstats_reference.json")
    data = {"gbstats": getattr(gbstats, "__version__", "0.8.0"), "cases": rows}
    out.write_text(json.dumps(data, indent=1) + "\n")


if __name__ == "__main__":
    main()
