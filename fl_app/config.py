"""The run configuration: the keys of a run, resolved from the user's, a preset's and the declared defaults.

Every key is declared once, as an :class:`~fl_app.options.Option`: the core
keys in :data:`fl_app.options.CORE_OPTIONS`, a strategy's own on its class
(built-in or plugin, :mod:`fl_app.plugins`). :class:`RunConfig` derives its
defaults, types and checks from them. ``pyproject.toml``'s
``[tool.flwr.app.config]`` table (Flower requires every run-config key there)
is generated from the same declarations: ``sflower keys --write``; a test
keeps it equal.

Keys are written with hyphens, as Flower does (``num-clients``);
:class:`RunConfig` exposes them as attributes with underscores
(``cfg.num_clients``).

A plugin's keys are not in ``pyproject.toml``, and Flower refuses run-config
keys that are not there, so under ``flwr run`` they travel in the core key
``strategy-options`` (``"trim-fraction=0.2 other=1"``); ``sflower run``
takes them directly too.
"""

from __future__ import annotations

import tomllib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fl_app.errors import ConfigError
from fl_app.options import CORE_OPTIONS, Option, parse_cut_layers
from fl_app.plugins import installed_options, options_of, strategy_class

#: The core keys, in declaration order.
CORE_KEYS: tuple[str, ...] = tuple(opt.key for opt in CORE_OPTIONS)
#: Where ``preset=NAME`` finds ``NAME.toml``: the ``presets/`` folder beside the app's packages.
PRESET_DIR = Path(__file__).resolve().parents[1] / "presets"


def installed_declarations(builtin_only: bool = False) -> dict[str, Option]:
    """``key -> Option`` of the core keys and every installed strategy's keys; ``builtin_only``: of sflower's
    own strategies only, ``pyproject.toml``'s table (a plugin's keys travel in ``strategy-options``).

    Raises:
        ConfigError: a strategy redeclares a core key, or two declare one key differently.
    """
    table = {opt.key: opt for opt in CORE_OPTIONS}
    for key, opt in installed_options(builtin_only).items():
        if key in table:
            raise ConfigError(f"strategy option {key} redeclares a core key")
        table[key] = opt
    return table


def defaults() -> dict[str, Any]:
    """``pyproject.toml``'s keys (the core keys and sflower's own strategies') with their defaults, in order."""
    return {key: opt.default for key, opt in installed_declarations(builtin_only=True).items()}


def preset_names() -> list[str]:
    """The presets of :data:`PRESET_DIR`, sorted."""
    return sorted(p.stem for p in PRESET_DIR.glob("*.toml"))


def preset_values(name: str) -> dict[str, Any]:
    """The keys of preset ``name``: ``presets/NAME.toml``, or a path to a TOML file of run-config keys.

    Raises:
        ConfigError: no such preset, or the file is not a flat TOML table of keys (one line).
    """
    path = Path(name) if name.endswith(".toml") else PRESET_DIR / f"{name}.toml"
    if not path.is_file():
        raise ConfigError(f"unknown preset '{name}'; choose one of: {', '.join(preset_names())}, "
                          "or give a path to a .toml file")
    try:
        table = tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"preset {path}: {' '.join(str(err).split())[:300]}") from None
    except RecursionError:
        raise ConfigError(f"preset {path}: nested too deep") from None
    nested = [k for k, v in table.items() if isinstance(v, dict)]
    if nested:
        raise ConfigError(f"preset {path}: expected flat run-config keys, found table(s) {', '.join(nested)}")
    return {str(k): v for k, v in table.items()}


def parse_strategy_options(text: str) -> dict[str, str]:
    """The keys of a ``strategy-options`` value: ``"trim-fraction=0.2 other=1"`` (spaces or commas).

    Raises:
        ConfigError: an item without ``=``.
    """
    return parse_key_values([item for item in text.replace(",", " ").split() if item])


class RunConfig:
    """A resolved, checked run configuration.

    Build it with :meth:`from_mapping`; unknown keys and badly typed values
    raise :class:`ConfigError`. Read values as attributes with underscores
    (``cfg.batch_size``) or with :meth:`get` by their hyphenated key.
    """

    def __init__(self, values: Mapping[str, Any]) -> None:
        self._values = dict(values)

    @classmethod
    def from_mapping(cls, overrides: Mapping[str, Any] | None = None,
                     given: Iterable[str] | None = None) -> RunConfig:
        """The declared defaults, then the preset's keys, then ``overrides``; keys may use ``-`` or ``_``.

        ``preset=NAME`` (:func:`preset_values`) sets its keys except those
        the user gave: every key of ``overrides`` (``given=None``), or only
        those named in ``given``, when ``overrides`` holds every key as
        under ``flwr run`` (the ServerApp passes the keys of Flower's
        override config). A resolved configuration passed again
        (:meth:`as_dict`) resolves to itself.

        Raises:
            ConfigError: an unknown key, a value of the wrong type or outside
                its range or choices, an unknown strategy or preset (one line).
        """
        keyed = {str(k).replace("_", "-"): v for k, v in dict(overrides or {}).items()}
        extra = parse_strategy_options(str(keyed.get("strategy-options", "") or ""))
        for key, value in extra.items():
            if key in keyed and str(keyed[key]) != value:
                raise ConfigError(f"{key} is given twice, as {keyed[key]!r} and in strategy-options as {value!r}")
            keyed.setdefault(key, value)
        explicit = set(keyed) if given is None else {str(k).replace("_", "-") for k in given} | set(extra)
        preset = str(keyed.get("preset", "") or "")
        if preset:
            for key, value in preset_values(preset).items():
                if key not in explicit:
                    keyed[key] = value
        declared = {opt.key: opt for opt in CORE_OPTIONS}
        chosen = strategy_class(str(keyed.get("strategy", declared["strategy"].default)))
        declared.update(installed_declarations(builtin_only=True))  # pyproject.toml's keys
        for opt in options_of(chosen):  # a plugin's own keys (built-in ones are declared already)
            if opt.key in declared and declared[opt.key] is not opt and opt.key in CORE_KEYS:
                raise ConfigError(f"strategy {chosen.name} redeclares the core key {opt.key}")
            declared.setdefault(opt.key, opt)
        values = {key: opt.default for key, opt in declared.items()}
        for key, raw in keyed.items():
            opt = declared.get(key)
            if opt is None:
                close = [k for k in declared if k.split("-")[0] == key.split("-")[0]]
                hint = f" (did you mean {', '.join(close)}?)" if close else ""
                if key in installed_declarations():
                    hint = f" of strategy {chosen.name}: it belongs to another installed strategy"
                raise ConfigError(f"unknown run-config key '{key}'{hint}")
            values[key] = opt.coerce(raw)
            opt.validate(values[key])
        values["strategy-options"] = ""  # its keys are now keys of their own (flwr run's sends fold them back)
        _resolve_cut_layers(values, explicit)
        cfg = cls(values)
        cfg._check()
        return cfg

    def _check(self) -> None:
        """The checks between core keys (each key's own are its :class:`Option`'s)."""
        if self.concurrency > self.num_clients:
            raise ConfigError(f"concurrency={self.concurrency} exceeds num-clients={self.num_clients}")
        if not 0 <= self.min_clients <= self.num_clients:
            raise ConfigError(f"min-clients must be in 0..num-clients ({self.num_clients}), got {self.min_clients}")

    def __getattr__(self, name: str) -> Any:
        values = self.__dict__.get("_values")
        key = name.replace("_", "-")
        if values is not None and key in values:
            return values[key]
        raise AttributeError(name)

    def get(self, key: str) -> Any:
        """The value of a hyphenated key."""
        return self._values[key]

    def as_dict(self) -> dict[str, Any]:
        """All keys with hyphens, JSON-friendly (a copy)."""
        return dict(self._values)

    def replace(self, **changes: Any) -> RunConfig:
        """A new checked config with some keys changed (underscored names)."""
        values = self.as_dict()
        values.update({k.replace("_", "-"): v for k, v in changes.items()})
        return RunConfig.from_mapping(values)

    def __repr__(self) -> str:
        return f"RunConfig({self._values!r})"



def _resolve_cut_layers(values: dict[str, Any], explicit: set[str]) -> None:
    """With ``cut-layers=c1,c2`` the run's cut layer is ``c1`` (the head's end: what ``end == 0`` means in
    the protocol); ``values["cut-layer"]`` is set to it.

    Raises:
        ConfigError: ``cut-layer`` given (not its default) and different from ``c1`` (one line).
    """
    cuts = parse_cut_layers(values.get("cut-layers", ""))
    if cuts is None:
        return
    if "cut-layer" in explicit and int(values["cut-layer"]) != cuts[0]:
        raise ConfigError(f"cut-layer={values['cut-layer']} contradicts cut-layers={values['cut-layers']}: "
                          f"the head ends at c1={cuts[0]}; give cut-layers alone")
    values["cut-layer"] = cuts[0]


def parse_key_values(pairs: list[str]) -> dict[str, str]:
    """Parse ``["key=value", ...]`` from the command line.

    Raises:
        ConfigError: for an item without ``=``.
    """
    out: dict[str, str] = {}
    for item in pairs:
        if "=" not in item:
            raise ConfigError(f"expected KEY=VALUE, got '{item}'")
        key, value = item.split("=", 1)
        out[key.strip()] = value.strip()
    return out
