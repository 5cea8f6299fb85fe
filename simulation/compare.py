"""``sflower compare``: sflower's runs beside another code's runs of the same configuration.

Used to check sflower against the authors' code of a paper (the GAS and
RingSFL side-by-side tables of the results pages). Both sides are curves of one
metric per global iteration:

* **ours**: run directories (their ``metrics.csv``, columns
  ``global_iteration`` and the metric);
* **theirs**: CSV files with the same two columns (the other code's log,
  converted: ``global_iteration`` counts completed global iterations from 1,
  accuracies are fractions).

For every global iteration that runs of both sides reached, the table gives
the other code's minimum, maximum and mean over its runs that reached it, sflower's mean (and min–max), and
whether sflower's mean lies inside the other code's min–max band widened by
``widen`` on each side (the issue tracker's criterion: 0.05). Below it, the
last global iteration both sides reached is compared as statistics: each
side's mean with its 95 % interval and the difference of means with Welch's
interval (:func:`simulation.stats.unpaired`: the two codes' seeds do not
correspond), stated as "not distinguishable" where that interval holds 0. It writes
``DIR/compare.md`` and ``DIR/compare.png`` (both sides' runs as thin lines,
the band shaded, sflower's mean bold).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from fl_app.run.errors import ConfigError
from simulation.outputs.report import markdown_table
from simulation.stats import mean_ci, unpaired


def _curve(path: Path, metric: str) -> pd.Series:
    """``metric`` indexed by ``global_iteration`` from a run directory or a CSV file.

    Raises:
        ConfigError: a missing file or column (one line).
    """
    csv = path / "metrics.csv" if path.is_dir() else path
    if not csv.is_file():
        raise ConfigError(f"compare: no {csv}")
    frame = pd.read_csv(csv)
    for col in ("global_iteration", metric):
        if col not in frame.columns:
            raise ConfigError(f"compare: {csv} has no column '{col}'")
    frame = frame.dropna(subset=[metric]).drop_duplicates("global_iteration", keep="last")
    return frame.set_index("global_iteration")[metric].astype(float)


def side_by_side(ours: Sequence[pd.Series], theirs: Sequence[pd.Series], widen: float = 0.05) -> pd.DataFrame:
    """The per-iteration comparison table (see the module docstring).

    Args:
        ours, theirs: one curve per run, indexed by global iteration.
        widen: how far sflower's mean may lie outside the other code's min–max band.

    Returns:
        rows for the global iterations ≥ 1 that at least one run of each side
        reached (each side's statistics over its runs that reached it):
        ``global_iteration``, ``theirs_runs``, ``theirs_min``, ``theirs_max``,
        ``theirs_mean``, ``ours_runs``, ``ours_min``, ``ours_max``,
        ``ours_mean``, ``inside`` (bool).

    Raises:
        ConfigError: a side without runs.
    """
    if not ours or not theirs:
        raise ConfigError("compare: need at least one run on each side")

    def reached(curves: Sequence[pd.Series], g: int) -> list[float]:
        return [float(c.loc[g]) for c in curves if g in c.index]

    rows = []
    for g in sorted({int(i) for c in ours for i in c.index if i >= 1}):
        t, o = reached(theirs, g), reached(ours, g)
        if not t:
            continue
        mean = sum(o) / len(o)
        rows.append({"global_iteration": g, "theirs_runs": len(t), "theirs_min": min(t), "theirs_max": max(t),
                     "theirs_mean": sum(t) / len(t), "ours_runs": len(o), "ours_min": min(o), "ours_max": max(o),
                     "ours_mean": mean, "inside": min(t) - widen <= mean <= max(t) + widen})
    return pd.DataFrame(rows)


def final_statement(ours: Sequence[pd.Series], theirs: Sequence[pd.Series], labels: tuple[str, str],
                    scale: float = 100.0, unit: str = " (%)") -> str:
    """The two sides at the last global iteration that every run of both reached: means with 95 %
    intervals, the difference with Welch's interval, and the verdict (one paragraph)."""
    last = min(int(c.index.max()) for c in [*ours, *theirs])
    o = [float(c.loc[last]) for c in ours if last in c.index]
    t = [float(c.loc[last]) for c in theirs if last in c.index]
    d = unpaired(labels[0], labels[1], o, t)

    def side(values: list[float]) -> str:
        mean, half = mean_ci(values)
        return f"{scale * mean:.2f}" + ("" if math.isnan(half) else f" ± {scale * half:.2f}") + f" ({len(values)} runs)"

    interval = "" if math.isnan(d.low) else f", 95% CI [{scale * d.low:+.2f}, {scale * d.high:+.2f}], Welch p {d.t_p:.3f}"
    verdict = re.sub(r"at \d+ seeds?$", f"at {len(o)} and {len(t)} runs", d.ours)
    return (f"At global iteration {last}{unit}: {labels[0]} {side(o)}, {labels[1]} {side(t)}; "
            f"difference {scale * d.diff:+.2f}{interval}: {verdict}.")


def compare(ours: Sequence[str | Path], theirs: Sequence[str | Path], out_dir: str | Path, *,
            metric: str = "test_accuracy", widen: float = 0.05, title: str = "",
            labels: tuple[str, str] = ("sflower", "authors' code")) -> pd.DataFrame:
    """Write ``compare.md`` and ``compare.png`` into ``out_dir``; return :func:`side_by_side`'s table.

    Accuracy-like metrics (values in [0, 1]) are printed in percent.

    Raises:
        ConfigError: missing files or columns, or an empty side.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ours_c = [_curve(Path(p), metric) for p in ours]
    theirs_c = [_curve(Path(p), metric) for p in theirs]
    table = side_by_side(ours_c, theirs_c, widen)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    pct = all(0.0 <= v <= 1.0 for c in [*ours_c, *theirs_c] for v in c)
    scale, unit, fmt = (100.0, " (%)", ".1f") if pct else (1.0, "", ".3f")
    shown = pd.DataFrame({
        "global iteration": table.global_iteration,
        f"{labels[1]}: runs": table.theirs_runs,
        f"{labels[1]}: min–max{unit}": [f"{scale * a:{fmt}}–{scale * b:{fmt}}"
                                        for a, b in zip(table.theirs_min, table.theirs_max)],
        f"{labels[0]}: mean{unit}": [f"{scale * m:{fmt}}" for m in table.ours_mean],
        f"{labels[0]}: min–max{unit}": [f"{scale * a:{fmt}}–{scale * b:{fmt}}"
                                        for a, b in zip(table.ours_min, table.ours_max)],
        f"inside ± {scale * widen:g}": ["yes" if v else "**no**" for v in table.inside],
    })
    head = f"# {title}\n\n" if title else ""
    text = (f"{head}{metric}: {len(ours_c)} run(s) of {labels[0]}, {len(theirs_c)} of {labels[1]}; "
            f"{int(table.inside.sum())} of {len(table)} global iterations inside the band.\n\n"
            f"{markdown_table(shown)}\n\n{final_statement(ours_c, theirs_c, labels, scale, unit)}\n\n"
            f"![curves](compare.png)\n")
    (out / "compare.md").write_text(text)

    fig, ax = plt.subplots(figsize=(6, 4))
    for c in theirs_c:
        ax.plot(c.index, scale * c.values, color="tab:gray", lw=0.8, alpha=0.7)
    for c in ours_c:
        ax.plot(c.index, scale * c.values, color="tab:blue", lw=0.8, alpha=0.5)
    ax.fill_between(table.global_iteration, scale * (table.theirs_min - widen), scale * (table.theirs_max + widen),
                    color="tab:gray", alpha=0.15, label=f"{labels[1]}: min–max ± {scale * widen:g}")
    ax.plot(table.global_iteration, scale * table.ours_mean, color="tab:blue", lw=2, label=f"{labels[0]}: mean")
    ax.set_xlabel("global iteration")
    ax.set_ylabel(metric + unit)
    ax.set_title(title or metric)
    ax.legend(loc="lower right", fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=120)
    plt.close(fig)
    return table
