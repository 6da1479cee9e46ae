"""Pipeline-health counters and the small statistics shared by aggregates and exports.

``Stats`` is plain data: the exposition reads these dicts at scrape time; only the engine
writes them. Every known label value is present from the start (value 0), so each series
exists before its first event.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping

import numpy as np

from evald.decode import REASONS

EVENT_KINDS = ("impression", "feedback", "unknown")
EVENT_OUTCOMES = ("accepted", "rejected", "duplicate")
UNATTRIBUTED_REASONS = ("late", "early", "orphaned", "duplicate", "unknown_item")
FINALIZE_REASONS = ("window", "late", "cap", "drain")
#: distinct actions a mapping's skipped feedback is counted by; the rest count under OTHER,
#: so evald_feedback_skipped_total has at most MAX_SKIPPED_ACTIONS + 1 series
MAX_SKIPPED_ACTIONS = 32
OTHER = "(other)"
#: seconds; wall time from a window closing (by the watermark) to its impressions being scored
LAG_BOUNDS: tuple[float, ...] = (0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)

Z95 = 1.959963984540054


class Stats:
    """Monotonic counters of what the engine did with each event (Prometheus counters)."""

    def __init__(self) -> None:
        #: (kind, outcome) -> events; kind "unknown" when a rejected record had no clear kind
        self.events: dict[tuple[str, str], int] = {
            (k, o): 0 for k in EVENT_KINDS for o in EVENT_OUTCOMES
        }
        #: rejection reason -> records (see evald.decode.REASONS)
        self.rejected: dict[str, int] = dict.fromkeys(REASONS, 0)
        #: why accepted feedback did not count towards any impression
        self.unattributed: dict[str, int] = dict.fromkeys(UNATTRIBUTED_REASONS, 0)
        #: impressions scored, by what closed them ("late": the window had already closed
        #: when the impression arrived, so it was closed at once)
        self.finalized: dict[str, int] = dict.fromkeys(FINALIZE_REASONS, 0)
        #: feedback an input mapping skipped (its action counts for nothing), by action
        self.skipped: dict[str, int] = {}
        #: impressions finalized with no positive feedback (also per segment in Aggregates)
        self.abandoned = 0
        #: event times still more than ``lateness`` ahead of their partition's confirmed time a
        #: whole block of events later: they did not move the watermark (PartitionClock)
        self.watermark_outliers = 0
        self.lag_bounds: tuple[float, ...] = LAG_BOUNDS
        #: non-cumulative counts per lag bucket, the last one is +Inf
        self.lag_counts: list[int] = [0] * (len(LAG_BOUNDS) + 1)
        self.lag_sum = 0.0
        self.lag_count = 0

    def counted(self) -> dict[str, int]:
        """Every counter that is not 0, flat (``events/impression/accepted``,
        ``rejected/invalid_json``, ``unattributed/late``, ``finalized/window``,
        ``skipped/<action>``, ``abandoned``): what a session logs when it ends."""
        flat = {f"events/{kind}/{outcome}": n for (kind, outcome), n in self.events.items()}
        for name, table in (
            ("rejected", self.rejected),
            ("unattributed", self.unattributed),
            ("finalized", self.finalized),
            ("skipped", self.skipped),
        ):
            flat.update({f"{name}/{key}": n for key, n in table.items()})
        flat["abandoned"] = self.abandoned
        flat["watermark_outliers"] = self.watermark_outliers
        return {key: n for key, n in flat.items() if n}

    def add(self, counted: Mapping[str, int]) -> None:
        """Add counts in :meth:`counted`'s flat form (a checkpoint's, or the difference of two
        commits'); a key this version does not know is ignored (a newer writer's)."""
        for key, n in counted.items():
            table, _, name = key.partition("/")
            if table == "events":
                kind, _, outcome = name.partition("/")
                if (kind, outcome) in self.events:
                    self.events[(kind, outcome)] += n
            elif table == "skipped":
                self.count_skipped(name, len(name), n)
            elif table in ("rejected", "unattributed", "finalized"):
                counts: dict[str, int] = getattr(self, table)
                if name in counts:
                    counts[name] += n
            elif key == "abandoned":
                self.abandoned += n
            elif key == "watermark_outliers":
                self.watermark_outliers += n

    @classmethod
    def merged(cls, parts: Iterable[Stats]) -> Stats:
        """One ``Stats`` holding the sum of ``parts`` (the engine's partitions)."""
        total = cls()
        for part in parts:
            total.add(part.counted())
            total.lag_counts = [
                a + b for a, b in zip(total.lag_counts, part.lag_counts, strict=True)
            ]
            total.lag_sum += part.lag_sum
            total.lag_count += part.lag_count
        return total

    def count_skipped(self, action: str, max_length: int, n: int = 1) -> None:
        """``n`` records skipped for ``action``: at most ``MAX_SKIPPED_ACTIONS`` actions are
        named (the rest count under ``OTHER``), each cut to ``max_length`` characters."""
        skipped = self.skipped
        if action not in skipped:
            if len(skipped) >= MAX_SKIPPED_ACTIONS:
                action = OTHER
            elif len(action) > max_length:
                action = action[:max_length]
        skipped[action] = skipped.get(action, 0) + n

    def observe_lag(self, seconds: float, n: int) -> None:
        """Record ``n`` impressions finalized ``seconds`` after their window closed."""
        seconds = max(0.0, seconds)
        index = int(np.searchsorted(self.lag_bounds, seconds, side="left"))
        self.lag_counts[index] += n
        self.lag_sum += seconds * n
        self.lag_count += n


def mean_ci95(count: float, total: float, squares: float) -> tuple[float, float]:
    """Mean and 95% CI half-width (normal approximation) from mergeable sums.

    Half-width = 1.96 * s / sqrt(n) with the sample standard deviation s; NaN when n < 2
    (undefined) or the sums overflowed (inf − inf), mean NaN when n = 0.
    """
    if count <= 0:
        return math.nan, math.nan
    mean = total / count
    if count < 2:
        return mean, math.nan
    variance = (squares - total * total / count) / (count - 1)
    if math.isnan(variance):  # max(0.0, nan) would be 0: a half-width of 0
        return mean, math.nan
    return mean, Z95 * math.sqrt(max(0.0, variance) / count)
