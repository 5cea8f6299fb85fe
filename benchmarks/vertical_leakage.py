"""Li et al. 2022's label attacks on the gradients the label party returns to a feature party, with and without
Marvell (issue 45).

``python -m benchmarks.vertical_leakage --dataset vertical-credit --iterations 400 --out docs/results/vertical-leakage``
runs ``vertical-sl`` (two parties, in-process) once per defence in :data:`DEFENCES`, keeps every gradient
``∂L/∂e_1`` the relay delivers to the feature party (what it receives, after the defence) with the true labels of
its batch (which the feature party does not have), and scores each batch with the norm and the direction attacks
(:func:`simulation.privacy.label_leakage.leakage_auc`; direction against one known example per class). It writes
``leakage.csv``: per defence the mean AUC over the batches, the mean squared noise norm per row the defence added
(its power, from the label party's replies), and the held-out accuracy.
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from pathlib import Path

import numpy as np
from sklearn.metrics import roc_auc_score

from fl_app.run.config import RunConfig
from fl_app.data.vertical import load_vertical
from fl_app.protocol.records import record_tensor
from benchmarks.vertical_psi import write_table
from simulation.engine import InProcessGrid
from simulation.privacy.label_leakage import leakage_auc, norm_scores
from simulation.vertical import run_vertical
from strategies.algorithms.vertical import VerticalSL

#: ``(label, keys)`` of each measured defence: none, Marvell at three budgets, isotropic noise at three scales.
DEFENCES = (
    ("none", {}),
    ("marvell s=0.1", {"label-defence": "marvell", "label-power": 0.1}),
    ("marvell s=1", {"label-defence": "marvell", "label-power": 1.0}),
    ("marvell s=4", {"label-defence": "marvell", "label-power": 4.0}),
    ("iso t=0.5", {"label-defence": "iso", "label-noise": 0.5}),
    ("iso t=2", {"label-defence": "iso", "label-noise": 2.0}),
    ("iso t=8", {"label-defence": "iso", "label-noise": 8.0}),
)


def measure(cfg: RunConfig) -> dict[str, float]:
    """One run of ``cfg``: mean norm and direction AUC over the batches a feature party receives, the noise power
    and the held-out accuracy."""
    batches: list[tuple[np.ndarray, np.ndarray]] = []
    push = InProcessGrid.push_messages

    def spy(grid: InProcessGrid, messages):
        messages = list(messages)
        for m in messages:
            c = m.content
            if "grad" in c.array_records:  # a backward: what the feature party receives
                batches.append((record_tensor(c["grad"], "g").numpy(), record_tensor(c["positions"], "positions")
                                .numpy()))
        return push(grid, messages)

    InProcessGrid.push_messages = spy
    try:
        summary = run_vertical(cfg, VerticalSL)
    finally:
        InProcessGrid.push_messages = push
    tables, _ = load_vertical(cfg.dataset, cfg.data_dir, overlap=cfg.vertical_overlap, seed=cfg.seed)
    shared = sorted(set(tables[0].ids) & set(tables[1].ids))
    y = tables[0].rows(shared)[1]
    kept = [(g, y[p]) for g, p in batches if len(np.unique(y[p])) == 2]
    # norm scoring as the paper's: the positive (minority) class 1 scored by ‖g‖ (leakage_auc's norm AUC is the
    # best class's, max(AUC, 1 - AUC) on two classes: an attacker who picks the class after the fact)
    norm = [roc_auc_score(yb == 1, norm_scores(g)) for g, yb in kept]
    direction = [leakage_auc(g, yb).direction for g, yb in kept]
    return {"norm_auc": float(np.mean(norm)), "direction_auc": float(np.mean(direction)), "batches": len(kept),
            "noise_power": summary["label_noise_power"], "accuracy": summary["final_accuracy"]}


def main(argv: list[str] | None = None) -> int:
    """Run every defence; write ``leakage.csv``; 0."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.vertical_leakage")
    p.add_argument("--dataset", default="vertical-credit")
    p.add_argument("--iterations", type=int, default=400)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--data-dir", default="../shared/data")
    p.add_argument("--out", default="docs/results/vertical-leakage")
    p.add_argument("--table-only", action="store_true", help="only render table.md from the CSV already written")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.table_only:
        write_table(out, "leakage.csv")
        return 0
    rows = []
    for label, keys in DEFENCES:
        with tempfile.TemporaryDirectory() as tmp:
            cfg = RunConfig.from_mapping({"strategy": "strategies.algorithms.vertical:VerticalSL",
                                          "dataset": args.dataset, "data-dir": args.data_dir, "seed": args.seed,
                                          "global-iterations": args.iterations, "eval-every": 0, "batch-size": 64,
                                          "lr": 0.1, "vertical-overlap": 0.9, "psi-backend": "dh",
                                          "output-dir": tmp, **keys})
            rows.append({"defence": label, **measure(cfg)})
        print(rows[-1], flush=True)
    with open(out / "leakage.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    (out / "command.txt").write_text(f"python -m benchmarks.vertical_leakage --dataset {args.dataset} "
                                     f"--iterations {args.iterations} --seed {args.seed} --out {args.out}\n")
    write_table(out, "leakage.csv")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
