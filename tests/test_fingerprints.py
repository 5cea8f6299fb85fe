"""Portable numerics across machines: the committed fingerprints rerun identically (every column but
wall time), and a process that did not start with portable numerics is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from fl_app.run.errors import ConfigError
from fl_app.run.numerics import PORTABLE_ENV, establish, launch_env, machine_record
from simulation.fingerprints import FINGERPRINTS, fingerprint

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.e2e  # python -m simulation.fingerprints check: four portable runs in a fresh process
def test_the_committed_fingerprints_rerun_identically():
    """ZO, GAS, a synchronous split and RingSFL in portable mode, in a fresh process (CI's machine)."""
    env = {k: v for k, v in os.environ.items() if k not in PORTABLE_ENV}  # the module restarts itself with them
    done = subprocess.run([sys.executable, "-m", "simulation.fingerprints", "check"], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr[-2000:]
    assert f"{len(FINGERPRINTS)} of {len(FINGERPRINTS)} fingerprints identical" in done.stdout
    for name in FINGERPRINTS:
        rows = (ROOT / "tests" / "fingerprints" / f"{name}.csv").read_text().splitlines()
        assert rows[0].startswith("global_iteration,") and "wall_time_s" not in rows[0] and len(rows) == 4  # header, iterations 0-2


def test_a_fingerprint_drops_the_wall_time_column_only(tmp_path):
    path = tmp_path / "metrics.csv"
    path.write_text("global_iteration,virtual_time_s,wall_time_s,test_accuracy\r\n0,0.0,0.25,0.1\r\n1,1.5,3.0,0.5\r\n")
    assert fingerprint(path) == "global_iteration,virtual_time_s,test_accuracy\n0,0.0,0.1\n1,1.5,0.5\n"


def test_portable_needs_its_environment_from_the_start(tmp_path, capsys):
    """This test process chose its kernels without portable numerics: a run asking for it is refused
    with one line naming the export, before anything is written; fast mode needs nothing."""
    from simulation.cli import main

    assert launch_env("fast") is None and launch_env("portable", PORTABLE_ENV) is None
    env = launch_env("portable", {"ATEN_CPU_CAPABILITY": "avx2", "PATH": "/bin"})
    assert env["ATEN_CPU_CAPABILITY"] == "default" and env["MKL_CBWR"] == "COMPATIBLE" and env["PATH"] == "/bin"
    establish("fast")
    with pytest.raises(ConfigError, match="export ATEN_CPU_CAPABILITY=default MKL_CBWR=COMPATIBLE"):
        establish("portable")
    out = tmp_path / "run"
    assert main(["run", "numerics=portable", f"output-dir={out}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "numerics=portable needs the process started with" in err and not out.exists()
    assert main(["run", "numerics=exact"]) == 2
    assert "numerics must be one of fast, portable; got 'exact'" in capsys.readouterr().err


def test_the_machine_record_names_the_kernels():
    rec = machine_record("fast")
    assert rec["mode"] == "fast" and rec["torch"].startswith("2.") and rec["aten_capability"]
    assert set(rec["env"]) >= set(PORTABLE_ENV) and isinstance(rec["isa"], list) and rec["threads"] >= 1
