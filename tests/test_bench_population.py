"""benchmarks/population.py: the scale benchmark's medians, ratios and table from hand-made runs, and its CLI's
one-line refusals (the runs themselves take minutes and are not run here)."""

from __future__ import annotations

import pytest

from benchmarks.population import main, summarise, summary_table


def _run(engine, n, rep, s, tree_mb):
    return {"engine": engine, "clients": n, "repeat": rep, "process_s": 10.0 + rep, "startup_s": 5.0,
            "s_per_global_iteration": s, "median_s_per_global_iteration": s, "peak_rss_mb": 100.0,
            "peak_tree_mb": tree_mb}


def test_summarise_takes_medians_over_repeats_and_ratios_to_the_smaller_size():
    runs = [_run("inprocess", 100, 0, 1.0, 500.0), _run("inprocess", 1000, 0, 2.0, 600.0),
            _run("inprocess", 1000, 1, 4.0, 800.0), _run("inprocess", 100, 1, 3.0, 700.0),
            _run("inprocess", 1000, 2, 3.5, 650.0), _run("inprocess", 100, 2, 2.0, 600.0),
            _run("ray", 100, 0, 5.0, 2000.0), _run("ray", 1000, 0, 6.0, 2100.0)]
    rows = summarise(runs)
    assert [(r["engine"], r["clients"], r["repeats"]) for r in rows] == [
        ("inprocess", 100, 3), ("inprocess", 1000, 3), ("ray", 100, 1), ("ray", 1000, 1)]
    small, large = rows[0], rows[1]
    assert small["median_s_per_global_iteration"] == 2.0 and large["median_s_per_global_iteration"] == 3.5
    assert small["peak_tree_mb"] == 600.0 and large["peak_tree_mb"] == 650.0
    assert small["process_s"] == 11.0  # median of 10, 11, 12
    assert small["s_ratio"] is None and small["memory_ratio"] is None
    assert large["s_ratio"] == 1.75 and large["memory_ratio"] == round(650 / 600, 3)
    assert rows[3]["s_ratio"] == 1.2  # ray's 1,000 against ray's 100, not in-process's
    table = summary_table(rows).splitlines()
    assert len(table) == 2 + 4
    assert table[3].startswith("| inprocess | 1,000 | 3 |") and "| 3.500 | 1.75 |" in table[3]
    assert "| – |" in table[2]


@pytest.mark.parametrize("args, says", [
    (["--sizes", "100,x"], "--sizes must be comma-separated integers"),
    (["--engines", "inprocess,mpi"], "--engines must be among inprocess, ray"),
    (["--sizes", "5"], "--sizes must be at least 10"),
])
def test_bad_arguments_are_refused_in_one_line(args, says, capsys, tmp_path):
    with pytest.raises(SystemExit) as exit_info:
        main([*args, "--out", str(tmp_path)])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert says in err and "Traceback" not in err
    assert not any(tmp_path.iterdir())
