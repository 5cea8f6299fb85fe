"""``sflower bench``: the system's own speed, measured side by side in one run.

Not part of the test suite. The benchmarks, each printing its figures and
ratios (this machine is shared and noisy, so compare within one run):

* ``engine``: the same GAS runs in-process and on the Ray engine with 1, 2
  and all CPUs (a core sweep): a short mnist-5k run where fixed costs
  dominate, and (not with ``--quick``) the paper's Fashion-MNIST setting;
  wall times, their ratios, Ray's start-up and the client parallelism it
  reached (see :func:`bench_engine`).
* ``throughput``: client iterations per second for GAS on Fashion-MNIST at
  the paper's settings (K=20, C=10, E=20, B=32, shard=2). With
  ``--against REV`` (e.g. ``HEAD``) it runs that git revision and the working
  tree alternately and reports seconds per global iteration and their ratio.
* ``scale``: 10, 100 and 1,000 registered virtual clients with 10
  concurrent: resident memory after setup and after the run, peak memory, and
  time per global iteration, each size in a fresh subprocess.
* ``generation``: time per server update of sampling generated activations,
  straightforward vs. ours, and the resident memory of the statistics for
  100 labels at D=4096, old (``--against``, default HEAD) vs. new (see
  :mod:`simulation.bench_generation`).
* ``memory``: peak client memory of one client step, zeroth-order against
  first-order (see :mod:`simulation.bench_memory`).
* ``summary`` (only when named, with ``--against REV``): the headline
  figures of the above, REV and the working tree side by side in one table
  (see :mod:`simulation.bench_summary`).
* ``ring``: one RingSFL round (LeNet-5, MNIST, 5 clients, 8:1:1:1:1) on the
  in-process and Ray engines against a one-process oracle doing the same
  arithmetic on the same batches (see :mod:`simulation.bench_ring`).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCHMARKS = ("engine", "throughput", "scale", "generation", "memory", "ring", "summary")
#: What ``sflower bench`` runs when no benchmark is named (``summary`` repeats the others' runs).
DEFAULT_BENCHMARKS = BENCHMARKS[:-1]
FMNIST_DIR = Path(__file__).resolve().parents[2] / "shared" / "data" / "fashion-mnist"


#: The short GAS run of ``bench engine`` (and ``bench summary``) where the engines' fixed costs dominate.
SMALL_ENGINE_RUN: dict[str, Any] = dict(strategy="gas", dataset="mnist-5k", num_clients=4, concurrency=2,
                                        partition="iid", global_iterations=1, local_iterations=10, eval_every=0)


def _plan(**overrides: Any):
    from fl_app.config import RunConfig
    from simulation.server_app import plan_run

    return plan_run(RunConfig.from_mapping(overrides))


def _fmnist_dir(data_dir: str | None) -> str:
    d = Path(data_dir) if data_dir else FMNIST_DIR
    return str(d)


def _mnist_dir(data_dir: str | None) -> str:
    """MNIST's IDX directory: ``mnist`` beside ``data_dir`` (which names Fashion-MNIST's), or the default."""
    from simulation.bench_ring import MNIST_DIR

    return str(Path(data_dir).parent / "mnist") if data_dir else str(MNIST_DIR)


def _engine_cores() -> list[int]:
    """CPU counts of the Ray core sweep: 1, 2 and all of this machine's CPUs."""
    return sorted({1, 2, os.cpu_count() or 2})


def _engine_pair(tmp: Path, name: str, cfg: dict[str, Any], cores: list[int]) -> dict[str, Any]:
    """One configuration in-process and on Ray with each CPU count: wall seconds, ratios, parallelism."""
    import pandas as pd

    from simulation.engine import run_inprocess
    from simulation.ray_engine import run_ray

    def iteration_s(out_dir: Path) -> float:
        rows = pd.read_csv(out_dir / "metrics.csv")
        return float(rows["wall_time_s"].iloc[1] - rows["wall_time_s"].iloc[0])

    plans = {"inprocess": _plan(**cfg, output_dir=str(tmp / f"{name}-inprocess"))}
    for n in cores:
        plans[f"ray-{n}cpu"] = _plan(**cfg, output_dir=str(tmp / f"{name}-ray-{n}cpu"))
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


def bench_engine(tmp: Path, quick: bool = False, data_dir: str | None = None) -> dict[str, Any]:
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
    """
    cores = _engine_cores()
    small = dict(SMALL_ENGINE_RUN, local_iterations=3) if quick else SMALL_ENGINE_RUN
    out: dict[str, Any] = {"cores": cores, "small": _engine_pair(tmp, "engine-small", small, cores)}
    if not quick:
        realistic = dict(strategy="gas", dataset="fashion-mnist", data_dir=_fmnist_dir(data_dir), num_clients=20,
                         concurrency=10, local_iterations=20, batch_size=32, partition="shard", shards=2,
                         global_iterations=2, eval_every=1, eval_samples=200)
        out["realistic"] = _engine_pair(tmp, "engine-realistic", realistic, cores)
    out["ray_over_inprocess_wall"] = {f"{k}/{n}cpu": out[k][f"ray-{n}cpu"]["over_inprocess_run"]
                                      for k in ("small", "realistic") if k in out for n in cores}
    return out


_THROUGHPUT_CHILD = r"""
import json, sys, time
import strategies.base as base
from simulation.bench import _plan
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


def _source_tree(rev: str, dest: Path) -> Path:
    """The tree of git revision ``rev`` of this checkout, extracted (``git archive``) under ``dest``.

    Leaves the repository itself untouched (no worktree metadata).

    Raises:
        ConfigError: not a git checkout, or ``rev`` is unknown.
    """
    from fl_app.errors import ConfigError

    repo = Path(__file__).resolve().parents[1]
    proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "--quiet", f"{rev}^{{commit}}"],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ConfigError(f"bench --against: {rev!r} is not a commit of {repo}")
    sha = proc.stdout.strip()
    dest.mkdir(parents=True, exist_ok=True)
    archive = subprocess.Popen(["git", "-C", str(repo), "archive", sha], stdout=subprocess.PIPE)
    subprocess.run(["tar", "-x", "-C", str(dest)], stdin=archive.stdout, check=True)
    archive.stdout.close()
    if archive.wait() != 0:
        raise ConfigError(f"bench --against: git archive {sha} failed")
    return dest


def run_in_tree(src: Path, args: list[str], what: str) -> dict[str, Any]:
    """Run ``python *args`` in a fresh interpreter with the code under ``src`` first on the path (cwd ``src``).

    Returns:
        the JSON object on the child's last stdout line ({} when it printed none).

    Raises:
        RuntimeError: the child failed; the message names ``what`` and gives its last stderr line.
    """
    env = dict(os.environ, PYTHONPATH=str(src))
    proc = subprocess.run([sys.executable, *args], cwd=str(src), env=env, capture_output=True, text=True,
                          check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"{what} of {src} failed: {tail}")
    lines = proc.stdout.strip().splitlines()
    return json.loads(lines[-1]) if lines else {}


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
    import statistics

    old_src = _source_tree(against, tmp / "throughput-src-old")
    new_src = Path(__file__).resolve().parents[1]
    e = 5 if quick else 20
    runs: dict[str, list[dict[str, Any]]] = {"old": [], "new": []}
    for i in range(repeats):
        for side, src in (("old", old_src), ("new", new_src)) if i % 2 == 0 else (("new", new_src), ("old", old_src)):
            runs[side].append(_throughput_child(src, _fmnist_dir(data_dir), tmp / f"throughput-{side}-{i}", e, 1))
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


def bench_generation_cost(quick: bool = False, against: str | None = None) -> dict[str, Any]:
    """Straightforward vs. incremental-factor sampling of generated activations (per server update),
    and the resident memory of the statistics for 100 labels at D=4096, ``against`` (default
    ``HEAD``) vs. the working tree (see :func:`simulation.bench_generation.run_memory`)."""
    from simulation import bench_generation

    kwargs = {"updates": 6, "warmup": 20, "baseline_updates": 1} if quick else {}
    out = bench_generation.run(**kwargs)
    out["memory"] = bench_generation.run_memory(against=against or "HEAD", quick=quick)
    return out


def run_benchmarks(names: list[str], quick: bool = False, data_dir: str | None = None,
                   against: str | None = None) -> dict[str, Any]:
    """Run the named benchmarks; print and return their figures.

    ``against``: a git revision that ``throughput`` and ``summary`` also
    run, side by side with the working tree (see :func:`bench_throughput`).
    """
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sflower-bench-") as tmpdir:
        tmp = Path(tmpdir)
        for name in names:
            print(f"== {name} ==", flush=True)
            if name == "engine":
                results[name] = bench_engine(tmp, quick, data_dir)
            elif name == "throughput":
                results[name] = bench_throughput(tmp, quick, data_dir, against)
            elif name == "scale":
                results[name] = bench_scale(tmp, quick, data_dir)
            elif name == "generation":
                results[name] = bench_generation_cost(quick, against)
            elif name == "memory":
                from simulation import bench_memory

                results[name] = bench_memory.run(quick)
            elif name == "ring":
                from simulation import bench_ring

                results[name] = bench_ring.run(tmp, quick, _mnist_dir(data_dir))
            elif name == "summary":
                from simulation import bench_summary

                if against is None:
                    raise ValueError("bench summary needs against=REV")
                results[name] = bench_summary.run(tmp, against, quick, data_dir)
            print(json.dumps(results[name], indent=2, default=str), flush=True)
            if name == "summary":
                print(results[name]["table"], flush=True)
    return results
