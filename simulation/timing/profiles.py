"""One client's device (:class:`DeviceProfile`), and a table of profiles for reports.

A profile holds the device's compute speed in FLOP/s, its uplink and downlink
rates in bits/s and, for the GAS wireless model, its distance to the server in
km. The heterogeneity models (:mod:`simulation.timing.devices`) draw them;
:class:`simulation.timing.durations.DeviceTiming` turns work into seconds on them.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, fields
from numbers import Integral
from typing import TYPE_CHECKING, Any, Sequence

from fl_app.run.errors import ConfigError

if TYPE_CHECKING:  # pragma: no cover - only for type checkers
    import pandas as pd

__all__ = ["STRAGGLERS", "DeviceProfile", "check_int", "profiles_frame"]

#: Values of :attr:`DeviceProfile.straggler`.
STRAGGLERS: tuple[str, ...] = ("none", "exponential")


def _json_float(x: float) -> float | str | None:
    if math.isnan(x):
        return None
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return float(x)


@dataclass(frozen=True)
class DeviceProfile:
    """One client's device.

    Attributes:
        partition_id: the client (data partition) this device belongs to.
        flops_per_s: compute speed in FLOP/s (positive, finite).
        uplink_bps: client-to-server rate in bits/s; ``math.inf`` means uplink
            time is ignored.
        downlink_bps: server-to-client rate in bits/s; ``math.inf`` (the
            default in every model) means downlink time is ignored.
        distance_km: distance to the server in km for the GAS wireless model;
            ``math.nan`` when not applicable.
        straggler: ``"none"``, or ``"exponential"`` for MU-SplitFed stragglers
            (each exchange's compute time is multiplied by an ``Exp(1)`` draw,
            see :class:`DeviceTiming`).

    Raises:
        ConfigError: on construction with a negative ``partition_id``, a
            non-positive speed or rate, or an unknown ``straggler``.
    """

    partition_id: int
    flops_per_s: float
    uplink_bps: float = math.inf
    downlink_bps: float = math.inf
    distance_km: float = math.nan
    straggler: str = "none"

    def __post_init__(self) -> None:
        if (
            not isinstance(self.partition_id, Integral)
            or isinstance(self.partition_id, bool)
            or self.partition_id < 0
        ):
            raise ConfigError(
                f"partition_id must be a non-negative integer, got {self.partition_id!r}"
            )
        if not (self.flops_per_s > 0 and math.isfinite(self.flops_per_s)):
            raise ConfigError(
                f"flops_per_s must be positive and finite, got {self.flops_per_s!r}"
            )
        for name in ("uplink_bps", "downlink_bps"):
            value = getattr(self, name)
            if not value > 0:  # also rejects NaN; inf is allowed
                raise ConfigError(f"{name} must be positive (or inf), got {value!r}")
        if self.straggler not in STRAGGLERS:
            raise ConfigError(
                f"unknown straggler model {self.straggler!r}; "
                f"choose one of {', '.join(STRAGGLERS)}"
            )

    def as_dict(self) -> dict[str, Any]:
        """Return the profile as a strict-JSON-friendly dict.

        Units are those of the attributes (FLOP/s, bits/s, km). Infinite rates
        become the string ``"inf"`` (meaning "this time is ignored"), and a NaN
        distance becomes ``None`` (JSON ``null``, "not applicable"), so the
        result passes ``json.dumps(..., allow_nan=False)``.
        """
        out: dict[str, Any] = {}
        for key, value in asdict(self).items():
            out[key] = _json_float(value) if isinstance(value, float) else value
        return out


def check_int(name: str, value: Any, minimum: int) -> int:
    """``value`` as an int when it is an integer (not a bool) >= ``minimum``.

    Raises:
        ConfigError: otherwise (the message names ``name``).
    """
    if not isinstance(value, Integral) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


def profiles_frame(profiles: Sequence[DeviceProfile]) -> "pd.DataFrame":
    """Tabulate profiles for reports: one row per client, indexed by partition id.

    Columns are the :class:`DeviceProfile` fields in their units (FLOP/s,
    bits/s, km) with ``inf`` / ``NaN`` kept as floats, plus two convenience
    columns ``gflops_per_s`` (GFLOP/s) and ``uplink_mbps`` (Mbit/s).
    """
    import pandas as pd

    columns = [f.name for f in fields(DeviceProfile)]
    frame = pd.DataFrame([asdict(p) for p in profiles], columns=columns)
    frame["gflops_per_s"] = frame["flops_per_s"].astype(float) / 1e9
    frame["uplink_mbps"] = frame["uplink_bps"].astype(float) / 1e6
    return frame.set_index("partition_id")

