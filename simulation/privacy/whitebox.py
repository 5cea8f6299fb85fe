"""White-box model inversion through the client-side model the server holds: least squares, or rMLE.

A server that holds the client-side model ``f`` (it aggregates the heads,
or, as in PSL, receives each client's head every round to evaluate it) need
not train a decoder (:mod:`simulation.privacy.inversion`): it can invert the
activations ``z = f(x)`` it received directly.

* Where ``f`` is affine (a convolution or linear layer with no nonlinearity
  before the cut: LeNet-5's ``conv1`` at cut 1), ``z = A x + b`` and
  :func:`invert_affine` solves the least-squares problem
  ``min_x ‖A x + b − z‖²`` (``torch.linalg.lstsq`` on ``A`` built column by
  column from ``f`` of the basis images; :func:`affine_operator`). With
  per-sample clipping (``act-clip``: ``z = s·(A x + b)``, ``s ≤ 1`` unknown)
  it solves ``[A, b] [u; s] = z`` for ``u = s·x`` and returns ``u / s``:
  still linear, still exact without noise.
* Otherwise :func:`invert_rmle`: the white-box regularised maximum-likelihood
  attack of He, Zhang and Lee, "Model inversion attacks against collaborative
  inference", ACSAC 2019, §4.1 (rMLE): gradient descent (Adam) on ``x``
  minimising ``‖f(x) − z‖² + λ·TV(x)``, ``TV`` the anisotropic total
  variation, ``x`` kept in the valid pixel range.

Both take ``f`` and ``z`` only; :func:`is_affine` decides which applies.
"""

from __future__ import annotations

import torch
from torch import nn

from fl_app.privacy.activations import clip_rows

#: The largest input size (C·H·W) whose affine operator is built as a dense matrix.
MAX_DENSE_INPUT = 4096


@torch.no_grad()
def is_affine(f: nn.Module, input_shape: tuple[int, ...], seed: int = 0, rtol: float = 1e-4) -> bool:
    """Whether ``f`` is affine on inputs ``[*, *input_shape]``: ``f(a x₁ + (1−a) x₂) = a f(x₁) + (1−a) f(x₂)``
    and ``f(x₁ + x₂) − f(x₁) − f(x₂) + f(0) = 0`` on random inputs, to ``rtol`` of the outputs' scale."""
    gen = torch.Generator().manual_seed(seed)
    x1, x2 = (torch.randn((2, *input_shape), generator=gen) for _ in range(2))
    f = f.eval()
    y1, y2, y0, y12 = f(x1), f(x2), f(torch.zeros_like(x1)), f(x1 + x2)
    scale = float(torch.cat([y1.flatten(), y2.flatten()]).abs().max()) or 1.0
    mid = f(0.3 * x1 + 0.7 * x2) - (0.3 * y1 + 0.7 * y2)
    return float((y12 - y1 - y2 + y0).abs().max()) <= rtol * scale and float(mid.abs().max()) <= rtol * scale


@torch.no_grad()
def affine_operator(f: nn.Module, input_shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor]:
    """``(A [m, n], b [m])`` float64 with ``f(x).flatten() = A x.flatten() + b`` for an affine ``f``
    (``n = prod(input_shape)``, one forward pass of the ``n`` basis images).

    Raises:
        ValueError: ``n`` exceeds :data:`MAX_DENSE_INPUT`.
    """
    n = 1
    for s in input_shape:
        n *= int(s)
    if n > MAX_DENSE_INPUT:
        raise ValueError(f"a dense affine operator of {n} inputs (more than {MAX_DENSE_INPUT})")
    f = f.eval().double()
    try:
        b = f(torch.zeros((1, *input_shape), dtype=torch.float64)).flatten()
        basis = torch.eye(n, dtype=torch.float64).reshape(n, *input_shape)
        cols = torch.cat([f(basis[i:i + 256]).reshape(-1, b.numel()) for i in range(0, n, 256)]) - b
    finally:
        f.float()
    return cols.T.contiguous(), b


def invert_affine(f: nn.Module, z: torch.Tensor, input_shape: tuple[int, ...], clipped: bool = False,
                  bounds: tuple[float, float] | None = None) -> torch.Tensor:
    """Least-squares inputs ``[B, *input_shape]`` of activations ``z`` ``[B, ...]`` through an affine ``f``.

    Args:
        clipped: the activations were clipped per sample (unknown scale ``s``; solved for, see the module
            docstring).
        bounds: clamp the result to ``[lo, hi]`` (the valid input range), or None.
    """
    a, b = affine_operator(f, input_shape)
    rhs = z.reshape(z.shape[0], -1).double().T
    if clipped:
        sol = torch.linalg.lstsq(torch.cat([a, b[:, None]], dim=1), rhs).solution
        scale = sol[-1:].clamp_min(1e-6)
        x = sol[:-1] / scale
    else:
        x = torch.linalg.lstsq(a, rhs - b[:, None]).solution
    x = x.T.reshape(z.shape[0], *input_shape).float()
    return x if bounds is None else x.clamp(*bounds)


def total_variation(x: torch.Tensor) -> torch.Tensor:
    """Anisotropic total variation of images ``[B, C, H, W]``: the mean absolute difference of neighbours."""
    return (x[..., 1:, :] - x[..., :-1, :]).abs().mean() + (x[..., :, 1:] - x[..., :, :-1]).abs().mean()


def invert_rmle(f: nn.Module, z: torch.Tensor, input_shape: tuple[int, ...], *, steps: int = 500,
                lr: float = 0.05, tv: float = 0.05, clip: float = 0.0,
                bounds: tuple[float, float] | None = None) -> torch.Tensor:
    """rMLE inputs ``[B, *input_shape]`` of activations ``z`` (He et al. 2019, §4.1; module docstring).

    Adam (``lr``) for ``steps`` steps on ``x`` from zeros, minimising ``mean((g(x) − z)²) + tv·TV(x)``, with
    ``g = clip_rows(f(·), clip)`` when ``clip > 0`` (the defence the run's configuration states), ``x``
    clamped to ``bounds`` after each step. ``f`` is frozen (its parameters get no gradient).
    """
    f = f.eval()
    for p in f.parameters():
        p.requires_grad_(False)
    target = z.detach().float()
    x = torch.zeros((z.shape[0], *input_shape), requires_grad=True)
    opt = torch.optim.Adam([x], lr=lr)
    for _ in range(steps):
        opt.zero_grad()
        out = f(x)
        out = clip_rows(out, clip) if clip > 0 else out
        loss = nn.functional.mse_loss(out.reshape(target.shape), target) + tv * total_variation(x)
        loss.backward()
        opt.step()
        if bounds is not None:
            with torch.no_grad():
                x.clamp_(*bounds)
    return x.detach()
