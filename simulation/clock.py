"""The virtual clock of the simulation.

The wall clock and zero timing used in deployment live next to the
interfaces, in :mod:`strategies.clock` (strategies must not import
``simulation``).
"""

from __future__ import annotations

from strategies.clock import Clock

__all__ = ["VirtualClock"]


class VirtualClock(Clock):
    """Virtual time in seconds, moved only by the event loop.

    Each message is due at ``send time + duration`` (from the device
    profiles); the dispatcher handles replies in due-time order and moves the
    clock to each reply's due time, so a run is reproducible from its seed
    whatever the real scheduling.
    """

    ordered = True

    def __init__(self) -> None:
        self._now = 0.0

    def now(self) -> float:
        """Current virtual time (s)."""
        return self._now

    def advance_to(self, t: float) -> None:
        """Set the time to ``max(now, t)`` (seconds)."""
        if t > self._now:
            self._now = float(t)
