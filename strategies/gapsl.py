"""GAPSL: gradient-aligned parallel split learning (leader gradient identification
and gradient direction alignment).

Source: ``papers/gapsl.txt`` (Sec. III, eqs. 1-8, Algorithms 1-2) and DESIGN.md
section 7. The functions here are the paper's equations on flattened
server-side gradients ``g_i`` (one per client of the round):

* LGI: consistency scores (eq. 1), the adaptive selection ratio ``K_t``
  (eq. 2), the leader gradient from the ``⌈K_t·S⌉`` most consistent clients
  (eqs. 3-4);
* GDA: angles to the leader (eq. 5), the adaptive threshold (eq. 6), the
  selected set ``Ŝ`` and the regulariser ``λ(1 − cos θ_i)`` of eq. 7.

The strategy that uses them is not written yet (the parallel-SL issue): these
are its tested building blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def pairwise_angles(grads: torch.Tensor) -> torch.Tensor:
    """``θ_ij = arccos(<g_i, g_j> / (‖g_i‖‖g_j‖))`` (radians) for rows of ``grads`` ``[S, D]``; ``[S, S]``."""
    g = grads.double()
    unit = g / g.norm(dim=1, keepdim=True).clamp_min(1e-30)
    return torch.arccos((unit @ unit.T).clamp(-1.0, 1.0))


def consistency_scores(grads: torch.Tensor) -> torch.Tensor:
    """GAPSL eq. 1: ``θ_i = (1/(S−1)) Σ_{j≠i} θ_ij``, ``[S]`` radians (lower = more consistent).

    Raises:
        ValueError: fewer than two gradients.
    """
    s = grads.shape[0]
    if s < 2:
        raise ValueError("consistency scores need at least two client gradients")
    ang = pairwise_angles(grads)
    return (ang.sum(dim=1) - ang.diagonal()) / (s - 1)


@dataclass
class SelectionRatio:
    """GAPSL eq. 2: ``K_t = K_min + (t/T)·((ν_max − ν)/(ν_max − ν_min))·(K_max − K_min)``.

    ``ν`` is the standard deviation (population) of the round's consistency
    scores; ``ν_max``/``ν_min`` are its running extremes, including this round.
    When they are equal (the first round) the stability factor is taken as 1.

    Attributes:
        k_min, k_max: bounds of the ratio (paper defaults 0.2 and 0.8).
        total_rounds: ``T``.
    """

    k_min: float = 0.2
    k_max: float = 0.8
    total_rounds: int = 1
    nu_min: float = math.inf
    nu_max: float = -math.inf

    def __call__(self, scores: torch.Tensor, t: int) -> float:
        """``K_t`` for round ``t`` (0-based) from this round's scores; updates the running extremes."""
        nu = float(scores.double().std(unbiased=False))
        self.nu_min, self.nu_max = min(self.nu_min, nu), max(self.nu_max, nu)
        span = self.nu_max - self.nu_min
        stability = 1.0 if span <= 0 else (self.nu_max - nu) / span
        return self.k_min + (t / self.total_rounds) * stability * (self.k_max - self.k_min)


def leader_gradient(grads: torch.Tensor, scores: torch.Tensor, ratio: float) -> tuple[torch.Tensor, list[int]]:
    """GAPSL eqs. 3-4: the mean of the ``⌈ratio·S⌉`` gradients with the lowest scores.

    Returns:
        ``(g_lead [D], selected row indices in ascending score order)``.
    """
    k = max(1, math.ceil(ratio * grads.shape[0] - 1e-9))
    order = torch.argsort(scores, stable=True)[:k].tolist()
    return grads[order].mean(dim=0), order


def alignment(grads: torch.Tensor, lead: torch.Tensor, eta: float) -> tuple[torch.Tensor, float, list[int]]:
    """GAPSL eqs. 5-6: angles to the leader, the threshold, the selected set ``Ŝ``.

    ``θ_th = max(min(mean(θ) − η·std(θ), π/2), 0)`` (population std) and
    ``Ŝ = {i : θ_lead,i ≤ θ_th}``.

    Returns:
        ``(θ_lead [S] radians, θ_th, Ŝ as row indices)``.
    """
    ang = pairwise_angles(torch.cat([lead[None], grads]))[0, 1:]
    th = max(min(float(ang.mean()) - eta * float(ang.std(unbiased=False)), math.pi / 2), 0.0)
    return ang, th, [i for i, a in enumerate(ang.tolist()) if a <= th]


def alignment_penalty_gradient(g: torch.Tensor, lead: torch.Tensor) -> torch.Tensor:
    """``∂(1 − cos(g, g_lead))/∂g = −(ĝ_lead − cos·ĝ)/‖g‖`` (hats: unit vectors); shape of ``g``.

    GAPSL's first-order mode adds ``λ`` times this to a selected client's
    server-side gradient (eq. 7 with the Hessian of ``L_i`` taken as the
    identity), where the paper's implementation, which detaches ``g_i``,
    gets no gradient from the regulariser at all (its footnote 6).
    """
    gn, ln = g.norm(), lead.norm()
    cos = (g @ lead) / (gn * ln)
    return -(lead / ln - cos * g / gn) / gn
