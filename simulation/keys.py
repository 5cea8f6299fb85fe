"""What is derived from the option declarations: ``pyproject.toml``'s run-config table and the docs' references.

Every key is declared once (:mod:`fl_app.run.options`, and ``options`` on each
strategy class). ``sflower keys --write`` rewrites from the declarations:

* ``pyproject.toml``'s ``[tool.flwr.app.config]`` table (Flower requires
  every run-config key there, with its default);
* the key reference, between ``<!-- sflower-keys -->`` and
  ``<!-- end sflower-keys -->`` in ``docs/reference/config.md``;
* the strategy reference, between ``<!-- sflower-strategies -->`` and
  ``<!-- end sflower-strategies -->`` in ``docs/reference/strategies.md``.

``sflower keys --check`` lists what is stale and exits 1 (a test runs it).
Only the installed strategies (entry points of ``sflower.strategies``) go
into ``pyproject.toml``: a plugin's keys travel in ``strategy-options``.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

from fl_app.run.config import CORE_KEYS, installed_declarations
from fl_app.run.options import CORE_OPTIONS, Option
from fl_app.run.plugins import options_of, strategy_class, strategy_names

ROOT = Path(__file__).resolve().parents[1]
#: The header of the generated table in ``pyproject.toml``.
TABLE = "[tool.flwr.app.config]"
KEY_MARKERS = ("<!-- sflower-keys -->", "<!-- end sflower-keys -->")
STRATEGY_MARKERS = ("<!-- sflower-strategies -->", "<!-- end sflower-strategies -->")


def _toml_value(value: object) -> str:
    """A default as TOML: ``true``, ``2``, ``0.001``, ``"gas"``."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)
    return repr(value)


def owners() -> dict[str, list[str]]:
    """``key -> strategy names`` declaring it, for every installed strategy key."""
    out: dict[str, list[str]] = {}
    for name in strategy_names(builtin_only=True):
        for opt in options_of(strategy_class(name)):
            out.setdefault(opt.key, []).append(name)
    return out


def pyproject_table() -> str:
    """The body of ``[tool.flwr.app.config]``: the core keys, then each strategy's, with their defaults."""
    lines = [f"# Generated from the option declarations by `sflower keys --write` (do not edit by hand).",
             TABLE, "# core keys (fl_app/run/options.py)"]
    lines += [f"{opt.key} = {_toml_value(opt.default)}" for opt in CORE_OPTIONS]
    declared = installed_declarations(builtin_only=True)
    who = owners()
    for key, opt in declared.items():
        if key not in CORE_KEYS:
            lines.append(f"{key} = {_toml_value(opt.default)}  # {', '.join(who.get(key, []))}")
    return "\n".join(lines) + "\n"


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _row(opt: Option, strategies: str = "") -> str:
    default = f"`{_toml_value(opt.default)}`"
    cells = [f"`{opt.key}`", default, _cell(opt.kind()), _cell(opt.help), _cell(opt.source)]
    if strategies:
        cells.insert(1, strategies)
    return "| " + " | ".join(cells) + " |"


def key_reference() -> str:
    """The key reference (markdown): the core keys, then the strategies' keys with who reads them."""
    out = ["### Core keys", "", "Every strategy reads these.", "",
           "| key | default | accepts | meaning | source |", "|---|---|---|---|---|"]
    out += [_row(opt) for opt in CORE_OPTIONS]
    out += ["", "### Strategy keys", "", "Declared on the strategy classes; a strategy ignores the others' keys.", "",
            "| key | strategies | default | accepts | meaning | source |", "|---|---|---|---|---|---|"]
    who = owners()
    for key, opt in installed_declarations(builtin_only=True).items():
        if key not in CORE_KEYS:
            out.append(_row(opt, ", ".join(f"`{n}`" for n in who.get(key, []))))
    return "\n".join(out) + "\n"


def strategy_reference() -> str:
    """The strategy reference (markdown): each strategy, its one-line description and its options."""
    out = []
    for name in strategy_names(builtin_only=True):
        cls = strategy_class(name)
        doc = (cls.__doc__ or "").strip().splitlines()
        out += [f"### `{name}`", "", doc[0] if doc else "", ""]
        if getattr(cls, "run_with", ""):
            out += [f"Run with: `{cls.run_with}`", ""]
        opts = options_of(cls)
        if opts:
            out += ["| key | default | accepts | meaning | source |", "|---|---|---|---|---|"]
            out += [_row(opt) for opt in opts] + [""]
    return "\n".join(out)


def _replace_table(text: str) -> str:
    """``pyproject.toml``'s text with its generated table (from its comment line to the next table) replaced."""
    start = text.index(TABLE)
    comment = text.rfind("\n# Generated from the option declarations", 0, start)
    begin = comment + 1 if comment != -1 and text[comment + 1:start].count("\n") == 1 else start
    nxt = re.search(r"^\[", text[start + len(TABLE):], flags=re.M)
    end = start + len(TABLE) + nxt.start() if nxt else len(text)
    rest = text[end:]
    return text[:begin] + pyproject_table() + ("\n" + rest if rest else "")


def _replace_block(text: str, markers: tuple[str, str], body: str) -> str:
    """``text`` with the part between the two markers replaced by ``body``."""
    head, _, rest = text.partition(markers[0])
    _, _, tail = rest.partition(markers[1])
    return f"{head}{markers[0]}\n\n{body}\n{markers[1]}{tail}"


def targets(root: Path = ROOT) -> dict[Path, str]:
    """``file -> its content with the generated parts up to date``, for each generated file that exists."""
    out = {}
    pyproject = root / "pyproject.toml"
    out[pyproject] = _replace_table(pyproject.read_text())
    for rel, markers, body in (("docs/reference/config.md", KEY_MARKERS, key_reference),
                               ("docs/reference/strategies.md", STRATEGY_MARKERS, strategy_reference)):
        path = root / rel
        if path.is_file() and markers[0] in (text := path.read_text()):
            out[path] = _replace_block(text, markers, body())
    return out


def stale(root: Path = ROOT) -> list[Path]:
    """The generated files whose content differs from the declarations'."""
    return [path for path, text in targets(root).items() if path.read_text() != text]


def write(root: Path = ROOT) -> list[Path]:
    """Rewrite the stale generated files; return them."""
    changed = []
    for path, text in targets(root).items():
        if path.read_text() != text:
            path.write_text(text)
            changed.append(path)
    return changed
