"""The click models by name: ``new_model(settings)`` and ``build(snapshot)``.

``new_model(settings)`` makes an empty model of ``settings.model``; ``build(raw)`` rebuilds one
from its ``snapshot()``. Every model reads ``Sessions`` and shares ``ClickModel``'s machinery:
bounded pairs, the horizon, the refit schedule and its state as bytes.
"""

from __future__ import annotations

from evald import snapshot
from evald.clicks.cascade import Cascade
from evald.clicks.coec import COEC
from evald.clicks.dbn import DBN
from evald.clicks.model import KIND, ClickModel
from evald.clicks.pbm import PBM
from evald.clicks.regression import RegressionPBM
from evald.clicks.sessions import Sessions
from evald.clicks.settings import MODELS, ClickSettings

__all__ = ["MODELS", "ClickModel", "ClickSettings", "Sessions", "build", "new_model"]

_CLASSES: dict[str, type[ClickModel]] = {
    cls.name: cls for cls in (PBM, Cascade, DBN, COEC, RegressionPBM)
}


def new_model(settings: ClickSettings) -> ClickModel:
    """An empty model of ``settings.model`` (ValueError naming a bad field)."""
    settings.check()
    return _CLASSES[settings.model](settings)


def build(raw: bytes) -> ClickModel:
    """The model a ``snapshot()`` holds, exactly; ValueError if ``raw`` is not one (or one
    this evald cannot read: settings or fields it does not know)."""
    meta, arrays = snapshot.decode(raw)
    if meta.get("kind") != KIND or meta.get("model") not in _CLASSES:
        raise ValueError("not a click-model snapshot")
    try:
        model = _CLASSES[meta["model"]](ClickSettings.from_json(meta["settings"]))
        model.restore(meta, arrays)
    except (KeyError, TypeError, IndexError) as exc:
        raise ValueError(f"a click-model snapshot this evald cannot read: {exc!r}") from None
    return model
