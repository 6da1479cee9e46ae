"""`evald top`'s zero-feedback lines: the exported means merged per display group weighted by
lists, drawn one line per arm that gives way before the health lines."""

from __future__ import annotations

import math

import pytest

from evald.top.model import build_view, parse
from evald.top.render import render
from evald.top.zerofeedback import ZeroLine, line, zero_lines

#: (arm, surface) -> quantity -> (mean, lists); the treatment's rbo defined on web only
SEGMENTS = {
    ("control", "web"): {"empty": (0.1, 100), "unjudged": (0.2, 90), "rbo": (None, 0)},
    ("control", "app"): {"empty": (0.0, 300), "unjudged": (0.6, 300), "rbo": (None, 0)},
    ("treatment", "web"): {"empty": (0.05, 200), "unjudged": (0.5, 180), "rbo": (0.3, 150)},
    ("treatment", "app"): {"empty": (0.0, 100), "unjudged": (0.2, 100), "rbo": (None, 0)},
}


def exposition(window: str = "5m") -> str:
    lines = ["# TYPE evald_zero_feedback_mean gauge", "# TYPE evald_zero_feedback_lists gauge"]
    for (arm, surface), quantities in SEGMENTS.items():
        for quantity, (mean, lists) in quantities.items():
            labels = f'arm="{arm}",quantity="{quantity}",surface="{surface}",window="{window}"'
            lines.append(f"evald_zero_feedback_lists{{{labels}}} {lists}")
            if mean is not None:  # the series is absent where no list defined it
                lines.append(f"evald_zero_feedback_mean{{{labels}}} {mean}")
    return "\n".join(lines) + "\n"


def test_groups_merge_their_segments_weighted_by_lists() -> None:
    got = {z.group: z.values for z in zero_lines(parse(exposition(), 0.0).samples, "5m", ["arm"])}
    assert list(got) == ["control", "treatment"]
    control, treatment = got["control"], got["treatment"]
    assert control["empty"] == (pytest.approx((0.1 * 100 + 0.0 * 300) / 400), 400)
    assert control["unjudged"] == (pytest.approx((0.2 * 90 + 0.6 * 300) / 390), 390)
    assert math.isnan(control["rbo"][0]) and control["rbo"][1] == 0
    assert treatment["rbo"] == (pytest.approx(0.3), 150)
    assert treatment["unjudged"] == (pytest.approx((0.5 * 180 + 0.2 * 100) / 280), 280)


def test_another_window_or_no_series_gives_no_line() -> None:
    assert zero_lines(parse(exposition("1h"), 0.0).samples, "5m", ["arm"]) == []
    assert zero_lines({}, "5m", ["arm"]) == []


def test_a_line_per_arm_fits_80_columns_and_says_what_is_missing() -> None:
    text = line(
        ZeroLine("treatment", {"rbo": (0.3, 150), "unjudged": (0.4, 280), "empty": (0.0375, 300)})
    )
    assert text == "treatment before feedback: RBO 0.300 · unjudged 0.400 · empty 0.037 (300)"
    missing = line(ZeroLine("control", {"rbo": (math.nan, 0), "empty": (0.0, 12_345)}))
    assert missing == "control before feedback: RBO - · unjudged - · empty 0.000 (12,345)"


def test_the_frame_shows_them_and_a_short_terminal_cuts_them_before_the_health() -> None:
    view = build_view("here", parse(exposition(), 0.0))
    lines = render(view).splitlines()
    zero = [i for i, text in enumerate(lines) if " before feedback: " in text]
    assert [lines[i].split()[0] for i in zero] == ["control", "treatment"]
    assert max(len(text) for text in lines) <= 80
    assert lines[-1].startswith("unattributed feedback")
    short = render(view, height=len(lines) - 1).splitlines()
    assert len(short) <= len(lines) - 1 and short[-1].startswith("unattributed feedback")
    assert sum(" before feedback: " in text for text in short) < len(zero)
