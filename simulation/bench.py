"""``sflower bench``: the system's own speed, measured side by side in one run.

Not part of the test suite. The benchmarks, each printing its figures and
ratios (this machine is shared and noisy, so compare within one run):

* ``engine``: the same short GAS run in-process and on the Ray engine:
  wall time, exchanges per second, and the share of wall time spent outside
  model compute. Model compute is the time inside ClientApp handlers
  (measured in-process; the Ray run does the same deterministic work) plus
  the server's reply hooks less their message pushes.
* ``throughput``: client iterations per second for GAS on Fashion-MNIST at
  the paper's settings (K=20, C=10, E=20, B=32, shard=2).
* ``scale``: 10, 100 and 1,000 registered virtual clients with 10
  concurrent: resident memory after setup and after the run, peak memory, and
  time per global iteration, each size in a fresh subprocess.
* ``generation``: time per server update of sampling generated activations,
  straightforward vs. ours (see :mod:`simulation.bench_generation`).
* ``memory``: peak client memory of one client step, zeroth-order against
  first-order (see :mod:`simulation.bench_memory`).
* ``ring``: one RingSFL round (LeNet-5, MNIST, 5 clients, 8:1:1:1:1) on the
  in-process and Ray engines against a one-process oracle doing the same
  arithmetic on the same batches (see :mod:`simulation.bench_ring`).
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCHMARKS = ("engine", "throughput", "scale", "generation", "memory", "ring")
FMNIST_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "fashion-mnist"


def _plan(**overrides: Any):
    from fl_app.config import RunConfig
    from fl_app.server_app import plan_run

    return plan_run(RunConfig.from_mapping(overrides))


def _fmnist_dir(data_dir: str | None) -> str:
    d = Path(data_dir) if data_dir else FMNIST_DIR
    return str(d)


def _mnist_dir(data_dir: str | None) -> str:
    """MNIST's IDX directory: ``mnist`` beside ``data_dir`` (which names Fashion-MNIST's), or the default."""
    from simulation.bench_ring import MNIST_DIR

    return str(Path(data_dir).parent / "mnist") if data_dir else str(MNIST_DIR)


def bench_engine(tmp: Path, quick: bool = False) -> dict[str, Any]:
    """Same GAS run in-process and on Ray: wall s, exchanges/s, share outside model compute."""
    from simulation.engine import run_inprocess, run_ray

    cfg = dict(strategy="gas", dataset="mnist-5k", num_clients=4, concurrency=2, partition="iid",
               global_iterations=1, local_iterations=3 if quick else 10, eval_every=0)
    out: dict[str, Any] = {}
    t0 = time.perf_counter()
    s_in = run_inprocess(_plan(**cfg, output_dir=str(tmp / "engine-inprocess")), progress=False)
    wall_in = time.perf_counter() - t0
    t0 = time.perf_counter()
    s_ray = run_ray(_plan(**cfg, output_dir=str(tmp / "engine-ray")), progress=False)
    wall_ray = time.perf_counter() - t0
    compute = s_in["client_compute_s"] + s_in["server_compute_s"]
    for name, summary, wall in (("inprocess", s_in, wall_in), ("ray", s_ray, wall_ray)):
        run_wall = summary["wall_time_s"]
        out[name] = {
            "wall_s_total": wall, "wall_s_run": run_wall, "exchanges": summary["exchanges"],
            "exchanges_per_s": summary["exchanges"] / run_wall,
            "share_outside_compute": max(0.0, 1.0 - compute / run_wall),
            "final_accuracy": summary["final_accuracy"],
        }
    out["model_compute_s"] = compute
    out["ray_over_inprocess_wall"] = out["ray"]["wall_s_run"] / out["inprocess"]["wall_s_run"]
    out["same_accuracy"] = s_in["final_accuracy"] == s_ray["final_accuracy"]
    return out


def bench_throughput(tmp: Path, quick: bool = False, data_dir: str | None = None) -> dict[str, Any]:
    """GAS at the paper's settings on Fashion-MNIST: client iterations per wall second."""
    from simulation.engine import run_inprocess

    plan = _plan(strategy="gas", dataset="fashion-mnist", data_dir=_fmnist_dir(data_dir), num_clients=20,
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


_SCALE_CHILD = r"""
import json, resource, sys, time
from simulation.bench import _plan, current_rss_mb
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


def current_rss_mb() -> float:
    """Resident memory of this process now (MB, from /proc/self/status)."""
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def bench_scale(tmp: Path, quick: bool = False, data_dir: str | None = None) -> dict[str, Any]:
    """10 / 100 / 1000 registered clients, 10 concurrent: peak RSS and s per global iteration."""
    sizes = (10, 100, 1000)
    results = []
    for n in sizes:
        cmd = [sys.executable, "-c", _SCALE_CHILD, str(n), _fmnist_dir(data_dir), str(tmp / f"scale-{n}"),
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


def bench_generation_cost(quick: bool = False) -> dict[str, Any]:
    """Straightforward vs. incremental-factor sampling of generated activations (per server update)."""
    from simulation import bench_generation

    kwargs = {"updates": 6, "warmup": 20, "baseline_updates": 1} if quick else {}
    return bench_generation.run(**kwargs)


def run_benchmarks(names: list[str], quick: bool = False, data_dir: str | None = None) -> dict[str, Any]:
    """Run the named benchmarks; print and return their figures."""
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sflower-bench-") as tmpdir:
        tmp = Path(tmpdir)
        for name in names:
            print(f"== {name} ==", flush=True)
            if name == "engine":
                results[name] = bench_engine(tmp, quick)
            elif name == "throughput":
                results[name] = bench_throughput(tmp, quick, data_dir)
            elif name == "scale":
                results[name] = bench_scale(tmp, quick, data_dir)
            elif name == "generation":
                results[name] = bench_generation_cost(quick)
            elif name == "memory":
                from simulation import bench_memory

                results[name] = bench_memory.run(quick)
            elif name == "ring":
                from simulation import bench_ring

                results[name] = bench_ring.run(tmp, quick, _mnist_dir(data_dir))
            print(json.dumps(results[name], indent=2, default=str), flush=True)
    return results
