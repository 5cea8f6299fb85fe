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
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import REPO_ROOT, fmnist_dir, side_by_side

SIZES = (100, 1000, 10000)
QUICK_SIZES = (100, 1000)
#: issue 47's command, less ``num-clients`` and the directories
RUN_KEYS = ("strategy=splitfed-v1", "dataset=fashion-mnist", "model=lenet5", "concurrency=10",
            "global-iterations=2", "local-iterations=1", "batch-size=4", "partition=iid")

#: The child: the tree's CLI, then its own peak RSS (KB) appended to a file.
_CHILD = r"""
import resource, sys
from simulation.cli import main
try:
    code = main(sys.argv[2:])
finally:
    with open(sys.argv[1], "w") as fh:
        fh.write(str(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss))
sys.exit(code)
"""


def one_run(src: Path, out: Path, n: int, data_dir: str) -> dict[str, Any]:
    """One ``sflower run`` of the tree ``src`` with ``n`` clients, writing under ``out``.

    Returns:
        ``{"clients", "process_s", "startup_s", "s_per_global_iteration", "peak_rss_mb"}``
        (seconds and MB).

    Raises:
        RuntimeError: the run failed (its last stderr line).
    """
    import os

    import pandas as pd

    out.mkdir(parents=True, exist_ok=True)
    rss_file = out / "peak_rss_kb"
    args = [sys.executable, "-c", _CHILD, str(rss_file), "run", "-q", *RUN_KEYS, f"num-clients={n}",
            f"data-dir={data_dir}", f"output-dir={out / 'run'}"]
    env = dict(os.environ, PYTHONPATH=str(src))
    t0 = time.perf_counter()
    proc = subprocess.run(args, cwd=str(src), env=env, capture_output=True, text=True, check=False)
    process_s = time.perf_counter() - t0
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        raise RuntimeError(f"population run with {n} clients of {src} failed: {tail}")
    wall = pd.read_csv(out / "run" / "metrics.csv")["wall_time_s"]
    iterations = len(wall) - 1
    training = float(wall.iloc[-1] - wall.iloc[0])
    return {"clients": n, "process_s": round(process_s, 2), "startup_s": round(process_s - training, 2),
            "s_per_global_iteration": round(training / iterations, 3),
            "peak_rss_mb": round(int(rss_file.read_text()) / 1024, 1)}


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
    data = fmnist_dir(data_dir)
    sizes = QUICK_SIZES if quick else SIZES
    runs: list[dict[str, Any]] = []
    for n in sizes:
        if against is None:
            runs.append({"tree": "new", **one_run(REPO_ROOT, tmp / f"new-{n}", n, data)})
            continue
        pair = side_by_side(against, tmp / f"n{n}", 1, lambda src, o, n=n: one_run(src, o, n, data))
        runs += [{"tree": side, **pair[side][0]} for side in ("old", "new")]
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
