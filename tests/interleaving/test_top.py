"""`evald top` shows each pair's preference and verdict from a real exposition."""

from __future__ import annotations

from interleaved_stream import CONFIG, events, lines

from evald.config import load_config
from evald.engine import Engine
from evald.exposition import Encoder, build_registry
from evald.top.model import build_view, parse
from evald.top.render import render


def frame(stream: list[dict]) -> str:
    engine = Engine(load_config(CONFIG), clock=lambda: 0.0, global_statistics=True)
    assert engine.feed_batch(lines(stream)) == []
    engine.drain()
    body, _ = Encoder().encode(build_registry(engine, process=False)[0])
    view = build_view("test", parse(body.decode(), 0.0))
    records = {r["segment"]["surface"]: r for r in engine.interleaving.records()}
    for p in view.preferences:
        r = records[p.segment.removeprefix("surface=")]
        assert (p.team_a, p.team_b, p.preference, p.lower, p.upper, p.winner) == (
            r["team_a"],
            r["team_b"],
            r["preference"],
            r["lower"],
            r["upper"],
            r["winner"],
        )
    assert len(view.preferences) == 2
    return render(view, width=80)


def test_the_verdict_and_the_undecided_are_shown() -> None:
    text = frame(events(n=1500))
    assert text.count(" A beats B") == 2 and "interleaving surface=app: A vs B +" in text
    text = frame(events(n=1500, same=True))
    assert text.count(" no difference shown yet") == 2 and "beats" not in text
    assert all(len(line) <= 80 for line in text.splitlines())
