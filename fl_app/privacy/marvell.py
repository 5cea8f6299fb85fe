"""Marvell's optimal noise for a binary label (Li et al., "Label Leakage and Protection in Two-party Split
Learning", ICLR 2022, §4): the covariances that minimise the leakage bound under a noise power budget.

Li et al. model the gradients a label party returns for its positive and negative
samples as Gaussians ``N(ḡ₁, v·I_d)`` and ``N(ḡ₀, u·I_d)`` and add zero-mean Gaussian noise of covariance
``Σ₁`` to each positive sample's gradient and ``Σ₀`` to each negative one's. The perturbed distributions are
``P̃₁ = N(ḡ₁, v·I + Σ₁)`` and ``P̃₀ = N(ḡ₀, u·I + Σ₀)``; any attacker's detection AUC is bounded by a
function of ``KL(P̃₁‖P̃₀) + KL(P̃₀‖P̃₁)``, which Marvell minimises subject to the expected noise power
``p·tr Σ₁ + (1 − p)·tr Σ₀ ≤ P`` (``p`` the positive fraction). The optimum has the form
``Σᵢ = λᵢ·ûûᵀ + μᵢ·(I − ûûᵀ)``, ``û = (ḡ₁ − ḡ₀)/‖ḡ₁ − ḡ₀‖``: a variance ``λᵢ`` along the class-mean
difference and ``μᵢ`` across it. With ``a = v + λ₁``, ``b = u + λ₀``, ``a' = v + μ₁``, ``b' = u + μ₀``,
``D² = ‖ḡ₁ − ḡ₀‖²``, the objective is

    ½·[a/b + b/a − 2 + (d − 1)·(a'/b' + b'/a' − 2) + D²·(1/a + 1/b)]

(the symmetrised KL of two Gaussians), over four non-negative numbers under one linear constraint: solved
here with SciPy's SLSQP (:func:`solve`). With ``u = v`` and ``p = ½`` the optimum is ``λ₀ = λ₁ = P``,
``μ₀ = μ₁ = 0`` (all the power along ``û``), and the objective ``D²/(v + P)``: checked in the tests.

The paper's own solver (its repository has no licence) was not used: this is implemented from the
definitions above. sflower sets ``P = s·D²`` (``label-power=s``), a budget that scales with the gradients:
in the symmetric case the optimum's KL sum is then ``D²/(v + s·D²) ≤ 1/s`` whatever their size. (As far as
we recall, the paper states its budget the same way, as a multiple of ``‖ḡ₁ − ḡ₀‖²``; its text was not at
hand to check.)
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from scipy.optimize import minimize


@dataclass(frozen=True)
class MarvellCovariances:
    """The optimal noise of one binary problem: ``Σ₁ = along_pos·ûûᵀ + across_pos·(I − ûûᵀ)``, likewise
    ``Σ₀``; ``kl``, the symmetrised KL of the perturbed class distributions (nats)."""

    along_pos: float
    across_pos: float
    along_neg: float
    across_neg: float
    kl: float


def symmetrised_kl(lam: np.ndarray, d2: float, u: float, v: float, d: int) -> float:
    """``KL(P̃₁‖P̃₀) + KL(P̃₀‖P̃₁)`` for noise variances ``lam = (λ₁, μ₁, λ₀, μ₀)`` (see the module docstring).

    Args:
        lam: the four variances (≥ 0): along ``û`` and across it, positive class then negative.
        d2: ``‖ḡ₁ − ḡ₀‖²``; u, v: the per-coordinate variances of the negative and positive gradients; d: their size.

    Returns:
        the objective (``inf`` where a variance along ``û`` is 0 and ``d2 > 0``).
    """
    a, ap, b, bp = v + lam[0], v + lam[1], u + lam[2], u + lam[3]
    if a <= 0 or b <= 0:
        return float("inf") if d2 > 0 or a != b else 0.0
    out = a / b + b / a - 2 + d2 * (1 / a + 1 / b)
    if d > 1:
        tiny = 1e-300
        out += (d - 1) * (0.0 if ap == bp else (ap / max(bp, tiny) + bp / max(ap, tiny) - 2))
    return 0.5 * float(out)


def solve(d2: float, u: float, v: float, p: float, d: int, power: float) -> MarvellCovariances:
    """Marvell's optimal covariances for one binary problem under the power budget ``power``.

    Args:
        d2: ``‖ḡ₁ − ḡ₀‖²`` (> 0); u, v: per-coordinate variances of the negative and positive gradients (≥ 0);
        p: the fraction of positive samples, in (0, 1); d: the gradient's size (≥ 1);
        power: ``P`` (> 0), the bound on ``p·tr Σ₁ + (1 − p)·tr Σ₀``.

    Returns:
        the four variances and the objective at them; the budget holds to SLSQP's tolerance (≈1e-9·P).

    Raises:
        ValueError: an argument out of its range.
    """
    if not (d2 > 0 and u >= 0 and v >= 0 and 0 < p < 1 and d >= 1 and power > 0):
        raise ValueError(f"Marvell needs d2 > 0, u, v >= 0, 0 < p < 1, d >= 1, power > 0 "
                         f"(got d2={d2}, u={u}, v={v}, p={p}, d={d}, power={power})")
    weights = np.array([p, p * (d - 1), 1 - p, (1 - p) * (d - 1)])

    def objective(x: np.ndarray) -> float:
        return symmetrised_kl(np.clip(x, 0, None) * power, d2, u, v, d)

    start = np.array([1.0, 0.0, 1.0, 0.0])  # all the power along û, feasible: weights·start = 1
    res = minimize(objective, start, method="SLSQP", bounds=[(0, None)] * 4,
                   constraints=[{"type": "ineq", "fun": lambda x: 1.0 - weights @ x, "jac": lambda x: -weights}],
                   options={"ftol": 1e-14, "maxiter": 500})
    x = np.clip(res.x, 0, None)
    spent = float(weights @ x)
    if spent > 1:  # SLSQP's last step may overshoot by its tolerance: scale back into the budget
        x = x / spent
    if not np.isfinite(objective(x)) or objective(x) > objective(start):
        x = start
    lam = x * power
    return MarvellCovariances(float(lam[0]), float(lam[1]), float(lam[2]), float(lam[3]),
                              symmetrised_kl(lam, d2, u, v, d))
