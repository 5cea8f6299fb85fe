"""GAPSL's LGI and GDA (eqs. 1-6) by hand on four 2-D gradients, and the
regulariser's gradient against autograd."""

from __future__ import annotations

import math

import pytest
import torch

from strategies.algorithms.gapsl import (
    SelectionRatio,
    alignment,
    alignment_penalty_gradient,
    consistency_scores,
    flat,
    leader_gradient,
    pairwise_angles,
)

PI = math.pi
# g1 = (1, 0), g2 = (0, 1), g3 = (1, 1), g4 = (-1, 0): pairwise angles are multiples of π/4
G = torch.tensor([[1.0, 0.0], [0.0, 1.0], [1.0, 1.0], [-1.0, 0.0]])


def test_angles_and_consistency_scores_eq1():
    ang = pairwise_angles(G)
    expected = torch.tensor([[0, PI / 2, PI / 4, PI], [PI / 2, 0, PI / 4, PI / 2],
                             [PI / 4, PI / 4, 0, 3 * PI / 4], [PI, PI / 2, 3 * PI / 4, 0]], dtype=torch.float64)
    assert torch.allclose(ang, expected, atol=1e-7)
    # θ_i = mean over the other three: 7π/12, 5π/12, 5π/12, 9π/12
    assert torch.allclose(consistency_scores(G), torch.tensor([7, 5, 5, 9], dtype=torch.float64) * PI / 12, atol=1e-7)
    with pytest.raises(ValueError):
        consistency_scores(G[:1])


def test_selection_ratio_eq2():
    k = SelectionRatio(k_min=0.2, k_max=0.8, total_rounds=10)
    scores = consistency_scores(G)
    nu0 = math.sqrt(11) * PI / 24  # population std of (7, 5, 5, 9)·π/12
    assert k(scores, 0) == pytest.approx(0.2)  # t = 0
    assert k.nu_min == pytest.approx(nu0) and k.nu_max == pytest.approx(nu0)
    # a more dispersed round: it is the running maximum, so the stability factor is 0
    nu1 = math.sqrt(0.75)  # std of (0, 0, 0, 2)
    assert k(torch.tensor([0.0, 0.0, 0.0, 2.0]), 5) == pytest.approx(0.2)
    # std 0.5 at t = 5 of T = 10: K = 0.2 + 0.5·(ν_max − 0.5)/(ν_max − ν_min)·0.6
    expected = 0.2 + 0.5 * (nu1 - 0.5) / (nu1 - nu0) * 0.6
    assert k(torch.tensor([0.0, 0.0, 1.0, 1.0]), 5) == pytest.approx(expected)
    assert 0.2 < expected < 0.8


def test_leader_gradient_eqs3_4():
    scores = consistency_scores(G)
    lead, chosen = leader_gradient(G, scores, 0.5)  # ⌈0.5·4⌉ = 2: the two 5π/12 scores
    assert chosen == [1, 2]
    assert torch.allclose(lead, torch.tensor([0.5, 1.0]))
    lead, chosen = leader_gradient(G, scores, 0.3)  # ⌈1.2⌉ = 2
    assert chosen == [1, 2]
    _, chosen = leader_gradient(G, scores, 0.8)  # ⌈3.2⌉ = 4
    assert chosen == [1, 2, 0, 3]


def test_alignment_threshold_and_selection_eqs5_6():
    lead = torch.tensor([0.5, 1.0])
    ang, th, selected = alignment(G, lead, eta=0.5)
    phi = math.atan2(1.0, 0.5)  # the leader's direction
    expected = [phi, PI / 2 - phi, phi - PI / 4, PI - phi]
    assert ang.tolist() == pytest.approx(expected, abs=1e-7)
    mean = sum(expected) / 4
    std = math.sqrt(sum((a - mean) ** 2 for a in expected) / 4)
    assert th == pytest.approx(mean - 0.5 * std)
    assert selected == [1, 2]  # 0.464 and 0.322 rad are within θ_th ≈ 0.644
    # the threshold is clipped to [0, π/2]
    assert alignment(G, lead, eta=10.0)[1] == 0.0
    assert alignment(G, lead, eta=-10.0)[1] == pytest.approx(PI / 2)


def test_penalty_gradient_matches_autograd():
    g = torch.tensor([0.3, -1.2, 0.7], dtype=torch.float64, requires_grad=True)
    lead = torch.tensor([1.0, 0.5, -0.2], dtype=torch.float64)
    penalty = 1 - (g @ lead) / (g.norm() * lead.norm())
    (auto,) = torch.autograd.grad(penalty, g)
    assert torch.allclose(alignment_penalty_gradient(g.detach(), lead), auto, atol=1e-12)
    # no correction once aligned
    assert torch.allclose(alignment_penalty_gradient(2 * lead, lead), torch.zeros(3, dtype=torch.float64), atol=1e-12)


def test_regulariser_modes_agree_when_the_hessian_is_the_identity():
    """With L_i = ½‖w − c_i‖² (Hessian I), the first-order mode equals double back-propagation;
    with λ = 0 both are Σ_{i∈Ŝ} g_i; on a non-quadratic loss they differ only by O(λ)."""
    from strategies.algorithms.gapsl import aligned_gradient

    w = torch.tensor([0.2, -0.4, 1.0], dtype=torch.float64, requires_grad=True)
    cs = [torch.tensor(v, dtype=torch.float64) for v in ([1.0, 0.0, 0.5], [-0.3, 0.8, 0.1], [0.4, 0.4, -1.0])]
    losses = [0.5 * ((w - c) ** 2).sum() for c in cs]
    lead = torch.tensor([0.5, 0.5, 0.2], dtype=torch.float64)
    exact = aligned_gradient(losses, [w], [0, 2], lead, 0.3, "exact")
    first = aligned_gradient(losses, [w], [0, 2], lead, 0.3, "first-order")
    plain = (w - cs[0]) + (w - cs[2])
    assert torch.allclose(exact, first, atol=1e-12)
    assert not torch.allclose(exact, plain.detach(), atol=1e-3)  # the regulariser does act
    assert torch.allclose(aligned_gradient(losses, [w], [0, 2], lead, 0.0, "exact"), plain.detach())
    # a quartic loss: the modes differ, by an amount that shrinks linearly with λ
    quartic = [((w - c) ** 4).sum() for c in cs]
    gaps = [float((aligned_gradient(quartic, [w], [0, 1], lead, lam, "exact")
                   - aligned_gradient(quartic, [w], [0, 1], lead, lam, "first-order")).norm()) for lam in (1e-2, 1e-3)]
    assert gaps[0] > 0 and gaps[1] == pytest.approx(gaps[0] / 10, rel=1e-6)
    with pytest.raises(ValueError):
        aligned_gradient(losses, [w], [0], lead, 0.1, "second")


@pytest.mark.slow  # a learning run per mode (95-106 s under load)
@pytest.mark.parametrize("mode", ["first-order", "exact"])
def test_gapsl_runs_and_learns(mode, tmp_path):
    import json

    from simulation.cli import main
    from tests.conftest import cli_args, read_metrics

    out = tmp_path / mode
    run = {"strategy": "gapsl", "gapsl-mode": mode, "dataset": "mnist-5k", "model": "lenet5", "cut-layer": 3,
           "num-clients": 4, "concurrency": 4, "partition": "iid", "global-iterations": 2, "local-iterations": 15,
           "batch-size": 16, "heterogeneity": "none", "seed": 0}
    assert main(cli_args({**run, "output-dir": out}, "-q")) == 0
    rows = read_metrics(out / "metrics.csv")
    summary = json.loads((out / "summary.json").read_text())
    assert float(rows[-1]["test_loss"]) < float(rows[0]["test_loss"])
    assert float(rows[-1]["test_accuracy"]) > float(rows[0]["test_accuracy"]) + 0.1
    assert 1 <= float(rows[-1]["gda_selected"]) <= 4
    assert 0 < summary["server_updates"] <= 2 * 15


def _gapsl(**overrides):
    from fl_app.learning.task import load_task
    from simulation.timing.clocks import VirtualClock
    from simulation.timing.durations import ZeroTiming
    from strategies.algorithms.gapsl import GAPSL
    from tests.conftest import make_cfg

    cfg = make_cfg(strategy="gapsl", model="lenet5", cut_layer=3, global_iterations=10, gapsl_eta=0.5, **overrides)
    s = GAPSL(cfg, load_task(cfg), clock=VirtualClock(), timing=ZeroTiming(), progress=False)
    s.initialize()
    return s


def test_lgi_and_gda_ablations_on_the_hand_example():
    # t = 0: K = K_min = 0.2, so LGI takes ⌈0.8⌉ = 1 client, the first of the two 5π/12 scores: g2
    lead, selected = _gapsl().leader_and_selection(G.double())
    assert torch.allclose(lead, G[1].double())
    # angles to g2: π/2, 0, π/4, π/2; mean 5π/16, std √11·π/16, so θ_th = (5 − 0.5·√11)π/16 ≈ 0.656 < π/4
    assert selected == [1]
    # Non-LGI: the leader is the mean of all four, (0.25, 0.5)
    lead, _ = _gapsl(gapsl_lgi="none").leader_and_selection(G.double())
    assert torch.allclose(lead, torch.tensor([0.25, 0.5], dtype=torch.float64))
    # Rand-LGI: one client (the same K), drawn from the seeded stream, not necessarily the most consistent
    leads = {tuple(_gapsl(gapsl_lgi="random", seed=s).leader_and_selection(G.double())[0].tolist()) for s in range(8)}
    assert len(leads) > 1 and all(any(torch.equal(torch.tensor(l), g) for g in G.double()) for l in leads)
    # Rand-GDA: as many clients as GDA selects (one here), at random
    picks = {tuple(_gapsl(gapsl_gda="random", seed=s).leader_and_selection(G.double())[1]) for s in range(8)}
    assert all(len(p) == 1 for p in picks) and len(picks) > 1


def _batches(s, n=4, seed=0):
    gen = torch.Generator().manual_seed(seed)
    shape = s.task.profiles[s.cut - 1].output_shape
    return {p: (torch.randn(8, *shape, generator=gen), torch.randint(0, 10, (8,), generator=gen)) for p in range(n)}


@pytest.mark.parametrize("who", ["selected", "all"])
def test_activation_gradients_go_to_eq8s_clients(who):
    """Sec. III: BP of eq. 8's loss, a sum over Ŝ, so only Ŝ receives activation gradients (selected);
    with ``all`` every client gets its own ∇_{A_i} L_i. Either way each gradient is the pre-step one."""
    import copy

    s = _gapsl(gapsl_client_grads=who)
    batches = _batches(s)
    before = copy.deepcopy(s.server_model)
    params = list(before.parameters())
    own, flat_grads = {}, []
    for p, (x, y) in batches.items():
        x = x.clone().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(before(x), y)
        gp = torch.autograd.grad(loss, params + [x])
        flat_grads.append(flat(gp[:-1]))
        own[p] = gp[-1]
    _, selected = _gapsl().leader_and_selection(torch.stack(flat_grads))
    assert 0 < len(selected) < 4  # the case where the readings differ
    got = s.server_iteration(batches)
    assert sorted(got) == [0, 1, 2, 3]
    for p in range(4):
        if who == "selected" and p not in selected:
            assert got[p] is None
        else:
            assert torch.allclose(got[p], own[p], atol=1e-7), p


@pytest.mark.slow  # a GAPSL run (67 s under load)
def test_unselected_clients_take_no_step(server_identity, one_torch_thread, monkeypatch):
    """A client outside Ŝ gets no gradient message: only its next forward, then its weights unmetered;
    its client-side model never moves, and it downloads nothing."""
    from tests.test_psl import _run
    from strategies.algorithms.gapsl import GAPSL

    monkeypatch.setattr(GAPSL, "leader_and_selection", lambda self, grads: (grads[0], [0]))
    s, task, _ = _run("gapsl", num_clients=3, concurrency=3, local_iterations=3)
    init = task.build_model().segment(0, task.cut_layer).state_dict()
    for pid in (1, 2):
        assert all(torch.equal(s.client_states[pid][k], v) for k, v in init.items()), pid
    assert any(not torch.equal(s.client_states[0][k], v) for k, v in init.items())
    grad_bytes = s.costs.activation_bits(task.cut_layer, 8, labels=False) / 8
    assert s.bytes_down == 3 * grad_bytes  # client 0's three gradients, nothing else
