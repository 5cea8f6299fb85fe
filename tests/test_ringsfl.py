"""RingSFL (its paper): propagation lengths, ring paths and overlap counts by hand,
eqs. 4-7 against a one-process computation, D2D timing by hand, dropout, the
label-sorted partition, vanilla SL's round-robin order, and learning on MNIST."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord
from torch import nn

from fl_app.run.errors import ConfigError
from tests.conftest import cli_args, make_cfg, read_metrics
from tests.fault_apps import failing_client_app

# =============================================================================
# Lengths, paths, overlaps by hand
# =============================================================================


def test_propagation_lengths_by_hand():
    from strategies.algorithms.ringsfl.schedule import propagation_lengths

    assert propagation_lengths([2e9, 1e9, 1e9], 12) == [6, 3, 3]  # exact: 12·(1/2, 1/4, 1/4)
    assert propagation_lengths([1, 1, 1], 10) == [4, 3, 3]  # 3.33 each; the remainder to the first
    assert propagation_lengths([6, 1, 1], 10) == [8, 1, 1]  # 7.5, 1.25, 1.25 (the authors' 8:1:1)
    assert propagation_lengths([3, 1, 1], 12) == [7, 3, 2]  # 7.2, 2.4, 2.4: one remainder, lowest index
    assert propagation_lengths([100, 1, 1], 12) == [10, 1, 1]  # 12, 0, 0 before every L_i >= 1
    assert propagation_lengths([5], 12) == [12]
    with pytest.raises(ConfigError, match="at least 3 model blocks"):
        propagation_lengths([1, 1, 1], 2)
    with pytest.raises(ConfigError, match="positive"):
        propagation_lengths([1, 0], 4)


def test_ring_paths_by_hand():
    """Algorithm 2 with the paper's Fig. 2 ring (lengths 2:1:3 on 6 blocks): each path
    starts at its client and covers blocks 0-5 once, node j running its next L_j blocks."""
    from strategies.algorithms.ringsfl.schedule import ring_path

    assert ring_path([2, 1, 3], 0) == [(0, 0, 2), (1, 2, 3), (2, 3, 6)]
    assert ring_path([2, 1, 3], 1) == [(1, 0, 1), (2, 1, 4), (0, 4, 6)]
    assert ring_path([2, 1, 3], 2) == [(2, 0, 3), (0, 3, 5), (1, 5, 6)]


def test_overlap_counts_fig5():
    """Fig. 5: 2 clients, 2:4. Client 0's flow runs W_0(0,1) then W_1(2,5); client 1's runs
    W_1(0,3) then W_0(4,5); so W_1's layers 2-3 are crossed twice (eq. 7 gives them 2η)."""
    from strategies.algorithms.ringsfl.schedule import overlap_counts

    assert overlap_counts([2, 4]) == [[1, 1, 0, 0, 1, 1], [1, 1, 2, 2, 1, 1]]
    # Fig. 2's ring, from the paths above; every block is crossed N = 3 times over the nodes
    counts = overlap_counts([2, 1, 3])
    assert counts == [[1, 1, 0, 1, 2, 1], [1, 0, 1, 0, 0, 1], [1, 2, 2, 2, 1, 1]]
    assert np.array(counts).sum(axis=0).tolist() == [3] * 6


@pytest.mark.parametrize("overrides, match", [
    ({"ring-lengths": "8:1:1:1"}, "4 entries for 5 clients"),
    ({"ring-lengths": "8:1:1:1:2"}, "sums to 13; lenet5 has 12 blocks"),
    ({"ring-lengths": "8:1:x:1:1"}, "not an integer"),
    ({"ring-lengths": "8:0:2:1:1"}, ">= 1"),
    ({"drop-per-round": 5}, "leaves no client"),
    ({"num-clients": 13, "concurrency": 13}, "13 clients need at least 13 model blocks"),
])
def test_bad_ring_config_is_refused(overrides, match, tmp_path, capsys):
    """Refused before anything runs, in one line, by plan_run and on the command line."""
    from simulation.server_app import plan_run
    from simulation.cli import main

    values = {"strategy": "ringsfl", "model": "lenet5", "num-clients": 5, "concurrency": 5, **overrides,
              "output-dir": str(tmp_path / "out")}
    with pytest.raises(ConfigError, match=match) as err:
        plan_run(make_cfg(**values))
    assert "\n" not in str(err.value)
    assert main(cli_args(values, "-q")) == 2
    assert match in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


# =============================================================================
# Eqs. 4-7 against one process
# =============================================================================


def _mlp6(input_shape, num_classes):
    """The paper's 6-layer MLP (Figs. 2 and 5), one linear(+ReLU) layer per block."""
    width = 16
    flat = int(np.prod(input_shape))
    blocks = [("fc1", nn.Sequential(nn.Flatten(), nn.Linear(flat, width), nn.ReLU()))]
    blocks += [(f"fc{k}", nn.Sequential(nn.Linear(width, width), nn.ReLU())) for k in range(2, 6)]
    return blocks + [("fc6", nn.Linear(width, num_classes))]


@pytest.fixture
def mlp6(monkeypatch):
    """Model ``mlp6`` (6 blocks), visible to the server and to the in-process clients."""
    from fl_app import models

    monkeypatch.setitem(models._BUILDERS, "mlp6", _mlp6)
    return "mlp6"


RING_OPT = dict(lr=0.05, momentum=0.0, weight_decay=0.0, clip_norm=0.0)


def _run_ring(model, **overrides):
    from fl_app.client_app import app
    from fl_app.learning.task import load_task
    from simulation.timing.clocks import VirtualClock
    from simulation.engine import InProcessGrid
    from simulation.timing.devices import draw_profiles
    from simulation.timing.durations import DeviceTiming
    from strategies.core.registry import get_strategy

    values = dict(strategy="ringsfl", model=model, num_clients=3, concurrency=3, partition="iid", batch_size=8,
                  global_iterations=1, local_iterations=1, heterogeneity="gas", seed=2, **RING_OPT)
    values.update(overrides)
    cfg = make_cfg(**values)
    task = load_task(cfg)
    timing = DeviceTiming(draw_profiles(cfg.heterogeneity, cfg.num_clients, cfg.seed), cfg.seed)
    s = get_strategy("ringsfl")(cfg, task, clock=VirtualClock(), timing=timing, progress=False)
    s.start(InProcessGrid(app, cfg.num_clients, seed=cfg.seed))
    return s, task


@pytest.mark.parametrize("version", [1, 2])
def test_eqs_4_to_7_by_hand(version, mlp6, server_identity, one_torch_thread):
    """The paper's Fig. 2 ring: 3 clients, lengths 2:1:3, the 6-layer MLP, one batch per
    client (unequal D_i: 1334/1333/1333, so the a_i differ). The blended models after the
    round (eq. 4; eq. 7 for v2) and their average (eq. 6) equal the one-process oracle
    (:func:`benchmarks.ring.ring_oracle`, which ``sflower bench ring`` times)."""
    from benchmarks.ring import ring_oracle

    s, task = _run_ring(mlp6, ring_lengths="2:1:3", ring_version=version)
    paths = [[(0, 0, 2), (1, 2, 3), (2, 3, 6)], [(1, 0, 1), (2, 1, 4), (0, 4, 6)], [(2, 0, 3), (0, 3, 5), (1, 5, 6)]]
    counts = [[1, 1, 0, 1, 2, 1], [1, 0, 1, 0, 0, 1], [1, 2, 2, 2, 1, 1]] if version == 2 else [[1] * 6] * 3
    blended, average, _ = ring_oracle(task, [0, 1, 2], paths, counts, RING_OPT["lr"], 8)
    assert s.ring == [0, 1, 2] and s.lengths == [2, 1, 3]
    start = task.build_model().state_dict()
    for pid in range(3):
        for k, v in blended[pid].items():
            assert torch.allclose(s.blended[pid][k], v, atol=1e-6, rtol=0), (pid, k)
        # a block no path crossed is untouched (node 0's block 2, node 1's blocks 1, 3, 4)
        for block, c in enumerate(counts[pid] if version == 2 else []):
            for k in (k for k in start if k.startswith(f"blocks.fc{block + 1}.")):
                assert torch.equal(s.blended[pid][k], start[k]) == (c == 0), (pid, k)
    for k, v in average.items():
        assert torch.allclose(s.model.state_dict()[k], v, atol=1e-6, rtol=0), k
    moved = {k: float((s.model.state_dict()[k] - start[k]).abs().max()) for k in start}
    assert min(moved.values()) > 1e-4  # every block trained
    # 3 own forwards, 6 relayed forwards, 6 backwards, 3 steps
    assert s.dispatcher.exchanges == 18 and s.server_updates == 1


def test_d2d_timing_by_hand(mlp6, server_identity, one_torch_thread):
    """2 identical devices (5e9 FLOP/s, free client-server links), lengths 3:3, D2D at 2 Mbit/s:
    the two paths mirror each other, so one step takes own forward + its hop's D2D + the
    other node's forward and backward (the loss) + the gradient's D2D + own backward."""
    s, task = _run_ring(mlp6, num_clients=2, concurrency=2, ring_lengths="3:3", heterogeneity="none",
                        d2d_rate=2.0)
    c, B, f = s.costs, 8, 5e9
    expected = (c.flops(0, 3, B) / f + c.activation_bits(3, B) / 2e6
                + c.flops(3, 6, B, backward=True) / f + c.activation_bits(3, B, labels=False) / 2e6
                + c.flops(0, 3, B, forward=False, backward=True) / f)
    assert s.clock.now() == pytest.approx(expected, rel=1e-12)
    # each hop counted once: per path one activation hop and one gradient hop
    assert s.d2d_bytes == 2 * (int(c.activation_bits(3, B) // 8) + int(c.activation_bits(3, B, labels=False) // 8))


def test_d2d_charging_mechanism():
    """A request's ``d2d_bits`` add ``bits / d2d_bps`` to its duration; without them the
    duration is the timing's, unchanged; the wall clock's timing charges nothing."""
    from flwr.app import RecordDict

    from simulation.timing.durations import DeviceTiming
    from simulation.timing.profiles import DeviceProfile
    from strategies.core.base import SFLStrategy
    from simulation.timing.durations import ZeroTiming
    from strategies.core.dispatcher import Request

    timing = DeviceTiming([DeviceProfile(0, 1e9, uplink_bps=1e6)], seed=0)
    s = SFLStrategy.__new__(SFLStrategy)
    s.timing, s.d2d_bps = timing, 4e6
    plain = Request("train.forward", RecordDict(), flops=2e9, bits_up=3e6)
    hop = Request("train.forward", RecordDict(), flops=2e9, bits_up=3e6, d2d_bits=8e6)
    assert s.expected_duration(0, plain) == timing.duration(0, 2e9, 3e6, 0.0) == 2.0 + 3.0
    assert s.expected_duration(0, hop) == 2.0 + 3.0 + 2.0
    s.timing = ZeroTiming()
    assert s.expected_duration(0, hop) == 0.0


def test_lengths_from_compute_speeds(mlp6, server_identity, one_torch_thread):
    """Without ring-lengths, L_i = C_i/ΣC·W from the devices' FLOP/s (GAS model, seed 2)."""
    from simulation.timing.devices import draw_profiles
    from strategies.algorithms.ringsfl.schedule import propagation_lengths

    s, task = _run_ring(mlp6)
    speeds = [p.flops_per_s for p in draw_profiles("gas", 3, 2)]
    assert s.lengths == propagation_lengths(speeds, 6)
    assert sum(s.lengths) == 6 and len(set(s.lengths)) > 1  # heterogeneous devices, unequal lengths


# =============================================================================
# Dropout
# =============================================================================


def test_drop_per_round_run_finishes(tmp_path):
    """5 clients, 2 injected failures per round: each round's ring is rebuilt from the 3
    others (lengths rescaled from 8:1:1:1:1) and the run completes with its metrics."""
    from simulation.cli import main

    out = tmp_path / "drop"
    values = {"strategy": "ringsfl", "model": "lenet5", "num-clients": 5, "concurrency": 5, "partition": "iid",
              "ring-lengths": "8:1:1:1:1", "drop-per-round": 2, "global-iterations": 2, "local-iterations": 3,
              "batch-size": 8, "momentum": 0, "weight-decay": 0, "lr": 0.02, "seed": 1, "output-dir": out}
    assert main(cli_args(values, "-q")) == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = read_metrics(out / "metrics.csv")
    assert summary["status"] == "completed" and summary["global_iterations"] == 2
    assert summary["failed_clients"] == []  # injected failures are transient
    assert [int(r["global_iteration"]) for r in rows] == [0, 1, 2]
    assert [int(r["ring_size"]) for r in rows[1:]] == [3, 3]
    assert int(rows[-1]["ring_rebuilds"]) == 2
    assert len(summary["ring"]) == 3 and sum(map(int, summary["ring_lengths"].split(":"))) == 12
    assert float(rows[-1]["test_loss"]) < float(rows[0]["test_loss"])


def test_node_failure_mid_round_loses_the_round_not_the_run(mlp6, tmp_path, one_torch_thread):
    """Client 1 fails on its 3rd backward (in the 2nd step of round 1): nothing of the
    round is aggregated, the ring is rebuilt from clients 0 and 2 with new lengths, the
    round is trained again from the global model, and the run completes."""
    from simulation.server_app import plan_run
    from simulation.engine import run_inprocess

    base = dict(strategy="ringsfl", model=mlp6, num_clients=3, concurrency=3, partition="iid", batch_size=8,
                global_iterations=2, local_iterations=2, ring_lengths="2:1:3", seed=3, **RING_OPT)
    plan = plan_run(make_cfg(**base, output_dir=str(tmp_path / "fail")))
    summary = run_inprocess(plan, progress=False, client_app=failing_client_app(fail_pid=1, fail_on_backward=3)[0])
    assert summary["status"] == "completed" and summary["failed_clients"] == [1]
    assert summary["ring"] == [0, 2] and summary["ring_lengths"] == "2:4"  # 2:3 rescaled to 6 blocks
    rows = read_metrics(tmp_path / "fail" / "metrics.csv")
    assert [int(r["ring_size"]) for r in rows[1:]] == [2, 2]
    assert [int(r["ring_rebuilds"]) for r in rows[1:]] == [1, 1]
    assert float(rows[2]["test_loss"]) < float(rows[0]["test_loss"])


# =============================================================================
# The label-sorted partition
# =============================================================================


def test_label_sorted_partition():
    """Stable sort by label, cut into near-equal contiguous chunks; no randomness."""
    from fl_app.data import partition_indices

    labels = np.array([2, 0, 1, 0, 2, 1, 1, 0, 2, 2, 1])
    parts = partition_indices(labels, 3, "label-sorted", seed=5)
    order = np.argsort(labels, kind="stable")
    assert np.array_equal(np.concatenate(parts), order)
    assert [len(p) for p in parts] == [4, 4, 3]
    assert [p.tolist() for p in parts] == [[1, 3, 7, 2], [5, 6, 10, 0], [4, 8, 9]]
    assert all(p.dtype == np.int64 for p in parts)
    assert all(np.array_equal(a, b) for a, b in zip(parts, partition_indices(labels, 3, "label-sorted", seed=9)))


def test_label_sorted_mnist_two_classes_each(shared_data):
    """MNIST, 5 clients: 12,000 images each, about 2 classes per client (the paper's non-IID)."""
    from fl_app.data import load_dataset, partition_indices

    y = load_dataset("mnist", str(shared_data / "mnist")).y_train.numpy()
    parts = partition_indices(y, 5, "label-sorted")
    assert [len(p) for p in parts] == [12000] * 5
    for p in parts:
        counts = np.bincount(y[p], minlength=10)
        assert (counts > 0).sum() <= 3 and np.sort(counts)[-2:].sum() > 0.9 * len(p)


# =============================================================================
# Vanilla SL, round-robin every batch (the authors' baseline)
# =============================================================================


def test_vanilla_sl_batch_order(server_identity, one_torch_thread):
    """3 clients, 2 global iterations of E = 2 batches: the model moves every batch,
    round-robin 0, 1 | 2, 0 (continuing across rounds), one client-side and one
    server-side model; equal to one process doing the same."""
    from fl_app.client_app import app
    from fl_app.learning.task import load_task
    from fl_app.learning.training import load_batch, make_sgd, sample_batch
    from simulation.timing.clocks import VirtualClock
    from simulation.engine import InProcessGrid
    from simulation.timing.devices import draw_profiles
    from simulation.timing.durations import DeviceTiming
    from strategies.core.registry import get_strategy

    cfg = make_cfg(strategy="vanilla-sl", sl_order="batch", model="lenet5", cut_layer=3, num_clients=3,
                   concurrency=3, partition="iid", batch_size=8, global_iterations=2, local_iterations=2, seed=4,
                   **RING_OPT)
    task = load_task(cfg)
    timing = DeviceTiming(draw_profiles("gas", 3, 4), 4)
    s = get_strategy("vanilla-sl")(cfg, task, clock=VirtualClock(), timing=timing, progress=False)
    s.start(InProcessGrid(app, 3, seed=4))

    cut = task.cut_layer
    model = task.build_model()
    client, server = model.segment(0, cut), model.segment(cut, len(model))
    c_opt, s_opt = make_sgd(client, 0.05, 0, 0), make_sgd(server, 0.05, 0, 0)
    samplers, steps = {p: ConfigRecord() for p in range(3)}, {p: 0 for p in range(3)}
    for pid in [0, 1, 2, 0]:
        x, y = load_batch(task, pid, sample_batch(task, pid, samplers[pid], 8), steps[pid])
        steps[pid] += 1
        a = client(x)
        h = a.detach().requires_grad_(True)
        s_opt.zero_grad()
        nn.functional.cross_entropy(server(h), y).backward()
        s_opt.step()
        c_opt.zero_grad()
        a.backward(h.grad)
        c_opt.step()
    for k, v in model.state_dict().items():
        assert torch.allclose(s.model.state_dict()[k], v, atol=1e-6, rtol=0), k
    assert s.server_updates == 4 and s.turn == 4
    assert s.dispatcher.exchanges == 8  # a forward and a backward (returning the model) per batch


# =============================================================================
# Learning on MNIST
# =============================================================================


def test_learns_mnist_lenet5(shared_data, tmp_path):
    """The paper's LeNet-5 setting at CPU scale: MNIST, 5 clients (IID), lengths 8:1:1:1:1,
    RingSFLv2, plain SGD at lr 0.02, batch 64; 6 rounds of 10 ring steps (60 batches per
    client). Measured (seed 0): accuracy 0.106 untrained, 0.504 after the 6th round (v1: 0.723;
    FedAvg with the same 6 x 10 local steps: 0.835; this early the nodes' blended models
    drift apart within a round, and v2's overlap multiplier widens that)."""
    from simulation.cli import main

    out = tmp_path / "ring"
    values = {"strategy": "ringsfl", "dataset": "mnist", "data-dir": shared_data / "mnist", "model": "lenet5",
              "num-clients": 5, "concurrency": 5, "partition": "iid", "ring-lengths": "8:1:1:1:1",
              "global-iterations": 6, "local-iterations": 10, "batch-size": 64, "lr": 0.02, "momentum": 0,
              "weight-decay": 0, "clip-norm": 0, "eval-samples": 1000, "seed": 0, "output-dir": out}
    assert main(cli_args(values, "-q")) == 0
    rows = read_metrics(out / "metrics.csv")
    acc = [float(r["test_accuracy"]) for r in rows]
    assert acc[0] < 0.15
    assert acc[-1] >= 0.35, acc
    assert float(rows[-1]["train_loss"]) < float(rows[1]["train_loss"])
    assert float(rows[-1]["test_loss"]) < float(rows[0]["test_loss"])


# =============================================================================
# Speed: the relay path's live objects and the bench's oracle check
# =============================================================================


@pytest.mark.parametrize("strategy, model", [("ringsfl", "lenet5"), ("ringsfl", "vit-small"),
                                             ("splitfed-v1", "alexnet")])
def test_live_objects_change_no_number(strategy, model, tmp_path, monkeypatch):
    """In-process nodes keep their live models and forward graphs (:mod:`fl_app.client.live`) only as a
    cache of ``context.state``: a run is bit-identical with them off (every message rebuilding
    its model, every backward recomputing its forward pass, as under Ray). vit-small has
    dropout (the kept graph holds the masks of the seeded forward pass); splitfed-v1
    piggybacks the next forward on each backward. (Every strategy of
    ``tests/test_engines.py::test_ray_matches_inprocess`` also checks it: Ray keeps nothing.)"""
    from fl_app.client import live
    from benchmarks.ring import time_engine

    taken = []
    take = live.LiveCache.take_graph
    monkeypatch.setattr(live.LiveCache, "take_graph", lambda self, *a: taken.append(take(self, *a)) or taken[-1])
    cfg = {"strategy": strategy, "model": model, "dataset": "mnist-5k", "num-clients": 3, "concurrency": 3,
           "partition": "iid", "global-iterations": 2, "local-iterations": 2, "batch-size": 8, "seed": 3,
           "momentum": 0.5 if strategy != "ringsfl" else 0.0, "eval-every": 1, "eval-samples": 64}
    runs = {}
    for on in (True, False):
        taken.clear()
        _, runs[on] = time_engine("inprocess", {**cfg, "output-dir": str(tmp_path / str(on))}, live=on)
        if on:
            assert any(g is not None for g in taken)  # the cache was used
        else:
            assert not taken
    a, b = (runs[on].global_model().state_dict() for on in (True, False))
    assert all(torch.equal(a[k], b[k]) for k in a)
    rows = [read_metrics(tmp_path / str(on) / "metrics.csv") for on in (True, False)]
    assert [r["test_loss"] for r in rows[0]] == [r["test_loss"] for r in rows[1]]
    assert runs[True].clock.now() == runs[False].clock.now()


def test_bench_ring_quick(shared_data, tmp_path):
    """``sflower bench ring`` on 3 steps: the oracle, summing in the order the engine's nodes did,
    ends with the in-process engine's blended models bit for bit (and their average to 1e-6),
    which the rebuilding variant also ends with; the figures are all there."""
    from benchmarks import ring as bench_ring

    out = bench_ring.run(tmp_path, data_dir=shared_data / "mnist", steps=3, repeats=1, ray=False)
    assert out["oracle_equals_inprocess"] and out["blended_bit_identical"] and out["rebuild_bit_identical"]
    assert out["max_abs_diff"] < 1e-6
    assert out["inprocess"]["exchanges"] == 3 * (5 * 5 + 5 * 4 + 5)  # per step: 5 paths of 5 forwards and 4 backwards, 5 steps
    assert out["inprocess"]["ratio_to_oracle"] > 0 and "ray" not in out


@pytest.mark.parametrize("version,momentum,warned", [(2, 0.9, True), (2, 0.0, False), (1, 0.9, False)])
def test_v2_under_momentum_warns_in_one_line(version, momentum, warned, caplog):
    """Eq. 7's overlap multiplier is defined for plain SGD: v2 with momentum says so, once, in one line."""
    from fl_app.learning.task import load_task
    from simulation.timing.clocks import VirtualClock
    from simulation.timing.durations import ZeroTiming
    from strategies.core.registry import get_strategy

    cfg = make_cfg(strategy="ringsfl", model="lenet5", num_clients=3, concurrency=3, ring_version=version,
                   momentum=momentum)
    s = get_strategy("ringsfl")(cfg, load_task(cfg), clock=VirtualClock(), timing=ZeroTiming(), progress=False)
    with caplog.at_level("WARNING", logger="sflower"):
        s.summary()
    notes = [r.getMessage() for r in caplog.records if "plain SGD" in r.getMessage()]
    assert len(notes) == (1 if warned else 0)
    assert all("\n" not in n and "momentum=0.9" in n for n in notes)
