"""The label-leakage defences of a U-shaped client: max-norm, iso and Marvell (Li et al., ICLR 2022).

In a label-private split (``cut-layers=c1,c2``) the gradient a client's tail
returns at ``c2`` reveals the batch's labels (norm and direction scoring:
:mod:`simulation.privacy.label_leakage`). With ``label-defence=max-norm`` the client
adds Gaussian noise to each sample's row ``g_j`` of that gradient before it
leaves: ``n_j ~ N(0, σ_j² I_d)``, ``σ_j = sqrt((‖g_max‖² − ‖g_j‖²) / d)``,
``‖g_max‖`` the largest row norm of the batch and ``d`` the row's size, so
that every row's expected squared norm is ``‖g_max‖²``: the norms no longer
single out a class, and the noise blurs the directions. This follows the
heuristic's stated aim in Li et al., "Label Leakage and Protection in
Two-party Split Learning" (ICLR 2022, "max norm"). It claims no differential
privacy.

``label-defence=iso`` is the paper's isotropic baseline, with a strength: each
row gets ``N(0, (t·‖g_max‖)²/d · I_d)``, ``t = label-noise``, so that the noise's
expected squared norm is ``t²·‖g_max‖²`` for every row (Li et al.'s "iso"
scales its noise by the largest gradient norm too; the parametrisation by
``t`` is sflower's).

``label-defence=marvell`` is the paper's optimised noise (:mod:`fl_app.privacy.marvell`), with the power budget
``P = s·‖ḡ₁ − ḡ₀‖²``, ``s = label-power``. The paper's problem is binary; sflower's batches have up to ten
classes, and its **multi-class extension is sflower's own, not the paper's**: a batch with exactly two
classes is the paper's problem (the larger label positive); a batch with more is split into one-vs-rest
problems, one per class ``c`` present (``c`` positive, every other sample negative, the class-conditional
means and variances estimated on the batch), and each sample gets the sum of the independent noises of all
the problems, drawn with each problem's optimal ``Σ₁`` or ``Σ₀`` by its side. So along each ``ûc`` both
sides carry at least the binary optimum's noise, and the total power is the sum of the problems' budgets. A
batch of one class gets no noise (there is no class-mean difference to hide within it).

**What the tail steps on** (``label-defence-tail``). With ``exact`` (the default) the defence acts on the
rows of ``∂L/∂z`` (``z`` the tail's input, what the server receives) after the tail has stepped on the exact
gradient: the server then sees the perturbed ``∂L/∂z`` but the tail's weights, uploaded each round, moved
on the exact one. With ``perturbed`` the defence acts one step earlier, on the rows of the loss's gradient
w.r.t. the logits ``g = ∂L/∂logits`` (``[B, classes]``), and :func:`tail_backward` back-propagates the one
perturbed ``g̃`` through the tail once: the returned ``∂L/∂z = J_zᵀ g̃`` and the tail's parameter gradient
``J_θᵀ g̃`` come from the same perturbed signal, so the tail's update tells the server nothing the returned
gradient does not. (Perturbing ``∂L/∂z`` itself could not be consistent: no parameter gradient corresponds
to an arbitrary perturbation of ``∂L/∂z``.) The noise is then sized on the logits' gradient rows
(``d`` = the number of classes).

The noise is drawn from a generator seeded by ``(run seed, stream
:data:`STREAM_LABEL_NOISE`, partition id, forward count)``, so runs are
reproducible on every engine.
"""

from __future__ import annotations

import torch

from fl_app.learning.task import seeded_generator

#: Seed-stream tag of the max-norm noise of a client's returned gradients.
STREAM_LABEL_NOISE = 43
#: The values of ``label-defence``.
DEFENCES = ("none", "max-norm", "iso", "marvell")
#: The values of ``label-defence-tail``: what the client's tail steps on.
TAIL_MODES = ("exact", "perturbed")


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


def _f64(value: float) -> torch.Tensor:
    return torch.tensor(value, dtype=torch.float64)


def marvell_noise(grad: torch.Tensor, labels: torch.Tensor, s: float, generator: torch.Generator) -> torch.Tensor:
    """``grad`` ``[B, ...]`` with Marvell's noise on each row (budget ``P = s·‖ḡ₁ − ḡ₀‖²`` per binary problem;
    more than two classes: one-vs-rest, sflower's extension, see the module docstring).

    Args:
        grad: the gradient rows (any device); labels: ``[B]`` integer labels of the rows;
        s: the power budget relative to the squared class-mean difference (``label-power``, > 0);
        generator: a CPU generator (one ``[B, d]`` standard normal draw per problem, in class order).

    Returns:
        a new tensor of ``grad``'s shape, dtype and device (``grad`` itself for a batch of one class).
    """
    from fl_app.privacy.marvell import solve  # SciPy: only where Marvell runs

    flat = grad.detach().reshape(grad.shape[0], -1).double().cpu()
    y = labels.detach().cpu().reshape(-1)
    classes = torch.unique(y)
    if len(classes) < 2:
        return grad
    d = flat.shape[1]
    noise = torch.zeros_like(flat)
    for c in (classes[1:] if len(classes) == 2 else classes):
        pos = y == c
        g1, g0 = flat[pos], flat[~pos]
        diff = g1.mean(dim=0) - g0.mean(dim=0)
        d2 = float((diff ** 2).sum())
        z = torch.randn(flat.shape, generator=generator, dtype=torch.float64)
        if d2 <= 0:
            continue
        v = float(((g1 - g1.mean(dim=0)) ** 2).sum(dim=1).mean()) / d
        u = float(((g0 - g0.mean(dim=0)) ** 2).sum(dim=1).mean()) / d
        cov = solve(d2, u, v, float(pos.double().mean()), d, s * d2)
        along = torch.where(pos, _f64(cov.along_pos), _f64(cov.along_neg)).sqrt()
        across = torch.where(pos, _f64(cov.across_pos), _f64(cov.across_neg)).sqrt()
        unit = diff / d2 ** 0.5
        noise += across[:, None] * z + (along - across)[:, None] * (z @ unit)[:, None] * unit[None, :]
    out = (flat + noise).to(grad.dtype).to(grad.device)
    return out.reshape(grad.shape)


def perturb(grad: torch.Tensor, defence: str, strength: float, generator: torch.Generator,
            labels: torch.Tensor | None = None) -> torch.Tensor:
    """``grad`` as ``label-defence`` releases it: unchanged (``none``), :func:`max_norm_noise`,
    :func:`iso_noise` (``strength`` = ``label-noise``) or :func:`marvell_noise` (``strength`` = ``label-power``,
    needs ``labels``).

    Raises:
        ValueError: an unknown ``defence``; ``marvell`` without ``labels``.
    """
    if defence == "none":
        return grad
    if defence == "max-norm":
        return max_norm_noise(grad, generator)
    if defence == "iso":
        return iso_noise(grad, strength, generator)
    if defence == "marvell":
        if labels is None:
            raise ValueError("label-defence=marvell needs the batch's labels")
        return marvell_noise(grad, labels, strength, generator)
    raise ValueError(f"unknown label-defence {defence!r}; expected one of {', '.join(DEFENCES)}")


def tail_backward(logits: torch.Tensor, loss: torch.Tensor, release) -> None:
    """``label-defence-tail=perturbed``: back-propagate ``g̃ = release(∂loss/∂logits)`` through the tail once,
    so that the parameters' ``.grad`` and the input's ``.grad`` both come from the one perturbed ``g̃``.

    Args:
        logits: the tail's output ``[B, classes]`` (in the autograd graph); loss: the scalar loss of ``logits``;
        release: ``g [B, classes] -> g̃`` of the same shape (the defence, e.g. a :func:`perturb` call).
    """
    (g,) = torch.autograd.grad(loss, logits, retain_graph=True)
    logits.backward(release(g))


def defence_generator(seed: int, partition_id: int, count: int) -> torch.Generator:
    """The generator of one returned gradient's noise: ``(seed, STREAM_LABEL_NOISE, partition_id, count)``."""
    return seeded_generator(seed, STREAM_LABEL_NOISE, partition_id, count)
