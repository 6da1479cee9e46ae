"""``evald replay --click-model``: the options, the hook on the replay's engine, the summary.

Kept here so ``evald/replay.py`` only declares, attaches and prints (three call sites).
"""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from evald.clicks.settings import IPS_CLIP, MAX_CLICK_DEPTH, ClickSettings

if TYPE_CHECKING:
    from evald.clicks.collect import Collector
    from evald.engine import Engine

#: the models replay offers (regression EM needs pair features, which events do not carry)
REPLAY_MODELS = ("pbm", "dbn", "cascade", "coec")
#: ranks read by default
DEPTH = 10


def add_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--click-model",
        choices=REPLAY_MODELS,
        help="fit a click model on the replayed lists and their clicks; the summary gains its "
        "examination curve by rank and the measures debiased by it (docs/click-models.md)",
    )
    parser.add_argument(
        "--click-depth",
        type=int,
        metavar="N",
        help=f"ranks the click model reads (default {DEPTH})",
    )
    parser.add_argument(
        "--ips-clip",
        type=float,
        metavar="M",
        help=f"inverse-propensity weights are clipped at M (default {IPS_CLIP:g})",
    )


def settings_of(args: argparse.Namespace) -> ClickSettings | None:
    """The click model's settings from the options (None: no --click-model); ValueError
    naming the option when one is out of range."""
    if args.click_model is None:
        for flag, value in (("--click-depth", args.click_depth), ("--ips-clip", args.ips_clip)):
            if value is not None:  # it would change nothing: say so rather than ignore it
                raise ValueError(f"{flag}: only with --click-model")
        return None
    depth = DEPTH if args.click_depth is None else args.click_depth
    clip = IPS_CLIP if args.ips_clip is None else args.ips_clip
    if not 1 <= depth <= MAX_CLICK_DEPTH:
        raise ValueError(f"--click-depth: must be between 1 and {MAX_CLICK_DEPTH}")
    if not 1 <= clip < math.inf:  # an infinite clip weighs a rank never examined inf
        raise ValueError(f"--ips-clip: must be a finite number >= 1, got {clip:g}")
    return ClickSettings(model=args.click_model, depth=depth, ips_clip=clip).check()


def attach(engine: Engine, label_keys: list[str], depth: int) -> Collector:
    """Collect the engine's finalized lists as sessions (decoder tee + join hook)."""
    from evald.clicks.collect import Collector, Tee

    tee = Tee(engine.decoder)
    engine.decoder = tee
    collector = Collector(tee, label_keys, depth)
    engine.on_joined = collector.on_joined
    return collector


def result(settings: ClickSettings, collector: Collector, measures: list[str]) -> dict[str, Any]:
    """The summary's ``click_model`` object: the model fitted on every collected list."""
    from evald.clicks.report import fit_log, summary

    sessions = collector.sessions()
    model = fit_log(settings, sessions, collector.segments)
    doc = summary(model, sessions, collector.label_keys, measures)
    doc["unmodelled"] = collector.unmodelled
    return doc
