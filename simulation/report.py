"""``sflower report DIR``: a markdown table (mean ± std over seeds) and plots of a sweep.

Writes into DIR:

* ``report.md``: one row per configuration (the sweep's grid keys except
  ``seed``) with final and best accuracy as mean ± std over seeds, time to the
  target accuracy, and the paper's number when the sweep file gives one. A
  run that diverged is counted in ``seeds`` as diverged (``"3 (1 diverged)"``)
  and left out of the final accuracy, which it never reached; its best
  accuracy counts;
* ``curves.png``: mean test accuracy against global iteration and against
  virtual time, all configurations on shared axes;
* ``profiles.png``: the device profiles (compute speed against uplink rate).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from fl_app.errors import ConfigError
from simulation.sweep import collect, expand, run_name


def _sweep_meta(out: Path) -> tuple[list[str], dict[str, Any], list[str]]:
    """(grid keys except seed, meta table, run names in sweep order) of a sweep directory."""
    path = out / "sweep.json"
    if path.exists():
        spec = json.loads(path.read_text())
        keys = list(spec["grid"])
        order = [run_name(r, keys) for r in expand(spec)]
        return [k for k in keys if k != "seed"], spec.get("meta", {}), order
    return ["strategy"], {}, []


def _fmt(mean: float, std: float, scale: float = 100.0) -> str:
    if mean is None or (isinstance(mean, float) and math.isnan(mean)):
        return "–"
    if std is None or (isinstance(std, float) and math.isnan(std)):
        return f"{scale * mean:.2f}"
    return f"{scale * mean:.2f} ± {scale * std:.2f}"


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-markdown table of a DataFrame (all cells as strings)."""
    cols = [str(c) for c in frame.columns]
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    for _, row in frame.iterrows():
        lines.append("| " + " | ".join(str(v) for v in row.tolist()) + " |")
    return "\n".join(lines)


def summarize(table: pd.DataFrame, keys: list[str], paper: dict[str, Any] | None = None) -> pd.DataFrame:
    """Mean ± std over seeds of each configuration (accuracies in %); time and global
    iterations to the target accuracy averaged over the seeds that reached it.

    A run whose ``status`` starts with ``diverged`` stopped before its last global
    iteration: ``seeds`` says how many did (``"3 (1 diverged)"``), the final
    accuracy is over the other runs (``–`` when none is left), and the best
    accuracy over all of them.
    """
    keys = [k for k in keys if k in table.columns] or ["strategy"]
    out = []
    for values, group in table.groupby(keys, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        row = dict(zip(keys, values))
        diverged = group.get("status", pd.Series("", index=group.index)).astype(str).str.startswith("diverged")
        row["seeds"] = f"{len(group)} ({int(diverged.sum())} diverged)" if diverged.any() else len(group)
        final = group.loc[~diverged, "final_accuracy"]
        row["final acc. (%)"] = _fmt(final.mean(), final.std())
        row["best acc. (%)"] = _fmt(group["best_accuracy"].mean(), group["best_accuracy"].std())
        tt, it = group["time_to_target_s"], group["iterations_to_target"]
        reached = f" ({int(tt.notna().sum())}/{len(group)} seeds)" if tt.notna().sum() < len(group) else ""
        row["time to target (virtual s)"] = "–" if tt.isna().all() else f"{tt.mean():.1f}{reached}"
        row["global iterations to target"] = "–" if it.isna().all() else f"{it.mean():.1f}{reached}"
        if paper:
            label = str(row.get("variant", row.get("strategy", "")))
            joined = "/".join(str(v) for v in values)
            key = next((k for k in paper if k in (label, joined)), None)
            row["paper (%)"] = paper[key] if key else "–"
        out.append(row)
    return pd.DataFrame(out)


def _mean_curves(out: Path, table: pd.DataFrame, keys: list[str], column: str) -> list[tuple[str, pd.DataFrame]]:
    """Per configuration: ``column`` and virtual time averaged over seeds, by global iteration."""
    keys = [k for k in keys if k in table.columns] or ["strategy"]
    curves = []
    for values, group in table.groupby(keys, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        frames = [pd.read_csv(out / r / "metrics.csv") for r in group["run"]]
        merged = pd.concat(frames)
        if column not in merged.columns:
            continue
        curve = merged.groupby("global_iteration")[[column, "virtual_time_s"]].mean()
        curves.append((", ".join(str(v) for v in values), curve))
    return curves


def plot_curves(out: Path, table: pd.DataFrame, keys: list[str], column: str = "test_accuracy",
                name: str = "curves.png", ylabel: str = "test accuracy (mean over seeds)",
                logy: bool = False) -> Path | None:
    """Mean curves of ``column`` for every configuration, against global iteration and virtual time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = _mean_curves(out, table, keys, column)
    if not curves:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for label, curve in curves:
        axes[0].plot(curve.index, curve[column], marker=".", label=label)
        axes[1].plot(curve["virtual_time_s"], curve[column], marker=".", label=label)
    axes[0].set_xlabel("global iteration")
    axes[1].set_xlabel("virtual time (s)")
    axes[0].set_ylabel(ylabel)
    for ax in axes:
        ax.grid(alpha=0.3)
        if logy:
            ax.set_yscale("log")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    path = out / name
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_profiles(out: Path, run_dir: Path) -> Path | None:
    """Compute speed (GFLOP/s) against uplink rate (Mbit/s) of a run's devices."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = json.loads((run_dir / "config.json").read_text()).get("device_profiles", [])
    rates = [p["uplink_bps"] for p in profiles]
    if not profiles or all(r == "inf" for r in rates):
        return None
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.scatter([p["flops_per_s"] / 1e9 for p in profiles], [float(r) / 1e6 for r in rates])
    for p in profiles:
        ax.annotate(str(p["partition_id"]), (p["flops_per_s"] / 1e9, float(p["uplink_bps"]) / 1e6), fontsize=7)
    ax.set_xlabel("compute speed (GFLOP/s)")
    ax.set_ylabel("uplink rate (Mbit/s)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "profiles.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def report(out_dir: str | Path) -> Path:
    """Write report.md, curves.png and profiles.png for a sweep directory.

    Raises:
        ConfigError: the directory holds no finished runs.
    """
    out = Path(out_dir)
    if not out.is_dir():
        raise ConfigError(f"'{out}' is not a directory")
    keys, meta, order = _sweep_meta(out)
    table = collect(out, target=float(meta.get("target-accuracy", 0.0)))
    if table.empty:
        raise ConfigError(f"no finished runs under '{out}'")
    if order:
        rank = {name: i for i, name in enumerate(order)}
        table = table.sort_values("run", key=lambda col: col.map(lambda r: rank.get(r, len(rank))))
    summary = summarize(table, keys, meta.get("paper"))
    lines = [f"# {meta.get('description', out.name)}", ""]
    if meta.get("budget"):
        lines += [f"Budget: {meta['budget']}", ""]
    lines += [markdown_table(summary), "", "![curves](curves.png)", ""]
    plot_curves(out, table, keys)
    if plot_curves(out, table, keys, "grad_dissimilarity", "dissimilarity.png",
                   "gradient dissimilarity (GAS Fig. 2)", logy=True):
        lines += ["![gradient dissimilarity](dissimilarity.png)", ""]
    if plot_profiles(out, out / table["run"].iloc[0]):
        lines += ["![device profiles](profiles.png)", ""]
    path = out / "report.md"
    path.write_text("\n".join(lines))
    return path
