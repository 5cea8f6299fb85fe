"""The time interfaces strategies depend on: :class:`Clock` and :class:`Timing`.

Strategies never import ``simulation``: they see a :class:`Clock` (what
time it is, and whether replies must be handled in due-time order) and a
:class:`Timing` (how long a piece of client work takes). The implementations
live in :mod:`simulation.timing`: the simulation supplies a virtual clock and
device-profile timing (``VirtualClock``, ``DeviceTiming``); deployment
supplies the ``WallClock``, where replies are handled in arrival order, with
``ZeroTiming``.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod

__all__ = ["Clock", "Timing"]


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

    def resume_at(self, t: float) -> None:
        """A resumed run's clock: continue from ``t`` seconds (a checkpoint's time)."""
        self.advance_to(t)


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

    def server_seconds(self, flops: float) -> float:
        """Seconds the server needs for ``flops`` FLOPs of its own compute (its steps, ZO perturbations,
        GAS's generation): 0.0 here (server compute is free, the default and the wall clock's case);
        :class:`simulation.timing.durations.DeviceTiming` charges ``flops / server-speed``.

        Raises:
            ValueError: negative or non-finite ``flops`` (by implementations that charge them).
        """
        return 0.0

    def link_duration(self, bits: float, rate_bps: float) -> float:
        """Seconds to send ``bits`` over a direct device-to-device link of ``rate_bps`` bits/s.

        RingSFL's relay hops (its paper, Sec. 4.1.1: 135 Mbit/s D2D links).
        ``0`` bits, or an infinite rate, take 0 s.

        Raises:
            ValueError: negative or non-finite ``bits``, or a non-positive rate.
        """
        if not (bits >= 0 and math.isfinite(bits)):
            raise ValueError(f"bits must be a non-negative finite number, got {bits!r}")
        if not rate_bps > 0:
            raise ValueError(f"link rate must be positive (bits/s), got {rate_bps!r}")
        return 0.0 if bits == 0 or math.isinf(rate_bps) else bits / rate_bps

