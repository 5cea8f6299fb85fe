"""Sweeps resume, collect one table, and report (issue: experiments, sweeps, reports)."""

from __future__ import annotations

import pandas as pd
import pytest

from fl_app.run.errors import ConfigError
from simulation.cli import main
from simulation.outputs.report import BEST, FINAL, report, summarize
from simulation.sweep import claim, expand, load_sweep, run_sweep

pytestmark = pytest.mark.usefixtures("one_torch_thread")

SWEEP = """
[meta]
description = "tiny"
target-accuracy = 0.15
[meta.paper]
"gas-nogen" = 12.5
[base]
dataset = "mnist-5k"
num-clients = 3
concurrency = 2
partition = "iid"
global-iterations = 1
local-iterations = 2
batch-size = 8
heterogeneity = "gas"
[variants]
"gas-nogen" = { strategy = "gas", generate = false }
fedavg = { strategy = "fedavg" }
[grid]
variant = ["gas-nogen", "fedavg"]
seed = [0, 1]
"""


def test_expand_applies_variants(tmp_path):
    path = tmp_path / "s.toml"
    path.write_text(SWEEP)
    runs = expand(load_sweep(path))
    assert len(runs) == 4
    assert runs[0]["strategy"] == "gas" and runs[0]["generate"] is False and runs[0]["seed"] == 0
    assert runs[3]["strategy"] == "fedavg" and runs[3]["seed"] == 1 and "generate" not in runs[3]


@pytest.mark.slow  # a sweep of whole runs, resumed (37 s)
def test_sweep_resumes_and_reports(tmp_path, capsys):
    path = tmp_path / "s.toml"
    path.write_text(SWEEP)
    out = tmp_path / "out"
    table = run_sweep(path, out, progress=False)
    assert len(table) == 4 and set(table["status"]) == {"completed"}
    assert {"final_accuracy", "best_accuracy", "time_to_target_s", "iterations_to_target",
            "bytes_up", "bytes_down", "wall_time_s", "strategy", "seed", "variant"} <= set(table.columns)
    assert pd.read_csv(out / "results.csv").shape[0] == 4

    # Interrupt one run: drop its summary. Resuming reruns it and only it.
    done = out / "variant=fedavg,seed=0"
    kept = out / "variant=gas-nogen,seed=1"
    (done / "summary.json").unlink()
    before = (kept / "metrics.csv").stat().st_mtime_ns
    capsys.readouterr()
    run_sweep(path, out, progress=False)
    printed = capsys.readouterr().out
    assert printed.count("skipped") == 3
    assert (done / "summary.json").exists()
    assert (kept / "metrics.csv").stat().st_mtime_ns == before

    md = " ".join(report(out).read_text().split())
    assert "| gas-nogen | 2 |" in md and "| fedavg | 2 |" in md and "12.5" in md
    assert (out / "curves.png").stat().st_size > 0 and (out / "profiles.png").stat().st_size > 0


def test_a_run_another_process_holds_is_skipped(tmp_path, capsys):
    """Two sweeps on one directory: a claimed run is left to its holder; the lock goes with its holder."""
    path = tmp_path / "s.toml"
    path.write_text(SWEEP)
    out = tmp_path / "out"
    out.mkdir()
    with claim(out, "variant=fedavg,seed=0") as mine:  # the other process (flock: per open file)
        assert mine
        with claim(out, "variant=fedavg,seed=0") as again:
            assert not again
        run_sweep(path, out, progress=False)
    assert "variant=fedavg,seed=0: running in another process, skipped" in capsys.readouterr().out
    assert not (out / "variant=fedavg,seed=0" / "summary.json").exists()
    assert (out / "variant=fedavg,seed=1" / "summary.json").exists()
    with claim(out, "variant=fedavg,seed=0") as mine:  # released: claimable again
        assert mine


def test_a_diverged_run_is_a_result_and_the_sweep_goes_on(tmp_path, capsys):
    """lr = 1e6 without clipping diverges: the sweep says so in one line, runs the next run, keeps the
    diverged run in the table, and a resumed sweep skips it (the same seed would diverge again)."""
    path = tmp_path / "d.toml"
    path.write_text(SWEEP.replace('[grid]\nvariant = ["gas-nogen", "fedavg"]\nseed = [0, 1]',
                                  '[grid]\nvariant = ["gas-nogen"]\nlr = [1e6, 0.01]\nclip-norm = [0.0]'))
    out = tmp_path / "out"
    table = run_sweep(path, out, progress=False).set_index("lr")
    printed = capsys.readouterr().out
    assert "lr=1000000.0,clip-norm=0.0: diverged:" in printed
    assert table.loc[1e6, "status"].startswith("diverged") and table.loc[0.01, "status"] == "completed"
    run_sweep(path, out, progress=False)
    assert capsys.readouterr().out.count("done, skipped") == 2


def test_the_report_counts_diverged_runs_apart():
    """A diverged run never reached the last global iteration: it is named in ``seeds`` and left out of
    the final accuracy (its last evaluation would pass for a result), but its best accuracy counts."""
    nan = float("nan")
    table = pd.DataFrame({
        "variant": ["a", "a", "a", "b"],
        "status": ["completed", "diverged: non-finite training loss (nan)", "completed", "diverged: nan"],
        "final_accuracy": [0.9, 0.5, 0.8, 0.4], "best_accuracy": [0.9, 0.95, 0.8, 0.6],
        "time_to_target_s": [nan] * 4, "iterations_to_target": [nan] * 4,
    })
    rows = summarize(table, ["variant"]).set_index("variant")
    assert rows.loc["a", "seeds"] == "3 (1 diverged)"
    # (0.9, 0.8): the diverged 0.5 is left out; sd 7.071, sem 5, t(0.975, 1 df) = 12.706: ± 63.53
    assert rows.loc["a", FINAL] == "85.00 ± 63.53"
    assert rows.loc["a", BEST] == "88.33 ± 18.97"  # (0.9, 0.95, 0.8): sd 7.638, sem 4.410, t(0.975, 2 df) = 4.303
    assert rows.loc["b", "seeds"] == "1 (1 diverged)" and rows.loc["b", FINAL] == "–"
    assert summarize(table.iloc[[0, 2]], ["variant"]).loc[0, "seeds"] == 2


def test_show_bytes_adds_the_mb_columns_and_the_bytes_plot(tmp_path):
    """``[meta] show-bytes``: mean MB up and down per configuration (10^6 bytes), and bytes.png."""
    from simulation.outputs.report import plot_bytes

    nan = float("nan")
    table = pd.DataFrame({
        "variant": ["f32", "f32", "int8", "int8"], "strategy": ["gas"] * 4, "status": ["completed"] * 4,
        "final_accuracy": [0.6, 0.7, 0.6, 0.5], "best_accuracy": [0.6, 0.7, 0.6, 0.5],
        "time_to_target_s": [nan] * 4, "iterations_to_target": [nan] * 4,
        "bytes_up": [4_000_000, 4_000_000, 1_000_000, 1_100_000], "bytes_down": [2e6, 2e6, 2e6, 2e6],
    })
    rows = summarize(table, ["variant"], show_bytes=True).set_index("variant")
    assert rows.loc["f32", "MB up"] == "4.0" and rows.loc["int8", "MB up"] == "1.1"  # (1.0 + 1.1) / 2 = 1.05
    assert rows.loc["int8", "MB down"] == "2.0"
    assert "MB up" not in summarize(table, ["variant"]).columns
    assert plot_bytes(tmp_path, table, ["variant"]).stat().st_size > 0


def test_bad_sweep_files(tmp_path):
    bad = tmp_path / "bad.toml"
    bad.write_text('[grid]\nstrategy = "gas"\n')
    with pytest.raises(ConfigError, match="non-empty list"):
        load_sweep(bad)
    bad.write_text('[grid]\nvariant = ["nope"]\n')
    with pytest.raises(ConfigError, match="not defined"):
        load_sweep(bad)
    bad.write_text('[grid]\nnot-a-key = [1]\n')
    with pytest.raises(ConfigError, match="unknown run-config key"):
        load_sweep(bad)
    assert main(["sweep", str(tmp_path / "missing.toml")]) == 2
    assert main(["report", str(tmp_path / "nothing")]) == 2
