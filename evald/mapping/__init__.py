"""Input mappings: events of any JSON schema read into evald's own (docs/mapping.md).

``decoder_for(source, config)`` is the decoder the engine gets for ``--mapping`` /
``input.mapping``: None for the built-in ``evald`` (the engine's fast native decoder), else a
:class:`MappingDecoder`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from evald.mapping.decoder import MappingDecoder
from evald.mapping.presets import BUILTIN, NATIVE
from evald.mapping.spec import MappingError, MappingSpec, load_spec

if TYPE_CHECKING:
    from evald.config import EngineConfig

__all__ = [
    "BUILTIN",
    "NATIVE",
    "MappingDecoder",
    "MappingError",
    "MappingSpec",
    "decoder_factory",
    "decoder_for",
    "load_spec",
]


def decoder_for(source: str, config: EngineConfig) -> MappingDecoder | None:
    """The decoder for mapping ``source`` (a name or a file) under ``config``'s limits and
    event-time bounds; None: the native schema. Raises :class:`MappingError`."""
    return decoder_factory(source, config)()


def decoder_factory(source: str, config: EngineConfig) -> Callable[[], MappingDecoder | None]:
    """A fresh decoder per call (each engine counts its own skips), the mapping read once,
    now: a file changed or removed later cannot stop a running daemon."""
    spec = load_spec(source)

    def make() -> MappingDecoder | None:
        if spec is None:
            return None
        return MappingDecoder(
            spec, config.limits, min_ts=config.min_event_time, max_lead=config.max_event_lead
        )

    return make
