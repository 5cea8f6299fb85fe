"""Strategy registry: name -> class.

A new algorithm is one new class decorated with :func:`register` in a module
listed in :data:`STRATEGY_MODULES` (or imported before the run starts).
"""

from __future__ import annotations

import importlib

from fl_app.errors import ConfigError

_REGISTRY: dict[str, type] = {}

#: Modules that define the built-in strategies (imported on first lookup).
STRATEGY_MODULES = ("strategies.algorithms.splitfed", "strategies.algorithms.psl", "strategies.algorithms.s2fl", "strategies.algorithms.gapsl", "strategies.algorithms.mu_splitfed", "strategies.algorithms.gas.strategy", "strategies.algorithms.fl", "strategies.algorithms.ringsfl.strategy")


def register(cls: type) -> type:
    """Class decorator: make a strategy available under ``cls.name``.

    Raises:
        ValueError: the name is empty or already taken by another class.
    """
    name = getattr(cls, "name", "")
    if not name:
        raise ValueError(f"{cls.__name__} needs a non-empty `name`")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"strategy name '{name}' is already registered by {_REGISTRY[name].__name__}")
    _REGISTRY[name] = cls
    return cls


def _load_builtin() -> None:
    for module in STRATEGY_MODULES:
        importlib.import_module(module)


def strategy_names() -> list[str]:
    """All registered strategy names, sorted."""
    _load_builtin()
    return sorted(_REGISTRY)


def get_strategy(name: str) -> type:
    """The strategy class registered under ``name``.

    Raises:
        ConfigError: unknown name (the message lists the known ones).
    """
    _load_builtin()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown strategy '{name}'; choose one of: {', '.join(sorted(_REGISTRY))}")
    return _REGISTRY[name]
