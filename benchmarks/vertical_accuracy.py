"""Vertical split learning against the same model trained centrally, and against the label party alone (issue 45).

``python -m benchmarks.vertical_accuracy --datasets vertical-breast,vertical-credit,vertical-fmnist --seeds 0,1,2,3,4
--out docs/results/vertical-accuracy`` runs, per dataset and seed, on the held-out test part of the intersection:

* ``vertical``: ``sflower run strategy=vertical-sl`` (in-process, PSI through the relay, label party on a node);
* ``centralised``: the same model (every party's bottom model, the join, the top model) trained in one process on
  the concatenated columns of the same intersection, with the same split, the same mini-batches and the same
  initial weights (:func:`train_central`);
* ``label-only``: the label party's bottom and a top model on its own columns alone (what vertical learning buys).

It writes ``accuracy.csv`` (one row per run) and ``table.md`` (mean ± 95 % interval over the seeds, and the paired
difference vertical − centralised with its verdict, :mod:`simulation.stats`).
"""

from __future__ import annotations

import argparse
import csv
import tempfile
from pathlib import Path

import torch

from fl_app.vertical import models as V
from fl_app.run.config import RunConfig
from fl_app.data.vertical import load_vertical
from simulation.stats import mean_ci, paired
from simulation.vertical import run_vertical
from strategies.algorithms.vertical import VerticalSL

#: Per dataset: the run's keys (iterations, batch, lr, overlap, parties).
SETTINGS = {
    "vertical-breast": {"global-iterations": 300, "batch-size": 32, "lr": 0.1, "vertical-overlap": 0.9},
    "vertical-credit": {"global-iterations": 1500, "batch-size": 64, "lr": 0.1, "vertical-overlap": 0.9},
    "vertical-fmnist": {"global-iterations": 1500, "batch-size": 64, "lr": 0.1, "vertical-overlap": 0.9,
                        "vertical-parties": 3, "vertical-rows": 10000, "vertical-embedding": 16},
}


def train_central(cfg: RunConfig, parties: list[int]) -> float:
    """Held-out accuracy of the unsplit model on the columns of ``parties`` (0: the label party's), trained in one
    process on the same intersection, split, batches and initial weights as the vertical run of ``cfg``."""
    tables, classes = load_vertical(cfg.dataset, cfg.data_dir, overlap=cfg.vertical_overlap, seed=cfg.seed,
                                    parties=cfg.vertical_parties, rows=cfg.vertical_rows)
    shared = sorted(set.intersection(*(set(t.ids) for t in tables)))
    xs = [torch.from_numpy(tables[k].rows(shared)[0]) for k in parties]
    y = torch.from_numpy(tables[0].rows(shared)[1])
    h, join = cfg.vertical_embedding, cfg.vertical_join
    bottoms = [V.bottom_model(x.shape[1], h, cfg.seed, k) for k, x in zip(parties, xs)]
    top = V.top_model(V.joined_width(h, len(parties), join), classes, cfg.seed)
    train, test = V.split_positions(len(shared), cfg.seed, cfg.vertical_test_fraction)
    params = [*top.parameters(), *(p for b in bottoms for p in b.parameters())]
    for it in range(cfg.global_iterations):
        pos = torch.from_numpy(V.batch_positions(train, cfg.batch_size, it, cfg.seed))
        loss = torch.nn.functional.cross_entropy(top(V.join_embeddings([b(x[pos]) for b, x in zip(bottoms, xs)],
                                                                      join)), y[pos])
        for p in params:
            p.grad = None
        loss.backward()
        with torch.no_grad():
            for p in params:
                p -= cfg.lr * p.grad
    t = torch.from_numpy(test)
    with torch.no_grad():
        return V.predict(top, [b(x[t]) for b, x in zip(bottoms, xs)], y[t], join)[1]


def main(argv: list[str] | None = None) -> int:
    """Run the table; 0."""
    p = argparse.ArgumentParser(prog="python -m benchmarks.vertical_accuracy")
    p.add_argument("--datasets", default=",".join(SETTINGS))
    p.add_argument("--seeds", default="0,1,2,3,4")
    p.add_argument("--data-dir", default="../shared/data")
    p.add_argument("--out", default="docs/results/vertical-accuracy")
    args = p.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = []
    for name in args.datasets.split(","):
        for seed in (int(s) for s in args.seeds.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                cfg = RunConfig.from_mapping({"strategy": "strategies.algorithms.vertical:VerticalSL", "dataset": name,
                                              "data-dir": args.data_dir, "seed": seed, "psi-backend": "dh",
                                              "eval-every": 0, "output-dir": tmp, **SETTINGS[name]})
                s = run_vertical(cfg, VerticalSL)
            k = cfg.vertical_parties if name == "vertical-fmnist" else 2
            row = {"dataset": name, "seed": seed, "intersection": s["intersection"], "test_rows": s["test_rows"],
                   "vertical": s["final_accuracy"], "centralised": train_central(cfg, list(range(k))),
                   "label_only": train_central(cfg, [0]), "psi_bytes": s["psi_bytes"],
                   "virtual_time_s": round(s["virtual_time_s"], 3)}
            rows.append(row)
            print(row, flush=True)
    with open(out / "accuracy.csv", "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]))
        w.writeheader()
        w.writerows(rows)
    lines = [("| dataset | seeds | vertical | centralised | label party only | vertical − centralised (paired) "
              "| vertical − label party only (paired) |"), "|---|---|---|---|---|---|---|"]
    for name in dict.fromkeys(r["dataset"] for r in rows):
        rs = [r for r in rows if r["dataset"] == name]
        cell = {c: "{:.4f} ± {:.4f}".format(*mean_ci([r[c] for r in rs])) for c in ("vertical", "centralised",
                                                                                 "label_only")}
        diffs = [paired("vertical", other, {r["seed"]: r["vertical"] for r in rs}, {r["seed"]: r[key] for r in rs})
                 for key, other in (("centralised", "centralised"), ("label_only", "label party only"))]
        lines.append(f"| {name} | {len(rs)} | {cell['vertical']} | {cell['centralised']} | {cell['label_only']} | "
                     + " | ".join(f"{d.diff:+.4f} [{d.low:+.4f}, {d.high:+.4f}]: {d.ours}" for d in diffs) + " |")
    (out / "table.md").write_text("\n".join(lines) + "\n\n(command: python -m benchmarks.vertical_accuracy "
                                  f"--datasets {args.datasets} --seeds {args.seeds} --out {args.out})\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
