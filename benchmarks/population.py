"""``python -m benchmarks population``: one ``sflower run`` per population size, start-up against training.

The run is issue 47's: SplitFed-V1, LeNet-5 on Fashion-MNIST, IID, 10 clients per round, 2 global
iterations of 1 local iteration at batch 4, in-process, ``N`` = 100, 1,000 and 10,000 registered
clients (``--quick``: 100 and 1,000). Each run is a fresh process (``python -c 'simulation.cli.main()'
run -q ...``), timed from outside; it reports its own peak resident memory (``ru_maxrss``) at exit.

Figures per run:

* ``process_s``: the process's wall seconds, interpreter start to exit;
* ``s_per_global_iteration``: ``(wall_time_s[last] - wall_time_s[0]) / 2`` from ``metrics.csv``
  (the rows after iteration 0's evaluation; every client's training and the evaluations);
* ``startup_s``: ``process_s`` less the global iterations' time: imports, data, partitioning,
  the handshake, the first evaluation and the outputs (``partition.png``, the model, the summary);
* ``peak_rss_mb``: the process's peak resident memory (MB).

With ``--against REV`` each size runs for ``REV``'s tree ("old") and this checkout ("new"), alternately
(:func:`benchmarks.common.side_by_side`). With ``--out DIR`` the figures go to ``DIR/results.json``
and the table to ``DIR/table.md``. The per-client cost is fitted from the two largest sizes:
``(figure(N2) - figure(N1)) / (N2 - N1)``.

``python -m benchmarks.population`` (:func:`main`) measures this checkout alone, on either engine, at
more global iterations and repeated: ``--sizes 100,1000,10000 --engines inprocess,ray --iterations 10
--repeats 2 --out DIR``. Each repeat runs every (engine, size) once, the order reversed every other
repeat (ABBA), so that load drift on a shared machine hits every size alike; with ``--against REV``
each (engine, size) runs for ``REV``'s tree and this one side by side instead. Beside the figures above it
reports ``median_s_per_global_iteration`` (the median of the per-iteration differences of
``wall_time_s``: one slow iteration does not move it) and ``peak_tree_mb``, the peak over the run of
the summed proportional set size (PSS, ``/proc/PID/smaps_rollup``) of the process and every process
it started (Ray's raylet, GCS and actors; shared pages such as Ray's object store counted once),
sampled every 0.5 s. It writes ``results.json``, ``table.md`` (per engine and size: the medians over
repeats, and the ratios to the size below) and ``scale.png`` (memory and seconds per global
iteration against the number of clients, one line per engine).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO_ROOT, fmnist_dir, side_by_side
from fl_app.run.errors import ConfigError

SIZES = (100, 1000, 10000)
QUICK_SIZES = (100, 1000)
#: issue 47's command, less ``num-clients``, the global iterations and the directories
RUN_KEYS = ("strategy=splitfed-v1", "dataset=fashion-mnist", "model=lenet5", "concurrency=10",
            "local-iterations=1", "batch-size=4", "partition=iid")
#: issue 47's global iterations
ITERATIONS = 2
ENGINES = ("inprocess", "ray")

#: The child: the tree's CLI, then its own peak RSS (KB) written to a file, and (a second line) the peak of
#: the summed PSS (KB) of it and its descendants, sampled by a thread every 0.5 s.
_CHILD = r"""
import resource, sys, threading
import psutil
def _tree_kb():
    me = psutil.Process()
    try:
        procs = [me, *me.children(recursive=True)]
    except psutil.Error:  # a child ended while being listed: this sample counts the process alone
        procs = [me]
    total = 0
    for p in procs:
        try:
            total += p.memory_full_info().pss // 1024
        except psutil.Error:  # ended since
            pass
    return total
peak = [0]
done = threading.Event()
def _sample():
    while not done.is_set():
        peak[0] = max(peak[0], _tree_kb())
        done.wait(0.5)
threading.Thread(target=_sample, daemon=True).start()
from simulation.cli import main
try:
    code = main(sys.argv[2:])
finally:
    done.set()
    with open(sys.argv[1], "w") as fh:
        fh.write(f"{resource.getrusage(resource.RUSAGE_SELF).ru_maxrss}\n{peak[0]}\n")
sys.exit(code)
"""


def one_run(src: Path, out: Path, n: int, data_dir: str, iterations: int = ITERATIONS,
            engine: str = "inprocess") -> dict[str, Any]:
    """One ``sflower run`` of the tree ``src`` with ``n`` clients, writing under ``out``.

    Args:
        iterations: global iterations (issue 47's: 2).
        engine: ``inprocess`` or ``ray``.

    Returns:
        ``{"clients", "engine", "process_s", "startup_s", "s_per_global_iteration",
        "median_s_per_global_iteration", "peak_rss_mb", "peak_tree_mb"}`` (seconds and MB).

    Raises:
        RuntimeError: the run failed (its last stderr line).
    """
    import os

    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    rss_file = out / "peak_rss_kb"
    args = [sys.executable, "-c", _CHILD, str(rss_file), "run", "-q", *RUN_KEYS, f"num-clients={n}",
            f"global-iterations={iterations}", f"engine={engine}", f"data-dir={data_dir}",
            f"output-dir={out / 'run'}"]
    env = dict(os.environ, PYTHONPATH=str(src))
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=str(src), env=env, capture_output=True, text=True, check=False)
    process_s = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"population run with {n} clients of {src} failed: {tail}")
    wall = pd.read_csv(out / "run" / "metrics.csv")["wall_time_s"]
    if len(wall) != iterations + 1:
        raise RuntimeError(f"population run with {n} clients of {src}: {len(wall)} metric rows, "
                           f"expected {iterations + 1}")
    training = float(wall.iloc[-1] - wall.iloc[0])
    rss_kb, tree_kb = (int(x) for x in rss_file.read_text().split())
    return {"clients": n, "engine": engine, "process_s": round(process_s, 2),
            "startup_s": round(process_s - training, 2),
            "s_per_global_iteration": round(training / iterations, 3),
            "median_s_per_global_iteration": round(float(wall.diff().iloc[1:].median()), 3),
            "peak_rss_mb": round(rss_kb / 1024, 1), "peak_tree_mb": round(tree_kb / 1024, 1)}


def bench_population(tmp: Path, quick: bool = False, data_dir: str | None = None, against: str | None = None,
                     out: str | None = None) -> dict[str, Any]:
    """Run the sizes (:data:`SIZES`; :data:`QUICK_SIZES` with ``quick``), of this checkout or side by side.

    Returns:
        ``{"command", "runs": [{"tree", ...one_run's figures}], "per_client": {tree: {figure: slope}},
        "table"}``; also written to ``out`` (``results.json``, ``table.md``) when given.

    Raises:
        RuntimeError: a run failed.
        ConfigError: ``against`` is not a commit.
    """
    sizes = QUICK_SIZES if quick else SIZES
    runs = measure(sizes, ("inprocess",), ITERATIONS, 1, tmp, data_dir, against)
    result = {"command": "python -m benchmarks population" + (" --quick" if quick else "")
              + (f" --against {against}" if against else ""), "against": against,
              "runs": runs, "per_client": _per_client(runs), "table": table(runs, against)}
    if out:
        dest = Path(out)
        dest.mkdir(parents=True, exist_ok=True)
        (dest / "results.json").write_text(json.dumps(result, indent=2) + "\n")
        (dest / "table.md").write_text(result["table"] + "\n")
    return result


def _per_client(runs: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Per tree, each figure's slope between its two largest sizes (per client: s or MB)."""
    slopes: dict[str, dict[str, float]] = {}
    for tree in sorted({r["tree"] for r in runs}):
        mine = sorted((r for r in runs if r["tree"] == tree), key=lambda r: r["clients"])
        if len(mine) < 2:
            continue
        a, b = mine[-2], mine[-1]
        slopes[tree] = {k: (b[k] - a[k]) / (b["clients"] - a["clients"])
                        for k in ("process_s", "startup_s", "s_per_global_iteration", "peak_rss_mb")}
    return slopes


def table(runs: list[dict[str, Any]], against: str | None = None) -> str:
    """The figures as a Markdown table, one row per (size, tree); ``old`` is ``against``'s tree."""
    lines = ["| clients | tree | process s | start-up s | s / global iteration | peak RSS MB |",
             "|---:|---|---:|---:|---:|---:|"]
    for r in runs:
        name = f"old ({against})" if r["tree"] == "old" and against else r["tree"]
        lines.append(f"| {r['clients']:,} | {name} | {r['process_s']:.1f} | {r['startup_s']:.1f} | "
                     f"{r['s_per_global_iteration']:.2f} | {r['peak_rss_mb']:.0f} |")
    return "\n".join(lines)


def measure(sizes: tuple[int, ...], engines: tuple[str, ...], iterations: int, repeats: int, tmp: Path,
            data_dir: str | None = None, against: str | None = None) -> list[dict[str, Any]]:
    """Every (engine, size) ``repeats`` times, the order reversed every other repeat (ABBA), of this checkout;
    with ``against``, each (engine, size) for ``against``'s tree ("old") and this one ("new") side by side
    (:func:`benchmarks.common.side_by_side`).

    Returns:
        one :func:`one_run` dict per run, with ``tree`` ("new" or "old") and ``repeat`` (0-based), in run order.

    Raises:
        RuntimeError: a run failed.
        ConfigError: ``against`` is not a commit.
    """
    data = fmnist_dir(data_dir)
    cells = [(engine, n) for engine in engines for n in sizes]
    runs: list[dict[str, Any]] = []
    if against is not None:
        for engine, n in cells:
            print(f"population: {engine}, {n:,} clients, {against} and this tree", file=sys.stderr, flush=True)
            pair = side_by_side(against, tmp / f"{engine}-{n}", repeats,
                                lambda src, o, n=n, engine=engine: one_run(src, o, n, data, iterations, engine))
            runs += [{"tree": side, "repeat": i, **fig} for side in ("old", "new") for i, fig in enumerate(pair[side])]
        return runs
    for rep in range(repeats):
        for engine, n in cells if rep % 2 == 0 else cells[::-1]:
            print(f"population: repeat {rep + 1}/{repeats}, {engine}, {n:,} clients", file=sys.stderr, flush=True)
            fig = one_run(REPO_ROOT, tmp / f"{engine}-{n}-{rep}", n, data, iterations, engine)
            runs.append({"tree": "new", "repeat": rep, **fig})
    return runs


#: the figures :func:`summarise` takes the median of, over repeats
FIGURES = ("process_s", "startup_s", "median_s_per_global_iteration", "peak_rss_mb", "peak_tree_mb")


def summarise(runs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (tree, engine, size): the median over repeats of each of :data:`FIGURES`, and the ratio of the
    per-iteration seconds and of the peak tree memory to the next smaller size's of the same tree and engine
    (``None`` at the smallest).

    Returns:
        one dict per (tree, engine, size), trees and engines in first-seen order, sizes ascending.
    """
    import statistics

    rows: list[dict[str, Any]] = []
    for tree, engine in dict.fromkeys((r.get("tree", "new"), r["engine"]) for r in runs):
        mine_all = [r for r in runs if r.get("tree", "new") == tree and r["engine"] == engine]
        prev = None
        for n in sorted({r["clients"] for r in mine_all}):
            mine = [r for r in mine_all if r["clients"] == n]
            row = {"tree": tree, "engine": engine, "clients": n, "repeats": len(mine),
                   **{k: round(statistics.median(r[k] for r in mine), 3) for k in FIGURES}}
            row["s_ratio"] = (round(row["median_s_per_global_iteration"] / prev["median_s_per_global_iteration"], 3)
                              if prev else None)
            row["memory_ratio"] = round(row["peak_tree_mb"] / prev["peak_tree_mb"], 3) if prev else None
            rows.append(row)
            prev = row
    return rows


def summary_table(rows: list[dict[str, Any]]) -> str:
    """:func:`summarise`'s rows as a Markdown table (ratios: to the next smaller size of the same engine)."""
    trees = len({r["tree"] for r in rows}) > 1
    lines = [("| tree " if trees else "") + "| engine | clients | repeats | process s | start-up s | s / global "
             "iteration (median) | ÷ smaller size | peak RSS MB (driver) | peak PSS MB (all processes) | ÷ smaller size |",
             ("|---" if trees else "") + "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]

    def ratio(x):
        return "–" if x is None else f"{x:.2f}"

    for r in rows:
        lines.append((f"| {r['tree']} " if trees else "") + f"| {r['engine']} | {r['clients']:,} | {r['repeats']} | {r['process_s']:.1f} | "
                     f"{r['startup_s']:.1f} | {r['median_s_per_global_iteration']:.3f} | {ratio(r['s_ratio'])} | "
                     f"{r['peak_rss_mb']:.0f} | {r['peak_tree_mb']:.0f} | {ratio(r['memory_ratio'])} |")
    return "\n".join(lines)


def plot(rows: list[dict[str, Any]], path: Path) -> None:
    """Peak memory (PSS of all processes, MB) and seconds per global iteration against clients, per engine."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(9, 3.6))
    for tree, engine in dict.fromkeys((r["tree"], r["engine"]) for r in rows):
        mine = [r for r in rows if r["tree"] == tree and r["engine"] == engine]
        xs = [r["clients"] for r in mine]
        label = engine if tree == "new" else f"{engine} ({tree} tree)"
        axes[0].plot(xs, [r["peak_tree_mb"] for r in mine], marker="o", label=label)
        axes[1].plot(xs, [r["median_s_per_global_iteration"] for r in mine], marker="o", label=label)
    for ax, label in zip(axes, ("peak memory, all processes (MB)", "seconds per global iteration (median)")):
        ax.set_xscale("log")
        ax.set_xlabel("registered clients")
        ax.set_ylabel(label)
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
        ax.legend()
    fig.suptitle("SplitFed-V1, LeNet-5 on Fashion-MNIST, 10 clients per global iteration")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.population``: :func:`measure`, then results.json, table.md and scale.png in ``--out``."""
    import argparse
    import tempfile

    ap = argparse.ArgumentParser(prog="python -m benchmarks.population", description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100,1000,10000", help="registered clients, comma-separated")
    ap.add_argument("--engines", default="inprocess,ray", help="comma-separated: inprocess, ray")
    ap.add_argument("--iterations", type=int, default=10, help="global iterations per run")
    ap.add_argument("--repeats", type=int, default=2, help="runs per (engine, size), in ABBA order")
    ap.add_argument("--data-dir", default=None, help="Fashion-MNIST's directory (default ../shared/data/fashion-mnist)")
    ap.add_argument("--against", default=None, help="a git revision to run side by side with this tree (\"old\")")
    ap.add_argument("--out", required=True, help="directory for results.json, table.md and scale.png")
    args = ap.parse_args(argv)
    try:
        sizes = tuple(int(x) for x in args.sizes.split(","))
    except ValueError:
        ap.error(f"--sizes must be comma-separated integers, got {args.sizes!r}")
    engines = tuple(args.engines.split(","))
    if any(e not in ENGINES for e in engines):
        ap.error(f"--engines must be among {', '.join(ENGINES)}, got {args.engines!r}")
    if min(sizes) < 10 or args.iterations < 2 or args.repeats < 1:
        ap.error("--sizes must be at least 10 (10 clients per round), --iterations at least 2, --repeats at least 1")
    with tempfile.TemporaryDirectory(prefix="sflower-population-") as tmp:
        try:
            runs = measure(sizes, engines, args.iterations, args.repeats, Path(tmp), args.data_dir, args.against)
        except (RuntimeError, ConfigError) as err:
            print(f"population: {err}", file=sys.stderr)
            return 1
    rows = summarise(runs)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    command = "python -m benchmarks.population " + " ".join(argv if argv is not None else sys.argv[1:])
    (out / "results.json").write_text(json.dumps({"command": command, "runs": runs, "summary": rows}, indent=2) + "\n")
    (out / "table.md").write_text(summary_table(rows) + "\n")
    plot(rows, out / "scale.png")
    print(summary_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
