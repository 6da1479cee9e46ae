"""Statistics that alerts can trust: pure functions over mergeable state.

Every state here is either a plain sum (merged by addition, so any partitioning and any order of
the stream give the same value) or a fold over windows in window order (the running
intersection of a confidence sequence, a CUSUM). Each state serializes to JSON for a checkpoint.
The methods, formulas, guarantees and references are in docs/statistics.md.
"""

from evald.statistics.bootstrap import BootstrapState, cluster_key, list_cluster, poisson_weights
from evald.statistics.clustered import ClusterSums, Contrast, contrast
from evald.statistics.cusum import Cusum, difference_z, siegmund_arl, standardized_z
from evald.statistics.intervals import Interval, Moments, t_interval
from evald.statistics.multiplicity import bonferroni_alpha, holm_reject
from evald.statistics.sequential import (
    Comparison,
    SequenceBound,
    confidence_sequence,
    rho_squared,
)
from evald.statistics.srm import SampleRatio, srm_log_evalue, srm_log_evalues

__all__ = [
    "BootstrapState",
    "ClusterSums",
    "Comparison",
    "Contrast",
    "Cusum",
    "Interval",
    "Moments",
    "SampleRatio",
    "SequenceBound",
    "bonferroni_alpha",
    "cluster_key",
    "confidence_sequence",
    "contrast",
    "difference_z",
    "holm_reject",
    "list_cluster",
    "poisson_weights",
    "rho_squared",
    "siegmund_arl",
    "srm_log_evalue",
    "srm_log_evalues",
    "standardized_z",
    "t_interval",
]
