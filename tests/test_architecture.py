"""The house rules, read from the source with ``ast`` (nothing here imports the code it checks).

* **Floors**: ``fl_app`` (bottom) < ``strategies`` (middle) < ``simulation``
  < ``benchmarks`` (top). A module imports only from its own floor or below; the ServerApp's
  wiring (:mod:`simulation.server_app`) is on ``simulation``'s floor, and ``sflower bench`` starts
  the benchmarks as a child program (``python -m benchmarks``) instead of importing them.
* **No import cycle** between modules, nor between a sub-package taken whole (``simulation/outputs/``)
  and the modules beside it (``simulation/sweep.py``): a cycle that function-level imports hide
  still ties the two together.
* **Defaults declared once**: outside :data:`CONFIG_MODULES`, no call
  ``.get("<declared key>", <literal>)`` restates a run-config key's default
  (the keys: ``pyproject.toml``'s ``[tool.flwr.app.config]``, generated from
  the declarations); a raw mapping's missing key takes its default through
  ``fl_app.run.config.given_or_default``, a resolved one is read from ``RunConfig``.
* **Sizes**: every strategy class (a class in ``strategies/`` that subclasses
  :data:`STRATEGY_BASES`, directly or through another) spans at most
  :data:`MAX_STRATEGY_LINES` lines from its ``class`` line to its last line,
  and no module outside ``tests/`` has more than :data:`MAX_MODULE_LINES`
  lines (the base classes themselves are bounded by their modules' sizes).

Every import counts for the floors: at module level, inside functions and
under ``TYPE_CHECKING``. The cycle check leaves out the last kind, which never
runs. Each check is parametrised so that a failure names the
offending module, class or import. There is no list of exceptions: code that
lands meets the limits.
"""

from __future__ import annotations

import ast
import tomllib
from collections import deque
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
#: The floors, bottom first: a module may import from its own floor and those below it.
FLOORS = ("fl_app", "strategies", "simulation", "benchmarks")
#: The classes whose subclasses are strategies (``strategies/``).
STRATEGY_BASES = frozenset({"SFLStrategy", "SyncStrategy", "AsyncStrategy"})
MAX_STRATEGY_LINES = 150
MAX_MODULE_LINES = 500
#: The modules that resolve the run-config keys and their defaults.
CONFIG_MODULES = frozenset({"fl_app.run.config", "fl_app.run.options"})


@cache
def modules() -> dict[str, Path]:
    """``dotted name -> file`` of every module of the floors."""
    out = {}
    for floor in FLOORS:
        for path in sorted((ROOT / floor).rglob("*.py")):
            parts = list(path.relative_to(ROOT).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            out[".".join(parts)] = path
    return out


def _is_package(name: str) -> bool:
    return modules()[name].name == "__init__.py"


def _project_module(dotted: str) -> str | None:
    """The longest prefix of ``dotted`` that is a module of ours (None: not ours)."""
    parts = dotted.split(".")
    while parts:
        name = ".".join(parts)
        if name in modules():
            return name
        parts.pop()
    return None


def _typing_only(tree: ast.Module) -> set[int]:
    """``id`` of every node under an ``if TYPE_CHECKING:`` block (imports that never run)."""
    inside = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
            inside.update(id(child) for stmt in node.body for child in ast.walk(stmt))
    return inside


@cache
def imports(name: str, runtime_only: bool = False) -> tuple[tuple[str, int], ...]:
    """``(imported module of ours, line)`` for every import statement anywhere in module ``name``.

    ``runtime_only`` leaves out those under ``if TYPE_CHECKING:``, which never execute and so
    cannot form an import cycle (they still count for the floors).
    """
    tree = ast.parse(modules()[name].read_text(), filename=str(modules()[name]))
    package = name if _is_package(name) else name.rpartition(".")[0]
    skip = _typing_only(tree) if runtime_only else set()
    found = []
    for node in ast.walk(tree):
        if id(node) in skip:
            continue
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # ``from pkg import sub`` imports the submodule ``pkg.sub``
            targets = [f"{base}.{a.name}" if f"{base}.{a.name}" in modules() else base for a in node.names]
        else:
            continue
        for target in targets:
            ours = _project_module(target)
            if ours is not None and ours != name:
                found.append((ours, node.lineno))
    return tuple(dict.fromkeys(found))


def _floor(name: str) -> int:
    return FLOORS.index(name.split(".")[0])


def _rel(path: Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _cycle_through(name: str) -> list[str] | None:
    """The shortest import cycle through module ``name`` (a list of modules, ``name`` first), or None."""
    parent: dict[str, str] = {}
    queue = deque([name])
    while queue:
        current = queue.popleft()
        for target, _ in imports(current, runtime_only=True):
            if target == name:
                path = [current]
                while path[-1] != name:
                    path.append(parent[path[-1]])
                return [name, *reversed(path[:-1])]
            if target not in parent:
                parent[target] = current
                queue.append(target)
    return None


def _strategy_classes() -> list[tuple[str, str, int]]:
    """``(file, class, lines)`` of every class in ``strategies/`` that subclasses :data:`STRATEGY_BASES`."""
    classes = []
    for name, path in modules().items():
        if name.split(".")[0] != "strategies":
            continue
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ClassDef):
                bases = {b.id if isinstance(b, ast.Name) else getattr(b, "attr", "") for b in node.bases}
                classes.append((_rel(path), node.name, bases, node.end_lineno - node.lineno + 1))
    strategy_names = set(STRATEGY_BASES)
    grown = True
    while grown:  # subclasses of subclasses, across modules (by class name)
        grown = False
        for _, cls, bases, _ in classes:
            if cls not in strategy_names and bases & strategy_names:
                strategy_names.add(cls)
                grown = True
    return [(f, cls, n) for f, cls, bases, n in classes if cls in strategy_names - STRATEGY_BASES]


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_import_from_a_higher_floor(name):
    """``fl_app`` imports nothing from ``strategies`` or ``simulation``; ``strategies`` nothing from ``simulation``."""
    upward = [f"line {line}: {target}" for target, line in imports(name) if _floor(target) > _floor(name)]
    assert not upward, f"{_rel(modules()[name])} ({FLOORS[_floor(name)]}) imports from a higher floor: {upward}"


@pytest.mark.parametrize("name", sorted(modules()))
def test_no_import_cycle(name):
    cycle = _cycle_through(name)
    assert cycle is None, f"import cycle: {' -> '.join([*cycle, name])}"


def _unit(name: str) -> str:
    """The unit of the sub-package cycle check: a module in a sub-package (``simulation.outputs.report``) is its
    sub-package (``simulation.outputs``); a module directly on a floor (``simulation.sweep``) is itself."""
    parts = name.split(".")
    return ".".join(parts[:2]) if len(parts) > 2 or (len(parts) == 2 and _is_package(name)) else name


def _unit_cycle_through(unit: str) -> list[str] | None:
    """The shortest runtime import cycle through ``unit`` among the units of :func:`_unit`, or None."""
    edges: dict[str, set[str]] = {}
    for name in modules():
        for target, _ in imports(name, runtime_only=True):
            if _unit(target) != _unit(name):
                edges.setdefault(_unit(name), set()).add(_unit(target))
    parent: dict[str, str] = {}
    queue = deque([unit])
    while queue:
        current = queue.popleft()
        for target in sorted(edges.get(current, ())):
            if target == unit:
                path = [current]
                while path[-1] != unit:
                    path.append(parent[path[-1]])
                return [unit, *reversed(path[:-1])]
            if target not in parent:
                parent[target] = current
                queue.append(target)
    return None


@pytest.mark.parametrize("unit", sorted({_unit(n) for n in modules()}))
def test_no_import_cycle_between_subpackages_and_modules(unit):
    """No cycle through a sub-package taken whole (as ``simulation.outputs.report`` -> ``simulation.sweep`` ->
    ``simulation.outputs.trackers`` once was), function-level imports included."""
    cycle = _unit_cycle_through(unit)
    assert cycle is None, f"import cycle between sub-packages and modules: {' -> '.join([*cycle, unit])}"


@pytest.mark.parametrize("name", sorted(n for n in modules() if _is_package(n) and not n.startswith("benchmarks")))
def test_every_package_says_what_it_holds_and_what_it_may_import(name):
    """Each package's ``__init__.py`` has a docstring: what the package holds, then a paragraph ``Imports: ...``
    whose first clause names exactly the floors it may import (its own and those below), so the tree says what
    each floor is."""
    doc = ast.get_docstring(ast.parse(modules()[name].read_text())) or ""
    assert "Imports:" in doc, f"{_rel(modules()[name])}: no 'Imports:' paragraph in its docstring"
    clause = doc.split("Imports:", 1)[1].split(";")[0].split(".")[0]
    named = {floor for floor in FLOORS if f"``{floor}``" in clause}
    assert named == set(FLOORS[: _floor(name) + 1]), (name, clause)


@pytest.mark.parametrize("path,cls,lines", [pytest.param(f, c, n, id=f"{f}::{c}") for f, c, n in _strategy_classes()])
def test_strategy_class_size(path, cls, lines):
    assert lines <= MAX_STRATEGY_LINES, f"{path}: strategy class {cls} spans {lines} lines (> {MAX_STRATEGY_LINES})"


@pytest.mark.parametrize("path", [_rel(p) for p in modules().values()])
def test_module_size(path):
    lines = len((ROOT / path).read_text().splitlines())
    assert lines <= MAX_MODULE_LINES, f"{path} has {lines} lines (> {MAX_MODULE_LINES})"


@cache
def declared_keys() -> frozenset[str]:
    """The run-config keys of ``pyproject.toml``'s ``[tool.flwr.app.config]`` (every built-in key)."""
    return frozenset(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["flwr"]["app"]["config"])


def _is_literal(node: ast.expr) -> bool:
    """``node`` is a literal other than None (``0.0``, ``"none"``, ``-1``, ``()``...)."""
    try:
        return ast.literal_eval(node) is not None
    except ValueError:
        return False


def restated_defaults(source: str) -> list[str]:
    """The calls ``X.get("<declared key>", <literal>)`` in ``source``, as ``line N: <call>``."""
    keys = declared_keys()
    return [f"line {n.lineno}: {ast.unparse(n)}" for n in ast.walk(ast.parse(source))
            if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "get"
            and len(n.args) == 2 and isinstance(n.args[0], ast.Constant) and n.args[0].value in keys
            and _is_literal(n.args[1])]


@pytest.mark.parametrize("name", sorted(set(modules()) - CONFIG_MODULES))
def test_no_restated_default(name):
    """A default is declared once (its ``Option``): ``.get(key, literal)`` outside the config modules restates it."""
    found = restated_defaults(modules()[name].read_text())
    assert not found, (f"{_rel(modules()[name])} restates declared defaults (read RunConfig, or "
                       f"fl_app.run.config.given_or_default): {found}")


def test_restated_default_check_sees_them():
    """The default check finds a restated default, and leaves a lookup of another key or without one alone."""
    source = ('a = cfg.get("compress-up", "none")\nb = meta.get("label-noise", -1.0)\n'
              'c = meta.get("rows", 0)\nd = meta.get("lr")\ne = meta.get("lr", None)\nf = meta.get("lr", x)\n')
    assert restated_defaults(source) == ["line 1: cfg.get('compress-up', 'none')",
                                         "line 2: meta.get('label-noise', -1.0)"]


def test_checks_see_the_code():
    """The checks above look at something: the known strategies and the ServerApp's imports are found."""
    found = {cls for _, cls, _ in _strategy_classes()}
    assert {"GAS", "RingSFL"} <= found, found
    assert "strategies.core.registry" in {t for t, _ in imports("simulation.server_app")}
    assert "simulation.deploy.cluster" in {t for t, _ in imports("benchmarks.deploy")}  # the top floor is read
    assert _unit("simulation.outputs.report") == "simulation.outputs" and _unit("simulation.sweep") == "simulation.sweep"
