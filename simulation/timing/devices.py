"""Device heterogeneity models: how fast each client computes and communicates.

A model draws one *profile* (:class:`~simulation.timing.profiles.DeviceProfile`)
per client: its compute speed in FLOP/s, its uplink and downlink rates in
bits/s and, for the wireless model, its distance to the server in km.
:class:`~simulation.timing.durations.DeviceTiming` turns work (FLOPs, bits
sent, bits received) into virtual seconds on that device; the event loop uses
those seconds to order client replies (docs/explanation/design.md §5 and §6).

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
from typing import ClassVar, TypeVar

import numpy as np

from fl_app.run.errors import ConfigError
from simulation.timing.channels import channel_rate_bps
from simulation.timing.profiles import DeviceProfile, check_int

__all__ = [
    "HETEROGENEITY",
    "DeviceModel",
    "register_device_model",
    "device_model_names",
    "get_device_model",
    "GasModel",
    "ExponentialModel",
    "HomogeneousModel",
    "RingTestbedModel",
    "GAS_FLOPS_RANGE",
    "GAS_DISTANCE_RANGE_KM",
    "DEFAULT_FLOPS_PER_S",
    "draw_profiles",
]

#: GAS: client compute speed range, FLOP/s (uniform).
GAS_FLOPS_RANGE: tuple[float, float] = (1e9, 1e10)
#: GAS: client distance to the server, km (uniform; 1 km cell radius).
GAS_DISTANCE_RANGE_KM: tuple[float, float] = (0.1, 1.0)
#: Compute speed of every device in the "exponential" and "none" models, FLOP/s.
DEFAULT_FLOPS_PER_S: float = 5e9

# Sub-seed tag of the profile draws (the straggler delays use 2:
# :mod:`simulation.timing.durations`), independent of any other use of the run's seed.
_PROFILE_STREAM = 1


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
        n = check_int("num_clients", num_clients, 1)
        seed = check_int("seed", seed, 0)
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

