"""Resume under Ray after SIGKILL (docs/how-to/checkpoints.md): for each strategy, a ``sflower run engine=ray``
process group (the driver and Ray's workers) SIGKILLed once checkpoint 3 of 6 is on disk, resumed with
``sflower run engine=ray resume=RUN_DIR``, beside the same run in one process without any fault; writes
``docs/results/resume-ray/verdict.csv`` (the columns of metrics.csv that differ: all but wall_time_s must not).

Run from the repository root: ``python docs/results/resume-ray/run.py [WORKDIR]`` (default /tmp/resume-ray).
"""

import csv
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from strategies.core import checkpoint as ckpt

STRATEGIES = ("gas", "splitfed-v1", "psl", "ringsfl")
#: tests/test_checkpoint.py's BASE budget
KEYS = ["dataset=mnist-5k", "model=lenet5", "cut-layer=2", "num-clients=3", "concurrency=2", "partition=iid",
        "local-iterations=2", "batch-size=8", "global-iterations=6", "eval-samples=200", "covariance=diagonal",
        "seed=1"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1"}


def sflower(*args: str, **kw) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "simulation.cli", "run", "-q", *args], env=ENV,
                            start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **kw)


def columns(path: Path) -> dict[str, list[str]]:
    rows = list(csv.reader(path.open()))
    return {n: [r[i] for r in rows[1:]] for i, n in enumerate(rows[0])}


def main(work: Path) -> None:
    rows = [["strategy", "killed_after_checkpoint", "rows", "columns_that_differ"]]
    for s in STRATEGIES:
        killed, ref = work / s / "ray", work / s / "inprocess"
        subprocess.run(["rm", "-rf", str(work / s)], check=True)
        proc = sflower("engine=ray", f"strategy={s}", *KEYS, "checkpoint-every=1", f"output-dir={killed}")
        while proc.poll() is None:
            try:
                if ckpt.read_meta(killed / ckpt.CHECKPOINT_FILE)["global_iteration"] >= 3:
                    break
            except ckpt.CheckpointError:
                pass
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
        at = ckpt.read_meta(killed / ckpt.CHECKPOINT_FILE)["global_iteration"]
        assert sflower("engine=ray", f"resume={killed}").wait() == 0, s
        assert sflower(f"strategy={s}", *KEYS, f"output-dir={ref}").wait() == 0, s
        a, b = columns(killed / "metrics.csv"), columns(ref / "metrics.csv")
        differ = [k for k in b if k != "wall_time_s" and a.get(k) != b[k]]
        rows.append([s, at, len(b["global_iteration"]), " ".join(differ) or "none"])
        print(rows[-1], flush=True)
    out = Path(__file__).parent / "verdict.csv"
    with out.open("w", newline="") as fh:
        csv.writer(fh).writerows(rows)


if __name__ == "__main__":
    main(Path(sys.argv[1] if len(sys.argv) > 1 else "/tmp/resume-ray"))
