"""The two strategies built on the generalised runtime, against one-process references:
``psl`` (per-client client-side models, one server step per local iteration on the
mean of the per-client losses) and ``vanilla-sl`` (clients in turn)."""

from __future__ import annotations

import pytest
import torch
from flwr.app import ConfigRecord
from torch import nn

from tests.conftest import make_cfg

OPT = dict(lr=0.05, momentum=0.9, weight_decay=0.001, clip_norm=5.0)


class RefClient:
    """A client-side model with its own persistent SGD and sampler, as a node keeps them."""

    def __init__(self, task, pid, cut, state, lr=OPT["lr"]):
        from fl_app.learning.training import make_sgd

        self.task, self.pid = task, pid
        self.model = task.build_model().segment(0, cut)
        self.model.load_state_dict(state)
        self.opt = make_sgd(self.model, lr, OPT["momentum"], OPT["weight_decay"])
        self.sampler, self.step = ConfigRecord(), 0

    def forward(self, b):
        from fl_app.learning.training import load_batch, sample_batch

        idx = sample_batch(self.task, self.pid, self.sampler, b)
        self.x, self.y = load_batch(self.task, self.pid, idx, self.step)
        self.step += 1
        with torch.no_grad():
            return self.model(self.x), self.y

    def backward(self, g):
        self.model(self.x).backward(g)
        nn.utils.clip_grad_norm_(self.model.parameters(), OPT["clip_norm"])
        self.opt.step()
        self.opt.zero_grad(set_to_none=True)


def _run(strategy, **overrides):
    from fl_app.client_app import app
    from fl_app.learning.task import load_task
    from simulation.timing.clocks import VirtualClock
    from simulation.engine import InProcessGrid
    from simulation.timing.devices import draw_profiles
    from simulation.timing.durations import DeviceTiming
    from strategies.core.registry import get_strategy

    cfg = make_cfg(strategy=strategy, partition="dirichlet", alpha=1.0, batch_size=8, global_iterations=1,
                   heterogeneity="gas", **OPT, **overrides)
    task = load_task(cfg)
    timing = DeviceTiming(draw_profiles("gas", cfg.num_clients, cfg.seed), cfg.seed)
    s = get_strategy(strategy)(cfg, task, clock=VirtualClock(), timing=timing, progress=False)
    s.start(InProcessGrid(app, cfg.num_clients, seed=cfg.seed))
    return s, task, timing


@pytest.mark.parametrize("psl_loss", ["mean", "sum"])
def test_psl_round_equals_reference(psl_loss, server_identity, one_torch_thread):
    """3 clients, E = 2: per-client models diverge and are never averaged; the server
    steps once per local iteration on mean_k L_k (or Σ_k L_k); client k receives ∇_{A_k} L_k."""
    from fl_app.learning.training import make_sgd

    s, task, timing = _run("psl", num_clients=3, concurrency=3, local_iterations=2, psl_loss=psl_loss)
    cut = task.cut_layer
    model = task.build_model()
    init_client = {k: v.clone() for k, v in model.segment(0, cut).state_dict().items()}
    server = task.build_model().segment(cut, len(model))
    server_opt = make_sgd(server, OPT["lr"], OPT["momentum"], OPT["weight_decay"])
    clients = {pid: RefClient(task, pid, cut, init_client) for pid in range(3)}
    for _ in range(2):
        batches = {pid: c.forward(8) for pid, c in clients.items()}
        xs = {pid: a.clone().requires_grad_(True) for pid, (a, _) in batches.items()}
        losses = [nn.functional.cross_entropy(server(xs[p]), batches[p][1]) for p in range(3)]
        server_opt.zero_grad(set_to_none=True)
        (torch.stack(losses).sum() if psl_loss == "sum" else torch.stack(losses).mean()).backward()
        nn.utils.clip_grad_norm_(server.parameters(), OPT["clip_norm"])
        server_opt.step()
        for pid, c in clients.items():
            c.backward(xs[pid].grad * (1 if psl_loss == "sum" else 3))

    assert s.server_updates == 2
    for k, v in server.state_dict().items():
        assert torch.allclose(s.server_model.state_dict()[k], v, rtol=1e-5, atol=1e-6), k
    for pid, c in clients.items():
        for k, v in c.model.state_dict().items():
            assert torch.allclose(s.client_states[pid][k], v, rtol=1e-5, atol=1e-6), (pid, k)
    key = next(iter(init_client))
    assert not torch.allclose(s.client_states[0][key], s.client_states[1][key])  # not averaged
    # the server's evaluation copies were neither timed nor metered: only activations went up
    acts = 3 * 2 * s.costs.activation_bits(cut, 8) / 8
    assert s.bytes_up == acts
    # the last row evaluates client_k ∘ server on the full test set: mean, min, max over clients
    from fl_app.learning.training import evaluate_model

    accs = []
    for pid, c in clients.items():
        full = task.build_model()
        full.load_state_dict({**c.model.state_dict(), **server.state_dict()})
        accs.append(evaluate_model(full, task.data.test_batches())[1])
    row = s.rows[-1]
    assert row["client_accuracy_mean"] == pytest.approx(sum(accs) / 3, abs=2e-3)
    assert row["client_accuracy_min"] == pytest.approx(min(accs), abs=2e-3)
    assert row["client_accuracy_max"] == pytest.approx(max(accs), abs=2e-3)
    assert row["test_accuracy"] == row["client_accuracy_mean"]


def test_vanilla_sl_clients_train_in_turn(server_identity, one_torch_thread):
    """2 clients, E = 2: the second client starts from the first one's model; one
    server-side model; the virtual time is the sum of both clients' work."""
    from fl_app.learning.training import make_sgd

    s, task, timing = _run("vanilla-sl", num_clients=2, concurrency=2, local_iterations=2)
    cut = task.cut_layer
    model = task.build_model()
    state = {k: v.clone() for k, v in model.segment(0, cut).state_dict().items()}
    server = task.build_model().segment(cut, len(model))
    server_opt = make_sgd(server, OPT["lr"], OPT["momentum"], OPT["weight_decay"])
    import numpy as np

    from strategies.core.base import STREAM_SELECTION

    # the cohort order is the seeded selection's: replay it
    rng = np.random.default_rng([s.cfg.seed, STREAM_SELECTION])
    order = [int(p) for p in rng.choice(2, size=2, replace=False)]
    expected_time = 0.0
    for pid in order:
        c = RefClient(task, pid, cut, state)
        for e in range(2):
            a, y = c.forward(8)
            x = a.clone().requires_grad_(True)
            server_opt.zero_grad(set_to_none=True)
            nn.functional.cross_entropy(server(x), y).backward()
            nn.utils.clip_grad_norm_(server.parameters(), OPT["clip_norm"])
            server_opt.step()
            c.backward(x.grad)
        state = {k: v.clone() for k, v in c.model.state_dict().items()}
        prof, costs = timing.profile(pid), s.costs
        fwd, act = costs.flops(0, cut, 8), costs.activation_bits(cut, 8)
        bwd = costs.flops(0, cut, 8, forward=False, backward=True)
        # forward; backward + piggybacked forward; last backward + model upload
        for flops, bits in [(fwd, act), (bwd + fwd, act), (bwd, costs.param_bits(0, cut))]:
            expected_time += flops / prof.flops_per_s + bits / prof.uplink_bps
    for k, v in state.items():
        assert torch.allclose(s.client_model.state_dict()[k], v, rtol=1e-5, atol=1e-6), k
    for k, v in server.state_dict().items():
        assert torch.allclose(s.server_model.state_dict()[k], v, rtol=1e-5, atol=1e-6), k
    assert s.server_updates == 4
    assert s.clock.now() == pytest.approx(expected_time, rel=1e-9)


def test_last_layer_gradient_aggregation_by_hand():
    """EPSL: φ = 0.5 of B = 4 rows -> rows 0-1 become the mean over the 3 clients, rows 2-3 stay."""
    from strategies.algorithms.psl import aggregate_last_layer_gradients

    g = [torch.full((4, 2), float(k)) for k in (1, 2, 6)]
    g[0][1] = torch.tensor([3.0, -3.0])
    out = aggregate_last_layer_gradients(g, 0.5)
    for k, o in enumerate(out):
        assert torch.equal(o[0], torch.tensor([3.0, 3.0]))  # (1 + 2 + 6) / 3
        assert torch.allclose(o[1], torch.tensor([11 / 3, 5 / 3]))  # (3 + 2 + 6) / 3, (-3 + 2 + 6) / 3
        assert torch.equal(o[2:], g[k][2:])
    assert torch.equal(g[0][0], torch.tensor([1.0, 1.0]))  # inputs untouched
    assert all(torch.equal(a, b) for a, b in zip(aggregate_last_layer_gradients(g, 0.0), g))  # φ = 0: PSL


def test_epsl_round_equals_reference(server_identity, one_torch_thread):
    """3 clients, E = 2, φ = 0.5 of B = 8: the server back-propagates the per-client last-layer
    gradients with rows 0-3 averaged across clients; client k gets C·∂/∂A_k of that.
    Clients and server step at their own learning rates (client-lr, server-lr-split)."""
    from fl_app.learning.training import make_sgd

    s, task, timing = _run("epsl", num_clients=3, concurrency=3, local_iterations=2, epsl_phi=0.5,
                           client_lr=0.02, server_lr_split=0.08)
    cut = task.cut_layer
    model = task.build_model()
    init_client = {k: v.clone() for k, v in model.segment(0, cut).state_dict().items()}
    server = task.build_model().segment(cut, len(model))
    server_opt = make_sgd(server, 0.08, OPT["momentum"], OPT["weight_decay"])
    clients = {pid: RefClient(task, pid, cut, init_client, lr=0.02) for pid in range(3)}
    for _ in range(2):
        batches = {pid: c.forward(8) for pid, c in clients.items()}
        xs = {pid: a.clone().requires_grad_(True) for pid, (a, _) in batches.items()}
        logits = {p: server(xs[p]) for p in range(3)}
        grads = []
        for p in range(3):  # ∂/∂z_k of (1/3) Σ_k CE_k = (softmax(z_k) - onehot) / (B · 3)
            probs = torch.softmax(logits[p].detach(), dim=1)
            grads.append((probs - nn.functional.one_hot(batches[p][1], probs.shape[1])) / (8 * 3))
        mean = (grads[0][:4] + grads[1][:4] + grads[2][:4]) / 3
        server_opt.zero_grad(set_to_none=True)
        for p in range(3):
            logits[p].backward(torch.cat([mean, grads[p][4:]]))
        nn.utils.clip_grad_norm_(server.parameters(), OPT["clip_norm"])
        server_opt.step()
        for pid, c in clients.items():
            c.backward(xs[pid].grad * 3)

    for k, v in server.state_dict().items():
        assert torch.allclose(s.server_model.state_dict()[k], v, rtol=1e-4, atol=1e-6), k
    for pid, c in clients.items():
        for k, v in c.model.state_dict().items():
            assert torch.allclose(s.client_states[pid][k], v, rtol=1e-4, atol=1e-6), (pid, k)
