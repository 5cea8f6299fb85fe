"""The wireless channel of the GAS paper: path loss and uplink rate of a client in a 1 km cell.

Source: gas-aaai2025, "Experimental setup" (its reference code sets the
constants). The path loss is ``128.1 + 37.6 log10(r)`` dB at ``r`` km (3GPP,
Abeta 2010), the channel gain ``h = 10^(-PL/10)`` and the uplink rate
(orthogonal access) ``R = W log2(1 + P h / (W N0))`` with ``W = 10`` MHz,
``P = 0.2`` W and ``N0 = -174`` dBm/Hz ``= 3.981e-21`` W/Hz. The GAS device
model (:class:`simulation.timing.devices.GasModel`) gives each client its rate.
"""

from __future__ import annotations

import math
from numbers import Real
from typing import Any

import numpy as np

from fl_app.run.errors import ConfigError

__all__ = ["GAS_BANDWIDTH_HZ", "GAS_TX_POWER_W", "GAS_NOISE_W_PER_HZ", "path_loss_db", "channel_rate_bps"]

#: GAS: total uplink bandwidth W, Hz (10 MHz).
GAS_BANDWIDTH_HZ: float = 10e6
#: GAS: client transmit power P, W.
GAS_TX_POWER_W: float = 0.2
#: GAS: noise power spectral density N0 = -174 dBm/Hz, in W/Hz.
GAS_NOISE_W_PER_HZ: float = 3.981e-21
#: Compute speed of every device in the "exponential" and "none" models, FLOP/s.


def _positive_distance(distance_km: Any) -> np.ndarray:
    d = np.asarray(distance_km, dtype=float)
    if d.size and not np.all(d > 0):  # also rejects NaN
        raise ConfigError(f"distance must be positive (km), got {distance_km!r}")
    return d


def _scalar_or_array(x: np.ndarray, like: Any) -> float | np.ndarray:
    return float(x) if np.ndim(like) == 0 else x


def path_loss_db(distance_km: float | np.ndarray) -> float | np.ndarray:
    """Path loss in dB at ``distance_km`` km: ``128.1 + 37.6 * log10(r)``.

    Source: GAS paper (gas-aaai2025, experimental setup), the 3GPP macro-cell
    model cited there as Abeta 2010. 128.1 dB at 1 km, 90.5 dB at 0.1 km.

    Args:
        distance_km: distance from client to server in km, a scalar or an array.

    Returns:
        A float for scalar input, else an ``np.ndarray`` of the same shape.

    Raises:
        ConfigError: if any distance is not positive (or is NaN).
    """
    d = _positive_distance(distance_km)
    return _scalar_or_array(128.1 + 37.6 * np.log10(d), distance_km)


def channel_rate_bps(
    distance_km: float | np.ndarray,
    bandwidth_hz: float = GAS_BANDWIDTH_HZ,
    tx_power_w: float = GAS_TX_POWER_W,
    noise_w_per_hz: float = GAS_NOISE_W_PER_HZ,
) -> float | np.ndarray:
    """Shannon rate in bits/s of a client ``distance_km`` km from the server.

    ``R = W * log2(1 + P * h / (W * N0))`` with channel gain
    ``h = 10 ** (-PL / 10)`` and ``PL = path_loss_db(r)``. Defaults are the GAS
    paper's: ``W = 10`` MHz, ``P = 0.2`` W, ``N0 = -174`` dBm/Hz
    ``= 3.981e-21`` W/Hz, which give about 8.30 Mbit/s at 1 km and
    121.3 Mbit/s at 0.1 km.

    Args:
        distance_km: distance in km, a scalar or an array.
        bandwidth_hz: bandwidth ``W`` in Hz.
        tx_power_w: transmit power ``P`` in W.
        noise_w_per_hz: noise power spectral density ``N0`` in W/Hz.

    Returns:
        A float for scalar input, else an ``np.ndarray`` of the same shape.

    Raises:
        ConfigError: if a distance, the bandwidth, the power or the noise
            density is not positive.
    """
    for name, value in (
        ("bandwidth_hz", bandwidth_hz),
        ("tx_power_w", tx_power_w),
        ("noise_w_per_hz", noise_w_per_hz),
    ):
        if not (isinstance(value, Real) and value > 0 and math.isfinite(value)):
            raise ConfigError(f"{name} must be a positive finite number, got {value!r}")
    d = _positive_distance(distance_km)
    gain = 10.0 ** (-(128.1 + 37.6 * np.log10(d)) / 10.0)
    snr = tx_power_w * gain / (bandwidth_hz * noise_w_per_hz)
    rate = bandwidth_hz * np.log2(1.0 + snr)
    return _scalar_or_array(rate, distance_km)

