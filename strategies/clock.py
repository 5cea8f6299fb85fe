"""The time interfaces strategies depend on, and the deployment clock.

Strategies never import ``simulation``: they see a :class:`Clock` (what
time it is, and whether replies must be handled in due-time order) and a
:class:`Timing` (how long a piece of client work takes). The simulation
supplies a virtual clock and device-profile timing
(``simulation.clock.VirtualClock``, ``simulation.heterogeneity.DeviceTiming``);
deployment supplies the :class:`WallClock`, where replies are handled in
arrival order, with :class:`ZeroTiming`.
"""

from __future__ import annotations

import time
from abc import ABC, abstractmethod

__all__ = ["Clock", "Timing", "WallClock", "ZeroTiming"]


class Clock(ABC):
    """A time source for the event loop (seconds since the run started)."""

    #: True when replies must be handled in virtual completion-time order.
    ordered: bool = True

    @abstractmethod
    def now(self) -> float:
        """Current time in seconds."""

    @abstractmethod
    def advance_to(self, t: float) -> None:
        """Move time forward to ``t`` seconds (never backwards)."""


class Timing(ABC):
    """Maps a client's work to seconds on its device."""

    @abstractmethod
    def duration(self, partition_id: int, flops: float, bits_up: float = 0.0,
                 bits_down: float = 0.0, draw: int | None = 0) -> float:
        """Seconds for ``flops`` of compute plus ``bits_up``/``bits_down`` of transfer.

        ``draw`` numbers the client's exchanges, for random (straggler) delays
        that must not depend on the order in which exchanges are timed;
        ``draw=None`` asks for the expected duration (random delays replaced
        by their mean).
        """


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


class ZeroTiming(Timing):
    """Every piece of work takes 0 s: for the wall clock, where time is real."""

    def duration(self, partition_id: int, flops: float, bits_up: float = 0.0,
                 bits_down: float = 0.0, draw: int | None = 0) -> float:
        """Always 0.0 seconds, whatever the work or ``draw``."""
        return 0.0
