"""How well a click model predicts clicks: log-likelihood and perplexity per rank.

Computed the standard way (Chuklin, Markov & de Rijke 2015, ch. 4; Dupret & Piwowarski 2008):

- log-likelihood: the mean over sessions of Σ_r log P(C_r = c_r | clicks above r), natural
  log, from the model's *conditional* click probabilities;
- perplexity at rank r: 2 ** -(mean over sessions of log2 P(C_r = c_r)), from the *marginal*
  click probability (what the model predicts before seeing any click of the session); the
  perplexity of a model is the mean of the per-rank values. 1 is perfect, 2 a coin flip.

Only shown ranks count; sessions weigh by their ``weights`` (a deduplicated log gives the same
numbers as the full one). Probabilities are clipped to [1e-12, 1 - 1e-12] so one impossible
event costs about 27.6 nats instead of an infinity.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from evald.clicks.model import ClickModel
from evald.clicks.sessions import Sessions

EPSILON = 1e-12


@dataclass(frozen=True, slots=True)
class Quality:
    log_likelihood: float  # mean per session, nats
    perplexity: float  # mean of the per-rank values
    perplexity_at: list[float]  # rank 1 first; NaN where no session showed the rank

    def to_json(self) -> dict[str, object]:
        return {
            "log_likelihood": self.log_likelihood,
            "perplexity": self.perplexity,
            "perplexity_at": [None if p != p else p for p in self.perplexity_at],
        }


def quality(model: ClickModel, sessions: Sessions) -> Quality:
    """The model's log-likelihood and perplexity on ``sessions`` (held-out ones, to judge it)."""
    conditional, full = model.click_probabilities(sessions)
    return score(conditional, full, sessions)


def score(conditional: np.ndarray, full: np.ndarray, sessions: Sessions) -> Quality:
    """Quality from click probabilities (n, depth); pure, so a test can feed it by hand."""
    shown = sessions.shown()
    clicks = sessions.clicks
    w = sessions.weights
    total = float(w.sum())
    p = np.clip(conditional, EPSILON, 1 - EPSILON)
    ll = np.where(shown, np.where(clicks, np.log(p), np.log1p(-p)), 0.0).sum(axis=1)
    q = np.clip(full, EPSILON, 1 - EPSILON)
    bits = np.where(shown, np.where(clicks, np.log2(q), np.log2(1 - q)), 0.0)
    weight_at = (shown * w[:, None]).sum(axis=0)
    with np.errstate(invalid="ignore", divide="ignore"):
        mean_bits = (bits * w[:, None]).sum(axis=0) / weight_at
    per_rank = np.where(weight_at > 0, np.exp2(-mean_bits), np.nan)
    seen = per_rank[weight_at > 0]
    return Quality(
        log_likelihood=float((ll * w).sum() / total) if total > 0 else float("nan"),
        perplexity=float(seen.mean()) if len(seen) else float("nan"),
        perplexity_at=per_rank.tolist(),
    )
