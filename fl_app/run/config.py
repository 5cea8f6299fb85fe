"""The run configuration: the keys of a run, resolved from the user's, a preset's and the declared defaults.

Every key is declared once, as an :class:`~fl_app.run.options.Option`: the core
keys in :data:`fl_app.run.options.CORE_OPTIONS`, a strategy's own on its class
(built-in or plugin, :mod:`fl_app.run.plugins`). :class:`RunConfig` derives its
defaults, types and checks from them. ``pyproject.toml``'s
``[tool.flwr.app.config]`` table (Flower requires every run-config key there)
is generated from the same declarations: ``sflower keys --write``; a test
keeps it equal.

A run reads the core keys and its strategy's (:func:`strategy_reads`); a key
of another strategy set to a value other than its default is an error, the
same rule for built-in strategies and plugins (docs/reference/config.md,
"Which keys a run takes"). A preset names its strategy; applied to another,
it needs ``preset-any-strategy=true``. Derived values (``cuts``, ``ushaped``,
``lossless_up``) are :class:`RunConfig` properties, read nowhere else.

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

from fl_app.run.errors import ConfigError
from fl_app.run.options import CORE_OPTIONS, Option, core_option, parse_cut_layers
from fl_app.run.plugins import installed_options, options_of, strategy_class, strategy_names

#: The core keys, in declaration order.
CORE_KEYS: tuple[str, ...] = tuple(opt.key for opt in CORE_OPTIONS)
#: Where ``preset=NAME`` finds ``NAME.toml``: the ``presets/`` folder beside the app's packages.
PRESET_DIR = Path(__file__).resolve().parents[2] / "presets"


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


def given_or_default(pairs: Mapping[str, Any], key: str) -> Any:
    """``pairs[key]`` as given (a command line's pairs, a saved ``config.json``, a sweep's run), else the
    declared default of core key ``key``: the one place a raw mapping's missing key takes its default.

    Raises:
        KeyError: ``key`` is not a core key.
    """
    return pairs[key] if key in pairs else core_option(key).default


def read_toml(path: Path, what: str) -> dict[str, Any]:
    """The table of TOML file ``path`` (a preset, a sweep file: untrusted input, data only).

    Args:
        path: the file.
        what: how the error names the file (``preset PATH``, ``sweep file 'PATH'``).

    Raises:
        ConfigError: unreadable, not UTF-8, not valid TOML, or nested too deep for the parser (one line).
    """
    try:
        return tomllib.loads(path.read_text())
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as err:
        raise ConfigError(f"{what} is not valid TOML: {' '.join(str(err).split())[:300]}") from None
    except RecursionError:
        raise ConfigError(f"{what} is nested too deep") from None


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
    table = read_toml(path, f"preset {path}")
    nested = [k for k, v in table.items() if isinstance(v, dict)]
    if nested:
        raise ConfigError(f"preset {path}: expected flat run-config keys, found table(s) {', '.join(nested)}")
    if not isinstance(table.get("strategy"), str) or not table["strategy"]:
        raise ConfigError(f"preset {path}: names no strategy (add a line strategy = \"NAME\": the strategy it is "
                          "made for)")
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
        core = {opt.key: opt for opt in CORE_OPTIONS}
        preset = str(keyed.get("preset", "") or "")
        applied = {k: v for k, v in preset_values(preset).items() if k not in explicit} if preset else {}
        name = str(applied.get("strategy", keyed.get("strategy", core["strategy"].default)))
        chosen = strategy_class(name)
        reads = strategy_reads(chosen)
        if preset:
            applied = _preset_keys(preset, applied, keyed, reads, chosen.name)
        keyed.update(applied)
        declared = dict(core)
        declared.update(installed_declarations(builtin_only=True))  # pyproject.toml's keys
        for opt in options_of(chosen):  # a plugin's own keys (built-in ones are declared already)
            if opt.key in declared and declared[opt.key] is not opt and opt.key in CORE_KEYS:
                raise ConfigError(f"strategy {chosen.name} redeclares the core key {opt.key}")
            declared.setdefault(opt.key, opt)
        values = {key: opt.default for key, opt in declared.items()}
        for key, raw in keyed.items():
            opt = declared.get(key) or _not_read(key, raw, chosen.name, declared)
            values[key] = opt.coerce(raw)
            opt.validate(values[key])
            if key not in reads and values[key] != opt.default:
                raise ConfigError(_not_read_message(key, raw, chosen.name))
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

    @property
    def cuts(self) -> tuple[int, int] | None:
        """``cut-layers`` as ``(c1, c2)``: the head is blocks ``[0, c1)``, the server's middle ``[c1, c2)``,
        the client's tail ``[c2, L)``; None for the prefix split at ``cut-layer``. The one reading of the key."""
        return parse_cut_layers(self._values["cut-layers"])

    @property
    def ushaped(self) -> bool:
        """The run is label-private (U-shaped, ``cut-layers=c1,c2``): the labels stay on the clients."""
        return self.cuts is not None

    @property
    def lossless_up(self) -> bool:
        """What clients send up arrives exactly as computed: ``compress-up=none`` (float32)."""
        return self._values["compress-up"] == "none"

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



def strategy_reads(cls: type) -> frozenset[str]:
    """The keys strategy class ``cls`` reads: the core keys (:data:`CORE_KEYS`) and those its class and
    its bases declare (:func:`~fl_app.run.plugins.options_of`), built-in or plugin alike."""
    return frozenset(CORE_KEYS) | {opt.key for opt in options_of(cls)}


def _owners(key: str) -> list[str]:
    """The installed strategies that declare ``key``, sorted."""
    return [name for name in strategy_names() if key in strategy_reads(strategy_class(name))]


def _not_read_message(key: str, raw: Any, strategy: str) -> str:
    """The one-line error of a key that strategy ``strategy`` does not read, set to ``raw`` (not its default)."""
    owners = _owners(key)
    owned = f" (a key of {', '.join(owners)})" if owners else ""
    return (f"{key}={raw} is not read by strategy {strategy}{owned}: remove it, or choose a strategy that "
            "reads it")


def _not_read(key: str, raw: Any, strategy: str, declared: Mapping[str, Option]) -> Option:
    """The option of ``key``, a key outside ``declared`` (another plugin's, at most), given as ``raw``.

    Raises:
        ConfigError: ``key`` is no installed strategy's (unknown, with a hint), or it is another
            strategy's and ``raw`` is not its default (one line).
    """
    opt = installed_declarations().get(key)
    if opt is None:
        close = [k for k in declared if k.split("-")[0] == key.split("-")[0]]
        hint = f" (did you mean {', '.join(close)}?)" if close else ""
        raise ConfigError(f"unknown run-config key '{key}'{hint}")
    if opt.coerce(raw) != opt.default:
        raise ConfigError(_not_read_message(key, raw, strategy))
    return opt


def _preset_keys(preset: str, applied: dict[str, Any], keyed: Mapping[str, Any], reads: frozenset[str],
                 strategy: str) -> dict[str, Any]:
    """The keys preset ``preset`` sets (``applied``: those the user did not give), checked against the
    run's strategy ``strategy``, which reads ``reads``.

    A preset names its strategy (:func:`preset_values`). Applied to another
    strategy (one the user gave), it is refused unless
    ``preset-any-strategy=true``; then only its keys that ``strategy`` reads are set.

    Raises:
        ConfigError: the preset's strategy is not the run's and ``preset-any-strategy`` is false (one line).
    """
    made_for = str(preset_values(preset)["strategy"])
    if "strategy" in applied or strategy_class(made_for) is strategy_class(str(keyed.get("strategy", made_for))):
        return applied
    any_strategy = core_option("preset-any-strategy")
    if not any_strategy.coerce(keyed.get("preset-any-strategy", any_strategy.default)):
        raise ConfigError(f"preset={preset} is made for strategy={made_for}, not {strategy}: give "
                          "preset-any-strategy=true to apply its keys that this strategy reads")
    return {k: v for k, v in applied.items() if k in reads}


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
