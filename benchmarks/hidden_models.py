"""The cost and the accuracy of ``hide-client-models``: the issue-43 setup, hidden vs not, per seed.

mnist-5k, LeNet-5, SplitFed-V1 U-shaped at ``cut-layers=1,9``, 4 IID
clients all in every round, 4 global iterations of 5 local iterations of 16
images, lr 0.05, on the in-process engine with one torch thread. For each
seed and mode it records the metric rows (test accuracy and loss, bytes up
and down, virtual seconds), the wall seconds per global iteration (the
metric rows' ``wall_time_s`` differences: training plus evaluation), and, in
the hidden runs, the wall seconds all clients spent sealing and opening
client-side states (AES-GCM and the averaging of the bundles)::

    python -m benchmarks.hidden_models docs/results/hidden-models/results.json 0 1 2
    python -m benchmarks.hidden_models docs/results/hidden-models/downlink.json 0 downlink=true

(``KEY=VALUE`` arguments add run-config keys: ``downlink=true`` times the
downloads, where the bundles' extra bytes cost virtual time.)

Results for this repository: ``docs/results/hidden-models/``.
"""

from __future__ import annotations

import csv
import json
import platform
import sys
import tempfile
import time
from pathlib import Path

import torch

SETUP = {"dataset": "mnist-5k", "model": "lenet5", "strategy": "splitfed-v1", "cut-layers": "1,9",
         "num-clients": 4, "concurrency": 4, "partition": "iid", "global-iterations": 4, "local-iterations": 5,
         "batch-size": 16, "lr": 0.05}


def measure(seed: int, hide: bool, out_dir: Path, extra: dict | None = None) -> dict:
    """One run of :data:`SETUP` at ``seed``; its rows, wall seconds per iteration and crypto seconds."""
    from fl_app.client import hidden as client_hidden
    from fl_app.run.config import RunConfig
    from simulation.engine import run_inprocess
    from simulation.server_app import plan_run

    crypto = [0.0]

    def timed(fn):
        def wrapper(*args, **kwargs):
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                crypto[0] += time.perf_counter() - t0
        return wrapper

    originals = {n: getattr(client_hidden, n) for n in ("seal_state", "open_bundle")}
    for name, fn in originals.items():
        setattr(client_hidden, name, timed(fn))
    try:
        cfg = RunConfig.from_mapping({**SETUP, **(extra or {}), "seed": seed, "hide-client-models": hide, "output-dir": str(out_dir)})
        run_inprocess(plan_run(cfg), progress=False)
    finally:
        for name, fn in originals.items():
            setattr(client_hidden, name, fn)
    rows = list(csv.DictReader(open(out_dir / "metrics.csv")))
    walls = [float(r["wall_time_s"]) for r in rows]
    keep = ("global_iteration", "test_accuracy", "test_loss", "bytes_up", "bytes_down", "virtual_time_s")
    return {"seed": seed, "hide-client-models": hide, "rows": [{k: r[k] for k in keep} for r in rows],
            "wall_s_per_iteration": [round(b - a, 3) for a, b in zip(walls, walls[1:])],
            "crypto_wall_s": round(crypto[0], 4) if hide else 0.0}


def main(argv: list[str]) -> int:
    """``OUT.json SEED... [KEY=VALUE...]``: run both modes for each seed, write the results."""
    out = Path(argv[0])
    seeds = [int(s) for s in argv[1:] if "=" not in s] or [0]
    extra = dict(a.split("=", 1) for a in argv[1:] if "=" in a)
    torch.set_num_threads(1)
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in seeds:
            for hide in (False, True):
                runs.append(measure(seed, hide, Path(tmp) / f"s{seed}-{int(hide)}", extra))
                print(json.dumps({k: runs[-1][k] for k in ("seed", "hide-client-models", "wall_s_per_iteration",
                                                           "crypto_wall_s")}), runs[-1]["rows"][-1], flush=True)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"setup": {**SETUP, **extra}, "runs": runs, "machine": platform.processor() or platform.machine(),
                               "torch_threads": 1}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
