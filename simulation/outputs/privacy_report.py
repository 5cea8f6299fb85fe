"""The privacy columns and plots of ``sflower report``, for sweeps whose runs were attacked.

A sweep with ``[meta] attack = "..."`` runs ``sflower attack`` on each run
(:func:`simulation.sweep.attack_run`); :func:`simulation.outputs.results.collect` then
puts ``inversion_mse``, ``inversion_psnr`` and ``inversion_ssim`` in
``results.csv``. From them the report adds:

* two columns to its table: the inversion's PSNR (dB) and SSIM, mean over
  seeds ± the half-width of the 95 % interval (:func:`privacy_columns`);
* ``privacy.png``: final test accuracy against the inversion's PSNR, one point
  per configuration (mean and 95 % intervals on both axes), one colour per
  strategy: the trade-off a defence moves along (:func:`plot_privacy`);
* ``label-leakage.png``, when U-shaped runs were attacked (``label_norm_auc``,
  ``label_direction_auc`` in ``results.csv``, two more table columns): final
  accuracy against the direction-scoring AUC (:func:`plot_label_leakage`);
* ``cut-layer.png``, when ``cut-layer`` is a grid key: the PSNR against the
  cut layer, one line per strategy and defence (:func:`plot_cut_layer`).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import pandas as pd

from simulation.stats import mean_ci

#: The results column of the inversion's PSNR (dB).
PSNR = "inversion_psnr"
#: The results columns of the label attack's AUCs (U-shaped runs; :mod:`simulation.privacy.label_leakage`).
NORM, DIRECTION = "label_norm_auc", "label_direction_auc"


def attacked(table: pd.DataFrame) -> bool:
    """Whether the table's runs carry inversion scores."""
    return PSNR in table.columns and table[PSNR].notna().any()


def _mean(values: pd.Series, digits: int) -> str:
    mean, half = mean_ci(values.dropna().astype(float).tolist())
    if math.isnan(mean):
        return "–"
    return f"{mean:.{digits}f}" if math.isnan(half) else f"{mean:.{digits}f} ± {half:.{digits}f}"


def privacy_columns(group: pd.DataFrame) -> dict[str, str]:
    """The report's inversion columns of one configuration's runs: PSNR (dB, 2 decimals) and SSIM (3); and,
    where the sweep holds U-shaped runs, the label attack's AUCs (norm, direction; 3 decimals)."""
    cols = {"inversion PSNR (dB)": _mean(group[PSNR], 2), "inversion SSIM": _mean(group["inversion_ssim"], 3)}
    if DIRECTION in group.columns:
        cols["label AUC, norm"] = _mean(group[NORM], 3) if NORM in group.columns else "–"
        cols["label AUC, direction"] = _mean(group[DIRECTION], 3)
    return cols


def _finish(fig: Any, ax: Any, path: Path, legend_size: int | None = None) -> Path:
    """Grid and legend on ``ax``, then ``fig`` saved to ``path`` (100 dpi) and closed; ``path``."""
    import matplotlib.pyplot as plt

    ax.grid(alpha=0.3)
    ax.legend(fontsize=legend_size)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def _groups(table: pd.DataFrame, keys: list[str]):
    keys = [k for k in keys if k in table.columns] or ["strategy"]
    for values, group in table[table[PSNR].notna()].groupby(keys, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        yield dict(zip(keys, values)), group


def _accuracy_against(out: Path, table: pd.DataFrame, keys: list[str], label: Any, column: str, xlabel: str,
                      name: str, marker: str) -> Path:
    """Final accuracy (%) against ``column``, one point per configuration (mean and 95 % intervals on both
    axes) labelled by ``label(keys, values)``, one colour per strategy; ``out/name``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 5.5))
    colours: dict[str, str] = {}
    for row, group in _groups(table[table[column].notna()], keys):
        strategy = str(group["strategy"].iloc[0])
        colour = colours.setdefault(strategy, f"C{len(colours)}")
        x, xh = mean_ci(group[column].astype(float).tolist())
        y, yh = mean_ci((100 * group["final_accuracy"]).astype(float).tolist())
        ax.errorbar(x, y, xerr=None if math.isnan(xh) else xh, yerr=None if math.isnan(yh) else yh, fmt=marker,
                    color=colour, capsize=3, label=strategy if strategy not in ax.get_legend_handles_labels()[1]
                    else None)
        ax.annotate(label(list(row), tuple(row.values())), (x, y), fontsize=7, xytext=(4, 2),
                    textcoords="offset points")
    ax.set_xlabel(xlabel)
    ax.set_ylabel("final test accuracy (%, mean and 95% interval)")
    return _finish(fig, ax, out / name)


def plot_privacy(out: Path, table: pd.DataFrame, keys: list[str], label: Any) -> Path:
    """Final accuracy (%) against the inversion's PSNR (dB), one point per configuration with 95 % intervals
    on both axes, one colour per strategy, each point labelled by ``label(keys, values)``; ``out/privacy.png``."""
    return _accuracy_against(out, table, keys, label, PSNR,
                             "inversion PSNR (dB; higher: the server reconstructs the inputs better)",
                             "privacy.png", "o")


def plot_label_leakage(out: Path, table: pd.DataFrame, keys: list[str], label: Any) -> Path | None:
    """Final accuracy (%) against the label attack's direction AUC, as :func:`plot_privacy`;
    ``out/label-leakage.png``, or None without U-shaped runs."""
    if DIRECTION not in table.columns or not table[DIRECTION].notna().any():
        return None
    return _accuracy_against(out, table, keys, label, DIRECTION,
                             "label inference AUC, direction scoring (0.5: chance; 1: every label read)",
                             "label-leakage.png", "s")


def plot_cut_layer(out: Path, table: pd.DataFrame, keys: list[str]) -> Path | None:
    """The inversion's PSNR (mean, 95 % interval) against ``cut-layer``, one line per configuration of the
    other grid keys; ``out/cut-layer.png``, or None when ``cut-layer`` is not a grid key."""
    if "cut-layer" not in keys:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    others = [k for k in keys if k != "cut-layer" and k in table.columns] or ["strategy"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for values, group in table[table[PSNR].notna()].groupby(others, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        cuts, means, halves = [], [], []
        for cut, by_cut in group.groupby("cut-layer"):
            m, h = mean_ci(by_cut[PSNR].astype(float).tolist())
            cuts.append(int(cut))
            means.append(m)
            halves.append(0.0 if math.isnan(h) else h)
        ax.errorbar(cuts, means, yerr=halves, marker="o", capsize=3, label="/".join(str(v) for v in values))
    ax.set_xlabel("cut layer (the client holds blocks [0, cut))")
    ax.set_ylabel("inversion PSNR (dB)")
    return _finish(fig, ax, out / "cut-layer.png", legend_size=7)
