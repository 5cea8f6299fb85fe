"""Options declared once; what is derived from them; strategy plugins; presets.

* ``pyproject.toml``'s run-config table and the docs' key and strategy
  references equal what the declarations generate (``sflower keys --check``).
* Every declared value check is enforced, with a one-line error.
* Floor 1 (``fl_app``) names no algorithm's key.
* A plugin strategy (the example under ``examples/trimmed-mean-splitfed``)
  runs from its own package: found by its entry point, its option validated
  and listed; its one hook is the coordinate-wise trimmed mean.
* A key the user gives wins over the preset at any value (``model=alexnet``
  with ``preset=mu-splitfed``), under ``sflower run``; the ``flwr run`` case
  is in ``tests/test_fab.py``.
"""

from __future__ import annotations

import ast
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import torch

from fl_app.run.config import CORE_KEYS, RunConfig, defaults, installed_declarations
from fl_app.run.errors import ConfigError
from fl_app.run.options import Option
from fl_app.run.plugins import register, strategy_class
from simulation import keys

REPO = Path(__file__).resolve().parents[1]
EXAMPLE = REPO / "examples" / "trimmed-mean-splitfed"
TINY = ["dataset=mnist-5k", "model=lenet5", "num-clients=3", "concurrency=3", "partition=iid", "heterogeneity=none",
        "global-iterations=1", "local-iterations=2", "batch-size=8", "eval-samples=100"]


def test_generated_files_equal_the_declarations():
    """pyproject.toml's table and docs/reference's generated blocks are what `sflower keys` writes."""
    assert keys.stale() == [], "run: sflower keys"


def test_pyproject_table_is_the_declared_defaults_with_their_types():
    with open(REPO / "pyproject.toml", "rb") as fh:
        table = tomllib.load(fh)["tool"]["flwr"]["app"]["config"]
    expected = defaults()
    assert list(table) == list(expected)
    for key, default in expected.items():
        # == alone would accept 1 == 1.0 == True: compare the types too.
        assert type(table[key]) is type(default) and table[key] == default, key


def test_every_declaration_is_complete_and_valid_at_its_default():
    declared = installed_declarations(builtin_only=True)
    assert set(CORE_KEYS) <= set(declared)
    for opt in declared.values():
        assert opt.help.strip() and opt.type in (bool, int, float, str), opt.key
        opt.validate(opt.default)  # a default its own checks refuse would be a bug
    strategy_keys = [k for k in declared if k not in CORE_KEYS]
    assert "gapsl-k-min" in strategy_keys and "trim-fraction" not in strategy_keys  # plugins are not pyproject's


@pytest.mark.parametrize("overrides, message", [
    ({"aggregation": "median"}, "aggregation must be one of data-size, uniform; got 'median'"),
    ({"ring-version": 3}, "ring-version must be one of 1, 2; got 3"),
    ({"epsl-phi": 1.5}, "epsl-phi must be <= 1, got 1.5"),
    ({"gapsl-k-min": 0.0}, "gapsl-k-min must be > 0, got 0.0"),
    ({"perturbations": 0}, "perturbations must be >= 1, got 0"),
    ({"init-seed": -2}, "init-seed must be >= 0, or -1 for seed; got -2"),
    ({"transport": "carrier-pigeon"}, "transport must be one of auto, flower, session"),
    ({"progress": "weeks"}, "progress must be one of flushes, iterations, uploads"),
])
def test_choices_and_bounds_are_enforced_in_one_line(overrides, message):
    with pytest.raises(ConfigError) as err:
        RunConfig.from_mapping(overrides)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_floor_one_names_no_algorithm_key():
    """No string in fl_app/ is a strategy's key: those are declared on the strategy classes."""
    strategy_keys = {k for k in installed_declarations(builtin_only=True) if k not in CORE_KEYS}
    found = []
    for path in sorted((REPO / "fl_app").rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and node.value in strategy_keys:
                found.append(f"{path.relative_to(REPO)}:{node.lineno} {node.value}")
    assert not found, found


def test_a_registered_class_brings_its_keys_and_their_checks():
    """Adding an option is one edit: declared on the class, it is accepted, typed and checked."""
    strategy = strategy_class("splitfed-v1")

    @register
    class Tilted(strategy):  # noqa: D401 (a throwaway strategy for this test)
        """A test strategy."""

        name = "test-tilted-splitfed"
        options = (Option("tilt", 2, "a test option", at_least=1),)

    cfg = RunConfig.from_mapping({"strategy": "test-tilted-splitfed", "tilt": "5"})
    assert cfg.get("tilt") == 5 and cfg.get("aggregation") == "data-size"
    with pytest.raises(ConfigError, match="tilt must be >= 1, got 0"):
        RunConfig.from_mapping({"strategy": "test-tilted-splitfed", "tilt": 0})
    with pytest.raises(ConfigError, match="unknown run-config key 'tlit'"):
        RunConfig.from_mapping({"strategy": "test-tilted-splitfed", "tlit": 3})
    # flwr run carries it in strategy-options; given twice with two values is refused
    assert RunConfig.from_mapping({"strategy": "test-tilted-splitfed", "strategy-options": "tilt=7"}).get("tilt") == 7
    with pytest.raises(ConfigError, match="given twice"):
        RunConfig.from_mapping({"strategy": "test-tilted-splitfed", "strategy-options": "tilt=7", "tilt": "8"})


def test_deploy_folds_a_plugins_keys_into_strategy_options(tmp_path):
    from simulation.deploy.run import run_config_for

    @register
    class Leaning(strategy_class("splitfed-v1")):
        """A test strategy."""

        name = "test-leaning-splitfed"
        options = (Option("lean", 0.5, "a test option"),)

    given = {"strategy": "test-leaning-splitfed", "lean": "0.25", "model": "lenet5"}
    table = run_config_for(RunConfig.from_mapping(given), given, tmp_path)
    assert "lean" not in table and table["strategy-options"] == "lean=0.25" and table["model"] == "lenet5"
    assert RunConfig.from_mapping(table).get("lean") == 0.25


def test_unknown_and_unimportable_strategies_are_one_line_errors():
    with pytest.raises(ConfigError, match="unknown strategy 'nope'.*package.module:Class"):
        RunConfig.from_mapping({"strategy": "nope"})
    with pytest.raises(ConfigError, match="cannot import no_such_module: ModuleNotFoundError"):
        RunConfig.from_mapping({"strategy": "no_such_module:Thing"})
    with pytest.raises(ConfigError, match="has no strategy class 'Path'"):
        RunConfig.from_mapping({"strategy": "pathlib:Path"})


def test_the_example_plugins_hook_is_a_coordinate_wise_trimmed_mean():
    sys.path.insert(0, str(EXAMPLE))
    try:
        from trimmed_mean_splitfed import TrimmedMeanSplitFed

        cfg = RunConfig.from_mapping({"strategy": "trimmed_mean_splitfed:TrimmedMeanSplitFed", "trim-fraction": 0.2})
    finally:
        sys.path.remove(str(EXAMPLE))
    lines = (EXAMPLE / "trimmed_mean_splitfed" / "__init__.py").read_text().splitlines()
    assert len(lines) < 45
    own = {k for k, v in vars(TrimmedMeanSplitFed).items() if callable(v) and not k.startswith("__")}
    assert own == {"aggregate_models"}  # the one hook it overrides
    strategy = TrimmedMeanSplitFed.__new__(TrimmedMeanSplitFed)
    strategy.cfg = cfg
    models = [{"w": torch.tensor([v, -v]), "n": torch.tensor(3)} for v in (1.0, 2.0, 3.0, 4.0, 100.0)]
    out = strategy.aggregate_models(models, [1.0] * 5)
    # trim 0.2 of 5 models: one dropped at each end, per coordinate: mean(2, 3, 4) and mean(-4, -3, -2)
    assert torch.equal(out["w"], torch.tensor([3.0, -3.0])) and int(out["n"]) == 3


def _fake_install(tmp_path: Path) -> dict[str, str]:
    """An environment where the example is 'installed': its folder and a dist-info with its entry point."""
    info = tmp_path / "site" / "trimmed_mean_splitfed-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: trimmed-mean-splitfed\nVersion: 0.1.0\n")
    ep = tomllib.loads((EXAMPLE / "pyproject.toml").read_text())["project"]["entry-points"]["sflower.strategies"]
    (info / "entry_points.txt").write_text("[sflower.strategies]\n" + "".join(f"{k} = {v}\n" for k, v in ep.items()))
    path = os.pathsep.join([str(tmp_path / "site"), str(EXAMPLE), os.environ.get("PYTHONPATH", "")])
    return {**os.environ, "PYTHONPATH": path}


def _sflower(args: list[str], env: dict[str, str], cwd: Path) -> subprocess.CompletedProcess:
    code = "import sys; from simulation.cli import main; sys.exit(main())"
    return subprocess.run([sys.executable, "-c", code, *args], env=env, cwd=cwd, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.e2e  # sflower run in subprocesses, one a whole AlexNet run
def test_the_example_plugin_runs_from_its_own_package_and_the_users_keys_beat_the_preset(tmp_path):
    """Found by its entry point; listed by `sflower strategies`; a bad trim-fraction is one line and exit 2;
    a run completes with preset=mu-splitfed (made for another strategy: preset-any-strategy=true) and
    model=alexnet given (the default: it still wins); the preset's MU-SplitFed-only server-steps is left out."""
    env = _fake_install(tmp_path)
    listed = _sflower(["strategies"], env, tmp_path)
    assert listed.returncode == 0, listed.stderr
    block = listed.stdout.split("\nsplitfed-trimmed-mean ", 1)[1]
    assert "trim-fraction=0.1" in block.split("\n\n")[0]
    bad = _sflower(["run", "strategy=splitfed-trimmed-mean", "trim-fraction=0.7"], env, tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip() == "sflower: error: trim-fraction must be <= 0.49, got 0.7"
    out = tmp_path / "run"
    run = _sflower(["run", "-q", "strategy=splitfed-trimmed-mean", "trim-fraction=0.34", "preset=mu-splitfed",
                    "preset-any-strategy=true", *TINY, "model=alexnet", "cut-layer=2", f"output-dir={out}"], env, tmp_path)
    assert run.returncode == 0, run.stderr[-2000:]
    config = json.loads((out / "config.json").read_text())["config"]
    assert config["model"] == "alexnet" and config["lr"] == 0.008 and config["perturbations"] == 8  # preset's
    assert config["strategy"] == "splitfed-trimmed-mean" and config["trim-fraction"] == 0.34
    assert config["server-steps"] == 1  # the preset's 2 is MU-SplitFed's key: not set on this strategy
    assert json.loads((out / "summary.json").read_text())["status"] == "completed"


def _error_line(args: list[str], capsys) -> tuple[int, str]:
    """``sflower ARGS`` in this process: its exit status and its standard error."""
    from simulation.cli import main

    code = main(args)
    return code, capsys.readouterr().err


def test_a_key_the_strategy_does_not_read_is_one_line_and_exit_2(capsys):
    """A built-in strategy's key given to another strategy at a value other than its default is refused, as
    a plugin's is; at its default (pyproject.toml's table carries every key) it changes nothing and passes."""
    code, err = _error_line(["run", "strategy=fedavg", "client-momentum=shared"], capsys)
    assert code == 2 and err == ("sflower: error: client-momentum=shared is not read by strategy fedavg (a key of "
                                 "gas): remove it, or choose a strategy that reads it\n")
    with pytest.raises(ConfigError, match=r"^buffer-models=3 is not read by strategy splitfed-v1 \(a key of gas\)"):
        RunConfig.from_mapping({"strategy": "splitfed-v1", "buffer-models": 3})
    with pytest.raises(ConfigError, match=r"^server-lr=2.0 is not read by strategy fedavg \(a key of ca2fl, "
                                          r"fedbuff, mu-splitfed\)"):
        RunConfig.from_mapping({"strategy": "fedavg", "server-lr": "2.0"})
    assert RunConfig.from_mapping({"strategy": "fedavg", "client-momentum": "own"}).strategy == "fedavg"
    for name in ("fedavg", "ringsfl", "mu-splitfed"):  # flwr run: every key of the table, only strategy given
        cfg = RunConfig.from_mapping({**defaults(), "strategy": name}, given={"strategy"})
        assert cfg.strategy == name and RunConfig.from_mapping(cfg.as_dict()).as_dict() == cfg.as_dict()


def test_a_preset_names_its_strategy_and_refuses_another_unless_asked(capsys, tmp_path):
    """Every preset names its strategy and sets it; applied to another strategy it is one line and exit 2,
    unless preset-any-strategy=true, which sets only the preset's keys that strategy reads."""
    from fl_app.run.config import preset_names, preset_values

    assert {name: preset_values(name)["strategy"] for name in preset_names()} == {
        "gas-reference": "gas", "mu-splitfed": "mu-splitfed", "ringsfl-reference": "ringsfl"}
    code, err = _error_line(["run", "preset=gas-reference", "strategy=fedavg"], capsys)
    assert code == 2 and err == ("sflower: error: preset=gas-reference is made for strategy=gas, not fedavg: give "
                                 "preset-any-strategy=true to apply its keys that this strategy reads\n")
    assert RunConfig.from_mapping({"preset": "mu-splitfed"}).strategy == "mu-splitfed"  # set by the preset
    assert RunConfig.from_mapping({**defaults(), "preset": "mu-splitfed"}, given={"preset"}).strategy == "mu-splitfed"
    mixed = RunConfig.from_mapping({"preset": "gas-reference", "strategy": "fedavg", "preset-any-strategy": "true"})
    assert (mixed.model, mixed.aggregation, mixed.init_seed) == ("alexnet-gas", "uniform", 2023)  # fedavg reads these
    assert (mixed.client_momentum, mixed.progress) == ("own", "flushes")  # GAS's keys: left at their defaults
    assert RunConfig.from_mapping(mixed.as_dict()).as_dict() == mixed.as_dict()
    nameless = tmp_path / "nameless.toml"
    nameless.write_text('lr = 0.1\n')
    with pytest.raises(ConfigError, match=r"nameless.toml: names no strategy"):
        RunConfig.from_mapping({"preset": str(nameless)})


def test_derived_keys_are_read_in_one_place():
    """``cut-layers``, the U-shaped question and the uplink's codec are RunConfig properties; the end of a
    block range has one sentinel, 0 for the cut (protocol.range_end)."""
    from fl_app import protocol as P

    prefix, ushaped = RunConfig.from_mapping({}), RunConfig.from_mapping({"cut-layers": " 2, 5"})
    assert (prefix.cuts, prefix.ushaped, prefix.lossless_up) == (None, False, True)
    assert (ushaped.cuts, ushaped.ushaped, ushaped.cut_layer) == ((2, 5), True, 2)
    assert not RunConfig.from_mapping({"compress-up": "int8"}).lossless_up
    assert (P.range_end(0, 3), P.range_end(5, 3)) == (3, 5)
    assert P.ForwardConfig(start=1).plan(4).end == 4 and P.ForwardConfig(end=6).plan(4).end == 6
