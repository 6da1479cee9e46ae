"""Where the attribution of a comparison record's drop starts (``outputs._since``)."""

from __future__ import annotations

from evald.drilldown.outputs import _since
from evald.events import MAX_TS_MS, format_timestamp

WIDTH = 300_000


def cusum_record(end_ms: int) -> dict[str, object]:
    """A record flagged by the CUSUM alone, its run the last three windows."""
    return {"end": format_timestamp(end_ms), "end_ms": end_ms, "upper": 0.2,
            "below_min_effect": False, "cusum_run_windows": 3}  # fmt: skip


def test_a_run_ending_in_year_10000_starts_its_windows_before_the_end() -> None:
    end = (MAX_TS_MS // WIDTH + 1) * WIDTH  # the window of events on 9999-12-31 ends in 10000
    record = cusum_record(end)
    assert str(record["end"]).startswith("10000-01-01T")
    assert _since(record, WIDTH) == end - 3 * WIDTH


def test_a_record_from_before_end_ms_is_read_by_its_end() -> None:
    end = 1_714_521_600_000
    record = cusum_record(end)
    del record["end_ms"]
    assert _since(record, WIDTH) == end - 3 * WIDTH


def test_a_band_below_zero_is_a_drop_since_the_start() -> None:
    assert _since({**cusum_record(1_714_521_600_000), "upper": -0.1}, WIDTH) is None
