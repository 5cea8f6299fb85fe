"""Statistics over seeds (simulation/stats.py) and the verdicts reports state, against hand-computed values."""

from __future__ import annotations

import math

import pandas as pd
import pytest

from simulation.outputs.report import Config, pairs_table, ranked_pairs
from simulation.stats import mean_ci, paired, unpaired


def test_mean_ci_is_student_t():
    # 1, 2, 3, 4: mean 2.5, sd 1.2910, sem 0.6455, t(0.975, 3 df) = 3.1824 -> half-width 2.0543
    mean, half = mean_ci([1.0, 2.0, 3.0, 4.0])
    assert mean == 2.5 and half == pytest.approx(2.0543, abs=1e-4)
    assert math.isnan(mean_ci([0.7])[1]) and mean_ci([0.7])[0] == 0.7
    assert mean_ci([0.5, 0.5, float("nan")]) == (0.5, 0.0)


def test_paired_difference_interval_and_verdicts():
    a = {0: 0.60, 1: 0.62, 2: 0.64, 3: 0.66}
    b = {0: 0.50, 1: 0.53, 2: 0.53, 3: 0.58, 9: 0.99}  # seed 9 has no partner: left out
    p = paired("A", "B", a, b)
    # differences 0.10, 0.09, 0.11, 0.08: mean 0.095, sd 0.012910, sem 0.006455, x 3.1824 = 0.020543
    assert p.n == 4 and p.diff == pytest.approx(0.095)
    assert (p.low, p.high) == (pytest.approx(0.074457, abs=1e-6), pytest.approx(0.115543, abs=1e-6))
    assert p.ours == "A above B" and p.against(85.0, 80.0) == "holds" and p.against(80.0, 85.0) == "reversed"
    assert p.t_p < 0.01 and math.isnan(p.wilcoxon_p)  # Wilcoxon from 6 pairs
    q = paired("A", "B", {0: 0.6, 1: 0.5, 2: 0.7}, {0: 0.55, 1: 0.56, 2: 0.62})
    assert q.ours == "not distinguishable at 3 seeds" and q.against(85.0, 80.0) == "not distinguishable"
    assert paired("A", "B", {0: 0.6}, {0: 0.5}).ours == "not established at 1 seed"
    assert paired("A", "B", {0: 0.6}, {0: 0.5}).against(1.0, 2.0) == "not established"
    assert paired("A", "B", {0: 0.6, 1: 0.4}, {0: 0.5, 1: 0.5}).against(None, 2.0) == "–"
    six = paired("A", "B", {s: 0.5 + 0.01 * s for s in range(6)}, {s: 0.5 for s in range(6)})
    assert not math.isnan(six.wilcoxon_p) and six.wilcoxon_p == pytest.approx(0.0625)  # exact: 2 / 2**5


def test_unpaired_is_welch():
    d = unpaired("ours", "theirs", [0.60, 0.62, 0.64], [0.50, 0.52, 0.54, 0.52])
    # se^2 = 0.0004/3 + 0.000267/4 = 0.0002; Welch df = 3.857, t(0.975, 3.857) = 2.80: 0.10 ± 0.0396
    assert d.n == 3 and d.diff == pytest.approx(0.10)
    assert (d.low, d.high) == (pytest.approx(0.0604, abs=5e-4), pytest.approx(0.1396, abs=5e-4))
    assert d.ours == "ours above theirs"
    assert unpaired("x", "y", [0.6, 0.4], [0.5, 0.51]).ours == "not distinguishable at 2 seeds"


def _table(rows):
    return pd.DataFrame(rows, columns=["variant", "seed", "status", "final_accuracy"])


def test_the_pairs_table_ranks_only_what_the_interval_supports():
    rows = []
    for s in range(5):
        rows += [("a", s, "completed", 0.70 + 0.01 * s), ("b", s, "completed", 0.60 + 0.012 * s),
                 ("c", s, "completed", 0.70 + (0.05 if s % 2 else -0.05))]
    rows[2] = ("c", 0, "diverged: nan", 0.2)  # seed 0 of c diverged: a vs c on seeds 1-4 (differences -0.04, 0.07, -0.02, 0.09)
    meta = {"paper": {"a": 80.0, "b": 90.0, "c": 70.0}}
    configs = {x: Config("", x, meta["paper"][x]) for x in "abc"}
    assert ranked_pairs(configs, meta) == [("b", "a"), ("a", "c")]
    t = pairs_table(_table(rows), ["variant"], meta).set_index("pair (A vs B)")
    assert t.loc["b vs a", "ours"] == "a above b" and t.loc["b vs a", "verdict"] == "reversed"
    assert t.loc["a vs c", "seeds"] == 4 and t.loc["a vs c", "verdict"] == "not distinguishable"
    # a stated pair without the paper's figures: "c above b" in the paper's words, and b is above c here
    t = pairs_table(_table(rows), ["variant"], {"paper": {}, "pairs": [["c", "b"]]}).set_index("pair (A vs B)")
    assert t.loc["c vs b", "paper"] == "c above (stated)" and t.loc["c vs b", "verdict"] in ("reversed", "not distinguishable")
    assert ranked_pairs(configs, {**meta, "pairs": [["c", "a"], ["b", "c"]]}) == [("b", "a"), ("a", "c"), ("b", "c")]
    # a compared pair, which no paper ranks: its difference and our reading, no paper column, no verdict
    t = pairs_table(_table(rows), ["variant"], {"paper": {}, "compare": [["b", "a"]]}).set_index("pair (A vs B)")
    assert list(t.index) == ["b vs a"] and t.loc["b vs a", "ours"] == "a above b"
    assert "paper" not in t.columns and "verdict" not in t.columns  # only unclaimed pairs: the columns go
    t = pairs_table(_table(rows), ["variant"], {**meta, "compare": [["b", "c"]]}).set_index("pair (A vs B)")
    assert t.loc["b vs c", "paper"] == "–" and t.loc["b vs c", "verdict"] == "–"
    assert t.loc["b vs a", "verdict"] == "reversed"
    assert ranked_pairs(configs, {**meta, "compare": [["b", "c"]]}, "compare") == [("b", "c")]
    # two partitions: ranked within each, never across; explicit pairs by variant apply in each
    split = {f"{v}/{p}": Config(p, v, {"a": 80.0, "b": 90.0}.get(v)) for p in ("iid", "shard") for v in "abc"}
    assert ranked_pairs(split, {"pairs": [["a", "c"]]}) == [("b/iid", "a/iid"), ("a/iid", "c/iid"),
                                                              ("b/shard", "a/shard"), ("a/shard", "c/shard")]
