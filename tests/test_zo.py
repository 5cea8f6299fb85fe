"""Zeroth-order optimisation (MU-SplitFed): the SPSA estimator by hand, seeded
directions, the client's zo_forward / zo_update protocol, MU-SplitFed's round."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from flwr.app import RecordDict
from torch import nn

from fl_app import protocol as P
from fl_app.learning.zo import direction, perturb_, perturbed_outputs, spsa_gradient, zo_seed
from tests.conftest import make_cfg

D = 5
A = torch.tensor(np.random.default_rng(0).normal(size=(7, D)), dtype=torch.float64)
B = torch.tensor(np.random.default_rng(1).normal(size=7), dtype=torch.float64)
X0 = torch.tensor([0.3, -1.2, 0.5, 2.0, -0.7], dtype=torch.float64)


def f(x: torch.Tensor) -> torch.Tensor:
    """The quadratic ½‖Ax − b‖²; its gradient is Aᵀ(Ax − b)."""
    r = A @ x - B
    return 0.5 * (r @ r)


def estimate(seeds, mu=1e-2):
    dirs = [[u.double() for u in direction([torch.Size([D])], s)] for s in seeds]
    diffs = [float(f(X0 + mu * u[0]) - f(X0 - mu * u[0])) for u in dirs]
    return spsa_gradient(diffs, dirs, mu, D)[0]


def test_directions_are_unit_and_seeded():
    u = direction([torch.Size([3, 4]), torch.Size([5])], 42)
    norm = float(torch.sqrt(sum((v.double() ** 2).sum() for v in u)))
    assert norm == pytest.approx(1.0, abs=1e-6)
    again = direction([torch.Size([3, 4]), torch.Size([5])], 42)
    assert all(torch.equal(a, b) for a, b in zip(u, again))
    other = direction([torch.Size([3, 4]), torch.Size([5])], 43)
    assert not torch.equal(u[0], other[0])
    assert zo_seed(1, 2, 3) == zo_seed(1, 2, 3) != zo_seed(1, 2, 4)


def test_estimator_is_unbiased_on_a_quadratic():
    """Mean of 20,000 single-direction estimates within 3 standard errors of ∇f, every coordinate."""
    grad = A.T @ (A @ X0 - B)
    samples = torch.stack([estimate([s]) for s in range(20_000)])
    mean, se = samples.mean(0), samples.std(0) / np.sqrt(len(samples))
    assert torch.all((mean - grad).abs() < 3 * se), (mean, grad, se)
    # and the estimate is not trivially the gradient: single draws scatter widely
    assert float(samples.std(0).min()) > 0.1 * float(grad.abs().max())


def test_estimator_variance_falls_like_one_over_p():
    totals = {}
    for p in (1, 4, 16):
        draws = torch.stack([estimate([1000 * k + j for j in range(p)]) for k in range(3000)])
        totals[p] = float(draws.var(0).sum())
    assert totals[1] / totals[4] == pytest.approx(4.0, rel=0.15)
    assert totals[1] / totals[16] == pytest.approx(16.0, rel=0.15)


def test_perturbed_outputs_restore_the_weights():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 2))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    x = torch.randn(6, 4)
    h, plus, minus = perturbed_outputs(model, x, [7, 8], 0.1)
    assert plus.shape == minus.shape == (2, 6, 2) and torch.equal(h, model(x).detach())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    shapes = [p.shape for p in model.parameters()]
    u = direction(shapes, 8)
    perturb_(model, u, -0.1)
    assert torch.allclose(model(x), minus[1], atol=1e-6)


def test_client_zo_step_by_hand(server_identity, one_torch_thread):
    """train.zo_forward returns h and the perturbed pairs of the seeded directions;
    train.zo_update regenerates the same u_p on the node and steps by
    -lr·(d/(2μP)) Σ diffs_p u_p, with no backward pass."""
    from fl_app.client.state import ZO_SEEDS, slot_key
    from fl_app.client_app import app
    from fl_app.learning.training import load_batch
    from simulation.engine import InProcessGrid
    from strategies.core.dispatcher import Request
    from strategies.core.base import SFLStrategy
    from simulation.timing.clocks import VirtualClock
    from simulation.timing.durations import ZeroTiming
    from fl_app.learning.task import load_task

    cfg = make_cfg(model="lenet5", cut_layer=3, num_clients=2, concurrency=2)
    task = load_task(cfg)
    s = SFLStrategy(cfg, task, clock=VirtualClock(), timing=ZeroTiming(), progress=False)
    grid = InProcessGrid(app, 2, seed=0)
    s.connect(grid, timeout=30)
    opt = dict(lr=0.1, momentum=0.0, weight_decay=0.0, clip_norm=0.0)
    mu, n_p = 0.01, 3
    fwd = P.ZOForwardConfig(end=3, batch_size=8, perturbations=n_p, smoothing=mu, **opt)
    reply = s.gather({1: Request(P.TRAIN_ZO_FORWARD, RecordDict({P.CONFIG: fwd.to_record()}))})[1]
    state = grid.contexts[s.clients[1].node_id].state
    batch = state.config_records[slot_key(P.OWN_SLOT, "batch")]
    seeds = list(batch[ZO_SEEDS])
    assert len(seeds) == n_p
    client = task.build_model().segment(0, 3)
    w0 = {k: v.clone() for k, v in client.state_dict().items()}
    x, y = load_batch(task, 1, batch["indices"], int(batch["step"]))
    h, plus, minus = perturbed_outputs(client, x, seeds, mu)
    got = P.record_state(reply.array_records[P.PERTURBED])
    assert torch.equal(P.record_tensor(reply.array_records[P.ACTIVATIONS], "x"), h)
    assert torch.equal(got["plus"], plus) and torch.equal(got["minus"], minus)

    diffs = (0.5, -0.25, 1.0)
    upd = P.ZOUpdateConfig(diffs=diffs, smoothing=mu, next=P.NEXT_WEIGHTS, **opt)
    new = P.record_state(s.gather({1: Request(P.TRAIN_ZO_UPDATE, RecordDict({P.CONFIG: upd.to_record()}))})[1]
                         .array_records[P.WEIGHTS])
    names = [n for n, _ in client.named_parameters()]
    shapes = [p.shape for _, p in client.named_parameters()]
    d = sum(p.numel() for p in client.parameters())
    for i, name in enumerate(names):
        g = sum(diffs[k] * direction(shapes, seeds[k])[i] for k in range(n_p)) * (d / (2 * mu * n_p))
        assert torch.allclose(new[name], w0[name] - 0.1 * g, atol=1e-6), name
    assert slot_key(P.OWN_SLOT, "optimizer") in state.array_records


@pytest.mark.slow  # a whole learning run under the preset (52 s)
def test_mu_splitfed_learns_under_its_preset(tmp_path, one_torch_thread):
    """The documented setting (preset=mu-splitfed): ZO on both sides reaches 40 % on the embedded
    mnist-5k within 60 rounds (53.3 % there, 59.1 % at the preset's 100, in the README's measurement)."""
    import json

    from simulation.cli import main
    from tests.conftest import cli_args

    out = tmp_path / "mu"
    run = {"strategy": "mu-splitfed", "preset": "mu-splitfed", "global-iterations": 60, "eval-every": 60}
    assert main(cli_args({**run, "output-dir": out}, "-q")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["final_accuracy"] >= 0.40
    assert summary["server_updates"] == 60 * 5 * 2


def test_mu_splitfed_learns_and_counts_seeds_not_vectors(tmp_path):
    """A short run learns; each exchange uploads 2P + 1 embeddings and downloads P scalars."""
    import json

    from simulation.cli import main
    from tests.conftest import cli_args, read_metrics

    out = tmp_path / "mu"
    run = {"strategy": "mu-splitfed", "dataset": "mnist-5k", "model": "lenet5", "cut-layer": 3,
           "num-clients": 4, "concurrency": 4, "partition": "iid", "global-iterations": 30, "local-iterations": 1,
           "batch-size": 32, "lr": 0.2, "momentum": 0.0, "weight-decay": 0.0, "server-steps": 2,
           "perturbations": 2, "heterogeneity": "exponential", "eval-every": 30, "seed": 0}
    assert main(cli_args({**run, "output-dir": out}, "-q")) == 0
    rows = read_metrics(out / "metrics.csv")
    summary = json.loads((out / "summary.json").read_text())
    assert float(rows[-1]["test_loss"]) < float(rows[0]["test_loss"]) - 0.5
    assert summary["server_updates"] == 30 * 4 * 2  # τ per client per exchange
    # per client and round: a zo_forward (h, h+, h- of 32 samples + int64 labels) and the model upload
    import math

    from fl_app.learning.task import load_task

    task = load_task(make_cfg(model="lenet5", cut_layer=3, num_clients=4, concurrency=4))
    emb = 32 * math.prod(task.profiles[2].output_shape) * 4
    client_bytes = sum(p.numel() * 4 for p in task.build_model().segment(0, 3).parameters())
    assert summary["bytes_up"] == 30 * 4 * ((2 * 2 + 1) * emb + 32 * 8 + client_bytes)
    # down: the start weights, then P = 2 float32 differences in the config (not an array payload)
    assert summary["bytes_down"] == 30 * 4 * client_bytes


def test_zo_server_step_by_hand():
    """eq. 5 on a linear server: w ← w − lr·(d/(2μP)) Σ_p diffs_p u_p with the seeded u_p, and zo-clip
    scales the estimate to the clip's norm; no momentum, no weight decay."""
    from fl_app.learning.zo import zo_server_step

    torch.manual_seed(0)
    model = nn.Linear(4, 3)
    x, y = torch.randn(8, 4), torch.tensor([0, 1, 2, 0, 1, 2, 0, 1])
    w0 = [p.detach().clone() for p in model.parameters()]
    shapes, d, mu, seeds = [p.shape for p in w0], sum(p.numel() for p in w0), 1e-3, [11, 12]

    def loss_at(params):
        return float(nn.functional.cross_entropy(nn.functional.linear(x, *params), y))

    est = [torch.zeros_like(p) for p in w0]
    for s in seeds:
        u = direction(shapes, s)
        diff = loss_at([p + mu * v for p, v in zip(w0, u)]) - loss_at([p - mu * v for p, v in zip(w0, u)])
        est = [e + diff * v * d / (2 * mu * len(seeds)) for e, v in zip(est, u)]
    loss = zo_server_step(model, x, y, seeds, mu, lr=0.05)
    assert loss == pytest.approx(loss_at(w0), rel=1e-6)
    for p, p0, g in zip(model.parameters(), w0, est):
        assert torch.allclose(p.detach(), p0 - 0.05 * g, atol=1e-5)
    # clipped: the step is lr·clip long, in the same direction
    norm = float(torch.sqrt(sum((g ** 2).sum() for g in est)))
    model2 = nn.Linear(4, 3)
    model2.load_state_dict({"weight": w0[0], "bias": w0[1]})
    zo_server_step(model2, x, y, seeds, mu, lr=0.05, clip=norm / 4)
    step = torch.sqrt(sum(((p.detach() - p0) ** 2).sum() for p, p0 in zip(model2.parameters(), w0)))
    assert float(step) == pytest.approx(0.05 * norm / 4, rel=1e-3)


ZO_RUN = {"dataset": "mnist-5k", "model": "lenet5", "cut-layer": 3, "num-clients": 6, "concurrency": 3,
          "partition": "iid", "global-iterations": 3, "local-iterations": 2, "batch-size": 16, "lr": 0.002,
          "momentum": 0.0, "weight-decay": 0.0, "perturbations": 2, "heterogeneity": "exponential", "seed": 3}


def _zo_run(tmp_path, name, **keys):
    from simulation.cli import main
    from tests.conftest import cli_args

    out = tmp_path / name
    assert main(cli_args({**ZO_RUN, **keys, "output-dir": out}, "-q")) == 0
    import pandas as pd

    return pd.read_csv(out / "metrics.csv").drop(columns=["wall_time_s"], errors="ignore")


def test_zo_splitfed_is_mu_splitfed_at_tau_one(tmp_path):
    """MU-SplitFed §5 / Appendix A.2: ZO-SplitFed (ZO clients and a ZO server) is MU-SplitFed at τ = 1,
    bit for bit; the first-order-server variant is a different algorithm."""
    mu = _zo_run(tmp_path, "mu", strategy="mu-splitfed", **{"server-steps": 1})
    zo = _zo_run(tmp_path, "zo", strategy="splitfed-v1", **{"client-optimizer": "zo", "server-optimizer": "zo"})
    fo = _zo_run(tmp_path, "fo", strategy="splitfed-v1", **{"client-optimizer": "zo"})
    assert mu.equals(zo)
    assert not mu["test_loss"].iloc[1:].equals(fo["test_loss"].iloc[1:])


def test_zo_clients_clip_at_zo_clip_not_clip_norm():
    """clip-norm clips first-order steps; a ZO client's estimate is clipped at zo-clip (0: none)."""
    from fl_app.learning.task import load_task
    from simulation.timing.clocks import VirtualClock
    from simulation.timing.durations import ZeroTiming
    from strategies.core.split import ZOFeedback
    from strategies.core.registry import get_strategy

    cfg = make_cfg(strategy="splitfed-v1", client_optimizer="zo", clip_norm=10.0, zo_clip=2.5)
    s = get_strategy("splitfed-v1")(cfg, load_task(cfg), clock=VirtualClock(), timing=ZeroTiming(), progress=False)
    fwd, upd = s.forward_request(8, None), s.backward_request(ZOFeedback((0.1,)), P.NEXT_NONE)
    assert P.ZOForwardConfig.from_record(P.config_of(fwd.content, P.CONFIG)).clip_norm == 2.5
    assert P.ZOUpdateConfig.from_record(P.config_of(upd.content, P.CONFIG)).clip_norm == 2.5
    cfg = make_cfg(strategy="splitfed-v1", clip_norm=10.0, zo_clip=2.5)
    s = get_strategy("splitfed-v1")(cfg, load_task(cfg), clock=VirtualClock(), timing=ZeroTiming(), progress=False)
    assert P.ForwardConfig.from_record(P.config_of(s.forward_request(8, None).content, P.CONFIG)).clip_norm == 10.0


def test_zo_gas_server_step_is_zeroth_order():
    """ZO-GAS: a flush steps the server-side model by eq. 5 on the buffer (plus generated activations),
    with the seeded server directions; the first-order server would move it differently."""
    import copy

    from fl_app.learning.task import load_task
    from fl_app.learning.zo import STREAM_ZO_SERVER, zo_server_step
    from simulation.timing.clocks import VirtualClock
    from simulation.timing.durations import ZeroTiming
    from strategies.algorithms.gas.strategy import GAS

    cfg = make_cfg(strategy="gas", model="lenet5", cut_layer=3, client_optimizer="zo", server_optimizer="zo",
                   generate=False, lr=0.003, perturbations=2, zo_clip=0.0)
    s = GAS(cfg, load_task(cfg), clock=VirtualClock(), timing=ZeroTiming(), progress=False)
    s.initialize()
    torch.manual_seed(1)
    shape = s.activation_shape
    x, y = torch.randn(16, *shape), torch.randint(0, 10, (16,))
    s.activation_buffer = [(x[:8], y[:8], 0), (x[8:], y[8:], 0)]
    s.server_updates = 4
    ref = copy.deepcopy(s.server_model)
    seeds = [zo_seed(cfg.seed, STREAM_ZO_SERVER, 0, 4, p) for p in range(2)]
    zo_server_step(ref, x, y, seeds, cfg.zo_smoothing, 0.003)
    before = {k: v.clone() for k, v in s.server_model.state_dict().items()}
    s.flush_activations()
    assert s.server_updates == 5 and s.server_opt is None
    after = s.server_model.state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in after)
    assert all(torch.equal(after[k], v) for k, v in ref.state_dict().items())


def test_a_zo_server_needs_zo_clients(tmp_path, capsys):
    from simulation.cli import main
    from tests.conftest import cli_args

    for strategy in ("splitfed-v1", "gas"):
        code = main(cli_args({"strategy": strategy, "server-optimizer": "zo", "output-dir": tmp_path / strategy}))
        assert code == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "client-optimizer=zo" in err[0]
        assert not (tmp_path / strategy).exists()
