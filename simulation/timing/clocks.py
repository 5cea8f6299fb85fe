"""The clocks: virtual time for the simulation, wall time for deployment.

Both implement :class:`strategies.core.clock.Clock`, the interface the event loop
sees. :func:`simulation.server_app.run_server` picks the one the ``clock``
run-config key names.
"""

from __future__ import annotations

import time

from strategies.core.clock import Clock

__all__ = ["VirtualClock", "WallClock"]


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

    def resume_at(self, t: float) -> None:
        """Continue from ``t`` seconds (a checkpoint's time), also back in time (a rollback to a checkpoint)."""
        self._now = float(t)


class WallClock(Clock):
    """Real elapsed seconds since construction; replies in arrival order."""

    ordered = False

    def __init__(self) -> None:
        self._t0 = time.monotonic()

    def now(self) -> float:
        """Seconds since the clock was created (``time.monotonic``)."""
        return time.monotonic() - self._t0

    def advance_to(self, t: float) -> None:
        """No-op: wall time moves by itself."""

    def resume_at(self, t: float) -> None:
        """Count on from ``t`` seconds (the time of the checkpoint a run resumes from)."""
        self._t0 = time.monotonic() - t
