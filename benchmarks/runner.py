"""``sflower bench [NAME ...]``: run the named benchmarks, print and return their figures."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

BENCHMARKS = ("engine", "throughput", "scale", "generation", "memory", "ring", "liveness", "population", "summary")
#: What ``sflower bench`` runs when no benchmark is named (``summary`` repeats the others' runs;
#: ``population`` takes minutes, at 10,000 clients).
DEFAULT_BENCHMARKS = tuple(b for b in BENCHMARKS if b not in ("population", "summary"))


def run_benchmarks(names: list[str], quick: bool = False, data_dir: str | None = None,
                   against: str | None = None, out: str | None = None) -> dict[str, Any]:
    """Run the named benchmarks; print and return their figures.

    ``against``: a git revision that ``engine`` (its small run, in-process),
    ``throughput``, ``ring`` (one 60-step round, in-process; 20 with
    ``quick``) and ``summary`` run side by side with the working tree, each
    run in a fresh interpreter (:func:`benchmarks.common.side_by_side`); so does ``population``.
    ``out``: the directory ``population`` writes its results file and table to.
    """
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="sflower-bench-") as tmpdir:
        tmp = Path(tmpdir)
        for name in names:
            print(f"== {name} ==", flush=True)
            if name == "engine":
                from benchmarks.engine import bench_engine

                results[name] = bench_engine(tmp, quick, data_dir, against)
            elif name == "throughput":
                from benchmarks.throughput import bench_throughput

                results[name] = bench_throughput(tmp, quick, data_dir, against)
            elif name == "scale":
                from benchmarks.scale import bench_scale

                results[name] = bench_scale(tmp, quick, data_dir)
            elif name == "generation":
                from benchmarks.generation import bench_generation_cost

                results[name] = bench_generation_cost(quick, against)
            elif name == "memory":
                from benchmarks import memory

                results[name] = memory.run(quick)
            elif name == "ring":
                from benchmarks import ring
                from benchmarks.common import mnist_dir

                if against is None:
                    results[name] = ring.run(tmp, quick, mnist_dir(data_dir))
                else:
                    results[name] = ring.ring_against(tmp, against, 20 if quick else 60, mnist_dir(data_dir))
            elif name == "liveness":  # the main job's first output and output gaps (this checkout only)
                from benchmarks.liveness import bench_liveness

                results[name] = bench_liveness(tmp, quick)
            elif name == "population":  # process time, start-up, s per iteration, peak RSS at 100..10,000 clients
                from benchmarks.population import bench_population

                results[name] = bench_population(tmp, quick, data_dir, against, out)
            elif name == "summary":
                from benchmarks import summary

                if against is None:
                    raise ValueError("bench summary needs against=REV")
                results[name] = summary.run(tmp, against, quick, data_dir)
            print(json.dumps(results[name], indent=2, default=str), flush=True)
            if name in ("summary", "population"):
                print(results[name]["table"], flush=True)
    return results
