"""Zeroth-order (ZO) optimisation: SPSA with directions on the unit sphere.

MU-SplitFed (its paper, Sec. 3, eqs. 3-6) trains the
client-side model, and its server-side copies, from loss differences only.
The paper's equations were lost in extraction; docs/explanation/design.md §7 fixes the
standard form used here:

    g = (d / (2 μ P)) · Σ_p [f(x + μ u_p) − f(x − μ u_p)] · u_p

with ``d`` the number of parameters, ``μ`` the smoothing parameter and
``u_p`` drawn uniformly from the unit sphere in R^d. For a quadratic ``f``
the difference is exactly ``2 μ ∇f·u_p`` and ``E[u uᵀ] = I / d``, so ``g`` is
unbiased; its variance falls like ``1/P``.

Directions are never transmitted: each ``u_p`` is regenerated from an integer
seed (:func:`direction`), on the client and wherever else it is needed.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import numpy as np
import torch
from torch import nn

from fl_app.run.device import to_device

#: Seed-stream tags of ZO directions (client side and server side).
STREAM_ZO_CLIENT = 19
STREAM_ZO_SERVER = 23


def zo_seed(*parts: int) -> int:
    """A 63-bit seed for one direction from integers (run seed, stream, client, step, p)."""
    seq = np.random.SeedSequence([int(p) for p in parts])
    return int(seq.generate_state(1, np.uint64)[0] >> 1)


def direction(shapes: Sequence[torch.Size], seed: int) -> list[torch.Tensor]:
    """``u`` uniform on the unit sphere of ``R^d``, ``d = Σ numel(shape)``, split into ``shapes``.

    A standard normal vector divided by its norm (float32, CPU); the same
    seed always gives the same ``u``.
    """
    gen = torch.Generator().manual_seed(int(seed))
    parts = [torch.randn(tuple(s), generator=gen) for s in shapes]
    norm = norm_of(parts)
    return [(p.double() / norm).float() for p in parts]


def norm_of(tensors: Iterable[torch.Tensor]) -> torch.Tensor:
    """The Euclidean norm of ``tensors`` taken as one vector, summed in float64 (a 0-d tensor)."""
    return torch.sqrt(sum((t.double() ** 2).sum() for t in tensors))


def trainable(model: nn.Module) -> list[nn.Parameter]:
    """``model``'s trainable parameters (``requires_grad``), in ``parameters()`` order: the ZO coordinates."""
    return [p for p in model.parameters() if p.requires_grad]


def num_parameters(model: nn.Module) -> int:
    """``d``: the number of trainable parameters of ``model``."""
    return int(sum(p.numel() for p in trainable(model)))


def shapes_of(model: nn.Module) -> list[torch.Size]:
    """Shapes of ``model``'s trainable parameters, in ``parameters()`` order."""
    return [p.shape for p in trainable(model)]


@torch.no_grad()
def perturb_(model: nn.Module, u: Sequence[torch.Tensor], scale: float) -> None:
    """``w ← w + scale · u`` in place over the trainable parameters."""
    for p, v in zip(trainable(model), u):
        p.add_(to_device(v, p.device), alpha=scale)


def spsa_gradient(diffs: Sequence[float], directions: Iterable[Sequence[torch.Tensor]], mu: float,
                  dim: int) -> list[torch.Tensor]:
    """``g = (d / (2 μ P)) Σ_p diffs_p · u_p`` (MU-SplitFed's ZO estimator, docs/explanation/design.md §7).

    Args:
        diffs: ``P`` loss differences ``f(x + μu_p) − f(x − μu_p)``.
        directions: the ``P`` directions, each a list of tensors.
        mu: the smoothing parameter μ (> 0).
        dim: ``d``, the dimension of the sphere the directions were drawn on.

    Returns:
        the estimate, shaped like the directions.

    Raises:
        ValueError: no differences, or ``mu <= 0``.
    """
    if not diffs or mu <= 0:
        raise ValueError("spsa_gradient needs at least one difference and mu > 0")
    scale = dim / (2.0 * mu * len(diffs))
    out: list[torch.Tensor] | None = None
    for diff, u in zip(diffs, directions):
        terms = [v * (float(diff) * scale) for v in u]
        out = terms if out is None else [a + b for a, b in zip(out, terms)]
    assert out is not None
    return out


@torch.no_grad()
def perturbed_outputs(model: nn.Module, x: torch.Tensor, seeds: Sequence[int], mu: float,
                      directions: list[list[torch.Tensor]] | None = None,
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(h, h⁺, h⁻)``: ``model(x)`` unperturbed and at ``w ± μ u_p`` for each seed.

    The ``u_p`` are appended to ``directions`` when a list is given (so a
    caller that forms the estimate does not draw them twice).

    The model's weights are restored afterwards (up to float rounding of
    ``w + μu − μu``, which is why the unperturbed pass comes first and the
    weights are copied back).

    Returns:
        ``h`` ``[B, ...]``, ``h⁺`` and ``h⁻`` ``[P, B, ...]``.
    """
    params = trainable(model)
    saved = [p.detach().clone() for p in params]
    shapes = [p.shape for p in params]
    h = model(x)
    plus, minus = [], []
    for seed in seeds:
        u = direction(shapes, seed)
        if directions is not None:
            directions.append(u)
        perturb_(model, u, mu)
        plus.append(model(x))
        perturb_(model, u, -2.0 * mu)
        minus.append(model(x))
        for p, s in zip(params, saved):
            p.copy_(s)
    return h, torch.stack(plus), torch.stack(minus)


@torch.no_grad()
def zo_server_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, seeds: Sequence[int], mu: float,
                   lr: float, clip: float = 0.0) -> float:
    """One ZO-SGD step of a server-side model on activations ``x`` (MU-SplitFed eq. 5).

    ``g = (d/(2μP)) Σ_p [l(w + μu_p) − l(w − μu_p)] u_p`` with one direction
    per seed and ``l`` the mean cross-entropy, then ``w ← w − lr·g``: plain
    ZO-SGD, no momentum or weight decay. MU-SplitFed's server, and the
    servers of its ZO baselines (ZO-SplitFed, ZO-GAS; §5: "we modify both
    vanilla SplitFed and GAS to use ZO optimization").

    Args:
        x: float32 activations ``[B, ...]``; y: int64 labels ``[B]``.
        seeds: one direction seed per perturbation (``P`` of them).
        mu: smoothing parameter μ (> 0).
        lr: the server-side learning rate.
        clip: clip the estimate's norm to this (0 = none; ``zo-clip``). The
            paper clips nothing; the SPSA estimate's norm is about ``√d`` times
            the gradient's, so a clip at first-order scale cuts nearly every step.

    Returns:
        the loss at ``w`` before the step.
    """
    params = trainable(model)
    dirs: list[list[torch.Tensor]] = []
    logits, plus, minus = perturbed_outputs(model, x, seeds, mu, dirs)
    loss = float(nn.functional.cross_entropy(logits, y))
    diffs = [float(nn.functional.cross_entropy(a, y) - nn.functional.cross_entropy(b, y)) for a, b in zip(plus, minus)]
    grads = spsa_gradient(diffs, dirs, mu, num_parameters(model))
    norm = float(norm_of(grads))
    factor = min(1.0, clip / (norm + 1e-6)) if clip > 0 else 1.0
    for p, g in zip(params, grads):
        p.sub_(to_device(g, p.device), alpha=lr * factor)
    return loss
