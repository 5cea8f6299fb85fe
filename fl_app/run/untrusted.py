"""A run directory is untrusted input: reading its JSON files and the run configuration they record.

``sflower run resume=RUN_DIR`` takes its configuration from the checkpoint's
header and ``sflower attack RUN_DIR`` from ``config.json``; a run directory
may come from someone else (a shared result, a download), so what it says
is checked like the keys a user types, and more:

* :func:`read_npz`: an ``.npz`` record, with ``allow_pickle=False``;
* :func:`read_json`: a JSON file of at most :data:`MAX_JSON_BYTES`, its
  nesting too deep, its bytes not UTF-8 or not JSON: one-line
  :class:`~fl_app.run.errors.ConfigError`;
* :func:`run_dir_config`: the recorded configuration must be a flat table of
  scalar values (finite numbers, strings without control characters) whose keys and values pass :class:`~fl_app.run.config.RunConfig`'s
  checks (the :class:`~fl_app.run.options.Option` declarations: unknown keys, bad
  types, out-of-range values). Beyond that, nothing it names is opened or
  imported unless the user names it: a key of :data:`PATH_KEYS` other than its
  default (``data-dir``, the session's TLS files), a plugin strategy
  ``strategy=package.module:Class`` (importing it runs its module) and a
  ``preset`` given as a path are refused with one line telling the user to give
  the key themselves; the user's own key wins.
"""

from __future__ import annotations

import json
import math
import re
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from fl_app.run.config import RunConfig, parse_strategy_options, preset_names
from fl_app.run.errors import ConfigError
from fl_app.run.options import CORE_OPTIONS

#: The largest JSON file of a run directory that is read (bytes); sflower's own are kilobytes.
MAX_JSON_BYTES = 64 * 2**20
#: Run-config keys whose value names a file or directory that a run reads: taken from a run directory only when
#: they keep their defaults; otherwise the user gives them on the command line.
PATH_KEYS = ("data-dir", "session-certificate", "session-key", "session-ca")
#: The longest string value a recorded configuration may hold.
MAX_VALUE_CHARS = 4096

_DEFAULTS = {opt.key: opt.default for opt in CORE_OPTIONS}
_KEY = re.compile(r"[a-z0-9][a-z0-9_-]{0,79}")


def read_json(path: str | Path, what: str = "") -> Any:
    """The JSON value of ``path`` (a file of a run directory).

    Args:
        path: the file.
        what: how the error names the file (default: its path).

    Raises:
        ConfigError: missing or unreadable, larger than :data:`MAX_JSON_BYTES`, not UTF-8 JSON, nested too deep
            for Python's parser (one line).
    """
    name = what or str(path)
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_JSON_BYTES + 1)
    except OSError as err:
        raise ConfigError(f"{name}: unreadable ({type(err).__name__}: {err.strerror or err})") from None
    if len(data) > MAX_JSON_BYTES:
        raise ConfigError(f"{name}: larger than {MAX_JSON_BYTES} bytes; not a file sflower wrote")
    try:
        return json.loads(data)
    except RecursionError:
        raise ConfigError(f"{name}: JSON nested too deep; not a file sflower wrote") from None
    except (ValueError, UnicodeDecodeError) as err:  # JSONDecodeError is a ValueError
        raise ConfigError(f"{name}: not valid JSON ({' '.join(str(err).split())})") from None


def read_json_table(path: str | Path, what: str = "") -> dict[str, Any]:
    """:func:`read_json` of a file whose value must be a JSON object.

    Raises:
        ConfigError: as :func:`read_json`, or the value is not an object (one line).
    """
    value = read_json(path, what)
    if not isinstance(value, dict):
        raise ConfigError(f"{what or path}: expected a JSON object, got {type(value).__name__}")
    return value


def read_npz(path: str | Path) -> Any:
    """An ``.npz`` record of the run directory, opened with ``allow_pickle=False`` (object arrays refused).

    Raises:
        ConfigError: not a readable ``.npz`` (one line).
    """
    try:
        return np.load(path, allow_pickle=False)
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
        raise ConfigError(f"{path}: not a readable .npz record ({type(err).__name__})") from None


def run_dir_config(saved: Any, source: str, user: Mapping[str, Any] | None = None,
                   ignore: tuple[str, ...] = ()) -> dict[str, Any]:
    """A run directory's recorded run configuration, checked as untrusted input (see the module docstring).

    Args:
        saved: the recorded configuration (the checkpoint header's ``config``, ``config.json``'s ``config``).
        source: the file it came from, for the error messages.
        user: the keys the user gave on the command line (they win over ``saved``'s).
        ignore: keys the caller never uses (e.g. ``sflower attack`` opens no session): reset to their defaults.

    Returns:
        ``saved`` with hyphenated keys, ``ignore`` keys reset; ``{**result, **user}`` passes
        :meth:`RunConfig.from_mapping <fl_app.run.config.RunConfig.from_mapping>`.

    Raises:
        ConfigError: not a flat table of scalar values; a key of :data:`PATH_KEYS`, a plugin strategy or a preset
            path the user did not give; an unknown key, a bad type or an out-of-range value (one line, naming
            ``source``).
    """
    if not isinstance(saved, dict):
        raise ConfigError(f"{source}: its run configuration is not a table of run-config keys")
    user = {str(k).replace("_", "-"): v for k, v in dict(user or {}).items()}
    values: dict[str, Any] = {}
    for key, value in saved.items():
        if not _KEY.fullmatch(str(key)):
            raise ConfigError(f"{source}: {str(key)[:80]!r} is not a run-config key")
        if not isinstance(value, (bool, int, float, str)) or (isinstance(value, str) and (
                len(value) > MAX_VALUE_CHARS or any(ord(c) < 32 for c in value))) or (
                isinstance(value, float) and not math.isfinite(value)):
            raise ConfigError(f"{source}: {key} holds {type(value).__name__} {str(value)[:40]!r}, not a run-config "
                              "value")
        values[str(key).replace("_", "-")] = value
    try:  # a plugin's keys folded into strategy-options are keys like the others (and checked as such)
        folded = parse_strategy_options(str(values.get("strategy-options") or ""))
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    for key, value in folded.items():
        if key in values and str(values[key]) != value:
            raise ConfigError(f"{source}: {key} is given twice, as {values[key]!r} and in strategy-options")
        values.setdefault(key, value)
    values.pop("strategy-options", None)
    for key in ignore:
        if key in values:
            values[key] = _DEFAULTS.get(key, values[key])
    strategy = str(values.get("strategy") or "")
    if ":" in strategy and str(user.get("strategy") or "") != strategy:
        raise ConfigError(f"{source} names the plugin strategy={strategy[:200]!r}, which sflower imports only when "
                          "you give that strategy= yourself")
    preset = str(values.get("preset") or "")
    if preset and preset not in preset_names() and "preset" not in user:
        raise ConfigError(f"{source} names preset={preset[:200]!r}, not one of sflower's presets: pass preset=... "
                          "yourself")
    try:
        cfg = RunConfig.from_mapping({**values, **user})
    except ConfigError as err:
        raise ConfigError(f"{source}: {err}") from None
    for key in PATH_KEYS:  # after resolving: a built-in preset may set one too
        if key not in user and cfg.get(key) != _DEFAULTS[key]:
            raise ConfigError(f"{source} names {key}={str(cfg.get(key))[:200]!r}; sflower reads no file or "
                              f"directory a run directory names: pass {key}=... yourself")
    return values
