"""A U-shaped client's label defences (fl_app/privacy/label_defence.py, fl_app/privacy/marvell.py).

* Marvell's optimal covariances against the hand solution (``u = v``, ``p = ½``: all the power ``P`` along
  the class-mean difference, symmetrised KL ``D²/(v + P)``); the budget holds in an asymmetric case, where
  the optimum beats the other feasible splits tried.
* Marvell's noise on a tiny batch lies along ``û`` with variance ``P`` (over many draws); one class: no noise.
* ``label-defence-tail=perturbed`` on a tiny linear tail: the tail's parameter gradient and the returned input
  gradient are ``g̃ᵀx`` and ``g̃W`` for the one perturbed ``g̃ = (softmax − onehot)/B + noise``, by hand.
* Bad combinations are one line, exit 2.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from fl_app.privacy.label_defence import defence_generator, marvell_noise, perturb, tail_backward
from fl_app.privacy.marvell import solve, symmetrised_kl
from simulation import cli
from tests.test_ushaped import BASE

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.mark.parametrize("d", [1, 10])
def test_marvell_symmetric_case_is_the_hand_solution(d):
    """u = v = 1, p = ½, D² = 4, P = 2: Σ₀ = Σ₁ = 2·ûûᵀ (nothing across û), KL sum = D²/(v + P) = 4/3."""
    cov = solve(4.0, 1.0, 1.0, 0.5, d, 2.0)
    assert cov.along_pos == pytest.approx(2.0, abs=1e-6) and cov.along_neg == pytest.approx(2.0, abs=1e-6)
    assert cov.across_pos == pytest.approx(0.0, abs=1e-6) and cov.across_neg == pytest.approx(0.0, abs=1e-6)
    assert cov.kl == pytest.approx(4.0 / 3.0, rel=1e-6)


def test_marvell_respects_the_budget_and_beats_other_splits():
    """u = 0.5, v = 2, p = 0.2, d = 10, D² = 4, P = 3: p·tr Σ₁ + (1 − p)·tr Σ₀ ≤ P, and the optimum's KL sum
    is below that of spending P all along û, all isotropically, or only on one class."""
    p, d, power = 0.2, 10, 3.0
    cov = solve(4.0, 0.5, 2.0, p, d, power)
    spent = p * (cov.along_pos + (d - 1) * cov.across_pos) + (1 - p) * (cov.along_neg + (d - 1) * cov.across_neg)
    assert spent <= power * (1 + 1e-9)
    others = [np.array([power, 0, power, 0]), np.full(4, power / d),
              np.array([power / p, 0, 0, 0]), np.array([0, 0, power / (1 - p), 0])]
    for lam in others:
        assert cov.kl < symmetrised_kl(lam, 4.0, 0.5, 2.0, d)


def test_marvell_noise_is_along_the_class_mean_difference():
    """Positives (1, ±1, 0), negatives (−1, 0, ±1): D² = 4, û = e₁, u = v = ⅓, p = ½; s = 0.5 gives P = 2, all
    along e₁: over 2000 draws the noise has no e₂, e₃ part and variance 2 along e₁ (within 6 %)."""
    grad = torch.tensor([[1.0, 1, 0], [1, -1, 0], [-1, 0, 1], [-1, 0, -1]])
    labels = torch.tensor([1, 1, 0, 0])
    noise = torch.stack([marvell_noise(grad, labels, 0.5, defence_generator(0, 0, k)) - grad for k in range(2000)])
    assert noise[..., 1:].abs().max() < 1e-5
    assert noise[..., 0].pow(2).mean().item() == pytest.approx(2.0, rel=0.06)
    assert torch.equal(perturb(grad, "marvell", 0.5, defence_generator(0, 0, 7), labels),
                       marvell_noise(grad, labels, 0.5, defence_generator(0, 0, 7)))
    same = torch.tensor([3, 3, 3, 3])
    assert marvell_noise(grad, same, 0.5, defence_generator(0, 0, 1)) is grad
    with pytest.raises(ValueError, match="needs the batch's labels"):
        perturb(grad, "marvell", 0.5, defence_generator(0, 0, 1))


def test_marvell_multi_class_sums_one_vs_rest_noises():
    """Three classes, one row each (rows e₁, e₂, e₃): three one-vs-rest problems, each with D² = ‖e_c − (e_a +
    e_b)/2‖² = 1.5, so s = 1 gives each the budget P = 1.5, which the optimum spends whole; the noises add up,
    so a row's expected squared noise, averaged over the rows, is 3 × 1.5 = 4.5 (over 1000 draws, within 8 %).
    The same seed gives the same noise."""
    grad = torch.eye(3)
    labels = torch.tensor([0, 1, 2])
    out = marvell_noise(grad, labels, 1.0, defence_generator(0, 0, 0))
    assert torch.equal(out, marvell_noise(grad, labels, 1.0, defence_generator(0, 0, 0)))
    power = torch.stack([(marvell_noise(grad, labels, 1.0, defence_generator(0, 0, k)) - grad).pow(2).sum()
                         for k in range(1000)]).mean() / 3
    assert float(power) == pytest.approx(4.5, rel=0.08)


def test_perturbed_tail_step_on_a_linear_tail_by_hand():
    """Tail W (2 × 3), z (2 × 3), labels (0, 1), iso noise t = 1 on ∂L/∂logits: g̃ = (softmax(zWᵀ) − onehot)/2
    + n with n the generator's draw times ‖g_max‖/√2; W.grad = g̃ᵀz and z.grad = g̃W (numpy, by hand)."""
    torch.manual_seed(0)
    tail = nn.Linear(3, 2, bias=False)
    z = torch.randn(2, 3, requires_grad=True)
    y = torch.tensor([0, 1])
    logits = tail(z)
    loss = nn.functional.cross_entropy(logits, y)
    tail_backward(logits, loss, lambda g: perturb(g, "iso", 1.0, defence_generator(5, 1, 3), y))

    w, zz = tail.weight.detach().numpy().astype(np.float64), z.detach().numpy().astype(np.float64)
    e = np.exp(zz @ w.T)
    g = (e / e.sum(axis=1, keepdims=True) - np.eye(2)[[0, 1]]) / 2
    scale = np.sqrt((g ** 2).sum(axis=1).max()) / np.sqrt(2)
    noise = torch.randn((2, 2), generator=defence_generator(5, 1, 3)).numpy().astype(np.float64)
    g_tilde = g + noise * scale
    assert np.allclose(tail.weight.grad.numpy(), g_tilde.T @ zz, atol=1e-6)
    assert np.allclose(z.grad.numpy(), g_tilde @ w, atol=1e-6)
    assert not np.allclose(tail.weight.grad.numpy(), g.T @ zz, atol=1e-3)  # the step is not the exact one


@pytest.mark.parametrize("keys, message", [
    (["label-power=1.0"], "goes with label-defence=marvell"),
    (["label-defence=marvell"], "marvell needs label-power > 0"),
    (["label-defence=iso", "label-noise=1", "label-power=1"], "goes with label-defence=marvell"),
    (["label-defence-tail=perturbed"], "needs a label-defence"),
    (["label-defence-tail=sideways"], "label-defence-tail"),
])
def test_bad_defence_combinations_are_one_line(tmp_path, capsys, keys, message):
    base = [f"{k}={v}" for k, v in BASE.items()]
    assert cli.main(["run", "-q", "strategy=splitfed-v1", *base, f"output-dir={tmp_path}", *keys]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
