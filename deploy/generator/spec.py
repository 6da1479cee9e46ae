"""What the generated rules, dashboard and manifests assume about an evald deployment.

One frozen value drives every renderer, so the label keys, arm values, ports and thresholds used
by the Prometheus rules, the Grafana dashboard and the Kubernetes manifests cannot disagree.
Defaults mirror evald's defaults (segment label keys, default measures, metrics port); a test
cross-checks them against the package.
"""

from __future__ import annotations

from dataclasses import dataclass, field

DEFAULT_MEASURES: tuple[str, ...] = (
    "nDCG@10",
    "RR",
    "Success@10",
    "RBP(p=0.8)",
    "P@10",
    "R@10",
    "AP@10",
)


@dataclass(frozen=True)
class Thresholds:
    """Alert thresholds; each is a knob an operator is expected to tune."""

    #: evald's statistics.alpha: the family-wise error rate of the treatment-below-control
    #: alert over every treatment x alerting measure x comparison segment, however often checked
    family_alpha: float = 0.05
    srm_alpha: float = 0.001  # evald's statistics.srm_alpha: the split is broken below it
    sequence_for: str = "5m"
    cusum_for: str = "5m"
    srm_for: str = "15m"
    down_for: str = "5m"  # the scrape failing (up == 0) or the target gone (absent)
    # two-sided 95% normal quantile, exactly the z of evald's own evald_window_ci95_halfwidth
    ci_z: float = 1.959963984540054
    ci_min_samples: int = 100  # scored impressions per arm in the 1h window
    watermark_stall: str = "15m"  # no watermark movement for this long (idle fallback included)
    watermark_for: str = "5m"
    finalize_delay: str = "45m"  # > window + lateness + idle timeout: accepted by then => finalized
    finalize_for: str = "10m"
    rejected_ratio: float = 0.05
    late_ratio: float = 0.05
    orphaned_ratio: float = 0.05
    ratio_range: str = "10m"
    ratio_min_events: int = 500  # events in ratio_range before a ratio can alert
    ratio_for: str = "10m"
    lag_records: int = 50_000
    lag_for: str = "15m"
    not_ready_for: str = "10m"
    certificate_days: int = 14  # the metrics endpoint's TLS certificate expires within this
    certificate_for: str = "15m"
    # the zero-feedback signals (evald's zero_feedback settings): each arm's last complete
    # window against the same arm's trailing hour, before any feedback is needed
    zero_window: str = "5m"  # which of evald's windows the alerts read
    zero_baseline: str = "1h"  # the trailing span averaged as the arm's usual level
    zero_baseline_gap: str = "15m"  # the baseline ends this long ago (a change is not its own)
    zero_min_lists: int = 50  # lists defining the quantity in the window before it can alert
    zero_for: str = "10m"
    rbo_drop: float = 0.2  # RBO with the reference arm this far below the arm's usual level
    unjudged_rise: float = 0.2  # unjudged share of the top items this far above usual
    empty_rise: float = 0.1  # share of empty lists this far above usual
    # the click model's examination curve (engine.click_model): a rank moved by more than
    # examination_shift against its mean over examination_baseline ending examination_gap ago
    examination_shift: float = 0.1
    examination_baseline: str = "3h"
    examination_gap: str = "30m"
    examination_min_lists: int = 1000  # lists behind the fits, over the instances
    examination_for: str = "30m"


@dataclass(frozen=True)
class Spec:
    """Deployment facts shared by all renderers."""

    segment_labels: tuple[str, ...] = ("model", "arm", "surface")
    arm_label: str = "arm"
    control: str = "control"
    treatment: str = "treatment"
    # labels whose value is fixed by the arm (each arm serves its own model): dropped when arms
    # are compared, or treatment and control would never match.
    arm_scoped_labels: tuple[str, ...] = ("model",)
    measures: tuple[str, ...] = DEFAULT_MEASURES
    metrics_port: int = 9464
    app: str = "evald"
    # what the README's `docker build -t evald:local .` (and docker compose) produce
    image: str = "evald:local"
    namespace: str = "evald"
    dashboard_uid: str = "evald-quality"
    thresholds: Thresholds = field(default_factory=Thresholds)

    def __post_init__(self) -> None:
        if self.arm_label not in self.segment_labels:
            raise ValueError(f"arm_label {self.arm_label!r} is not a segment label")
        for label in self.arm_scoped_labels:
            if label not in self.segment_labels or label == self.arm_label:
                raise ValueError(f"arm_scoped_labels: {label!r} is not a non-arm segment label")
        if self.control == self.treatment:
            raise ValueError("control and treatment arm values must differ")

    @property
    def comparison_labels(self) -> tuple[str, ...]:
        """Segment labels two arms are compared within (arm and arm-scoped labels removed)."""
        dropped = {self.arm_label, *self.arm_scoped_labels}
        return tuple(label for label in self.segment_labels if label not in dropped)
