"""``sflower bench summary``: its table and its input errors (the runs themselves are benchmarks, not tests)."""

import subprocess
import sys

import pytest

from benchmarks.summary import table


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


def test_side_by_side_alternates_old_and_new_in_their_own_trees(tmp_path):
    """``--against``'s runs: the revision's extracted tree and this checkout, in the order old, new, new, old."""
    from benchmarks.common import REPO_ROOT, side_by_side

    calls = []
    runs = side_by_side("HEAD", tmp_path, 2, lambda src, out: calls.append((src, out.name)) or {"n": len(calls)})
    old_src = tmp_path / "src-old"
    assert calls == [(old_src, "old-0"), (REPO_ROOT, "new-0"), (REPO_ROOT, "new-1"), (old_src, "old-1")]
    assert runs == {"old": [{"n": 1}, {"n": 4}], "new": [{"n": 2}, {"n": 3}]}
    assert (old_src / "strategies" / "core" / "base.py").is_file()  # HEAD's tree, extracted


@pytest.mark.e2e  # the ring benchmark in two processes: HEAD's extracted tree and this checkout
def test_ring_against_head_gives_the_same_round(shared_data, tmp_path):
    """``sflower bench ring --against HEAD`` on 2 steps: both sides run, with the same losses and exchanges."""
    from benchmarks.ring import ring_against

    out = ring_against(tmp_path, "HEAD", 2, shared_data / "mnist", repeats=1)
    assert out["same_results"] and out["old"]["round_s"] > 0 and out["new"]["round_s"] > 0
    assert out["round_new_over_old"] == out["new"]["round_s"] / out["old"]["round_s"]
