"""The series budget: how many series the engine collector exposes at worst, from the settings.

Why bounded: segments are capped (``max_segments`` plus one overflow segment, see
evald.segments), so the worst case is a function of the settings alone, which
:func:`check_series_budget` holds against ``max_series``. The counts come from the series table
(:data:`SERIES`), so a new entry there is counted without an edit here.

The check lives here and not in EngineConfig's validators: the table sits above the settings
(it reads the engine), and a validator importing it closed an import cycle. The commands that
load engine settings call it right after (`evald run`, `check-config` and `produce` through the
daemon's settings, `evald demo`, `evald replay`), so a refused budget still exits 2 naming
``max_segments`` before anything starts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from evald.config import ConfigError
from evald.exposition.series import SERIES, Series

if TYPE_CHECKING:
    from evald.config import EngineConfig

__all__ = ["SeriesShape", "check_series_budget"]

#: series the engine collector exposes beside the table (evald_engine_series_age_seconds)
_COLLECTOR_OWN = 1


@dataclass(frozen=True, slots=True)
class SeriesShape:
    """How many series the engine collector exposes, derived from the settings.

    ``per_segment``: each measure's histogram (one ``_bucket`` per bound plus ``+Inf``, ``_sum``,
    ``_count``), each window width's five ``evald_window_*`` series per measure, and
    ``evald_impressions_abandoned_total``. ``fixed``: the pipeline-health series, which do not
    depend on the input, plus one ``evald_window_end_timestamp_seconds`` per width, plus the
    collector's own ``evald_engine_series_age_seconds``. Not counted:
    one ``evald_watermark_timestamp_seconds`` per input partition the process owns (bounded by
    the topics, not by the data).
    """

    per_segment: int
    fixed: int

    @classmethod
    def of(cls, config: EngineConfig, series: Sequence[Series] = SERIES) -> SeriesShape:
        """The shape of ``series`` (default: the whole table) under ``config``."""
        return cls(
            sum(entry.per_segment(config) for entry in series),
            sum(entry.fixed(config) for entry in series) + _COLLECTOR_OWN,
        )

    def worst_case(self, max_segments: int) -> int:
        """Series with every kept segment and the overflow segment holding data."""
        return (max_segments + 1) * self.per_segment + self.fixed

    def segments_within(self, max_series: int) -> int:
        """The largest ``max_segments`` whose worst case fits in ``max_series`` (may be < 1)."""
        return (max_series - self.fixed) // self.per_segment - 1


def check_series_budget(config: EngineConfig) -> None:
    """Raise :class:`~evald.config.ConfigError` (``max_segments: ...``, with the cap that fits
    or the budget needed) if the worst case of ``config`` exceeds its ``max_series``."""
    shape = SeriesShape.of(config)
    worst = shape.worst_case(config.max_segments)
    if worst <= config.max_series:
        return
    fits = shape.segments_within(config.max_series)
    hint = (
        f"lower max_segments to {fits} or raise max_series to {worst}"
        if fits >= 1
        else f"raise max_series to at least {shape.worst_case(1)}"
    )
    raise ConfigError(
        f"max_segments: {config.max_segments} segments (+1 overflow) x "
        f"{shape.per_segment} series each + {shape.fixed} fixed = {worst:,} series, "
        f"over max_series ({config.max_series:,}); {hint}"
    )
