"""ClickSettings: what a click model is and how it is fitted on a stream."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

#: the deepest rank a click model reads (ranks are stored in one byte of a row key)
MAX_DEPTH = 255
MAX_CLICK_DEPTH = MAX_DEPTH

#: the models ``evald replay --click-model`` and ``evald judge --model`` know
MODELS = ("pbm", "cascade", "dbn", "coec", "regression")
#: a week, in ms: the default half-life of the statistics (the rolling horizon)
WEEK_MS = 7 * 24 * 3600 * 1000
#: inverse-propensity weights are clipped at this bound by default
IPS_CLIP = 10.0


@dataclass(frozen=True, slots=True)
class ClickSettings:
    """One click model's settings; ``check()`` raises ValueError naming the field."""

    model: str = "pbm"
    #: ranks the model reads, from the top (ranks below are not modelled)
    depth: int = 10
    #: (query, item) pairs kept with their own parameters; a cold pair answers the prior
    max_pairs: int = 100_000
    #: half-life of every statistic in event time (ms); None: no decay (everything seen counts)
    half_life: int | None = WEEK_MS
    #: lists of a partition between two refits of the parameters, once warmed up
    refit_every: int = 10_000
    #: lists before the first refit; the gap then doubles up to ``refit_every``
    first_refit: int = 1_000
    #: EM iterations per refit, warm-started from the current parameters
    iterations: int = 20
    #: pseudo-sessions of the prior behind each pair's attractiveness (and DBN's satisfaction)
    prior_strength: float = 1.0
    #: inverse-propensity weights are clipped at this bound (1 / examination <= ips_clip)
    ips_clip: float = IPS_CLIP

    def check(self) -> ClickSettings:
        if self.model not in MODELS:
            raise ValueError(f"model: {self.model!r} is not one of {', '.join(MODELS)}")
        if not 1 <= self.depth <= MAX_DEPTH:
            raise ValueError(f"depth: must be between 1 and {MAX_DEPTH}, got {self.depth}")
        if self.max_pairs < 16:
            raise ValueError(f"max_pairs: must be >= 16, got {self.max_pairs}")
        if self.half_life is not None and self.half_life <= 0:
            raise ValueError(f"half_life: must be > 0 ms, got {self.half_life}")
        if self.refit_every < 1 or self.first_refit < 1:
            raise ValueError("refit_every and first_refit: must be >= 1")
        if self.iterations < 1:
            raise ValueError(f"iterations: must be >= 1, got {self.iterations}")
        if not self.prior_strength >= 0:
            raise ValueError(f"prior_strength: must be >= 0, got {self.prior_strength}")
        if not 1 <= self.ips_clip < math.inf:  # an infinite clip: Σ w θ is inf · 0 = NaN
            raise ValueError(f"ips_clip: must be a finite number >= 1, got {self.ips_clip}")
        return self

    def to_json(self) -> dict[str, object]:
        return {f.name: getattr(self, f.name) for f in fields(self)}

    @classmethod
    def from_json(cls, doc: dict[str, object]) -> ClickSettings:
        return cls(**doc).check()  # type: ignore[arg-type]
