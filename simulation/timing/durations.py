"""Work to seconds: the :class:`~strategies.core.clock.Timing` implementations.

:class:`DeviceTiming` charges a client's FLOPs and bits on its device profile
(with MU-SplitFed's exponential stragglers); the event loop uses those
virtual seconds to order client replies. :class:`ZeroTiming` charges nothing:
with the wall clock, time is real.
"""

from __future__ import annotations

import math
from numbers import Integral
from typing import Sequence

import numpy as np

from fl_app.run.errors import ConfigError
from simulation.timing.profiles import DeviceProfile, check_int
from strategies.core.clock import Timing

__all__ = ["DeviceTiming", "ZeroTiming"]

# Sub-seed tag of the straggler delays (the profile draws use 1:
# :mod:`simulation.timing.devices`), independent of any other use of the run's seed.
_DELAY_STREAM = 2


class DeviceTiming(Timing):
    """Maps work to virtual seconds on each client's device.

    ``duration = flops / f_k * s + bits_up / uplink_bps + bits_down / downlink_bps``
    where ``s = 1`` for ordinary devices and ``s ~ Exp(λ)`` (MU-SplitFed
    stragglers, rate ``λ = straggler_rate``, mean ``1/λ``) when the profile's
    ``straggler`` is ``"exponential"``; infinite rates contribute 0 s. With
    ``draw=None`` the expected duration is returned (``s = 1/λ``).

    What FLOPs to charge is the caller's choice (e.g. GAS reference-code
    accounting, ``batch-parallel``, charges one sample per pass: see
    :class:`fl_app.learning.costs.BlockCosts` and docs/explanation/design.md §6).

    The server's own compute is charged by :meth:`server_seconds` at
    ``server_flops_per_s`` (``server-speed``; infinite by default: free).

    Args:
        profiles: one profile per client; partition ids must be unique.
        seed: the run's seed (integer >= 0) for the straggler delays.
        straggler_rate: λ of the exponential straggler factor (> 0; the
            ``straggler-rate`` run-config key).
        server_flops_per_s: the server's compute speed in FLOP/s (> 0; the
            ``server-speed`` run-config key); ``math.inf``: server compute takes 0 s.

    Raises:
        ConfigError: for an empty profile list, duplicate partition ids, a
            bad seed, a non-positive straggler rate or server speed.
    """

    def __init__(self, profiles: Sequence[DeviceProfile], seed: int, straggler_rate: float = 1.0,
                 server_flops_per_s: float = math.inf) -> None:
        if len(profiles) == 0:
            raise ConfigError("DeviceTiming needs at least one device profile")
        if not (straggler_rate > 0 and math.isfinite(straggler_rate)):
            raise ConfigError(f"straggler-rate must be positive and finite, got {straggler_rate!r}")
        if not server_flops_per_s > 0:
            raise ConfigError(f"server-speed must be > 0 (FLOP/s), got {server_flops_per_s!r}")
        self.server_flops_per_s = float(server_flops_per_s)
        self.seed: int = check_int("seed", seed, 0)
        self.straggler_rate = float(straggler_rate)
        self._profiles: dict[int, DeviceProfile] = {}
        for p in profiles:
            if p.partition_id in self._profiles:
                raise ConfigError(f"duplicate device profile for partition {p.partition_id}")
            self._profiles[p.partition_id] = p

    @property
    def profiles(self) -> list[DeviceProfile]:
        """The profiles, ordered by partition id."""
        return [self._profiles[k] for k in sorted(self._profiles)]

    def profile(self, partition_id: int) -> DeviceProfile:
        """The profile of ``partition_id``.

        Raises:
            ConfigError: if no profile exists for that partition.
        """
        try:
            return self._profiles[partition_id]
        except KeyError:
            raise ConfigError(
                f"no device profile for partition {partition_id!r} "
                f"({len(self._profiles)} profiles)"
            ) from None

    def straggler_factor(self, partition_id: int, draw: int | None = 0) -> float:
        """Multiplier (dimensionless) of the compute time of exchange ``draw`` of a client.

        1.0 unless the profile's straggler is ``"exponential"``; then an
        ``Exp(1)`` draw from ``np.random.default_rng([seed, 2, partition_id, draw])``
        divided by ``straggler_rate`` (an ``Exp(λ)`` draw; MU-SplitFed), so it
        depends only on (seed, client, draw). ``draw=None`` asks for the
        expected value ``1/λ``.

        Raises:
            ConfigError: unknown partition.
            ValueError: ``draw`` is neither ``None`` nor a non-negative integer
                (checked for straggling devices only).
        """
        profile = self.profile(partition_id)
        if profile.straggler != "exponential":
            return 1.0
        if draw is None:
            return 1.0 / self.straggler_rate
        if not isinstance(draw, Integral) or draw < 0:
            raise ValueError(f"draw must be a non-negative integer, got {draw!r}")
        rng = np.random.default_rng([self.seed, _DELAY_STREAM, int(partition_id), int(draw)])
        return float(rng.exponential(1.0)) / self.straggler_rate

    def duration(
        self,
        partition_id: int,
        flops: float,
        bits_up: float = 0.0,
        bits_down: float = 0.0,
        draw: int | None = 0,
    ) -> float:
        """Virtual seconds that client ``partition_id`` needs for one exchange.

        Args:
            partition_id: the client.
            flops: computation of the exchange in FLOPs, as counted by the
                caller (see the class docstring).
            bits_up: bits sent to the server.
            bits_down: bits received from the server.
            draw: per-client exchange counter the caller increments, so the
                random straggler delay of an exchange does not depend on the
                order in which exchanges are timed; ``None`` for the expected
                duration (straggler factor 1.0, the mean of ``Exp(1)``).

        Returns:
            ``flops / f_k * factor + bits_up / uplink_bps + bits_down / downlink_bps``
            seconds, where ``factor`` is :meth:`straggler_factor`.

        Raises:
            ConfigError: unknown partition.
            ValueError: negative or non-finite ``flops`` / bits, negative ``draw``.
        """
        for name, value in (("flops", flops), ("bits_up", bits_up), ("bits_down", bits_down)):
            if not (value >= 0 and math.isfinite(value)):
                raise ValueError(f"{name} must be a non-negative finite number, got {value!r}")
        p = self.profile(partition_id)
        seconds = 0.0
        if flops:
            seconds += flops / p.flops_per_s * self.straggler_factor(partition_id, draw)
        if bits_up and math.isfinite(p.uplink_bps):
            seconds += bits_up / p.uplink_bps
        if bits_down and math.isfinite(p.downlink_bps):
            seconds += bits_down / p.downlink_bps
        return float(seconds)

    def server_seconds(self, flops: float) -> float:
        """Virtual seconds of ``flops`` FLOPs of server compute: ``flops / server_flops_per_s``
        (0.0 at the default infinite speed, or for no work).

        Raises:
            ValueError: negative or non-finite ``flops``.
        """
        if not (flops >= 0 and math.isfinite(flops)):
            raise ValueError(f"flops must be a non-negative finite number, got {flops!r}")
        if not flops or math.isinf(self.server_flops_per_s):
            return 0.0
        return float(flops / self.server_flops_per_s)

    def __repr__(self) -> str:
        return f"DeviceTiming({len(self._profiles)} devices, seed={self.seed})"


class ZeroTiming(Timing):
    """Every piece of work takes 0 s: for the wall clock, where time is real."""

    def duration(self, partition_id: int, flops: float, bits_up: float = 0.0,
                 bits_down: float = 0.0, draw: int | None = 0) -> float:
        """Always 0.0 seconds, whatever the work or ``draw``."""
        return 0.0

    def link_duration(self, bits: float, rate_bps: float) -> float:
        """Always 0.0 seconds: with the wall clock, transfers take their real time."""
        return 0.0
