"""The label-leakage defence of a U-shaped client: the max-norm heuristic (Li et al., ICLR 2022).

In a label-private split (``cut-layers=c1,c2``) the gradient a client's tail
returns at ``c2`` reveals the batch's labels (norm and direction scoring:
:mod:`simulation.privacy.label_leakage`). With ``label-defence=max-norm`` the client
adds Gaussian noise to each sample's row ``g_j`` of that gradient before it
leaves: ``n_j ~ N(0, σ_j² I_d)``, ``σ_j = sqrt((‖g_max‖² − ‖g_j‖²) / d)``,
``‖g_max‖`` the largest row norm of the batch and ``d`` the row's size, so
that every row's expected squared norm is ``‖g_max‖²``: the norms no longer
single out a class, and the noise blurs the directions. This follows the
heuristic's stated aim in Li et al., "Label Leakage and Protection in
Two-party Split Learning" (ICLR 2022, "max norm"); the tail's own update uses
the exact gradient (only what goes to the server is perturbed). It claims no
differential privacy.

``label-defence=iso`` is the paper's isotropic baseline, with a strength: each
row gets ``N(0, (t·‖g_max‖)²/d · I_d)``, ``t = label-noise``, so that the noise's
expected squared norm is ``t²·‖g_max‖²`` for every row (Li et al.'s "iso"
scales its noise by the largest gradient norm too; the parametrisation by
``t`` is sflower's).

The noise is drawn from a generator seeded by ``(run seed, stream
:data:`STREAM_LABEL_NOISE`, partition id, forward count)``, so runs are
reproducible on every engine.
"""

from __future__ import annotations

import torch

from fl_app.task import seeded_generator

#: Seed-stream tag of the max-norm noise of a client's returned gradients.
STREAM_LABEL_NOISE = 43
#: The values of ``label-defence``.
DEFENCES = ("none", "max-norm", "iso")


def max_norm_noise(grad: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """``grad`` ``[B, ...]`` with each row ``g_j`` perturbed by ``N(0, σ_j² I_d)``, ``σ_j² = (‖g_max‖² − ‖g_j‖²)/d``.

    Args:
        grad: the gradient a tail returns (any device); one row per sample.
        generator: a CPU generator (the noise is drawn on the CPU, then moved).

    Returns:
        a new tensor of ``grad``'s shape, dtype and device; the largest row is unchanged.
    """
    flat = grad.detach().reshape(grad.shape[0], -1)
    squares = (flat.double() ** 2).sum(dim=1)
    sigma = ((squares.max() - squares).clamp_min(0.0) / flat.shape[1]).sqrt().to(flat.dtype)
    noise = torch.randn(flat.shape, generator=generator, dtype=flat.dtype)
    return (flat + noise.to(flat.device) * sigma[:, None].to(flat.device)).reshape(grad.shape)


def iso_noise(grad: torch.Tensor, t: float, generator: torch.Generator) -> torch.Tensor:
    """``grad`` ``[B, ...]`` with each row perturbed by ``N(0, (t·‖g_max‖)²/d · I_d)`` (``d`` the row's size):
    the isotropic-noise baseline of Li et al., ICLR 2022, scaled by ``t`` (sflower's parametrisation).

    Args:
        grad: the gradient a tail returns (any device); one row per sample.
        t: the noise's scale relative to the batch's largest row norm (``label-noise``, ≥ 0).
        generator: a CPU generator (the noise is drawn on the CPU, then moved).

    Returns:
        a new tensor of ``grad``'s shape, dtype and device.
    """
    flat = grad.detach().reshape(grad.shape[0], -1)
    top = (flat.double() ** 2).sum(dim=1).max().sqrt()
    sigma = (t * top / flat.shape[1] ** 0.5).to(flat.dtype)
    noise = torch.randn(flat.shape, generator=generator, dtype=flat.dtype)
    return (flat + noise.to(flat.device) * sigma.to(flat.device)).reshape(grad.shape)


def perturb(grad: torch.Tensor, defence: str, t: float, generator: torch.Generator) -> torch.Tensor:
    """``grad`` as ``label-defence`` releases it: unchanged (``none``), :func:`max_norm_noise` or :func:`iso_noise`.

    Raises:
        ValueError: an unknown ``defence``.
    """
    if defence == "none":
        return grad
    if defence == "max-norm":
        return max_norm_noise(grad, generator)
    if defence == "iso":
        return iso_noise(grad, t, generator)
    raise ValueError(f"unknown label-defence {defence!r}; expected one of {', '.join(DEFENCES)}")


def defence_generator(seed: int, partition_id: int, count: int) -> torch.Generator:
    """The generator of one returned gradient's noise: ``(seed, STREAM_LABEL_NOISE, partition_id, count)``."""
    return seeded_generator(seed, STREAM_LABEL_NOISE, partition_id, count)
