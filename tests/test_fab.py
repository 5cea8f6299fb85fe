"""Flower packaging: ``flwr build`` makes a FAB (format version 1) that ``flwr run`` runs in simulation.

The FAB is built from the repository, unpacked, and run from the unpacked
copy on a SuperLink of our own in simulation mode (loopback, no TLS, offline:
no dependency installation, telemetry or update check), for one global
iteration. Every process started is stopped at the end (``Deployment``).
"""

from __future__ import annotations

import json
import os
import subprocess
import time
import tomllib
import zipfile
from pathlib import Path

import pytest
from flwr.supercore.fab_format_version import normalize_and_validate_fab_format

from simulation.deploy.cluster import APP_DIR, OFFLINE_ENV, Deployment
from simulation.deploy.processes import FLOWER_REQUIREMENT, flower_binaries_missing

# flwr build and flwr run: Flower's own processes
pytestmark = [pytest.mark.e2e,
              pytest.mark.skipif(bool(flower_binaries_missing()), reason="Flower's binaries are not installed")]


def build_fab(tmp_path: Path) -> Path:
    """``flwr build --app REPO`` in ``tmp_path``; returns the one .fab it wrote."""
    env = {**os.environ, **OFFLINE_ENV, "FLWR_HOME": str(tmp_path / "home")}
    out = subprocess.run(["flwr", "build", "--app", str(APP_DIR)], cwd=tmp_path, env=env, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stdout + out.stderr
    fabs = list(tmp_path.glob("*.fab"))
    assert len(fabs) == 1, (fabs, out.stdout)
    return fabs[0]


def test_fab_has_format_1_fields_license_and_code(tmp_path):
    fab = build_fab(tmp_path)
    with zipfile.ZipFile(fab) as z:
        names = set(z.namelist())
        assert {"LICENSE", "pyproject.toml", "README.md", "simulation/server_app.py", "fl_app/client_app.py"} <= names
        assert "Apache License" in z.read("LICENSE").decode()
        project = tomllib.loads(z.read("pyproject.toml").decode())
    app = project["tool"]["flwr"]["app"]
    assert app["fab-format-version"] == 1 and app["flwr-version-target"] == "1.42.0"
    assert project["project"]["license"] == {"file": "LICENSE"}
    flwr_dep = [d for d in project["project"]["dependencies"] if d.startswith("flwr[")]
    assert flwr_dep == ["flwr[simulation]>=1.42.0,<1.43"] == [FLOWER_REQUIREMENT]
    # Flower's own FAB format check: the lower bound it derives and the target it keeps
    meta = normalize_and_validate_fab_format(project)
    assert (meta.fab_format_version, meta.flwr_version_min, meta.flwr_version_target) == (1, "1.42.0", "1.42.0")
    assert not any(n.startswith("tests/test_") for n in names)  # Flower leaves test files out


def test_flwr_run_runs_the_built_fab_in_simulation(tmp_path, monkeypatch):
    """The unpacked FAB runs under ``flwr run`` on a simulation SuperLink: one global iteration, all outputs.

    The strategy is the example plugin (``strategy=module:Class``, importable from ``PYTHONPATH`` in
    every process), its key travels in ``strategy-options``, and ``model=alexnet`` given beside
    ``preset=mu-splitfed`` (applied to another strategy: ``preset-any-strategy=true``) wins over the
    preset's ``lenet5`` although it is the default."""
    example = Path(__file__).resolve().parents[1] / "examples" / "trimmed-mean-splitfed"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(example), os.environ.get("PYTHONPATH", "")]))
    fab = build_fab(tmp_path)
    app = tmp_path / "app"
    with zipfile.ZipFile(fab) as z:
        z.extractall(app)
    out = tmp_path / "out"
    run_config = {"strategy": "trimmed_mean_splitfed:TrimmedMeanSplitFed", "strategy-options": "trim-fraction=0.34",
                  "preset": "mu-splitfed", "preset-any-strategy": True, "model": "alexnet", "cut-layer": 2, "num-clients": 2, "concurrency": 2,
                  "partition": "iid", "heterogeneity": "none", "global-iterations": 1, "local-iterations": 2,
                  "batch-size": 8, "output-dir": str(out)}
    with Deployment(tmp_path / "deploy", tls=False, auth=False) as dep:
        dep.start_superlink(simulation=True)
        runner = dep.run_app(run_config, app_dir=app,
                             federation_config="num-supernodes=2 client-resources-num-cpus=1 init-args-num-cpus=1")
        deadline = time.monotonic() + 400
        while not (out / "summary.json").exists() and time.monotonic() < deadline:
            if not runner.alive():
                time.sleep(3)  # the summary may land just after `flwr run --stream` returns
                break
            time.sleep(1)
        log = runner.log_path.read_text(errors="replace")
    assert (out / "summary.json").exists(), log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["global_iterations"] == 1, summary
    for name in ("metrics.csv", "model.safetensors", "model.json", "partition.png"):
        assert (out / name).is_file(), name
    config = json.loads((out / "config.json").read_text())["config"]
    assert (config["model"], config["lr"], config["trim-fraction"]) == ("alexnet", 0.008, 0.34), config
