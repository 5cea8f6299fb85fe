"""Server-side training steps shared by the split strategies: one step, and the activation gradient.

:func:`optimizer_step` is the sequence every server-side update runs (zero
the gradients, back-propagate, clip and step); :func:`step_on_loss` adds the
check of the loss before it (SplitFed, MiniBatch-SFL, PSL, EPSL, S²FL),
and GAPSL passes its own back-propagation (eq. 8's gradient).
:func:`server_step` is one step on received activations; :func:`activation_gradient`
is ``∂L/∂A`` without touching the model (GAS's ``G_k``, S²FL's clients);
:func:`zo_step` is a zeroth-order server step (MU-SplitFed).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

import torch
from torch import nn

from fl_app.run.config import RunConfig
from fl_app.learning.training import clip_and_step
from fl_app.learning.zo import STREAM_ZO_SERVER, zo_seed, zo_server_step
from strategies.core.errors import check_loss

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def optimizer_step(model: nn.Module, opt: torch.optim.Optimizer, clip_norm: float,
                   backward: Callable[[], None]) -> None:
    """Zero ``opt``'s gradients, run ``backward`` (which fills the parameters' ``.grad``), clip at
    ``clip_norm`` (0: none) and step (:func:`fl_app.learning.training.clip_and_step`)."""
    opt.zero_grad(set_to_none=True)
    backward()
    clip_and_step(model, opt, clip_norm)


def step_on_loss(model: nn.Module, opt: torch.optim.Optimizer, loss: torch.Tensor, clip_norm: float, *,
                 backward: Callable[[], None] | None = None, where: str = "server step") -> None:
    """One step of ``model`` on ``loss`` (its ``backward()``, or ``backward`` when given, e.g. EPSL's
    back-propagation of aggregated logit gradients), after checking that the loss is finite.

    Raises:
        DivergedError: the loss is not finite.
    """
    check_loss(loss.detach(), where)
    optimizer_step(model, opt, clip_norm, backward or loss.backward)


def set_gradient(params: Sequence[torch.Tensor], flat: torch.Tensor) -> None:
    """Give each of ``params`` its slice of the flattened gradient ``flat`` (``[Σ numel]``) as ``.grad``."""
    start = 0
    for p in params:
        p.grad = flat[start:start + p.numel()].view_as(p).to(p.dtype)
        start += p.numel()


def server_step(model: nn.Module, opt: torch.optim.Optimizer, activations: torch.Tensor,
                labels: torch.Tensor, clip_norm: float, loss_fn: LossFn | None = None,
                input_grad: bool = True) -> tuple[torch.Tensor | None, torch.Tensor]:
    """One step of a server-side model on smashed data.

    Args:
        activations: float32 ``[B, ...]`` received from clients.
        labels: int64 ``[B]``.
        loss_fn: ``(logits, labels) -> scalar`` (default: mean cross-entropy).
        input_grad: compute dL/d(activations); False skips that backward work
            (the parameter gradients, and so the step, are bit-identical).

    Returns:
        ``(grad, loss)``: ``grad`` = dL/d(activations), same shape (None with
        ``input_grad=False``); the loss before the step (detached).

    Raises:
        DivergedError: the loss is not finite.
    """
    x = activations.detach().requires_grad_(input_grad)
    loss = (loss_fn or nn.functional.cross_entropy)(model(x), labels)
    step_on_loss(model, opt, loss, clip_norm)
    return (x.grad.detach() if input_grad else None), loss.detach()


def server_steps(steps: Mapping[int, tuple[nn.Module, torch.optim.Optimizer, torch.Tensor]],
                 losses: Callable[[dict[int, torch.Tensor]], Mapping[int, torch.Tensor]],
                 clip_norm: float) -> dict[int, torch.Tensor]:
    """One step of each client's server-side model on its activations, the losses of all outputs at once.

    Args:
        steps: ``pid -> (model, optimizer, activations [B, ...])``.
        losses: the outputs ``pid -> model(activations)`` to ``pid -> scalar loss`` (the cross-entropy against
            the labels, or the clients' tails in a U-shaped split:
            :meth:`~strategies.core.ushaped.LabelPrivateSplit.client_losses`); a pid it leaves out takes no
            step and gets no gradient.

    Returns:
        ``pid -> dL/d(activations)`` (same shapes), in ascending pid order; each model stepped once as
        :func:`server_step` steps it (bit-identical with the cross-entropy).

    Raises:
        DivergedError: a loss is not finite.
    """
    leaves = {pid: steps[pid][2].detach().requires_grad_(True) for pid in sorted(steps)}
    got = losses({pid: steps[pid][0](x) for pid, x in leaves.items()})
    grads = {}
    for pid in sorted(got):
        model, opt, _ = steps[pid]
        step_on_loss(model, opt, got[pid], clip_norm)
        grads[pid] = leaves[pid].grad.detach()
    return grads


def activation_gradient(model: nn.Module, activations: torch.Tensor, labels: torch.Tensor,
                        loss_fn: LossFn | None = None, where: str | None = None) -> torch.Tensor:
    """``∂ loss_fn(model(A), y) / ∂A`` without touching the model's parameter gradients.

    Args:
        activations: ``[B, ...]``; the result has their shape.
        labels: int64 ``[B]``.
        loss_fn: ``(logits, labels) -> scalar`` (default: mean cross-entropy).
        where: when given, the loss is checked first (:func:`~strategies.core.errors.check_loss`).

    Raises:
        DivergedError: ``where`` is given and the loss is not finite.
    """
    x = activations.detach().requires_grad_(True)
    loss = (loss_fn or nn.functional.cross_entropy)(model(x), labels)
    if where is not None:
        check_loss(loss.detach(), where)
    (grad,) = torch.autograd.grad(loss, x)
    return grad.detach()


def zo_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, cfg: RunConfig, key: int, updates: int,
            lr: float) -> float:
    """One ZO-SGD step of a server-side model (MU-SplitFed eq. 5, :func:`fl_app.learning.zo.zo_server_step`).

    Directions come from ``(seed, server stream, key, updates, p)`` for
    ``p < perturbations``; smoothing ``zo-smoothing``, clip ``zo-clip``.

    Args:
        key: which server-side model (a client's copy: its partition id).
        updates: the server updates so far.

    Returns:
        the loss before the step.

    Raises:
        DivergedError: the loss is not finite.
    """
    seeds = [zo_seed(cfg.seed, STREAM_ZO_SERVER, key, updates, p) for p in range(cfg.perturbations)]
    loss = zo_server_step(model, x, y, seeds, cfg.zo_smoothing, lr, cfg.zo_clip)
    check_loss(torch.tensor(loss), "server ZO step")
    return loss
