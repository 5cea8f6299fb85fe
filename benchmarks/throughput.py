"""``sflower bench throughput``: GAS client iterations per second at the paper's settings, old and new."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from benchmarks.common import PLAN_PRELUDE, fmnist_dir, make_plan, run_in_tree, side_by_side

_THROUGHPUT_CHILD = PLAN_PRELUDE + r"""
import json, sys, time
import importlib.util
# where the strategies evaluate: strategies.core.evaluation since issue 22, strategies.core.base before
base = importlib.import_module("strategies.core.evaluation" if importlib.util.find_spec("strategies.core.evaluation")
                               else "strategies.core.base")
from simulation.engine import run_inprocess
data_dir, out, iters, gi = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
spent = [0.0]
_evaluate = base.evaluate_model
def timed(*a, **k):
    t = time.perf_counter()
    try:
        return _evaluate(*a, **k)
    finally:
        spent[0] += time.perf_counter() - t
base.evaluate_model = timed
plan = _plan(strategy="gas", dataset="fashion-mnist", data_dir=data_dir, num_clients=20, concurrency=10,
             local_iterations=iters, batch_size=32, partition="shard", shards=2, global_iterations=gi,
             eval_every=0, output_dir=out)
plan.task.profiles
t0 = time.perf_counter()
summary = run_inprocess(plan, progress=False)
wall = time.perf_counter() - t0
import pandas as pd
rows = pd.read_csv(plan.out_dir / "metrics.csv")
print(json.dumps({"wall_s": wall, "eval_s": spent[0], "s_per_global_iteration": (wall - spent[0]) / gi,
                  "server_compute_s": summary.get("server_compute_s"),
                  "client_iterations": float(rows["client_iterations"].iloc[-1]),
                  "server_updates": summary.get("server_updates"),
                  "accuracy": [float(a) for a in rows["test_accuracy"]],
                  "loss": [float(a) for a in rows["test_loss"]]}))
"""


def _throughput_child(src: Path, data_dir: str, out: Path, iters: int, gi: int) -> dict[str, Any]:
    """One throughput run of the code under ``src`` in a fresh interpreter (JSON figures)."""
    return run_in_tree(src, ["-c", _THROUGHPUT_CHILD, data_dir, str(out), str(iters), str(gi)], "throughput run")


def bench_throughput(tmp: Path, quick: bool = False, data_dir: str | None = None,
                     against: str | None = None, repeats: int = 2) -> dict[str, Any]:
    """GAS at the paper's settings on Fashion-MNIST (K=20, C=10, E=20, B=32, shard=2).

    Reports client iterations per wall second and the wall seconds per global
    iteration (evaluation excluded). With ``against`` (a git revision such as
    ``HEAD``), that revision's code (extracted with ``git archive``) and the
    working tree run the same configuration alternately, ``repeats`` times
    each, each run in a fresh interpreter, so load drift on a shared machine
    hits both; the ratio new/old of the median seconds per global iteration
    is reported, with whether the two gave the same accuracy and loss bit
    for bit.

    Raises:
        ConfigError: ``against`` is not a commit of this checkout.
        RuntimeError: a run failed (its last error line).
    """
    from simulation.engine import run_inprocess

    if against is None:
        plan = make_plan(strategy="gas", dataset="fashion-mnist", data_dir=fmnist_dir(data_dir), num_clients=20,
                     concurrency=10, local_iterations=5 if quick else 20, batch_size=32, partition="shard",
                     shards=2, global_iterations=1, eval_every=0, output_dir=str(tmp / "throughput"))
        t0 = time.perf_counter()
        summary = run_inprocess(plan, progress=False)
        wall = time.perf_counter() - t0
        import pandas as pd

        rows = pd.read_csv(plan.out_dir / "metrics.csv")
        iters = float(rows["client_iterations"].iloc[-1])
        run_wall = summary["wall_time_s"]
        return {"client_iterations": iters, "wall_s_run": run_wall, "wall_s_total": wall,
                "client_iterations_per_s": iters / run_wall,
                "server_updates_per_s": summary["server_updates"] / run_wall}
    import statistics

    e = 5 if quick else 20
    runs = side_by_side(against, tmp / "throughput", repeats,
                        lambda src, out: _throughput_child(src, fmnist_dir(data_dir), out, e, 1))
    out: dict[str, Any] = {"against": against, "local_iterations": e, "repeats": repeats}
    for side in ("old", "new"):
        per = [r["s_per_global_iteration"] for r in runs[side]]
        out[side] = {"s_per_global_iteration": statistics.median(per), "runs_s": per,
                     "server_compute_s": statistics.median(r["server_compute_s"] for r in runs[side]),
                     "client_iterations_per_s": runs[side][0]["client_iterations"] / statistics.median(per),
                     "final_accuracy": runs[side][0]["accuracy"][-1]}
    out["ratio_new_over_old"] = out["new"]["s_per_global_iteration"] / out["old"]["s_per_global_iteration"]
    o, n = runs["old"][0], runs["new"][0]
    out["same_accuracy_and_loss_bitwise"] = o["accuracy"] == n["accuracy"] and o["loss"] == n["loss"]
    out["max_abs_loss_difference"] = max(abs(a - b) for a, b in zip(o["loss"], n["loss"]))
    return out

