"""The engine keys of ``sflower run``: which engine runs a job, and the size of its Ray instance.

``engine``, ``ray-address``, ``ray-cpus`` and ``ray-gpus`` choose how a job
executes, not what it computes, so they are not run-config keys (a run's
numbers are the same on both engines). They are declared as run-config keys
are, as :class:`~fl_app.run.options.Option`s, and parsed by the same parser
(:meth:`~fl_app.run.options.Option.coerce`, :meth:`~fl_app.run.options.Option.validate`).
"""

from __future__ import annotations

import re
from typing import Any

from fl_app.run.errors import ConfigError
from fl_app.run.options import Option
from simulation.engine import ENGINES

#: ``sflower run`` keys of the Ray engine (``engine=ray`` only), see :func:`pop_engine_options`.
RAY_ADDRESS_KEY = "ray-address"
RAY_CPUS_KEY = "ray-cpus"
RAY_GPUS_KEY = "ray-gpus"
RAY_IDLE_KEY = "ray-idle"
_HOST_PORT = re.compile(r"^(\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.-]+):([0-9]{1,5})$")


def check_ray_address(address: str) -> str:
    """Validate a ``ray-address``: ``auto`` (the cluster ``ray start`` runs on this machine) or ``HOST:PORT``.

    Returns:
        the address, stripped.

    Raises:
        ConfigError: anything else (one line).
    """
    value = str(address).strip()
    match = _HOST_PORT.match(value)
    if value == "auto" or (match and 0 < int(match.group(2)) < 65536):
        return value
    raise ConfigError(f"{RAY_ADDRESS_KEY}='{address}': expected auto or HOST:PORT of a Ray head "
                      f"(the address 'ray start --head' prints, e.g. 10.0.0.5:6379)")


def _check_address(value: str) -> None:
    check_ray_address(value)


def _check_cpus(value: int) -> None:
    if value < 1:
        raise ConfigError(f"{RAY_CPUS_KEY}={value}: expected a positive integer")


def _check_gpus(value: float) -> None:
    if not 0.0 <= value <= 1.0:
        raise ConfigError(f"{RAY_GPUS_KEY}={value:g}: expected a GPU fraction per client in [0, 1]")


#: The engine keys: ``engine`` and the Ray engine's three.
ENGINE_OPTIONS: tuple[Option, ...] = (
    Option("engine", "inprocess", "the engine: `inprocess` (one process, checkpoints) or `ray` (Flower's "
           "simulation engine)", choices=ENGINES),
    Option(RAY_ADDRESS_KEY, "", "`engine=ray`: join the Ray cluster at `auto` (this machine's) or `HOST:PORT`",
           check=_check_address),
    Option(RAY_CPUS_KEY, 1, "`engine=ray`: the local Ray instance's CPUs, one client actor each", check=_check_cpus),
    Option(RAY_GPUS_KEY, 0.0, "`engine=ray`: each client actor's GPU fraction (0.25: four clients per GPU)",
           check=_check_gpus),
    Option(RAY_IDLE_KEY, False, "`engine=ray`: client actors run at Linux's idle priority (SCHED_IDLE), so that "
           "they never slow the ServerApp's cores; for a machine that runs nothing else"),
)
_OPTIONS = {opt.key: opt for opt in ENGINE_OPTIONS}


def _value(key: str, raw: str) -> Any:
    """``raw`` parsed and checked as engine key ``key``."""
    opt = _OPTIONS[key]
    value = opt.coerce(raw)
    opt.validate(value)
    return value


def split_engine(pairs: dict[str, str]) -> tuple[str, dict[str, str]]:
    """Remove ``engine`` from ``sflower run`` pairs: ``(the engine, the pairs left)``.

    Raises:
        ConfigError: an unknown engine (one line).
    """
    engine = _value("engine", pairs.pop("engine")) if "engine" in pairs else _OPTIONS["engine"].default
    return engine, pairs


def pop_engine_options(engine: str, pairs: dict[str, str]) -> dict[str, Any]:
    """Remove the engine's own keys from ``sflower run`` pairs; the keyword arguments of the engine.

    ``ray-address=auto|HOST:PORT`` joins an existing Ray cluster and
    ``ray-cpus=N`` sizes the local Ray instance (one client actor per CPU);
    both need ``engine=ray``, and they exclude each other (a cluster's size
    is its nodes' ``--num-cpus``). ``ray-gpus=F`` gives each client actor
    the GPU fraction ``F`` (Flower's ``client-resources-num-gpus``; 0.25 =
    four clients per GPU), so that ``device=auto`` finds a GPU in the actors.
    ``ray-idle=true`` runs the client actors in Linux's ``SCHED_IDLE`` class
    (:func:`simulation.ray_engine._yield_cpu`).

    Raises:
        ConfigError: a key for another engine, a bad address, CPU count or
            GPU fraction, or ``ray-gpus`` on a local instance without a GPU.
    """
    given = {key: pairs.pop(key) for key in (RAY_ADDRESS_KEY, RAY_CPUS_KEY, RAY_GPUS_KEY, RAY_IDLE_KEY)
             if key in pairs}
    if given and engine != "ray":
        raise ConfigError(f"{next(iter(given))} needs engine=ray (engine is {engine})")
    if RAY_ADDRESS_KEY in given and RAY_CPUS_KEY in given:
        raise ConfigError(f"give {RAY_ADDRESS_KEY} or {RAY_CPUS_KEY}, not both: a cluster's CPUs are its "
                          f"nodes' (ray start --num-cpus)")
    names = {RAY_ADDRESS_KEY: "address", RAY_CPUS_KEY: "num_cpus", RAY_GPUS_KEY: "num_gpus",
             RAY_IDLE_KEY: "idle_actors"}
    opts = {names[key]: _value(key, raw) for key, raw in given.items()}
    if "address" in opts:
        opts["address"] = check_ray_address(opts["address"])
    if opts.get("num_gpus", 0.0) > 0 and "address" not in opts:
        import torch

        if not torch.cuda.is_available():
            raise ConfigError(f"{RAY_GPUS_KEY}={given[RAY_GPUS_KEY]} but this machine has no GPU that torch sees "
                              f"(Ray would wait for one forever)")
    return opts
