"""``sflower bench summary``: its table and its input errors (the runs themselves are benchmarks, not tests)."""

import subprocess
import sys

from simulation.bench.summary import table


def test_table_gives_old_new_and_ratio_and_skips_rows_neither_side_has():
    res = {"against": "abc123",
           "old": {"s_per_global_iteration": 20.0, "ray_small": {"ray_over_inprocess": 2.0},
                   "main_job": {"wall_s": 400.0, "final_accuracy": 0.951}},
           "new": {"s_per_global_iteration": 15.0, "ray_small": {"ray_over_inprocess": 1.5},
                   "main_job": {"wall_s": 100.0}}}
    lines = table(res).splitlines()
    assert lines[0] == "| figure | old (abc123) | new | new ÷ old |"
    rows = {line.split(" | ")[0].lstrip("| "): line for line in lines[2:]}
    assert rows["GAS s per global iteration (FMNIST, K=20 C=10 E=20 B=32)"].endswith("| 20.00 | 15.00 | 0.75 |")
    assert rows["Ray (2 CPUs) ÷ in-process, small run"].endswith("| 2.00 | 1.50 | 0.75 |")
    assert rows["main job wall s (`sflower run`)"].endswith("| 400 | 100 | 0.25 |")
    assert rows["main job final accuracy"].endswith("| 0.951 | – | – |")  # one side missing: no ratio
    assert not any("realistic" in r for r in rows)  # neither side ran it
    assert not any("statistics" in r for r in rows)
    res["statistics_case"] = {"dim": 512, "labels": 20, "seen_per_label": 100}
    res["old"]["statistics_mb"], res["new"]["statistics_mb"] = 200.0, 50.0
    assert "| statistics MB, 20 labels at D=512 (100 seen each) | 200 | 50 | 0.25 |" in table(res).splitlines()


def _bench(*args):
    return subprocess.run([sys.executable, "-m", "simulation.cli", "bench", *args],
                          capture_output=True, text=True, check=False)


def test_summary_without_a_revision_or_with_an_unknown_one_is_a_one_line_error():
    for args, words in ((("summary",), "needs --against"),
                        (("summary", "--against", "no-such-revision-xyz"), "is not a commit")):
        proc = _bench(*args)
        assert proc.returncode != 0
        err = proc.stderr.strip().splitlines()
        assert len(err) == 1 and words in err[0], proc.stderr
        assert "Traceback" not in proc.stderr
