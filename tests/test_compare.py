"""``sflower compare``: the per-iteration band check against another code's runs."""

from __future__ import annotations

import pandas as pd
import pytest

from simulation.compare import side_by_side


def _c(values, start=1):
    return pd.Series(values, index=range(start, start + len(values)))


def test_band_is_theirs_min_max_widened():
    theirs = [_c([0.10, 0.50, 0.80]), _c([0.20, 0.40, 0.90])]
    ours = [_c([0.30, 0.35, 0.50]), _c([0.30, 0.45, 0.70, 0.99])]  # iteration 4: no run of theirs reached it
    t = side_by_side(ours, theirs, widen=0.05)
    assert list(t.global_iteration) == [1, 2, 3]
    shorter = side_by_side(ours, [*theirs, _c([0.9])])  # a stopped run counts where it got to
    assert shorter.theirs_runs.tolist() == [3, 2, 2] and shorter.theirs_max.tolist() == [0.9, 0.5, 0.9]
    assert t.ours_mean.round(6).tolist() == [0.30, 0.40, 0.60]
    assert t.theirs_min.tolist() == [0.10, 0.40, 0.80] and t.theirs_max.tolist() == [0.20, 0.50, 0.90]
    # 0.30 > 0.20 + 0.05; 0.40 inside; 0.60 < 0.80 - 0.05
    assert t.inside.tolist() == [False, True, False]
    assert side_by_side(ours, theirs, widen=0.25).inside.tolist() == [True, True, True]


def test_iteration_zero_is_left_out_and_empty_side_refused():
    from fl_app.run.errors import ConfigError

    t = side_by_side([_c([0.1, 0.2], start=0)], [_c([0.1, 0.2], start=0)])
    assert list(t.global_iteration) == [1]
    with pytest.raises(ConfigError):
        side_by_side([], [_c([0.1])])


def test_cli_writes_table_and_plot(tmp_path, capsys):
    from simulation.cli import main

    run = tmp_path / "run"
    run.mkdir()
    pd.DataFrame({"global_iteration": [0, 1, 2], "test_accuracy": [0.1, 0.5, 0.6]}).to_csv(run / "metrics.csv")
    theirs = tmp_path / "theirs.csv"
    pd.DataFrame({"global_iteration": [1, 2], "test_accuracy": [0.52, 0.70]}).to_csv(theirs, index=False)
    assert main(["compare", str(tmp_path / "out"), "--ours", str(run), "--theirs", str(theirs)]) == 0
    text = " ".join((tmp_path / "out" / "compare.md").read_text().split())  # to_markdown pads the columns
    assert "1 of 2 global iterations inside the band" in text and "| 2 | 1 | 70.0–70.0 | 60.0 |" in text
    assert "sflower 60.00 (1 runs), authors' code 70.00 (1 runs); difference -10.00: not established at 1 and 1 runs" in text
    assert (tmp_path / "out" / "compare.png").stat().st_size > 0
    assert main(["compare", str(tmp_path / "o2"), "--ours", str(run), "--theirs", str(theirs), "--metric", "acc"]) == 2
    assert "has no column 'acc'" in capsys.readouterr().err
