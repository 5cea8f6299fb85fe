"""Clocks: a virtual clock for simulation, the wall clock for deployment."""

from __future__ import annotations

import time

from strategies.clock import Clock, Timing


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
        """Set the time to ``max(now, t)``."""
        if t > self._now:
            self._now = float(t)


class WallClock(Clock):
    """Real elapsed seconds since construction; replies in arrival order."""

    ordered = False

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now(self) -> float:
        """Seconds since the clock was created."""
        return time.monotonic() - self._t0

    def advance_to(self, t: float) -> None:
        """No-op: wall time moves by itself."""


class ZeroTiming(Timing):
    """Every piece of work takes 0 s: for the wall clock, where time is real."""

    def duration(self, partition_id: int, flops: float, bits_up: float = 0.0,
                 bits_down: float = 0.0, draw: int = 0) -> float:
        """Always 0.0 seconds."""
        return 0.0
