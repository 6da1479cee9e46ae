"""The event-time windowed join of one input partition (``JoinStore``); docs/semantics.md."""

from evald.join.store import Closed, Joined, JoinStore

__all__ = ["Closed", "JoinStore", "Joined"]
