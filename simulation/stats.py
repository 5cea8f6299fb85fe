"""Statistics over seeds: confidence intervals, paired differences and the verdicts a report states.

A results table ranks configurations by a metric measured once per seed.
The ranking is a claim about the configurations only when the seed-to-seed
spread cannot explain it, so every report states, per configuration, the
mean with its 95 % confidence interval (Student t over the seeds) and, per
ranked pair, the paired difference over the seeds both ran with its 95 %
interval and a paired test (``scipy.stats.ttest_rel``; ``wilcoxon`` from
n = 6). The verdict follows the interval of the difference alone:

* ``A above B`` where it lies above 0, ``B above A`` where below;
* ``not distinguishable at n seeds`` where it contains 0;
* ``not established at n seeds`` where n < 2 (no interval).

Beside a paper's ordering of the same pair the verdict reads ``holds``,
``reversed`` or ``not distinguishable`` (``not established`` for n < 2).
Diverged runs are never averaged: a pair is compared on the seeds where
both runs completed.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from scipy import stats

#: Confidence level of every interval.
LEVEL = 0.95
#: The smallest number of pairs for which the Wilcoxon signed-rank test is reported.
WILCOXON_MIN_N = 6


def mean_ci(values: Sequence[float], level: float = LEVEL) -> tuple[float, float]:
    """Mean and the half-width of its Student-t confidence interval.

    Args:
        values: one measurement per seed (NaNs are dropped).
        level: the confidence level.

    Returns:
        ``(mean, half_width)``; ``half_width`` is NaN for fewer than 2 values,
        0 for identical values; ``(nan, nan)`` for none.
    """
    x = np.asarray([v for v in values if v is not None and not math.isnan(float(v))], dtype=float)
    if x.size == 0:
        return math.nan, math.nan
    if x.size < 2:
        return float(x.mean()), math.nan
    sem = float(x.std(ddof=1)) / math.sqrt(x.size)
    return float(x.mean()), float(stats.t.ppf(0.5 + level / 2, x.size - 1)) * sem


@dataclass(frozen=True)
class Paired:
    """The paired comparison of configuration ``a`` with ``b`` over the seeds both completed.

    Attributes:
        a, b: the configurations' labels.
        n: seeds compared.
        diff: mean of ``a - b`` (the metric's units).
        low, high: its 95 % confidence interval (NaN for n < 2).
        t_p: two-sided p-value of the paired t-test (NaN for n < 2).
        wilcoxon_p: two-sided p-value of the Wilcoxon signed-rank test (NaN for n < 6).
    """

    a: str
    b: str
    n: int
    diff: float
    low: float
    high: float
    t_p: float
    wilcoxon_p: float

    @property
    def ours(self) -> str:
        """The verdict on the data alone: ``A above B``, ``B above A``, ``not distinguishable``, ``not established``."""
        if self.n < 2 or math.isnan(self.low):
            return f"not established at {self.n} seed{'s' if self.n != 1 else ''}"
        if self.low > 0:
            return f"{self.a} above {self.b}"
        if self.high < 0:
            return f"{self.b} above {self.a}"
        return f"not distinguishable at {self.n} seeds"

    def against(self, paper_a: float | None, paper_b: float | None) -> str:
        """The verdict beside a paper's figures for ``a`` and ``b``: ``holds``, ``reversed``,
        ``not distinguishable``, ``not established``; ``–`` when the paper gives no order."""
        if paper_a is None or paper_b is None or paper_a == paper_b:
            return "–"
        if self.n < 2 or math.isnan(self.low):
            return "not established"
        if self.low <= 0 <= self.high:
            return "not distinguishable"
        return "holds" if (self.low > 0) == (paper_a > paper_b) else "reversed"


def paired(a: str, b: str, values_a: dict[int, float], values_b: dict[int, float], level: float = LEVEL) -> Paired:
    """Compare two configurations seed by seed.

    Args:
        a, b: labels.
        values_a, values_b: metric per seed (seeds missing from either, or NaN, are left out).
        level: the confidence level of the interval.
    """
    seeds = sorted(s for s in values_a.keys() & values_b.keys()
                   if not (math.isnan(float(values_a[s])) or math.isnan(float(values_b[s]))))
    d = np.asarray([float(values_a[s]) - float(values_b[s]) for s in seeds], dtype=float)
    n = int(d.size)
    if n == 0:
        return Paired(a, b, 0, math.nan, math.nan, math.nan, math.nan, math.nan)
    mean, half = mean_ci(d, level)
    t_p = w_p = math.nan
    if n >= 2:
        t_p = 1.0 if not d.any() else float(stats.ttest_rel([float(values_a[s]) for s in seeds],
                                                             [float(values_b[s]) for s in seeds]).pvalue)
        if math.isnan(t_p):  # identical non-zero differences: no spread, the sign decides
            t_p = 0.0
    if n >= WILCOXON_MIN_N:
        w_p = 1.0 if not d.any() else float(stats.wilcoxon(d).pvalue)
    return Paired(a, b, n, mean, mean - half, mean + half, t_p, w_p)


def unpaired(a: str, b: str, values_a: Sequence[float], values_b: Sequence[float], level: float = LEVEL) -> Paired:
    """Compare two independent samples (two codes' runs, whose seeds do not correspond): the difference
    of means with Welch's interval and t-test (``scipy.stats.ttest_ind(equal_var=False)``); the
    Mann-Whitney U test takes the Wilcoxon field (from 6 runs a side). ``n`` is the smaller side's count."""
    x = np.asarray([v for v in values_a if not math.isnan(float(v))], dtype=float)
    y = np.asarray([v for v in values_b if not math.isnan(float(v))], dtype=float)
    n = int(min(x.size, y.size))
    if n == 0:
        return Paired(a, b, 0, math.nan, math.nan, math.nan, math.nan, math.nan)
    diff = float(x.mean() - y.mean())
    low = high = t_p = u_p = math.nan
    if n >= 2:
        if x.std() == 0 and y.std() == 0:
            low = high = diff
            t_p = 1.0 if diff == 0 else 0.0
        else:
            res = stats.ttest_ind(x, y, equal_var=False)
            ci = res.confidence_interval(level)
            low, high, t_p = float(ci.low), float(ci.high), float(res.pvalue)
    if n >= WILCOXON_MIN_N:
        u_p = float(stats.mannwhitneyu(x, y).pvalue)
    return Paired(a, b, n, diff, low, high, t_p, u_p)
