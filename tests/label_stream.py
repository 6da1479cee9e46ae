"""A seeded stream whose treatment's drop is carried by a label that is not a segment key
(``device=android``, the segments being arm and surface), for the attribution's tests."""

from __future__ import annotations

import json

import numpy as np

DEVICES = ["android", "ios", "desktop"]
DEVICE_SHARES = [0.3, 0.45, 0.25]


def events(seed: int, *, spread: bool, n: int = 12_000) -> list[str]:
    """``n`` lists over an hour, arms alternating, queries Zipf-like among 100; labels arm and
    surface (the segments), device (three values), browser (two, unrelated) and session (a new
    value on every list: a hostile key). A click at rank 1 (RR 1) with probability 0.6; the
    treatment's android lists get it at rank 4 (RR 0.25). ``spread``: every treatment list is
    degraded with android's share of traffic instead (the same drop overall)."""
    rng = np.random.default_rng(seed)
    weights = 1.0 / np.arange(1, 101)
    weights /= weights.sum()
    lines = []
    for k in range(n):
        ts, rid = k * 300, f"r{k}"
        arm = "treatment" if k % 2 else "control"
        device = DEVICES[int(rng.choice(3, p=DEVICE_SHARES))]
        labels = {
            "arm": arm,
            "surface": "web" if rng.random() < 0.5 else "app",
            "device": device,
            "browser": "b1" if rng.random() < 0.5 else "b2",
            "session": f"s{k}",
        }
        query = f"query {int(rng.choice(100, p=weights))}"
        body = {"request_id": rid, "ts": ts, "items": list("abcde"), "query": query}
        lines.append(json.dumps({**body, "labels": labels}))
        if rng.random() < 0.6:
            if spread:
                degraded = arm == "treatment" and rng.random() < DEVICE_SHARES[0]
            else:
                degraded = arm == "treatment" and device == "android"
            item = "d" if degraded else "a"
            click = {"request_id": rid, "ts": ts + 1_000, "item": item, "action": "click"}
            lines.append(json.dumps(click))
    return lines
