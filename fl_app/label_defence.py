"""The label-leakage defence of a U-shaped client: the max-norm heuristic (Li et al., ICLR 2022).

In a label-private split (``cut-layers=c1,c2``) the gradient a client's tail
returns at ``c2`` reveals the batch's labels (norm and direction scoring:
:mod:`simulation.label_leakage`). With ``label-defence=max-norm`` the client
adds Gaussian noise to each sample's row ``g_j`` of that gradient before it
leaves: ``n_j ~ N(0, σ_j² I_d)``, ``σ_j = sqrt((‖g_max‖² − ‖g_j‖²) / d)``,
``‖g_max‖`` the largest row norm of the batch and ``d`` the row's size, so
that every row's expected squared norm is ``‖g_max‖²``: the norms no longer
single out a class, and the noise blurs the directions. This follows the
heuristic's stated aim in Li et al., "Label Leakage and Protection in
Two-party Split Learning" (ICLR 2022, "max norm"); the tail's own update uses
the exact gradient (only what goes to the server is perturbed). It claims no
differential privacy.

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
DEFENCES = ("none", "max-norm")


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


def defence_generator(seed: int, partition_id: int, count: int) -> torch.Generator:
    """The generator of one returned gradient's noise: ``(seed, STREAM_LABEL_NOISE, partition_id, count)``."""
    return seeded_generator(seed, STREAM_LABEL_NOISE, partition_id, count)
