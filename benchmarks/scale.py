"""``sflower bench scale``: 10, 100 and 1,000 registered clients, 10 concurrent: memory and time per iteration."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks.common import PLAN_PRELUDE, fmnist_dir

_SCALE_CHILD = PLAN_PRELUDE + r"""
import json, resource, sys, time
from benchmarks.common import current_rss_mb
from simulation.engine import run_inprocess
n, data_dir, out, iters = int(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
plan = _plan(strategy="gas", dataset="fashion-mnist", data_dir=data_dir, num_clients=n, concurrency=10,
             partition="iid", global_iterations=2, local_iterations=iters, eval_every=0, output_dir=out)
plan.task.profiles
rss_setup = current_rss_mb()
summary = run_inprocess(plan, progress=False)
rss_run = current_rss_mb()
import pandas as pd
rows = pd.read_csv(plan.out_dir / "metrics.csv")
per_iter = float(rows["wall_time_s"].iloc[-1] - rows["wall_time_s"].iloc[-2])
print(json.dumps({"clients": n, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                  "rss_after_setup_mb": rss_setup, "rss_after_run_mb": rss_run,
                  "rss_growth_in_run_mb": rss_run - rss_setup, "s_per_global_iteration": per_iter}))
"""


def bench_scale(tmp: Path, quick: bool = False, data_dir: str | None = None) -> dict[str, Any]:
    """10 / 100 / 1000 registered clients, 10 concurrent: peak RSS and s per global iteration."""
    sizes = (10, 100, 1000)
    results = []
    for n in sizes:
        cmd = [sys.executable, "-c", _SCALE_CHILD, str(n), fmnist_dir(data_dir), str(tmp / f"scale-{n}"),
               "2" if quick else "5"]
        proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise RuntimeError(f"scale benchmark with {n} clients failed: {proc.stderr.strip().splitlines()[-1]}")
        results.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    base = results[0]
    for r in results:
        r["rss_after_run_ratio_vs_10"] = r["rss_after_run_mb"] / base["rss_after_run_mb"]
        r["time_ratio_vs_10"] = r["s_per_global_iteration"] / base["s_per_global_iteration"]
    return {"runs": results}
