"""Device heterogeneity models: how fast each client computes and communicates.

A *profile* (:class:`DeviceProfile`) describes one client's device: its compute
speed in FLOP/s, its uplink and downlink rates in bits/s and, for the wireless
model, its distance to the server in km. :class:`DeviceTiming` turns work
(FLOPs, bits sent, bits received) into virtual seconds on that device; the
event loop uses those seconds to order client replies (DESIGN.md §5 and §6).

Device models live in a registry, as strategies do: each model is one
subclass of :class:`DeviceModel` decorated with :func:`register_device_model`,
and its ``name`` is the value of the ``heterogeneity`` config key.
:func:`device_model_names` lists every registered model; the three built-in
ones (:data:`HETEROGENEITY`) are:

``"gas"``
    The wireless cell of the GAS paper (gas-aaai2025, "Experimental setup"; its
    reference code sets the constants). Client ``k`` gets a compute speed
    ``f_k ~ U[1e9, 1e10]`` FLOP/s and a distance ``r_k ~ U[0.1, 1]`` km from
    the server at the centre of a 1 km cell. The path loss is
    ``128.1 + 37.6 log10(r)`` dB (3GPP, Abeta 2010), the channel gain
    ``h = 10^(-PL/10)`` and the uplink rate (orthogonal access)
    ``R_k = W log2(1 + P h / (W N0))`` with ``W = 10`` MHz, ``P = 0.2`` W and
    ``N0 = -174`` dBm/Hz ``= 3.981e-21`` W/Hz. Downlink time is ignored
    unless asked for, in which case the downlink uses the same rate.
``"exponential"``
    The straggler model of MU-SplitFed (mu-splitfed, "Experimental Setup",
    following GAS and Reisizadeh et al. 2022): every device has the same speed
    (5e9 FLOP/s) and communication is free, but each exchange's computation
    time is multiplied by an independent ``Exp(1)`` draw (mean 1), so the mean
    time equals the nominal one while single exchanges straggle.
``"none"``
    Identical devices (5e9 FLOP/s), free communication: a homogeneous baseline.

Everything is drawn from the run's seed, and a given client's profile and
delays do not depend on how many clients there are or on the order in which
exchanges are timed, so runs are reproducible whatever the real scheduling.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, fields
from numbers import Integral, Real
from typing import TYPE_CHECKING, Any, ClassVar, Sequence, TypeVar

import numpy as np

from fl_app.errors import ConfigError
from strategies.clock import Timing

if TYPE_CHECKING:  # pragma: no cover - only for type checkers
    import pandas as pd

__all__ = [
    "HETEROGENEITY",
    "DeviceModel",
    "register_device_model",
    "device_model_names",
    "get_device_model",
    "GasModel",
    "ExponentialModel",
    "HomogeneousModel",
    "STRAGGLERS",
    "GAS_FLOPS_RANGE",
    "GAS_DISTANCE_RANGE_KM",
    "GAS_BANDWIDTH_HZ",
    "GAS_TX_POWER_W",
    "GAS_NOISE_W_PER_HZ",
    "DEFAULT_FLOPS_PER_S",
    "path_loss_db",
    "channel_rate_bps",
    "DeviceProfile",
    "draw_profiles",
    "DeviceTiming",
    "profiles_frame",
]

#: Values of :attr:`DeviceProfile.straggler`.
STRAGGLERS: tuple[str, ...] = ("none", "exponential")

#: GAS: client compute speed range, FLOP/s (uniform).
GAS_FLOPS_RANGE: tuple[float, float] = (1e9, 1e10)
#: GAS: client distance to the server, km (uniform; 1 km cell radius).
GAS_DISTANCE_RANGE_KM: tuple[float, float] = (0.1, 1.0)
#: GAS: total uplink bandwidth W, Hz (10 MHz).
GAS_BANDWIDTH_HZ: float = 10e6
#: GAS: client transmit power P, W.
GAS_TX_POWER_W: float = 0.2
#: GAS: noise power spectral density N0 = -174 dBm/Hz, in W/Hz.
GAS_NOISE_W_PER_HZ: float = 3.981e-21
#: Compute speed of every device in the "exponential" and "none" models, FLOP/s.
DEFAULT_FLOPS_PER_S: float = 5e9

# Sub-seed tags, so that profile draws and straggler delays are independent of
# each other and of any other use of the run's seed.
_PROFILE_STREAM = 1
_DELAY_STREAM = 2


# --------------------------------------------------------------------------
# Wireless channel (GAS paper)
# --------------------------------------------------------------------------


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


# --------------------------------------------------------------------------
# Profiles
# --------------------------------------------------------------------------


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


def _check_int(name: str, value: Any, minimum: int) -> int:
    if not isinstance(value, Integral) or isinstance(value, bool) or value < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    return int(value)


# --------------------------------------------------------------------------
# Device models (registry)
# --------------------------------------------------------------------------


class DeviceModel(ABC):
    """A heterogeneity model: draws one :class:`DeviceProfile` per client.

    A new model is one subclass decorated with :func:`register_device_model`
    that sets :attr:`name` (the ``heterogeneity`` config value), cites its
    source in the docstring and implements :meth:`profile`. Models take no
    constructor arguments.

    :meth:`draw` builds profile ``k`` from its own generator
    ``np.random.default_rng([seed, 1, k])`` (see :meth:`rng`), so profile
    ``k`` depends only on ``(model, seed, k)``: adding clients keeps the
    earlier profiles, and the draws are independent of other uses of the
    run's seed.
    """

    #: Registry key and value of the ``heterogeneity`` config key.
    name: ClassVar[str] = ""

    @staticmethod
    def rng(seed: int, partition_id: int) -> np.random.Generator:
        """The generator of client ``partition_id``'s profile:
        ``np.random.default_rng([seed, 1, partition_id])``."""
        return np.random.default_rng([seed, _PROFILE_STREAM, partition_id])

    @abstractmethod
    def profile(self, partition_id: int, seed: int, *, downlink: bool) -> DeviceProfile:
        """The profile of client ``partition_id`` for the run's ``seed``.

        Args:
            partition_id: the client, >= 0.
            seed: the run's seed, >= 0 (use :meth:`rng` for random draws).
            downlink: whether downlink time is charged (models that ignore
                communication may ignore it).
        """

    def draw(self, num_clients: int, seed: int, *, downlink: bool = False) -> list[DeviceProfile]:
        """Draw the profiles of ``num_clients`` clients (partition ids 0..n-1).

        Args:
            num_clients: number of clients, >= 1.
            seed: the run's seed, an integer >= 0.
            downlink: also charge downlink time (see each model).

        Returns:
            ``num_clients`` profiles ordered by partition id.

        Raises:
            ConfigError: ``num_clients < 1`` or a negative / non-integer ``seed``.
        """
        n = _check_int("num_clients", num_clients, 1)
        seed = _check_int("seed", seed, 0)
        return [self.profile(k, seed, downlink=downlink) for k in range(n)]

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"


_DEVICE_MODELS: dict[str, type[DeviceModel]] = {}

_M = TypeVar("_M", bound=type[DeviceModel])


def register_device_model(cls: _M) -> _M:
    """Class decorator: make a :class:`DeviceModel` available under ``cls.name``.

    Raises:
        TypeError: ``cls`` is not a :class:`DeviceModel` subclass.
        ValueError: the name is empty or already taken by another class.
    """
    if not (isinstance(cls, type) and issubclass(cls, DeviceModel)):
        raise TypeError(f"{cls!r} is not a DeviceModel subclass")
    name = cls.name
    if not name:
        raise ValueError(f"{cls.__name__} needs a non-empty `name`")
    if name in _DEVICE_MODELS and _DEVICE_MODELS[name] is not cls:
        raise ValueError(
            f"device model name '{name}' is already registered by {_DEVICE_MODELS[name].__name__}"
        )
    _DEVICE_MODELS[name] = cls
    return cls


def device_model_names() -> tuple[str, ...]:
    """Names of all registered device models, built-in ones first, in registration order."""
    return tuple(_DEVICE_MODELS)


def get_device_model(name: str) -> type[DeviceModel]:
    """The device model class registered under ``name``.

    Raises:
        ConfigError: unknown name (the message lists the known ones).
    """
    try:
        return _DEVICE_MODELS[name]
    except (KeyError, TypeError):  # TypeError: unhashable name
        raise ConfigError(
            f"unknown heterogeneity model {name!r}; "
            f"choose one of {', '.join(device_model_names())}"
        ) from None


@register_device_model
class GasModel(DeviceModel):
    """The wireless cell of the GAS paper (gas-aaai2025, "Experimental setup").

    ``f_k ~ U[1e9, 1e10]`` FLOP/s (:data:`GAS_FLOPS_RANGE`), then
    ``r_k ~ U[0.1, 1]`` km (:data:`GAS_DISTANCE_RANGE_KM`), both from
    :meth:`DeviceModel.rng`; ``uplink_bps = channel_rate_bps(r_k)``;
    ``downlink_bps`` is the same rate when ``downlink`` is true, else ``inf``
    (downlink time ignored). No stragglers.
    """

    name = "gas"

    def profile(self, partition_id: int, seed: int, *, downlink: bool) -> DeviceProfile:
        """Client ``partition_id``'s GAS device (see the class docstring)."""
        rng = self.rng(seed, partition_id)
        flops = float(rng.uniform(*GAS_FLOPS_RANGE))
        distance = float(rng.uniform(*GAS_DISTANCE_RANGE_KM))
        rate = float(channel_rate_bps(distance))
        return DeviceProfile(
            partition_id=partition_id,
            flops_per_s=flops,
            uplink_bps=rate,
            downlink_bps=rate if downlink else math.inf,
            distance_km=distance,
            straggler="none",
        )


@register_device_model
class ExponentialModel(DeviceModel):
    """MU-SplitFed stragglers (mu-splitfed, "Experimental Setup", following GAS
    and Reisizadeh et al. 2022).

    Every device computes at :data:`DEFAULT_FLOPS_PER_S` (5e9 FLOP/s) and
    communication is free (infinite rates; ``downlink`` is ignored), but the
    profile is marked ``straggler="exponential"``: :class:`DeviceTiming`
    multiplies each exchange's compute time by an ``Exp(λ)`` draw
    (``straggler-rate`` λ, default 1: mean 1).
    """

    name = "exponential"

    def profile(self, partition_id: int, seed: int, *, downlink: bool) -> DeviceProfile:
        """A 5e9 FLOP/s straggling device with free communication."""
        return DeviceProfile(
            partition_id=partition_id, flops_per_s=DEFAULT_FLOPS_PER_S, straggler="exponential"
        )


@register_device_model
class HomogeneousModel(DeviceModel):
    """Identical devices: a homogeneous baseline (no paper source needed).

    Every device computes at :data:`DEFAULT_FLOPS_PER_S` (5e9 FLOP/s),
    communication is free (``downlink`` is ignored) and there are no
    stragglers.
    """

    name = "none"

    def profile(self, partition_id: int, seed: int, *, downlink: bool) -> DeviceProfile:
        """A 5e9 FLOP/s device with free communication."""
        return DeviceProfile(partition_id=partition_id, flops_per_s=DEFAULT_FLOPS_PER_S)


@register_device_model
class RingTestbedModel(DeviceModel):
    """RingSFL's prototype: 2 PCs and the rest Raspberry Pis, all on 135 Mbit/s links (RingSFL Sec. 4.1.1).

    The paper's testbed has two PC nodes (Intel i7-11700) as ``u_0, u_1`` and
    three Raspberry Pi 4 nodes (Cortex-A72 @ 1.5 GHz) as ``u_2 … u_4``, with
    D2D TCP rates of 135 Mbit/s. It gives no FLOP/s figures; we take
    :data:`PC_FLOPS_PER_S` = 2e10 for a PC and :data:`PI_FLOPS_PER_S` = 2.5e9
    for a Pi (the 8:1 ratio of single-core PyTorch throughput we assume for
    the two CPUs). Client ``k < 2`` is a PC, every other client a Pi; uplink
    (and, with ``downlink``, downlink) at 135 Mbit/s; no stragglers.
    """

    name = "ringsfl-testbed"
    PC_FLOPS_PER_S: float = 2e10
    PI_FLOPS_PER_S: float = 2.5e9
    LINK_BPS: float = 135e6

    def profile(self, partition_id: int, seed: int, *, downlink: bool) -> DeviceProfile:
        """A PC for partitions 0 and 1, a Raspberry Pi otherwise."""
        flops = self.PC_FLOPS_PER_S if partition_id < 2 else self.PI_FLOPS_PER_S
        return DeviceProfile(partition_id=partition_id, flops_per_s=flops, uplink_bps=self.LINK_BPS,
                             downlink_bps=self.LINK_BPS if downlink else math.inf)


#: Names of the built-in device models (the ``heterogeneity`` config key);
#: :func:`device_model_names` also lists models registered later.
HETEROGENEITY: tuple[str, ...] = device_model_names()


def draw_profiles(
    kind: str, num_clients: int, seed: int, *, downlink: bool = False
) -> list[DeviceProfile]:
    """Draw the device profiles of ``num_clients`` clients (partition ids 0..n-1).

    Looks up the registered :class:`DeviceModel` named ``kind`` and calls its
    :meth:`~DeviceModel.draw`. Built-in models (see the module docstring and
    each class for sources):

    * ``"gas"`` (:class:`GasModel`, GAS paper): ``f_k ~ U[1e9, 1e10]`` FLOP/s,
      ``r_k ~ U[0.1, 1]`` km, ``uplink_bps = channel_rate_bps(r_k)``;
      ``downlink_bps`` is the same rate if ``downlink`` else ``inf``.
    * ``"exponential"`` (:class:`ExponentialModel`, MU-SplitFed):
      ``f = 5e9`` FLOP/s for all, infinite rates, ``straggler="exponential"``.
    * ``"none"`` (:class:`HomogeneousModel`): ``f = 5e9`` FLOP/s for all,
      infinite rates, no stragglers.
    * ``"ringsfl-testbed"`` (:class:`RingTestbedModel`, RingSFL's prototype):
      2 PCs (2e10 FLOP/s) then Raspberry Pis (2.5e9 FLOP/s), 135 Mbit/s links.

    Profile ``k`` is drawn from its own generator
    ``np.random.default_rng([seed, 1, k])``, so it depends only on
    ``(kind, seed, k)``: adding clients keeps the earlier profiles, and the
    draws are independent of other uses of ``seed``.

    Args:
        kind: a name from :func:`device_model_names`.
        num_clients: number of clients, >= 1.
        seed: the run's seed, an integer >= 0.
        downlink: GAS only: also charge downlink time, at the uplink rate.

    Returns:
        A list of ``num_clients`` profiles, ordered by partition id.

    Raises:
        ConfigError: for an unknown ``kind`` (the message lists the known
            ones), ``num_clients < 1`` or a negative / non-integer ``seed``.
    """
    model = get_device_model(kind)()
    return model.draw(num_clients, seed, downlink=downlink)


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


# --------------------------------------------------------------------------
# Timing
# --------------------------------------------------------------------------


class DeviceTiming(Timing):
    """Maps work to virtual seconds on each client's device.

    ``duration = flops / f_k * s + bits_up / uplink_bps + bits_down / downlink_bps``
    where ``s = 1`` for ordinary devices and ``s ~ Exp(λ)`` (MU-SplitFed
    stragglers, rate ``λ = straggler_rate``, mean ``1/λ``) when the profile's
    ``straggler`` is ``"exponential"``; infinite rates contribute 0 s. With
    ``draw=None`` the expected duration is returned (``s = 1/λ``).

    What FLOPs to charge is the caller's choice (e.g. GAS reference-code
    accounting, ``batch-parallel``, charges one sample per pass: see
    :class:`fl_app.costs.BlockCosts` and DESIGN.md §6).

    Args:
        profiles: one profile per client; partition ids must be unique.
        seed: the run's seed (integer >= 0) for the straggler delays.
        straggler_rate: λ of the exponential straggler factor (> 0; the
            ``straggler-rate`` run-config key).

    Raises:
        ConfigError: for an empty profile list, duplicate partition ids, a
            bad seed or a non-positive rate.
    """

    def __init__(self, profiles: Sequence[DeviceProfile], seed: int, straggler_rate: float = 1.0) -> None:
        if len(profiles) == 0:
            raise ConfigError("DeviceTiming needs at least one device profile")
        if not (straggler_rate > 0 and math.isfinite(straggler_rate)):
            raise ConfigError(f"straggler-rate must be positive and finite, got {straggler_rate!r}")
        self.seed: int = _check_int("seed", seed, 0)
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

    def __repr__(self) -> str:
        return f"DeviceTiming({len(self._profiles)} devices, seed={self.seed})"
