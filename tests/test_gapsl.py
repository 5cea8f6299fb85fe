"""GAPSL's LGI and GDA (eqs. 1-6) by hand on four 2-D gradients, and the
regulariser's gradient against autograd."""

from __future__ import annotations

import math

import pytest
import torch

from strategies.gapsl import (
    SelectionRatio,
    alignment,
    alignment_penalty_gradient,
    consistency_scores,
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
