"""``sflower bench engine``: the in-process and Ray engines side by side, Ray with 1, 2 and all CPUs."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from benchmarks.common import PLAN_PRELUDE, SMALL_ENGINE_RUN, fmnist_dir, make_plan, run_in_tree, side_by_side

_ENGINE_CHILD = PLAN_PRELUDE + r"""
import json, sys
from simulation.engine import run_inprocess
plan = _plan(**json.loads(sys.argv[1]))
plan.task.profiles
s = run_inprocess(plan, progress=False)
print(json.dumps({"wall_s_run": s["wall_time_s"], "exchanges": s["exchanges"],
                  "final_accuracy": s["final_accuracy"], "final_loss": s["final_loss"]}))
"""


def engine_cores() -> list[int]:
    """CPU counts of the Ray core sweep: 1, 2 and all of this machine's CPUs."""
    return sorted({1, 2, os.cpu_count() or 2})


def engine_pair(tmp: Path, name: str, cfg: dict[str, Any], cores: list[int]) -> dict[str, Any]:
    """One configuration in-process and on Ray with each CPU count: wall seconds, ratios, parallelism.

    ``cfg``: run-config overrides (underscored keys); each run writes to ``tmp/NAME-ENGINE``.
    """
    import pandas as pd

    from simulation.engine import run_inprocess
    from simulation.ray_engine import run_ray

    def iteration_s(out_dir: Path) -> float:
        rows = pd.read_csv(out_dir / "metrics.csv")
        return float(rows["wall_time_s"].iloc[1] - rows["wall_time_s"].iloc[0])

    plans = {"inprocess": make_plan(**cfg, output_dir=str(tmp / f"{name}-inprocess"))}
    for n in cores:
        plans[f"ray-{n}cpu"] = make_plan(**cfg, output_dir=str(tmp / f"{name}-ray-{n}cpu"))
    plans["inprocess"].task.profiles  # the data is loaded (and cached) before any timer starts
    out: dict[str, Any] = {}
    for key, plan in plans.items():
        t0 = time.perf_counter()
        if key == "inprocess":
            summary = run_inprocess(plan, progress=False)
        else:
            summary = run_ray(plan, progress=False, num_cpus=int(key.split("-")[1][:-3]))
        wall = time.perf_counter() - t0
        run_wall = summary["wall_time_s"]
        entry = {"wall_s_total": wall, "wall_s_run": run_wall, "s_first_global_iteration": iteration_s(plan.out_dir),
                 "exchanges": summary["exchanges"], "exchanges_per_s": summary["exchanges"] / run_wall,
                 "final_accuracy": summary["final_accuracy"], "final_loss": summary["final_loss"]}
        if key == "inprocess":
            entry["model_compute_s"] = summary["client_compute_s"] + summary["server_compute_s"]
            entry["client_compute_s"] = summary["client_compute_s"]
            entry["server_compute_s"] = summary["server_compute_s"]
        else:
            ray = summary["ray"]
            entry.update(ray_start_s=ray["start_s"], mean_parallel=ray["mean_parallel"],
                         max_parallel=ray["max_parallel"])
        out[key] = entry
    base = out["inprocess"]
    for key in plans:
        if key != "inprocess":
            r = out[key]
            r["over_inprocess_run"] = r["wall_s_run"] / base["wall_s_run"]
            r["over_inprocess_total"] = r["wall_s_total"] / base["wall_s_total"]
            r["over_inprocess_iteration"] = r["s_first_global_iteration"] / base["s_first_global_iteration"]
            r["same_results"] = (r["final_accuracy"], r["final_loss"]) == (base["final_accuracy"], base["final_loss"])
    return out


def engine_against(tmp: Path, against: str, cfg: dict[str, Any], repeats: int = 3) -> dict[str, Any]:
    """The in-process run ``cfg`` for git revision ``against`` (old) and this checkout (new), alternately.

    Each run is a fresh interpreter (:func:`~benchmarks.common.side_by_side`);
    the figure per side is the fastest run's ``wall_s_run`` (seconds), and
    ``exchanges_per_s_new_over_old`` their ratio in exchanges per second
    (above 1: the new code is faster). ``same_results``: every run gave the
    same accuracy, loss and exchange count.

    Raises:
        ConfigError: ``against`` is not a commit of this checkout.
        RuntimeError: a run failed (its last error line).
    """
    import json

    runs = side_by_side(against, tmp / "engine-against", repeats, lambda src, out: run_in_tree(
        src, ["-c", _ENGINE_CHILD, json.dumps(dict(cfg, output_dir=str(out)))], "engine run"))
    out: dict[str, Any] = {"against": against, "repeats": repeats}
    for side, rs in runs.items():
        best = min(r["wall_s_run"] for r in rs)
        out[side] = {"wall_s_run": best, "exchanges_per_s": rs[0]["exchanges"] / best,
                     "runs_s": [r["wall_s_run"] for r in rs]}
    out["exchanges_per_s_new_over_old"] = out["new"]["exchanges_per_s"] / out["old"]["exchanges_per_s"]
    out["same_results"] = len({(r["final_accuracy"], r["final_loss"], r["exchanges"])
                               for rs in runs.values() for r in rs}) == 1
    return out


def bench_engine(tmp: Path, quick: bool = False, data_dir: str | None = None,
                 against: str | None = None) -> dict[str, Any]:
    """The in-process and Ray engines side by side, Ray with 1, 2 and all CPUs (one client actor per CPU).

    * ``small``: a short GAS run on mnist-5k (4 clients, 2 concurrent, 1
      global iteration of 10 local iterations; 3 with ``quick``), where the
      engines' fixed costs dominate.
    * ``realistic`` (not with ``quick``): GAS on Fashion-MNIST at the
      paper's settings (K=20, C=10, E=20, B=32, shard=2), 2 global
      iterations, a 200-image evaluation after the first.

    Per run: ``wall_s_total`` (the call, Ray's start included),
    ``wall_s_run`` (the strategy's wall time: handshake, evaluations and
    training, as in summary.json), ``s_first_global_iteration`` (between the
    first two metric rows); for Ray ``ray_start_s``, the client parallelism
    reached (``mean_parallel``, ``max_parallel``, see
    :func:`simulation.ray_engine.placement_table`) and each wall time over the
    in-process one, and whether accuracy and loss are identical.

    With ``against`` (a git revision), only the small run, in-process, for
    that revision and this checkout side by side (:func:`engine_against`).
    """
    cores = engine_cores()
    small = dict(SMALL_ENGINE_RUN, local_iterations=3) if quick else SMALL_ENGINE_RUN
    if against is not None:
        return engine_against(tmp, against, small)
    out: dict[str, Any] = {"cores": cores, "small": engine_pair(tmp, "engine-small", small, cores)}
    if not quick:
        realistic = dict(strategy="gas", dataset="fashion-mnist", data_dir=fmnist_dir(data_dir), num_clients=20,
                         concurrency=10, local_iterations=20, batch_size=32, partition="shard", shards=2,
                         global_iterations=2, eval_every=1, eval_samples=200)
        out["realistic"] = engine_pair(tmp, "engine-realistic", realistic, cores)
    out["ray_over_inprocess_wall"] = {f"{k}/{n}cpu": out[k][f"ray-{n}cpu"]["over_inprocess_run"]
                                      for k in ("small", "realistic") if k in out for n in cores}
    return out
