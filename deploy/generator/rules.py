"""Prometheus recording and alerting rules for evald, rendered from a :class:`Spec`.

Recording rules turn the exported histograms and window sums into per-segment and per-arm means
that aggregate across instances (sum the rates/sums first, divide last). Alerts read the recorded
series so dashboards and alerts agree on one definition of every number.

Naming follows Prometheus' ``level:metric:operation`` convention: ``segment:`` keeps every
segment label, ``arm:`` keeps the arm and the comparison labels, ``arms:`` compares two arms.
"""

from __future__ import annotations

from typing import Any

from deploy.generator.spec import Spec

Rule = dict[str, Any]
Group = dict[str, Any]

# Scrape-side label kept in every aggregation so two evald deployments never mix.
JOB = "job"


def _by(*labels: str) -> str:
    return ", ".join(labels)


def _seconds(duration: str) -> int:
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800}
    return int(duration[:-1]) * units[duration[-1]]


def segment_keys(spec: Spec) -> tuple[str, ...]:
    """Labels of a per-segment, per-measure series after aggregation across instances."""
    return ("measure", JOB, *spec.segment_labels)


def arm_keys(spec: Spec) -> tuple[str, ...]:
    """Labels of a per-arm series: the arm plus what arms are compared within."""
    return ("measure", JOB, *spec.comparison_labels, spec.arm_label)


def comparison_keys(spec: Spec) -> tuple[str, ...]:
    """Labels of a treatment-versus-control series."""
    return ("measure", JOB, *spec.comparison_labels)


def _histogram_means(spec: Spec, rng: str) -> list[Rule]:
    seg = _by(*segment_keys(spec))
    arm = _by(*arm_keys(spec))
    arm_label = spec.arm_label
    return [
        {
            "record": f"segment:evald_measure_count:rate{rng}",
            "expr": f"sum by ({seg}) (rate(evald_measure_count[{rng}]))",
        },
        {
            "record": f"segment:evald_measure_sum:rate{rng}",
            "expr": f"sum by ({seg}) (rate(evald_measure_sum[{rng}]))",
        },
        {
            "record": f"segment:evald_measure:mean{rng}",
            "expr": f"segment:evald_measure_sum:rate{rng}\n"
            f"  / (segment:evald_measure_count:rate{rng} > 0)",
        },
        {
            "record": f"arm:evald_measure_count:rate{rng}",
            "expr": f"sum by ({arm}) (segment:evald_measure_count:rate{rng})",
        },
        {
            "record": f"arm:evald_measure:mean{rng}",
            "expr": f"sum by ({arm}) (segment:evald_measure_sum:rate{rng})\n"
            f"  / (arm:evald_measure_count:rate{rng} > 0)",
        },
        {
            "record": f"arms:evald_measure:treatment_control_ratio{rng}",
            "expr": f'arm:evald_measure:mean{rng}{{{arm_label}="{spec.treatment}"}}\n'
            f"  / ignoring ({arm_label})\n"
            f'(arm:evald_measure:mean{rng}{{{arm_label}="{spec.control}"}} > 0)',
        },
    ]


def _window_stats(spec: Spec) -> list[Rule]:
    seg = _by("window", *segment_keys(spec))
    arm = _by("window", *arm_keys(spec))
    a, t, c = spec.arm_label, spec.treatment, spec.control
    rules: list[Rule] = []
    for part in ("count", "sum", "sum_squares"):
        rules.append(
            {
                "record": f"segment:evald_window_{part}:sum",
                "expr": f"sum by ({seg}) (evald_window_{part})",
            }
        )
    rules.append(
        {
            "record": "segment:evald_window:mean",
            "expr": "segment:evald_window_sum:sum / (segment:evald_window_count:sum > 0)",
        }
    )
    for part in ("count", "sum", "sum_squares"):
        rules.append(
            {
                "record": f"arm:evald_window_{part}:sum",
                "expr": f"sum by ({arm}) (segment:evald_window_{part}:sum)",
            }
        )
    n = "arm:evald_window_count:sum"
    s = "arm:evald_window_sum:sum"
    q = "arm:evald_window_sum_squares:sum"
    rules += [
        {"record": "arm:evald_window:mean", "expr": f"{s} / ({n} > 0)"},
        {
            # squared standard error of the mean: sample variance / n, variance from the sums
            "record": "arm:evald_window:stderr_squared",
            "expr": f"clamp_min({q} - {s} ^ 2 / {n}, 0)\n  / (({n} > 1) - 1)\n  / {n}",
        },
        {
            "record": "arms:evald_window:treatment_minus_control",
            "expr": f'arm:evald_window:mean{{{a}="{t}"}}\n'
            f"  - ignoring ({a})\n"
            f'arm:evald_window:mean{{{a}="{c}"}}',
        },
        {
            "record": "arms:evald_window:treatment_minus_control_ci_bound",
            "expr": f"{spec.thresholds.ci_z} * sqrt(\n"
            f'  arm:evald_window:stderr_squared{{{a}="{t}"}}\n'
            f"  + ignoring ({a})\n"
            f'  arm:evald_window:stderr_squared{{{a}="{c}"}}\n'
            ")",
        },
    ]
    return rules


def recording_groups(spec: Spec) -> list[Group]:
    """Groups of recording rules: histogram means (5m, 1h), arm ratios, event-time windows."""
    return [
        {
            "name": "evald.histogram-means",
            "rules": _histogram_means(spec, "5m") + _histogram_means(spec, "1h"),
        },
        {"name": "evald.event-time-windows", "rules": _window_stats(spec)},
        {"name": "evald.zero-feedback", "rules": _zero_feedback_means(spec)},
    ]


def zero_keys(spec: Spec) -> tuple[str, ...]:
    """Labels of a per-arm zero-feedback series: as ``arm_keys``, the quantity for the measure."""
    return ("quantity", JOB, *spec.comparison_labels, spec.arm_label)


def _zero_feedback_means(spec: Spec) -> list[Rule]:
    """Each arm's zero-feedback quantities over the last complete window, merged across
    instances and arm-scoped labels by their lists (the mean's weight)."""
    keys = _by(*zero_keys(spec))
    window = f'window="{spec.thresholds.zero_window}"'
    return [
        {
            "record": "arm:evald_zero_feedback_lists:sum",
            "expr": f"sum by ({keys}) (evald_zero_feedback_lists{{{window}}})",
        },
        {
            "record": "arm:evald_zero_feedback:mean",
            "expr": f"sum by ({keys}) (\n"
            f"  evald_zero_feedback_mean{{{window}}} * evald_zero_feedback_lists{{{window}}}\n"
            ")\n"
            "/ (arm:evald_zero_feedback_lists:sum > 0)",
        },
    ]


#: alert name -> (quantity, comparison with the usual level, threshold attribute, wording)
ZERO_FEEDBACK_ALERTS: dict[str, tuple[str, str, str, str]] = {
    "EvaldListsChangedBeforeFeedback": (
        "rbo",
        "<",
        "rbo_drop",
        "its lists' rank-biased overlap with the reference arm's lists for the same queries fell",
    ),
    "EvaldUnjudgedItemsRising": (
        "unjudged",
        ">",
        "unjudged_rise",
        "the share of its top items never judged for their query rose",
    ),
    "EvaldEmptyListsRising": (
        "empty",
        ">",
        "empty_rise",
        "the share of empty lists it serves rose",
    ),
}


def _zero_feedback_alert(spec: Spec, name: str) -> Rule:
    """One arm's zero-feedback quantity moved past its threshold from the same arm's usual
    level (the trailing baseline's average), on enough lists: no feedback needed."""
    th = spec.thresholds
    quantity, sign, attribute, wording = ZERO_FEEDBACK_ALERTS[name]
    threshold = float(getattr(th, attribute))
    keys = _by(*zero_keys(spec))
    now = f'arm:evald_zero_feedback:mean{{quantity="{quantity}"}}'
    usual = f"avg_over_time({now}[{th.zero_baseline}] offset {th.zero_baseline_gap})"
    moved = f"{now} {sign} ({usual} {'-' if sign == '<' else '+'} {threshold:g})"
    lists = f'arm:evald_zero_feedback_lists:sum{{quantity="{quantity}"}}'
    text = _segment_text(spec, zero_keys(spec))
    return {
        "alert": name,
        "expr": f"{moved}\nand on ({keys}) ({lists} >= {th.zero_min_lists})",
        "for": th.zero_for,
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": f"{{{{ $labels.{spec.arm_label} }}}}: {wording}",
            "description": f"In the last complete {th.zero_window} window ({text}), {wording} by "
            f"more than {threshold:g} against its average over the {th.zero_baseline} before "
            f"{th.zero_baseline_gap} ago, on at least {th.zero_min_lists} lists. This needs no "
            "click: the served lists changed (docs/drilldown.md, Zero-feedback signals).",
        },
    }


def _segment_text(spec: Spec, keys: tuple[str, ...]) -> str:
    return " ".join(f"{k}={{{{ $labels.{k} }}}}" for k in keys if k != "measure")


#: Labels the scrape adds per evald instance: compose's static target gives ``instance``, the
#: PodMonitor adds ``pod`` too (its other labels, namespace, container, endpoint, are the same on
#: every pod of the StatefulSet).
INSTANCE_LABELS = ("instance", "pod")


def across_instances(how: str, series: str) -> str:
    """``series`` with the instances aggregated away.

    Under ``evald run`` every instance exports the same comparison and CUSUM values (each folds
    the statistics topic), so one per-instance alert would fire once per instance. ``how`` is
    ``max`` or ``min`` (never ``sum``; ``avg`` for an estimate each instance makes of the same
    quantity from its own partitions, the examination curve), chosen so that a drop alert fires
    only when every instance still exporting agrees, while the sample-ratio guard (which holds
    the others back) fires as soon as any instance rejects the split. The values differ only for
    the moments an instance lags behind the topic; one that is down or has not read it yet
    exports nothing, no say.
    """
    return f"{how} without ({_by(*INSTANCE_LABELS)}) ({series})"


def _srm_on(spec: Spec) -> str:
    """Labels of one comparison segment of one evald deployment (instances aggregated away)."""
    return _by(JOB, "comparison", *spec.comparison_labels)


def _srm_ok(spec: Spec) -> str:
    """Drop the comparisons whose sample-ratio guard has fired on any instance: their difference
    is biased."""
    p_value = across_instances("min", "evald_comparison_srm_p_value")
    return f"unless on ({_srm_on(spec)})\n({p_value} < {spec.thresholds.srm_alpha:g})"


#: how many contributors a drop alert names (evald exports at most three per drop)
CONTRIBUTORS = 3
#: the drop alerts' annotation naming the contributors, when evald attributed none (yet)
NO_CONTRIBUTORS = (
    "none attributed (no query summaries, no complete window yet, or no slice explains it)"
)


def contributors_annotation(spec: Spec, against: str) -> str:
    """The top contributors of the alert's drop, read from ``evald_drop_contributor`` when the
    annotation is expanded: ``dimension=value (share of the drop)``, largest share first.

    ``against`` is the drop the alert fires on (``control`` or ``baseline``): a treatment can
    be flagged both ways, each drop with its own explanations. Instances aggregated away as for
    the alert itself: each instance attributes over the partitions it owns, and a value is
    shown with the largest share any instance gives it.
    """
    keys = (JOB, "comparison", "measure", spec.arm_label, *spec.comparison_labels)
    # a PromQL single-quoted string: the query sits in the template's double-quoted one
    matchers = ", ".join([*(f"{k}=%q" for k in keys), f"against='{against}'"])
    # rank is aggregated away too: two instances may rank the same value differently
    inner = f"max without ({_by(*INSTANCE_LABELS, 'rank')}) (evald_drop_contributor{{{matchers}}})"
    query = f"sort_desc(topk({CONTRIBUTORS}, {inner}))"
    args = " ".join(f"$labels.{k}" for k in keys)
    return (
        f'{{{{ with printf "{query}" {args} | query }}}}'
        "{{ range $i, $c := . }}{{ if $i }}; {{ end }}"
        "{{ $c.Labels.dimension }}={{ $c.Labels.value }} "
        "({{ $c.Value | humanizePercentage }} of the drop){{ end }}"
        f"{{{{ else }}}}{NO_CONTRIBUTORS}{{{{ end }}}}"
    )


def contributors_text(contributors: list[tuple[str, str, float]]) -> str:
    """What :func:`contributors_annotation` expands to for ``(dimension, value, share)``
    rows in the order the query returns them (the promtool scenarios' expected text)."""
    if not contributors:
        return NO_CONTRIBUTORS
    return "; ".join(f"{d}={v} ({share * 100:.4g}% of the drop)" for d, v, share in contributors)


def _treatment_below_control(spec: Spec) -> Rule:
    th = spec.thresholds
    on = _by(JOB, "comparison", "measure")
    return {
        "alert": "EvaldTreatmentBelowControl",
        "expr": "(\n"
        f"  {across_instances('max', 'evald_comparison_upper')}\n"
        f"  + on ({on}) group_left ()\n"
        f"  {across_instances('max', 'evald_comparison_min_effect')}\n"
        ") < 0\n" + _srm_ok(spec),
        "for": th.sequence_for,
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "{{ $labels.measure }}: {{ $labels." + spec.arm_label + " }} below "
            f"{spec.control} by more than the minimum effect",
            "description": "The always-valid confidence sequence of comparison "
            "{{ $labels.comparison }} on {{ $labels." + spec.arm_label + " }} minus "
            f"{spec.control} for {{{{ $labels.measure }}}} "
            f"({_segment_text(spec, spec.comparison_labels)}) lies wholly below minus the "
            "configured minimum effect. Family-wise error rate "
            f"{th.family_alpha * 100:g}% over every treatment, alerting measure and segment of the "
            "comparison, however often it is checked (docs/statistics.md).",
            "contributors": contributors_annotation(spec, "control"),
        },
    }


def _cusum_drop(spec: Spec, name: str, series: str, what: str, against: str) -> Rule:
    th = spec.thresholds
    return {
        "alert": name,
        "expr": f"{across_instances('min', series)}\n"
        f"> on ({JOB}, comparison) group_left ()\n"
        f"{across_instances('max', 'evald_cusum_threshold')}\n" + _srm_ok(spec),
        "for": th.cusum_for,
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": f"{{{{ $labels.measure }}}}: drop of {what} detected",
            "description": f"The CUSUM of {what} for {{{{ $labels.measure }}}} "
            f"({_segment_text(spec, (spec.arm_label, *spec.comparison_labels))}, comparison "
            "{{ $labels.comparison }}) is above its threshold h: a sustained drop of about one "
            "standard error of a window mean or more. One false alarm per ~930 windows on "
            "average without a change, whatever the traffic (docs/statistics.md §4).",
            "contributors": contributors_annotation(spec, against),
        },
    }


def _down(spec: Spec) -> list[Rule]:
    th = spec.thresholds
    return [
        {
            "alert": "EvaldDown",
            "expr": f'up{{{JOB}="{spec.app}"}} == 0',
            "for": th.down_for,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "evald is down or cannot be scraped",
                "description": "Prometheus has failed to scrape {{ $labels.instance }} for "
                f"{th.down_for}: every evald quality alert is silent meanwhile.",
            },
        },
        {
            "alert": "EvaldAbsent",
            "expr": f'absent(up{{{JOB}="{spec.app}"}})',
            "for": th.down_for,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "No evald target is scraped",
                "description": f'Prometheus has no scrape target with {JOB}="{spec.app}" since '
                f"{th.down_for}: evald is not deployed or its service discovery broke, and every "
                "evald quality alert is silent meanwhile.",
            },
        },
    ]


def _sample_ratio(spec: Spec) -> Rule:
    th = spec.thresholds
    return {
        "alert": "EvaldSampleRatioMismatch",
        "expr": f"{across_instances('min', 'evald_comparison_srm_p_value')} < {th.srm_alpha:g}",
        "for": th.srm_for,
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "Arm counts of comparison {{ $labels.comparison }} do not follow the split",
            "description": "The always-valid sample-ratio test of comparison "
            f"{{{{ $labels.comparison }}}} ({_segment_text(spec, spec.comparison_labels)}) "
            f"rejects the configured split at {th.srm_alpha:g}: a bucketing bug or lost "
            "traffic of one arm. The comparison's alerts are suppressed while it fires.",
        },
    }


def _pair_on(spec: Spec) -> str:
    """Labels of one pair of teams in one segment of one evald deployment."""
    return _by(JOB, *spec.segment_labels, "team_a", "team_b")


def _coin_ok(spec: Spec) -> str:
    """Drop the pairs whose draft-coin guard has fired on any instance: the interleaver is not
    the method it claims, so the preference is biased."""
    p_value = across_instances("min", "evald_interleaving_srm_p_value")
    return f"unless on ({_pair_on(spec)})\n({p_value} < {spec.thresholds.srm_alpha:g})"


def _interleaving_win(spec: Spec, name: str, bound: str, winner: str, loser: str) -> Rule:
    """``name`` fires when the always-valid band on the preference (team_a over team_b)
    excludes 0 on ``winner``'s side: ``upper < 0`` (team_b wins) or ``lower > 0`` (team_a)."""
    th = spec.thresholds
    how, test = ("max", "< 0") if bound == "upper" else ("min", "> 0")
    return {
        "alert": name,
        "expr": f"{across_instances(how, f'evald_interleaving_{bound}')} {test}\n" + _coin_ok(spec),
        "for": th.sequence_for,
        "labels": {"severity": "info"},
        "annotations": {
            "summary": f"Interleaving: {{{{ $labels.{winner} }}}} beats {{{{ $labels.{loser} }}}}",
            "description": "The always-valid confidence sequence on the interleaving preference "
            f"of {{{{ $labels.team_a }}}} over {{{{ $labels.team_b }}}} "
            f"({_segment_text(spec, spec.segment_labels)}) excludes 0: users prefer "
            f"{{{{ $labels.{winner} }}}}. Family-wise error rate {th.family_alpha * 100:g}% "
            "(interleaving.alpha) over every segment and pair, however often it is checked "
            "(docs/statistics.md, Interleaving).",
        },
    }


def _interleaving_coin(spec: Spec) -> Rule:
    th = spec.thresholds
    return {
        "alert": "EvaldInterleavingCoinBiased",
        "expr": f"{across_instances('min', 'evald_interleaving_srm_p_value')} < {th.srm_alpha:g}",
        "for": th.srm_for,
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": "Interleaving: {{ $labels.team_a }} and {{ $labels.team_b }} do not lead "
            "half the lists each",
            "description": "The always-valid test of the draft's coin for "
            "{{ $labels.team_a }} vs {{ $labels.team_b }} "
            f"({_segment_text(spec, spec.segment_labels)}) rejects a fair coin at "
            f"{th.srm_alpha:g}: the interleaver is not the method it claims, or drops a team. "
            "The pair's interleaving alerts are suppressed while it fires.",
        },
    }


def _examination_shift(spec: Spec) -> Rule:
    """A rank's examination (the click model's position-bias curve) moved against its own
    trailing mean: a page change that moved the fold shows here first. The instances' curves
    (each pools the partitions it owns) are averaged; at low traffic the fits are too noisy."""
    th = spec.thresholds
    on = _by(JOB, *spec.segment_labels)
    exam = "evald_click_examination"
    baseline = f"avg_over_time({exam}[{th.examination_baseline}] offset {th.examination_gap})"
    lists = f"sum without ({_by(*INSTANCE_LABELS)}) (evald_click_model_lists)"
    return {
        "alert": "EvaldExaminationCurveShifted",
        "expr": "abs(\n"
        f"  {across_instances('avg', exam)}\n"
        f"  - {across_instances('avg', baseline)}\n"
        f") > {th.examination_shift:g}\n"
        f"and on ({on}) ({lists} >= {th.examination_min_lists})",
        "for": th.examination_for,
        "labels": {"severity": "info"},
        "annotations": {
            "summary": "Examination at rank {{ $labels.rank }} moved by more than "
            f"{th.examination_shift:g}",
            "description": "The click model's examination probability at rank "
            "{{ $labels.rank }} "
            f"({_segment_text(spec, spec.segment_labels)}) differs by more than "
            f"{th.examination_shift:g} from its mean over the {th.examination_baseline} ending "
            f"{th.examination_gap} ago: users look at the ranks differently (a page or layout "
            "change moved the fold), so raw click measures moved for a reason other than the "
            "ranker (docs/click-models.md).",
        },
    }


def _unattributed_ratio(spec: Spec, reason: str, name: str, ratio: float) -> Rule:
    th = spec.thresholds
    rng = th.ratio_range
    feedback = 'evald_events_total{kind="feedback"}'
    return {
        "alert": name,
        "expr": "(\n"
        f'  sum by ({JOB}) (rate(evald_feedback_unattributed_total{{reason="{reason}"}}[{rng}]))\n'
        f"  / sum by ({JOB}) (rate({feedback}[{rng}]))\n"
        f"  > {ratio:g}\n"
        ")\n"
        f"and on ({JOB}) (sum by ({JOB}) (increase({feedback}[{rng}])) >= {th.ratio_min_events})",
        "for": th.ratio_for,
        "labels": {"severity": "warning"},
        "annotations": {
            "summary": f"More than {ratio:.0%} of feedback is {reason}",
            "description": f"Over the last {rng}, more than {ratio:.0%} of feedback events of job "
            f"{{{{ $labels.job }}}} were {reason} and could not be attributed to an impression.",
        },
    }


def alert_groups(spec: Spec) -> list[Group]:
    """One group of alerts on quality, experiment arms and pipeline health."""
    th = spec.thresholds
    rng = th.ratio_range
    delay = th.finalize_delay
    accepted = 'evald_events_total{kind="impression", outcome="accepted"}'
    look_back = f"{_seconds(delay) // 60 + 15}m"  # the whole span in which those were finalized
    alerts = [
        _treatment_below_control(spec),
        _cusum_drop(
            spec,
            "EvaldTreatmentDropDetected",
            "evald_cusum_vs_control",
            f"the {{{{ $labels.{spec.arm_label} }}}} arm against {spec.control}",
            "control",
        ),
        _cusum_drop(
            spec,
            "EvaldArmDropDetected",
            "evald_cusum_vs_baseline",
            f"the {{{{ $labels.{spec.arm_label} }}}} arm against its own trailing baseline",
            "baseline",
        ),
        _sample_ratio(spec),
        _interleaving_win(spec, "EvaldInterleavingSecondTeamWins", "upper", "team_b", "team_a"),
        _interleaving_win(spec, "EvaldInterleavingFirstTeamWins", "lower", "team_a", "team_b"),
        _interleaving_coin(spec),
        *(_zero_feedback_alert(spec, name) for name in ZERO_FEEDBACK_ALERTS),
        _examination_shift(spec),
        *_down(spec),
        {
            "alert": "EvaldWatermarkStalled",
            "expr": f"changes(evald_watermark_timestamp_seconds[{th.watermark_stall}]) == 0\n"
            "and evald_watermark_timestamp_seconds > 0",
            "for": th.watermark_for,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "Event-time watermark stalled",
                "description": f"The watermark of partition {{{{ $labels.partition }}}} on "
                f"{{{{ $labels.instance }}}} has not moved for {th.watermark_stall}; windows no "
                "longer close, so nothing is scored.",
            },
        },
        {
            "alert": "EvaldNoImpressionsFinalized",
            "expr": f"(sum by ({JOB}, instance) (increase({accepted}[15m] offset {delay})) > 0)\n"
            f"unless on ({JOB}, instance)\n"
            f"(sum by ({JOB}, instance) (increase(evald_impressions_finalized_total[{look_back}]))"
            " > 0)",
            "for": th.finalize_for,
            "labels": {"severity": "critical"},
            "annotations": {
                "summary": "Impressions are accepted but none is finalized",
                "description": f"{{{{ $labels.instance }}}} accepted impressions more than {delay} "
                f"ago but finalized none in the last {look_back}: the join is stuck.",
            },
        },
        {
            "alert": "EvaldHighRejectedRate",
            "expr": "(\n"
            f'  sum by ({JOB}) (rate(evald_events_total{{outcome="rejected"}}[{rng}]))\n'
            f"  / sum by ({JOB}) (rate(evald_events_total[{rng}]))\n"
            f"  > {th.rejected_ratio:g}\n"
            ")\n"
            f"and on ({JOB}) (sum by ({JOB}) (increase(evald_events_total[{rng}]))"
            f" >= {th.ratio_min_events})",
            "for": th.ratio_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": f"More than {th.rejected_ratio:.0%} of events are rejected",
                "description": f"Over the last {rng}, more than {th.rejected_ratio:.0%} of the "
                "events of job {{ $labels.job }} were rejected; see evald_rejected_total by "
                "reason and the dead-letter topic.",
            },
        },
        _unattributed_ratio(spec, "late", "EvaldHighLateFeedbackRate", th.late_ratio),
        _unattributed_ratio(spec, "orphaned", "EvaldHighOrphanedFeedbackRate", th.orphaned_ratio),
        {
            "alert": "EvaldConsumerLagHigh",
            "expr": f"sum by ({JOB}, topic) (evald_consumer_lag) > {th.lag_records}\n"
            f"and on ({JOB}, topic)\n"
            f"deriv(sum by ({JOB}, topic) (evald_consumer_lag)[{th.lag_for}:1m]) >= 0",
            "for": th.lag_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "Kafka consumer lag is high and not shrinking",
                "description": f"evald is more than {th.lag_records} records behind on topic "
                "{{ $labels.topic }} and the lag is not decreasing.",
            },
        },
        {
            "alert": "EvaldTLSCertificateExpiresSoon",
            "expr": "evald_tls_certificate_expiry_timestamp_seconds - time() < "
            f"{th.certificate_days} * 86400",
            "for": th.certificate_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "evald's metrics TLS certificate expires soon",
                "description": "The TLS certificate {{ $labels.instance }} serves /metrics with "
                f"expires within {th.certificate_days} days (or has): renew it and restart "
                "evald, which reads it at start; Prometheus refuses it once expired.",
            },
        },
        {
            "alert": "EvaldNotReady",
            "expr": "evald_ready == 0",
            "for": th.not_ready_for,
            "labels": {"severity": "warning"},
            "annotations": {
                "summary": "evald is not ready",
                "description": "{{ $labels.instance }} has reported not ready for "
                f"{th.not_ready_for} (broker unreachable, restoring state, or starting).",
            },
        },
    ]
    return [{"name": "evald.alerts", "rules": alerts}]
