"""A sweep's runs and its results table: which runs a sweep holds, their directory names, and one row per run.

:func:`expand` and :func:`run_name` give a sweep's runs (``base`` with each grid combination) and their
directories; :func:`collect` reads each run directory's ``config.json``, ``summary.json`` and ``metrics.csv``
(and ``privacy/`` where ``sflower attack`` ran) into ``results.csv``. :mod:`simulation.sweep` runs the runs;
:mod:`simulation.outputs.report` reports the table. Imports: ``fl_app`` and pandas only.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pandas as pd

from fl_app.run.errors import ConfigError
from fl_app.run.untrusted import read_json_table


def expand(spec: Mapping[str, Any]) -> list[dict[str, Any]]:
    """All runs of a sweep: ``base`` updated with each grid combination (grid order)."""
    keys = list(spec["grid"])
    runs = []
    for combo in itertools.product(*(spec["grid"][k] for k in keys)):
        run = dict(spec["base"])
        run.update(dict(zip(keys, combo)))
        if "variant" in run:
            run.update(spec.get("variants", {}).get(run["variant"], {}))
        runs.append(run)
    return runs

def run_name(run: Mapping[str, Any], grid_keys: list[str]) -> str:
    """Directory name of a run: ``key=value`` pairs of its grid keys."""
    return ",".join(f"{k}={run[k]}" for k in grid_keys)

def time_to_target(metrics: pd.DataFrame, target: float) -> tuple[float, float]:
    """First ``(virtual_time_s, global_iteration)`` at which test accuracy ≥ ``target`` (NaN if never)."""
    if target <= 0:
        return math.nan, math.nan
    hit = metrics[metrics["test_accuracy"] >= target]
    if hit.empty:
        return math.nan, math.nan
    row = hit.iloc[0]
    return float(row["virtual_time_s"]), float(row["global_iteration"])

def inversion_columns(run_dir: Path) -> dict[str, Any]:
    """``inversion_mse``, ``inversion_psnr``, ``inversion_ssim`` of a run's ``privacy/inversion.json``
    (``sflower attack``), and ``label_norm_auc``, ``label_direction_auc`` of its ``privacy/labels.json`` where
    it attacked a U-shaped run's labels; nothing when it has no inversion.json."""
    path = run_dir / "privacy" / "inversion.json"
    if not path.is_file():
        return {}
    res = read_json_table(path)
    labels_path = run_dir / "privacy" / "labels.json"  # U-shaped runs: simulation.privacy.label_leakage.attack_run
    labels = read_json_table(labels_path) if labels_path.is_file() else {}
    return {**{f"inversion_{k}": res[k] for k in ("mse", "psnr", "ssim")},
            **{f"label_{k}": labels[k] for k in ("norm_auc", "direction_auc") if k in labels}}

def collect(out_dir: str | Path, target: float = 0.0) -> pd.DataFrame:
    """One row per run directory under ``out_dir``: its config, final/best accuracy,
    time to ``target`` accuracy (virtual s and global iterations), bytes moved, wall time.
    Writes ``results.csv``."""
    out = Path(out_dir)
    rows = []
    for cfg_path in sorted(out.glob("*/config.json")):
        run_dir = cfg_path.parent
        if not (run_dir / "summary.json").exists() or not (run_dir / "metrics.csv").exists():
            continue
        config = read_json_table(cfg_path).get("config")
        if not isinstance(config, dict):
            raise ConfigError(f"{cfg_path}: no run configuration")
        variant = dict(kv.split("=", 1) for kv in run_dir.name.split(",") if "=" in kv).get("variant")
        summary = read_json_table(run_dir / "summary.json")
        metrics = pd.read_csv(run_dir / "metrics.csv")
        t_s, t_it = time_to_target(metrics, target)
        rows.append({
            "run": run_dir.name, **({"variant": variant} if variant else {}), **config,
            "status": summary.get("status"),
            "final_accuracy": summary.get("final_accuracy"),
            "best_accuracy": summary.get("best_accuracy"),
            "global_iterations_done": summary.get("global_iterations"),
            "target_accuracy": target,
            "time_to_target_s": t_s,
            "iterations_to_target": t_it,
            "virtual_time_s": summary.get("virtual_time_s"),
            "bytes_up": summary.get("bytes_up"),
            "bytes_down": summary.get("bytes_down"),
            "wall_time_s": summary.get("wall_time_s"),
            **inversion_columns(run_dir),
        })
    table = pd.DataFrame(rows)
    table.to_csv(out / "results.csv", index=False)
    return table
