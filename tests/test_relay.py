"""The generalised runtime: block ranges on any node, named slots, queued and
tagged requests, weighted gradient accumulation, ``train.step``.

A three-node relay (A -> B -> C -> server -> C -> B -> A) is checked against
the same model run in one process, and its virtual time against the hand
sum of its hops' durations.
"""

from __future__ import annotations

import pytest
import torch
from flwr.app import RecordDict
from torch import nn

from fl_app import protocol as P
from tests.conftest import make_cfg

LR = 1.0  # plain SGD at lr 1: a step moves the weights by exactly -grad


@pytest.fixture
def relay_setup(server_identity, one_torch_thread):
    from fl_app.client_app import app
    from simulation.server_app import plan_run
    from simulation.timing.clocks import VirtualClock
    from simulation.engine import InProcessGrid
    from simulation.timing.durations import DeviceTiming
    from strategies.core.base import SFLStrategy

    cfg = make_cfg(num_clients=3, concurrency=3, heterogeneity="gas", partition="iid", batch_size=8, seed=4)
    plan = plan_run(cfg)
    grid = InProcessGrid(app, 3, seed=4)
    s = SFLStrategy(cfg, plan.task, clock=VirtualClock(), timing=DeviceTiming(plan.profiles, cfg.seed),
                    progress=False)
    s.connect(grid, timeout=30)
    return s, grid, plan


def _state(grid, s, pid):
    return grid.contexts[s.clients[pid].node_id].state


def test_three_node_relay_matches_one_process(relay_setup):
    from strategies.core.dispatcher import Request

    s, grid, plan = relay_setup
    task, costs, B = plan.task, s.costs, 8
    A, Bn, C = 0, 1, 2
    ranges = {A: (0, 2), Bn: (2, 4), C: (4, 6)}
    slot = {A: P.OWN_SLOT, Bn: P.relay_slot(A), C: P.relay_slot(A)}
    opt = {"lr": LR, "momentum": 0.0, "weight_decay": 0.0, "clip_norm": 0.0}
    sent: list[tuple[int, Request]] = []

    def request(pid, action, content, flops, bits_up, tag):
        req = Request(action, content, flops, bits_up, tag=tag)
        sent.append((pid, req))
        return pid, req

    # ---- forward: A runs [0, 2) on its own data, B and C run their ranges on the relayed activations
    a, b = ranges[A]
    cfg_a = P.ForwardConfig(slot=slot[A], start=a, end=b, batch_size=B, **opt)
    (r,) = s.gather_replies([request(A, P.TRAIN_FORWARD, RecordDict({P.CONFIG: cfg_a.to_record()}),
                                     costs.flops(a, b, B), costs.activation_bits(b, B), ("fwd", A))])
    assert r.tag == ("fwd", A) and r.pid == A
    outputs = {A: P.record_tensor(r.content.array_records[P.ACTIVATIONS], "x")}
    labels = P.record_tensor(r.content.array_records[P.LABELS], "y")
    prev = A
    for pid in (Bn, C):
        a, b = ranges[pid]
        cfg = P.ForwardConfig(slot=slot[pid], start=a, end=b, **opt)
        content = RecordDict({P.CONFIG: cfg.to_record(), P.ACTIVATIONS: P.tensor_record("x", outputs[prev]),
                              P.LABELS: P.tensor_record("y", labels)})
        (r,) = s.gather_replies([request(pid, P.TRAIN_FORWARD, content, costs.flops(a, b, B),
                                         costs.activation_bits(b, B), ("fwd", pid))])
        assert r.tag == ("fwd", pid)
        assert torch.equal(P.record_tensor(r.content.array_records[P.LABELS], "y"), labels)
        outputs[pid] = P.record_tensor(r.content.array_records[P.ACTIVATIONS], "x")
        prev = pid

    # ---- server: blocks [6, 8), the loss, the gradient w.r.t. C's output
    model = task.build_model()
    server = model.segment(6, 8)
    x_s = outputs[C].clone().requires_grad_(True)
    server_loss = nn.functional.cross_entropy(server(x_s), labels)
    server_loss.backward()
    grad = x_s.grad.detach()

    # ---- backward: each node gets its backward and a train.step queued together
    weights_before = {pid: {k: v.clone() for k, v in model.segment(*ranges[pid]).state_dict().items()}
                      for pid in ranges}
    stepped = {}
    for pid in (C, Bn, A):
        a, b = ranges[pid]
        back = P.BackwardConfig(slot=slot[pid], accumulate=True, weight=1.0, **opt)
        step = P.StepConfig(slot=slot[pid], return_weights=True, **opt)
        grad_bits = costs.activation_bits(a, B, labels=False) if a > 0 else 0.0
        replies = s.gather_replies([
            request(pid, P.TRAIN_BACKWARD, RecordDict({P.CONFIG: back.to_record(),
                                                       P.GRADIENT: P.tensor_record("g", grad)}),
                    costs.flops(a, b, B, forward=False, backward=True), grad_bits, ("bwd", pid)),
            request(pid, P.TRAIN_STEP, RecordDict({P.CONFIG: step.to_record()}), 0.0, 0.0, ("step", pid)),
        ])
        assert [r.tag for r in replies] == [("bwd", pid), ("step", pid)]
        if a > 0:
            grad = P.record_tensor(replies[0].content.array_records[P.GRADIENT], "g")
        else:
            assert P.GRADIENT not in replies[0].content.array_records  # block 0 has no input gradient
        stepped[pid] = P.record_state(replies[1].content.array_records[P.WEIGHTS])

    # ---- the same model in one process
    ref = task.build_model()
    x, y = _own_batch(grid, s, task, A)
    assert torch.equal(y, labels)
    acts = x
    for pid in (A, Bn, C):
        acts = ref.segment(*ranges[pid])(acts)
        assert torch.allclose(acts, outputs[pid], atol=1e-6, rtol=0), f"output of node {pid}"
    loss = nn.functional.cross_entropy(ref.segment(6, 8)(acts), y)
    assert abs(float(loss.detach()) - float(server_loss.detach())) < 1e-6
    loss.backward()
    ref_params = dict(ref.named_parameters())
    for pid in (A, Bn, C):
        for k, w0 in weights_before[pid].items():
            got_grad = (w0 - stepped[pid][k]) / LR
            assert torch.allclose(got_grad, ref_params[k].grad, atol=1e-6, rtol=0), f"{k} on node {pid}"
    for k, p in server.named_parameters():
        assert torch.allclose(p.grad, ref_params[k].grad, atol=1e-6, rtol=0)

    # ---- slots: B's own client-side model is untouched by the segment it trained for A
    assert "slot.own.weights" not in _state(grid, s, Bn).array_records
    assert "slot.relay:0.weights" in _state(grid, s, Bn).array_records
    assert "slot.relay:0.accum" not in _state(grid, s, Bn).array_records  # cleared by train.step

    # ---- virtual time: the hand sum of every hop's duration (flops / f_k + bits_up / R_k)
    expected = 0.0
    for pid, req in sent:
        prof = plan.profiles[pid]
        expected += req.flops / prof.flops_per_s + req.bits_up / prof.uplink_bps
    assert s.clock.now() == pytest.approx(expected, rel=1e-12)
    assert s.dispatcher.exchanges == len(sent) == 9


def _own_batch(grid, s, task, pid):
    from fl_app.learning.training import load_batch

    batch = _state(grid, s, pid).config_records["slot.own.batch"]
    return load_batch(task, pid, batch["indices"], int(batch["step"]))


def test_weighted_accumulation_and_lr_scale(relay_setup):
    """Two weighted backward passes accumulate ``Σ w_i g_i``; ``train.step`` applies it
    with per-block learning-rate multipliers; without ``accumulate`` a weighted step is
    ``w·g``."""
    from strategies.core.dispatcher import Request

    s, grid, plan = relay_setup
    task, B = plan.task, 8
    opt = {"lr": 0.5, "momentum": 0.0, "weight_decay": 0.0, "clip_norm": 0.0}
    fwd = P.ForwardConfig(slot=P.OWN_SLOT, start=0, end=2, batch_size=B, **opt)
    weights = []
    g = torch.randn(B, 64, 7, 7, generator=torch.Generator().manual_seed(1))
    for w in (0.25, 0.75):
        s.gather({0: Request(P.TRAIN_FORWARD, RecordDict({P.CONFIG: fwd.to_record()}))})
        back = P.BackwardConfig(accumulate=True, weight=w, **opt)
        s.gather({0: Request(P.TRAIN_BACKWARD, RecordDict({P.CONFIG: back.to_record(),
                                                           P.GRADIENT: P.tensor_record("g", g * (1 + w))}))})
        weights.append(w)
    # reference: the two batches the node used, through the initial weights
    ref = task.build_model().segment(0, 2)
    w0 = {k: v.clone() for k, v in ref.state_dict().items()}
    acc = {k: torch.zeros_like(v) for k, v in w0.items()}
    from fl_app.learning.training import load_batch, sample_batch
    from flwr.app import ConfigRecord

    sampler = ConfigRecord()
    for step, w in enumerate(weights):
        idx = sample_batch(task, 0, sampler, B)
        x, _ = load_batch(task, 0, idx, step)
        ref.zero_grad()
        ref(x).backward(g * (1 + w))
        for k, p in ref.named_parameters():
            acc[k] += w * p.grad
    stored = P.record_state(_state(grid, s, 0).array_records["slot.own.accum"])
    for k in acc:
        assert torch.allclose(stored[k], acc[k], atol=1e-6, rtol=1e-5)
    scale = (2.0, 3.0)
    step = P.StepConfig(return_weights=True, lr_scale=scale, **opt)
    got = s.gather({0: Request(P.TRAIN_STEP, RecordDict({P.CONFIG: step.to_record()}))})[0]
    new = P.record_state(got.array_records[P.WEIGHTS])
    for k in acc:
        block = 0 if k.startswith("blocks.conv1.") else 1
        assert torch.allclose(new[k], w0[k] - opt["lr"] * scale[block] * acc[k], atol=1e-6, rtol=1e-5), k


def test_backward_with_a_server_held_optimizer_state(relay_setup):
    """A ``train.backward`` carrying :data:`~fl_app.protocol.OPTIMIZER` steps with that momentum
    buffer instead of the slot's own, and returns the new one: ``m' = β·m + g + λ·w``,
    ``w' = w − lr·m'`` (torch's SGD); an empty record means no buffer yet (``m' = g + λ·w``)."""
    from strategies.core.dispatcher import Request

    s, grid, plan = relay_setup
    task, B = plan.task, 8
    opt = {"lr": 0.1, "momentum": 0.5, "weight_decay": 0.01, "clip_norm": 0.0}
    fwd = P.ForwardConfig(slot=P.OWN_SLOT, start=0, end=2, batch_size=B, **opt)
    back = P.BackwardConfig(next=P.NEXT_WEIGHTS, **opt)
    g = 1e-3 * torch.randn(B, 64, 7, 7, generator=torch.Generator().manual_seed(1))
    ref = task.build_model().segment(0, 2)
    w = {k: v.detach().clone() for k, v in ref.named_parameters()}
    from fl_app.learning.training import load_batch, sample_batch
    from flwr.app import ConfigRecord

    sampler = ConfigRecord()
    m = None
    for step in range(2):
        s.gather({0: Request(P.TRAIN_FORWARD, RecordDict({P.CONFIG: fwd.to_record()}))})
        sent = {} if m is None else {k: 3.0 * v for k, v in m.items()}  # not what the slot would hold
        got = s.gather({0: Request(P.TRAIN_BACKWARD, RecordDict({
            P.CONFIG: back.to_record(), P.GRADIENT: P.tensor_record("g", g), P.OPTIMIZER: P.state_record(sent)}))})[0]
        idx = sample_batch(task, 0, sampler, B)
        x, _ = load_batch(task, 0, idx, step)
        ref.load_state_dict(w)
        ref.zero_grad()
        ref(x).backward(g)
        m = {k: (opt["momentum"] * sent[k] if sent else 0.0) + p.grad + opt["weight_decay"] * w[k]
             for k, p in ref.named_parameters()}
        w = {k: w[k] - opt["lr"] * m[k] for k in w}
        returned = P.record_state(got.array_records[P.OPTIMIZER])
        new = P.record_state(got.array_records[P.WEIGHTS])
        for k in m:
            assert torch.allclose(returned[k], m[k], atol=1e-6, rtol=1e-5), k
            assert torch.allclose(new[k], w[k], atol=1e-6, rtol=1e-5), k


def test_action_configs_round_trip():
    cfg = P.ForwardConfig(slot="relay:3", start=2, end=5, batch_size=7, loss=True, lr=0.1, lr_scale=(1.0, 2.0, 3.0))
    rec = cfg.to_record()
    assert rec["batch-size"] == 7 and rec["lr-scale"] == [1.0, 2.0, 3.0] and rec["slot"] == "relay:3"
    assert P.ForwardConfig.from_record(rec) == cfg
    assert P.BackwardConfig.from_record({}) == P.BackwardConfig()
    assert P.relay_slot(3) == "relay:3"
