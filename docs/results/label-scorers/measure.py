"""The label-private how-to's scorer table: norm and direction AUCs of every tail gradient returned in a
U-shaped splitfed-v1 run on mnist-5k, LeNet-5, for two tails and two defences (one seed).

Run from the repository root: ``python docs/results/label-scorers/measure.py`` (a few minutes on 2 cores);
writes ``docs/results/label-scorers/scorers.csv``.
"""

import csv
from pathlib import Path

from fl_app.client_app import app
from fl_app.run.config import RunConfig
from fl_app.learning.task import load_task
from simulation.engine import run_inprocess
from simulation.privacy.label_leakage import TailGradients
from simulation.server_app import plan_run

BASE = {"strategy": "splitfed-v1", "dataset": "mnist-5k", "model": "lenet5", "num-clients": 4, "concurrency": 4,
        "partition": "iid", "local-iterations": 5, "batch-size": 16, "global-iterations": 4, "eval-samples": 200,
        "lr": 0.05, "seed": 1}
OUT = Path(__file__).resolve().parent / "scorers.csv"

rows = []
for cuts in ("2,11", "2,9"):
    for defence in ("none", "max-norm"):
        cfg = RunConfig.from_mapping({**BASE, "cut-layers": cuts, "label-defence": defence})
        y = load_task(cfg).data.y_train.numpy()
        recorder = TailGradients(app, lambda idx: y[idx])
        run_inprocess(plan_run(cfg), progress=False, client_app=recorder)
        auc = recorder.auc()
        rows.append({"cut-layers": cuts, "label-defence": defence, "norm_auc": f"{auc.norm:.3f}",
                     "direction_auc": f"{auc.direction:.3f}", "samples": auc.samples})
        print(rows[-1], flush=True)
with OUT.open("w", newline="") as f:
    writer = csv.DictWriter(f, fieldnames=list(rows[0]))
    writer.writeheader()
    writer.writerows(rows)
