"""The strongest known attacks of ``sflower attack`` (:mod:`simulation.privacy.strongest`), each on a case whose
answer is known by hand:

* gradient matching reads every label of hand-made rows, and of an undefended tiny U-shaped run (its server's
  record, ``tails.safetensors``), where replaying the tail's steps reproduces every uploaded tail (tracking error
  below 1e-6); one wrong label shows up as a tracking error;
* the label counts of a bias update are exact where the prediction is uniform (zero output weights);
* clustering well-separated rows is exact, and one known row per cluster names them all;
* least squares inverts a linear head (a convolution) to float precision, clipped or not; rMLE runs where
  the head is not affine; the affine check tells the two apart;
* the worst case picks the strongest of each kind and names the attacks the server could not run.
"""

from __future__ import annotations

import copy

import numpy as np
import pytest
import torch
from torch import nn

from simulation.privacy.clustering import (cluster_rows, known_label_accuracy, matched_accuracy, name_clusters,
                                           one_per_cluster_accuracy)
from simulation.privacy.matching import match_labels, track_tail
from simulation.privacy.strongest import ServerHoldings, headline_lines, label_attacks, worst_case
from simulation.privacy.update_labels import bag_accuracy, label_counts
from simulation.privacy.whitebox import invert_affine, invert_rmle, is_affine

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def _tail(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 4))


def _grad(tail: nn.Module, z: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    x = z.clone().requires_grad_(True)
    nn.functional.cross_entropy(tail(x), y).backward()
    return x.grad


def test_gradient_matching_reads_every_label_of_hand_made_rows():
    tail = _tail()
    z, y = torch.randn(32, 6), torch.arange(32) % 4
    assert torch.equal(match_labels(tail, z, _grad(tail, z, y), 4), y)


def _events(tail: nn.Module, rounds: int = 2, steps: int = 3, lr: float = 0.1, momentum: float = 0.9):
    """A client's tail record as a server sees it (sent weights, z/g per step, uploaded tail) and the labels."""
    cfg = {"lr": lr, "momentum": momentum, "weight-decay": 5e-4, "clip-norm": 0.0, "lr-scale": [],
           "optimizer": "sgd", "slot": "tail", "start": 9, "end": 12, "batch-size": 8, "loss": True,
           "accumulate": False, "weight": 1.0, "model-slot": "", "label-slot": "own"}
    client, events, labels = copy.deepcopy(tail), [], []
    gen = torch.Generator().manual_seed(1)
    for _ in range(rounds):
        events.append({"kind": "sent", "weights": {k: v.clone() for k, v in client.state_dict().items()}})
        opt = torch.optim.SGD(client.parameters(), lr=lr, momentum=momentum, weight_decay=5e-4)
        for _ in range(steps):
            z, y = torch.randn(8, 6, generator=gen), torch.randint(0, 4, (8,), generator=gen)
            opt.zero_grad()
            x = z.clone().requires_grad_(True)
            nn.functional.cross_entropy(client(x), y).backward()
            opt.step()
            events.append({"kind": "forward", "z": z, "g": x.grad.clone(), "config": cfg})
            labels.append(y)
        events.append({"kind": "uploaded", "weights": {k: v.clone() for k, v in client.state_dict().items()}})
    return events, torch.cat(labels)


def test_tracking_replays_the_tail_and_a_wrong_label_shows():
    tail = _tail()
    events, labels = _events(tail)
    res = track_tail(tail, events, 4)
    assert torch.equal(res.tracked, labels) and res.exact
    assert len(res.errors) == 2 and max(res.errors) < 1e-6
    events[1]["g"] = _grad(copy.deepcopy(tail), events[1]["z"], (labels[:8] + 1) % 4)  # not what it trained on
    assert track_tail(tail, events, 4).errors[0] > 1e-4


def test_label_counts_are_exact_for_a_uniform_prediction():
    """Zero output weights and bias: p = 1/K for every example, so one SGD step's bias update is
    ``-lr (1/B) (B/K - n)``; the counts come back exactly."""
    head = nn.Linear(5, 4)
    nn.init.zeros_(head.weight)
    nn.init.zeros_(head.bias)
    y = torch.tensor([0, 0, 0, 1, 2, 2, 3, 3])
    loss = nn.functional.cross_entropy(head(torch.randn(8, 5)), y)
    (gb,) = torch.autograd.grad(loss, head.bias)
    counts = label_counts(torch.zeros(4), -0.5 * gb, lr=0.5, batch_size=8, steps=1)
    assert counts.tolist() == [3, 1, 2, 2] and bag_accuracy(counts, y.numpy()) == 1.0
    assert bag_accuracy(np.array([2, 2, 2, 2]), y.numpy()) == 7 / 8


def test_clustering_separated_rows_and_one_known_row_per_cluster():
    rng = np.random.default_rng(0)
    centres = np.eye(5) * 10
    labels = np.repeat(np.arange(5), 20)
    rows = centres[labels] + rng.normal(0, 0.1, (100, 5))
    clusters = cluster_rows(rows, 5, "kmeans")
    assert matched_accuracy(clusters, labels) == 1.0
    assert matched_accuracy(cluster_rows(rows, 5, "spectral"), labels) == 1.0
    one_each = np.array([np.flatnonzero(clusters == c)[0] for c in range(5)])
    assert (name_clusters(clusters, one_each, labels[one_each], 5) == labels).all()
    assert one_per_cluster_accuracy(clusters, labels) == 1.0
    assert known_label_accuracy(clusters, labels, 1) == pytest.approx(0.2)  # one known row names everything


def test_least_squares_inverts_a_linear_head_and_rmle_runs_on_a_nonlinear_one():
    from simulation.privacy.inversion import scores

    torch.manual_seed(0)
    head = nn.Conv2d(1, 6, 5, padding=2)
    x = torch.rand(4, 1, 12, 12)
    assert is_affine(head, (1, 12, 12))
    with torch.no_grad():
        z = head(x)
        clipped = z * 0.3  # a per-sample clip with an unknown scale (here the same for every sample)
    for acts, clip in ((z, False), (clipped, True)):
        rec = invert_affine(head, acts, (1, 12, 12), clipped=clip, bounds=(0.0, 1.0))
        assert scores(rec, x)["psnr"] > 60.0
    relu = nn.Sequential(head, nn.ReLU())
    assert not is_affine(relu, (1, 12, 12))
    with torch.no_grad():
        zr = relu(x)
    rec = invert_rmle(relu, zr, (1, 12, 12), steps=200, tv=0.0, bounds=(0.0, 1.0))
    assert scores(rec, x)["psnr"] > scores(torch.full_like(x, 0.5), x)["psnr"] + 10.0


def test_worst_case_picks_the_strongest_and_names_what_is_not_held():
    """The label attack furthest above its own chance wins (0.9 at chance 0.1 beats 0.92 at chance 0.9)."""
    rows = [{"attack": "a", "kind": "labels", "held": True, "accuracy": 0.4, "chance": 0.1},
            {"attack": "b", "kind": "labels", "held": True, "accuracy": 0.9, "chance": 0.1},
            {"attack": "dec", "kind": "inputs", "held": True, "psnr": 20.0, "ssim": 0.5},
            {"attack": "wb", "kind": "inputs", "held": True, "psnr": 40.0, "ssim": 0.9},
            {"attack": "counts", "kind": "labels", "held": True, "accuracy": 0.92, "chance": 0.9},
            {"attack": "c", "kind": "labels", "held": False, "reason": "no tails"}]
    w = worst_case(rows)
    assert w["labels"]["attack"] == "b" and w["inputs"]["attack"] == "wb" and w["not_held"] == {"c": "no tails"}
    assert w["labels"]["advantage"] == pytest.approx(0.8 / 0.9)
    lines = headline_lines({"attacks": rows, "worst_case": w})
    assert "labels 0.900" in lines[0] and "40.00 dB (wb)" in lines[0] and any("not held" in ln for ln in lines)


def test_label_attacks_without_a_tail_record_are_not_held():
    rows = label_attacks(ServerHoldings(num_classes=10), {0: np.zeros(4, dtype=np.int64)})
    assert rows and all(not r["held"] and "tails.safetensors" in r["reason"] for r in rows)


def test_gradient_matching_on_an_undefended_ushaped_run(tmp_path):
    """A tiny U-shaped SplitFed-V1 run with privacy-record: from the server's record alone, gradient matching
    names every label the clients' tails trained on, and replaying the tails reproduces every uploaded tail."""
    from fl_app.run.config import RunConfig
    from fl_app.privacy.activations import read_tail_truth, tail_truth_path
    from fl_app.learning.task import load_task
    from simulation.engine import run_inprocess
    from simulation.privacy.record import read_tail_events
    from simulation.server_app import plan_run

    cfg = RunConfig.from_mapping({
        "strategy": "splitfed-v1", "dataset": "mnist-5k", "model": "lenet5", "cut-layers": "2,9", "num-clients": 2, "concurrency": 2,
        "partition": "iid", "local-iterations": 2, "batch-size": 8, "global-iterations": 2, "eval-samples": 100,
        "seed": 1, "privacy-record": True, "output-dir": str(tmp_path)})
    assert run_inprocess(plan_run(cfg), progress=False)["status"] == "completed"
    events = read_tail_events(tmp_path)
    assert sorted(events) == [0, 1]
    model = load_task(cfg).build_model()
    held = ServerHoldings(num_classes=10, tail_events=events, initial_tail=model.segment(9, len(model)))
    labels = {p: read_tail_truth(tail_truth_path(tmp_path, p))[1] for p in events}
    rows = {r["attack"]: r for r in label_attacks(held, labels)}
    assert rows["gradient-matching static"]["accuracy"] == 1.0
    assert rows["gradient-matching tracked"]["accuracy"] == 1.0
    assert rows["gradient-matching tracked"]["tracking_error"] < 1e-6
    assert rows["gradient-matching tracked"]["samples"] == 2 * 2 * 2 * 8
