"""Checkpoint size and write time: GAS with the default AlexNet, in whichever sflower checkout runs it.

Runs ``sflower run``'s defaults (GAS, AlexNet cut 2, mnist-5k, 20 clients,
10 concurrent, 20 local iterations of 32 images) for 3 global iterations with
``checkpoint-every=1`` on the in-process engine, times every
``Checkpointer.write`` call (wall seconds: draining the dispatcher, fetching
the clients' states, encoding, writing and fsyncing the file) and reports
the checkpoint file's size in bytes. The same script runs against an older
checkout (the pickle format, ``checkpoint.pt``) to compare formats:

    python -m benchmarks.checkpoint_format OUT.json                       # this checkout
    PYTHONPATH=OLD_CHECKOUT python benchmarks/checkpoint_format.py OUT.json

Results for this repository: ``docs/results/checkpoint-format/``.
"""

from __future__ import annotations

import json
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch


def measure(out_dir: Path) -> dict:
    """Run the benchmark's GAS job in ``out_dir``; the checkpoint writes' seconds and the file's size."""
    from fl_app.run.config import RunConfig
    from simulation.engine import run_inprocess
    from simulation.server_app import plan_run
    from strategies.core import checkpoint as ckpt

    seconds: list[float] = []
    write = ckpt.Checkpointer.write

    def timed(self, *args, **kwargs):
        t0 = time.perf_counter()
        result = write(self, *args, **kwargs)
        seconds.append(time.perf_counter() - t0)
        return result

    ckpt.Checkpointer.write = timed
    torch.set_num_threads(1)
    cfg = RunConfig.from_mapping({"global-iterations": 3, "checkpoint-every": 1, "eval-samples": 500,
                                  "output-dir": str(out_dir)})
    run_inprocess(plan_run(cfg), progress=False)
    files = [p for p in (out_dir / "checkpoint.sfl", out_dir / "checkpoint.pt") if p.is_file()]
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                            cwd=Path(ckpt.__file__).parent).stdout.strip()
    return {"commit": commit, "file": files[0].name, "format": getattr(ckpt, "FORMAT", None),
            "size_bytes": files[0].stat().st_size, "writes": len(seconds),
            "write_s": [round(s, 4) for s in seconds], "median_write_s": round(statistics.median(seconds), 4),
            "config": {k: cfg.as_dict()[k] for k in ("strategy", "model", "cut-layer", "dataset", "num-clients",
                                                     "concurrency", "local-iterations", "batch-size")},
            "machine": platform.processor() or platform.machine(), "torch_threads": 1}


def main(argv: list[str]) -> int:
    """``checkpoint_format.py OUT.json``: measure and write the JSON."""
    with tempfile.TemporaryDirectory() as tmp:
        result = measure(Path(tmp) / "run")
    Path(argv[0]).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
