"""``sflower bench summary --against REV``: the headline speed and memory figures, old and new, in one run.

One table of the figures issue 13 ("speed and memory") asks to see before
and after, for git revision ``REV`` ("old") and the working tree ("new"):

* **GAS s per global iteration**: Fashion-MNIST at the paper's settings
  (K=20, C=10, E=20, B=32, shard=2), evaluation excluded, the two trees run
  alternately (:func:`benchmarks.throughput.bench_throughput`);
* **Ray ÷ in-process**: the run wall time (``summary.json``'s
  ``wall_time_s``) on Ray with 2 CPUs over the in-process one, on the small
  mnist-5k run of ``sflower bench engine`` (fixed costs dominate) and on one
  global iteration of the Fashion-MNIST run above (``realistic``, not with
  ``--quick``);
* **generation**: seconds per server update of the full-covariance
  statistics (update + top-up, D=3136) and the resident memory of 100 labels
  at D=4096 (:mod:`benchmarks.generation`);
* **main job**: ``sflower run`` with no arguments, wall seconds of the whole
  command (interpreter start included) and its final accuracy.

Every figure of a tree comes from a fresh interpreter that imports that
tree's code (``PYTHONPATH``), so the old revision runs exactly as it was.
Ratios are new/old, measured side by side on the same machine in the same
run (this machine is shared and noisy: compare within one run only).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from benchmarks.common import PLAN_PRELUDE, REPO_ROOT, SMALL_ENGINE_RUN, fmnist_dir, run_in_tree, source_tree

_ENGINE_CHILD = PLAN_PRELUDE + r"""
import json, sys, time
from simulation import engine
from simulation.engine import run_inprocess
if hasattr(engine, "run_ray"):  # revisions before the Ray engine had its own module
    run_ray = engine.run_ray
else:  # (not an ImportError test: an editable install would supply this checkout's module)
    from simulation.ray_engine import run_ray
cfg, engine = json.loads(sys.argv[1]), sys.argv[2]
plan = _plan(**cfg)
plan.task.profiles
t0 = time.perf_counter()
if engine == "inprocess":
    summary = run_inprocess(plan, progress=False)
else:
    summary = run_ray(plan, progress=False, num_cpus=int(engine.split("-")[1]))
print(json.dumps({"wall_s_total": time.perf_counter() - t0, "wall_s_run": summary["wall_time_s"],
                  "final_accuracy": summary["final_accuracy"]}))
"""

_GENERATION_CHILD = r"""
import json, pathlib
import simulation
if (pathlib.Path(simulation.__file__).parent.parent / "benchmarks" / "generation.py").exists():
    from benchmarks import generation as bench_generation
elif (pathlib.Path(simulation.__file__).parent / "bench" / "generation.py").exists():  # before benchmarks/ moved
    from simulation.bench import generation as bench_generation
else:  # a revision before issue 22
    from simulation import bench_generation
r = bench_generation.run(updates=6, warmup=20, baseline_updates=1)
print(json.dumps({"ours_full_s": r["ours_full_s"], "straightforward_s": r["straightforward_s"]}))
"""


def _ray_ratio(src: Path, cfg: dict[str, Any], cpus: int) -> dict[str, Any]:
    """In-process and Ray (``cpus`` CPUs) runs of ``cfg`` in ``src``; their run walls and ratio."""
    ins = run_in_tree(src, ["-c", _ENGINE_CHILD, json.dumps(cfg), "inprocess"], "in-process run")
    ray = run_in_tree(src, ["-c", _ENGINE_CHILD, json.dumps(cfg), f"ray-{cpus}"], "Ray run")
    return {"inprocess_s": ins["wall_s_run"], "ray_s": ray["wall_s_run"],
            "ray_over_inprocess": ray["wall_s_run"] / ins["wall_s_run"],
            "same_accuracy": ins["final_accuracy"] == ray["final_accuracy"]}


def _main_job(src: Path, out: Path) -> dict[str, Any]:
    """``sflower run`` with no arguments in ``src``: wall seconds of the command and final accuracy."""
    code = f"import sys; from simulation.cli import main; sys.exit(main(['run', 'output-dir={out}']))"
    t0 = time.perf_counter()
    run_in_tree(src, ["-c", code], "main job")
    wall = time.perf_counter() - t0
    summary = json.loads((out / "summary.json").read_text())
    return {"wall_s": wall, "final_accuracy": summary["final_accuracy"],
            "global_iterations": summary["global_iterations"]}


def run(tmp: Path, against: str, quick: bool = False, data_dir: str | None = None) -> dict[str, Any]:
    """The summary table, ``against`` (old) vs. the working tree (new); see the module docstring.

    With ``quick`` the throughput runs use E=5, the realistic Ray run and
    the main jobs are left out.

    Raises:
        ConfigError: ``against`` is not a commit of this checkout.
        RuntimeError: a run of either tree failed.
    """
    from benchmarks.generation import run_memory
    from benchmarks.throughput import bench_throughput

    new_src = REPO_ROOT
    old_src = source_tree(against, tmp / "summary-src-old")
    sides = {"old": old_src, "new": new_src}
    realistic = dict(strategy="gas", dataset="fashion-mnist", data_dir=fmnist_dir(data_dir), num_clients=20,
                     concurrency=10, local_iterations=20, batch_size=32, partition="shard", shards=2,
                     global_iterations=1, eval_every=0)
    out: dict[str, Any] = {"against": against, "quick": quick, "old": {}, "new": {}}
    thr = bench_throughput(tmp, quick, data_dir, against)
    for side in sides:
        out[side]["s_per_global_iteration"] = thr[side]["s_per_global_iteration"]
    out["throughput_same_accuracy_and_loss_bitwise"] = thr["same_accuracy_and_loss_bitwise"]
    for side, src in sides.items():
        out[side]["ray_small"] = _ray_ratio(src, SMALL_ENGINE_RUN, 2)
        if not quick:
            out[side]["ray_realistic"] = _ray_ratio(src, realistic, 2)
        out[side]["generation"] = run_in_tree(src, ["-c", _GENERATION_CHILD], "generation benchmark")
    memory = run_memory(against=against, quick=quick)
    out["statistics_case"] = {k: memory[k] for k in ("dim", "labels", "seen_per_label")}
    for side in sides:
        if side in memory:
            out[side]["statistics_mb"] = memory[side]["early"].get("growth_mb")
            out[side]["statistics_projected_mb_steady"] = memory[side]["steady"].get("projected_100_labels_mb")
    if not quick:
        for side, src in sides.items():
            out[side]["main_job"] = _main_job(src, tmp / f"summary-main-{side}")
    out["table"] = table(out)
    return out


def table(res: dict[str, Any]) -> str:
    """The old/new/ratio figures of :func:`run`'s result as a Markdown table."""
    def get(side: str, *path: str) -> float | None:
        v: Any = res.get(side, {})
        for p in path:
            v = v.get(p) if isinstance(v, dict) else None
        return v

    rows = [
        ("GAS s per global iteration (FMNIST, K=20 C=10 E=20 B=32)", ("s_per_global_iteration",), "{:.2f}"),
        ("Ray (2 CPUs) ÷ in-process, small run", ("ray_small", "ray_over_inprocess"), "{:.2f}"),
        ("Ray (2 CPUs) ÷ in-process, realistic run", ("ray_realistic", "ray_over_inprocess"), "{:.2f}"),
        ("generation s per server update (full, D=3136)", ("generation", "ours_full_s"), "{:.4f}"),
        ("statistics MB, {labels} labels at D={dim} ({seen_per_label} seen each)",
         ("statistics_mb",), "{:.0f}"),
        ("statistics MB, 100 labels at D={dim}, steady state (projected)",
         ("statistics_projected_mb_steady",), "{:.0f}"),
        ("main job wall s (`sflower run`)", ("main_job", "wall_s"), "{:.0f}"),
        ("main job final accuracy", ("main_job", "final_accuracy"), "{:.3f}"),
    ]
    lines = [f"| figure | old ({res['against']}) | new | new ÷ old |", "|---|---|---|---|"]
    case = {"labels": 100, "dim": 4096, "seen_per_label": 400, **res.get("statistics_case", {})}
    for name, path, fmt in rows:
        o, n = get("old", *path), get("new", *path)
        if o is None and n is None:
            continue
        name = name.format(**case)
        ratio = f"{n / o:.2f}" if isinstance(o, (int, float)) and isinstance(n, (int, float)) and o else "–"
        lines.append(f"| {name} | {fmt.format(o) if o is not None else '–'} | "
                     f"{fmt.format(n) if n is not None else '–'} | {ratio} |")
    return "\n".join(lines)
