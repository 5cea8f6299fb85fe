"""The strategy catalogue: built-in strategies and plugins, found the same way.

A strategy is a class with a ``name`` and, optionally, ``options``
(:class:`~fl_app.run.options.Option` declarations). It becomes available in one
of three ways:

* an entry point of the group :data:`GROUP` (``sflower.strategies``) in any
  installed package's metadata, whose value is a module (every class it
  registers with :func:`register`) or a ``module:Class``. sflower's own
  strategies are entry points of its ``pyproject.toml``, like any plugin's;
* ``strategy=package.module:Class`` in the run configuration, which imports
  the module (it must be importable in every process that runs the app: the
  ServerApp, Ray actors, SuperNodes);
* :func:`register` on a class imported before the run (tests, scripts).

This module knows no algorithm: it holds classes by name and reads their
``options``. Loading a class imports its module and nothing else.
"""

from __future__ import annotations

import importlib
from importlib.metadata import entry_points
from typing import Any

from fl_app.run.errors import ConfigError
from fl_app.run.options import Option

#: The entry-point group of strategy plugins (and of sflower's built-in strategies).
GROUP = "sflower.strategies"

#: The distribution whose entry points are the built-in strategies (their keys are ``pyproject.toml``'s).
BUILTIN_DISTRIBUTION = "sflower"

_REGISTRY: dict[str, type] = {}
_BUILTIN: set[str] = set()
_loaded = False


def register(cls: type) -> type:
    """Class decorator: make a strategy available under ``cls.name``.

    Raises:
        ValueError: the name is empty or already taken by another class.
    """
    name = getattr(cls, "name", "")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{cls.__name__} needs a non-empty string `name`")
    if name in _REGISTRY and _REGISTRY[name] is not cls:
        raise ValueError(f"strategy name '{name}' is already registered by {_REGISTRY[name].__name__}")
    _REGISTRY[name] = cls
    return cls


def load_entry_points() -> None:
    """Import every entry point of :data:`GROUP` once (a class entry is registered).

    Raises:
        ConfigError: an entry point fails to import, or none is installed (sflower itself not installed).
    """
    global _loaded
    if _loaded:
        return
    _loaded = True
    found = entry_points(group=GROUP)
    builtin_modules = {ep.module for ep in found if ep.dist is not None and ep.dist.name == BUILTIN_DISTRIBUTION}
    for ep in found:
        try:
            obj = ep.load()
        except Exception as err:  # a broken plugin must not take the run down with a traceback
            _loaded = False
            raise ConfigError(f"strategy plugin '{ep.name}' ({ep.value}) failed to import: "
                              f"{type(err).__name__}: {err}") from None
        if isinstance(obj, type) and isinstance(getattr(obj, "name", None), str) and _REGISTRY.get(obj.name) is not obj:
            register(obj)
    _BUILTIN.update(name for name, cls in _REGISTRY.items() if cls.__module__ in builtin_modules)
    if not found:
        raise ConfigError(f"no strategy is installed under the entry-point group '{GROUP}': install sflower "
                          "(pip install -e .), whose built-in strategies are entry points too")


def _import_class(spec: str) -> type:
    """The class of ``package.module:Class``, registered under its ``name``."""
    module_name, _, attr = spec.partition(":")
    try:
        module = importlib.import_module(module_name)
    except Exception as err:
        raise ConfigError(f"strategy={spec}: cannot import {module_name}: {type(err).__name__}: {err}") from None
    cls = getattr(module, attr, None)
    if not isinstance(cls, type) or not isinstance(getattr(cls, "name", None), str) or not cls.name:
        raise ConfigError(f"strategy={spec}: {module_name} has no strategy class {attr!r} (a class with a `name`)")
    if _REGISTRY.get(cls.name) is not cls:
        register(cls)
    return cls


def strategy_class(name: str) -> type:
    """The strategy class of a ``strategy`` value: a registered name or ``package.module:Class``.

    Raises:
        ConfigError: unknown name (the message lists the known ones), or a plugin that cannot be imported.
    """
    if ":" in name:
        return _import_class(name)
    if name not in _REGISTRY:
        load_entry_points()
    if name not in _REGISTRY:
        raise ConfigError(f"unknown strategy '{name}'; choose one of: {', '.join(sorted(_REGISTRY))}, "
                          "or give a plugin class as strategy=package.module:Class")
    return _REGISTRY[name]


def strategy_names(builtin_only: bool = False) -> list[str]:
    """Every registered strategy name (entry points loaded), sorted; ``builtin_only``: sflower's own."""
    load_entry_points()
    return sorted(n for n in _REGISTRY if not builtin_only or n in _BUILTIN)


def options_of(cls: type) -> list[Option]:
    """The options ``cls`` declares and those of its base classes, base first (a subclass's wins)."""
    seen: dict[str, Option] = {}
    for klass in reversed(cls.__mro__):
        for opt in vars(klass).get("options", ()):
            seen[opt.key] = opt
    return list(seen.values())


def installed_options(builtin_only: bool = False) -> dict[str, Option]:
    """``key -> Option`` of every registered strategy (entry points loaded), by strategy name;
    ``builtin_only``: of sflower's own strategies (those of :data:`BUILTIN_DISTRIBUTION`'s entry points).

    Raises:
        ConfigError: two strategies declare one key with different types or defaults.
    """
    load_entry_points()
    out: dict[str, Option] = {}
    for name in sorted(_REGISTRY):  # by name: the same order whichever package's entry points load first
        if builtin_only and name not in _BUILTIN:
            continue
        for opt in options_of(_REGISTRY[name]):
            _merge(out, opt, name)
    return out


def _merge(table: dict[str, Any], opt: Option, owner: str) -> None:
    """Add ``opt`` to ``table`` unless the same key is declared there with another type or default."""
    known = table.get(opt.key)
    if known is None:
        table[opt.key] = opt
    elif known.type is not opt.type or known.default != opt.default:
        raise ConfigError(f"strategy '{owner}' declares {opt.key}={opt.default!r}, which another strategy "
                          f"declares as {known.default!r}: one key, one declaration")
