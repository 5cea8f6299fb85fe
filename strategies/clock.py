"""The time interfaces strategies depend on.

Strategies never import ``simulation``: they see a :class:`Clock` (what
time it is, and whether replies must be handled in due-time order) and a
:class:`Timing` (how long a piece of client work takes). The simulation
supplies a virtual clock and device-profile timing; deployment supplies the
wall clock, where replies are handled in arrival order.
"""

from __future__ import annotations

from abc import ABC, abstractmethod


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
                 bits_down: float = 0.0, draw: int = 0) -> float:
        """Seconds for ``flops`` of compute plus ``bits_up``/``bits_down`` of transfer.

        ``draw`` numbers the client's exchanges, for random (straggler) delays
        that must not depend on the order in which exchanges are timed.
        """
