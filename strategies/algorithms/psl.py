"""The parallel split learning (PSL) family: per-client client-side models, one server-side model.

Source: GAPSL (its paper, Section III: "PSL") and docs/explanation/design.md
§7. Client-side models are per client and never aggregated
(:class:`~strategies.core.split.PerClientModels`); each is evaluated as
``client_k ∘ server``.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping

import torch
from torch import nn

from fl_app.run.options import Option
from strategies.core.errors import check_loss
from strategies.core.registry import register
from strategies.core.server_step import step_on_loss
from strategies.core.split import PerClientModels

#: ``(outputs pid -> [B_k, ...], labels pid -> [B_k] or None) -> pid -> scalar loss``
ClientLosses = Callable[[Mapping[int, torch.Tensor], Mapping[int, torch.Tensor | None]], Mapping[int, torch.Tensor]]


def per_client_logits(model: nn.Module, batches: dict[int, tuple[torch.Tensor, torch.Tensor | None]],
                      losses_of: ClientLosses | None = None,
                      ) -> tuple[list[int], list[torch.Tensor], torch.Tensor, list[torch.Tensor]]:
    """Run the server-side model once on the cohort's concatenated activations.

    Args:
        batches: ``pid -> (activations [B_k, ...], labels [B_k])``.
        losses_of: ``(outputs, labels) -> losses``, per client (default: the mean cross-entropy); a
            U-shaped run's clients' tails (:meth:`~strategies.core.ushaped.LabelPrivateSplit.client_losses`),
            which leave out a client that failed.

    Returns:
        ``(pids, inputs, logits, losses)``: pids ascending (those with a loss); each client's
        activations as a leaf that requires grad; the outputs ``[ΣB_k, ...]`` of every client in pid
        order; each client's mean loss ``L_k`` (scalars in the autograd graph of the server-side parameters).
    """
    pids = sorted(batches)
    xs = [batches[p][0].detach().requires_grad_(True) for p in pids]
    logits = model(torch.cat(xs))
    outputs = dict(zip(pids, logits.split([x.shape[0] for x in xs])))
    labels = {p: batches[p][1] for p in pids}
    if losses_of is None:
        got = {p: nn.functional.cross_entropy(z, labels[p]) for p, z in outputs.items()}
    else:
        got = losses_of(outputs, labels)
    kept = [(p, x) for p, x in zip(pids, xs) if p in got]
    return [p for p, _ in kept], [x for _, x in kept], logits, [got[p] for p, _ in kept]


def per_client_losses(model: nn.Module, batches: dict[int, tuple[torch.Tensor, torch.Tensor | None]],
                      losses_of: ClientLosses | None = None,
                      ) -> tuple[list[int], list[torch.Tensor], list[torch.Tensor]]:
    """``(pids, inputs, losses)`` of :func:`per_client_logits`."""
    pids, xs, _, losses = per_client_logits(model, batches, losses_of)
    return pids, xs, losses


def aggregate_last_layer_gradients(grads: list[torch.Tensor], phi: float) -> list[torch.Tensor]:
    """EPSL's partial aggregation of last-layer activation gradients (Lin et al. 2023).

    The first ``n = floor(φ · min_k B_k)`` rows of every client's gradient are
    replaced by their mean over the clients (row ``j`` of the result is
    ``(1/C) Σ_k G_k[j]`` for ``j < n``); the other rows stay each client's own.

    Args:
        grads: per client, ``∂L/∂z_k`` of the last layer's output ``z_k``
            (the logits), ``[B_k, classes]``.
        phi: the aggregated fraction φ in ``[0, 1]``; 0 is PSL.

    Returns:
        The new per-client gradients, same shapes (new tensors).
    """
    n = int(phi * min(g.shape[0] for g in grads)) if grads else 0
    out = [g.clone() for g in grads]
    if n > 0:
        mean = torch.stack([g[:n] for g in grads]).mean(dim=0)
        for g in out:
            g[:n] = mean
    return out


@register
class PSL(PerClientModels):
    """Parallel split learning: per-client client-side models, one server step per local iteration.

    The server-side model steps once per local iteration on
    ``L = (1/C) Σ_k L_k``, the mean of the cohort's per-client mean losses
    (``psl-loss=mean``), or on their sum ``Σ_k L_k`` (``psl-loss=sum``). GAPSL
    (Sec. III, "PSL") does not say which; the sum's server gradient is ``C``
    times the mean's. Each client receives ``∇_{A_k} L_k``, the gradient of
    its own loss, under either, so its step does not shrink with the cohort
    size (as in MiniBatch-SFL).
    """

    name = "psl"
    ushaped_refusal = ""
    options = (Option("psl-loss", "mean", "PSL/EPSL: the server steps on the mean or the sum of the per-client "
                      "losses (GAPSL Sec. III does not say; GAPSL itself sums, eq. 8)", ("mean", "sum")),)

    def initialize(self) -> None:
        """One server-side model with a persistent optimizer."""
        super().initialize()
        self.server_opt = self.server_optimizer(self.server_model)

    def server_loss(self, pids: list[int], losses: list[torch.Tensor]) -> torch.Tensor:
        """The server's objective from the per-client losses: their mean or sum (``psl-loss``)."""
        stacked = torch.stack(losses)
        return stacked.sum() if self.cfg.psl_loss == "sum" else stacked.mean()

    def own_loss_scale(self, n: int) -> float:
        """``∂L/∂L_k``'s inverse: what turns ``∇_{A_k} L`` into ``∇_{A_k} L_k`` (``n`` clients; 1 for the sum)."""
        return 1.0 if self.cfg.psl_loss == "sum" else float(n)

    def server_iteration(self, batches: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> dict[int, torch.Tensor]:
        """One step on the mean (or sum) of the per-client losses; each client gets ``∇_{A_k} L_k``."""
        pids, xs, losses = per_client_losses(self.server_model, batches, self.client_losses)
        step_on_loss(self.server_model, self.server_opt, self.server_loss(pids, losses), self.cfg.clip_norm)
        return self.client_gradients(pids, xs)

    def client_gradients(self, pids: list[int], xs: list[torch.Tensor]) -> dict[int, torch.Tensor]:
        """After a server step: count it; each client's ``∇_{A_k} L_k`` from its input's gradient."""
        self.server_updates += 1
        scale = self.own_loss_scale(len(pids))
        return {p: x.grad.detach() * scale for p, x in zip(pids, xs)}


@register
class EPSL(PSL):
    """EPSL (Lin et al. 2023): PSL whose server aggregates a fraction φ of the last-layer activation gradients.

    Each local iteration the server runs its model on the concatenated
    activations, takes every client's last-layer gradient ``∂L/∂z_k`` (``L``
    the mean of the per-client losses, as PSL), averages the first
    ``φ·B`` rows across clients (:func:`aggregate_last_layer_gradients`),
    and back-propagates the result through the server-side model once: the
    server-side step and every client's activation gradient (scaled by
    ``C``, as PSL) come from it. The averaged rows are what EPSL
    broadcasts; the virtual clock charges no server time, so its saving in
    server computation does not show in virtual time. φ = 0 is PSL.
    """

    name = "epsl"
    ushaped_refusal = ("its server averages a fraction of the clients' last-layer (logit) gradients (EPSL §3), "
                       "so the last layer and the labels are on the server")
    options = (Option("epsl-phi", 0.5, "fraction φ of each batch whose last-layer activation gradients the "
                      "server averages across clients (0 = PSL)", at_least=0, at_most=1,
                      source="EPSL §3"),)

    def server_iteration(self, batches: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> dict[int, torch.Tensor]:
        """One server step on the partly aggregated last-layer gradients; each client gets its ``∇_{A_k}``."""
        pids, xs, logits, losses = per_client_logits(self.server_model, batches)
        loss = self.server_loss(pids, losses)
        check_loss(loss.detach(), "server step")
        (grad,) = torch.autograd.grad(loss, logits, retain_graph=True)
        parts = aggregate_last_layer_gradients(list(grad.split([x.shape[0] for x in xs])), self.cfg.epsl_phi)
        step_on_loss(self.server_model, self.server_opt, loss, self.cfg.clip_norm,
                     backward=lambda: logits.backward(torch.cat(parts)))
        return self.client_gradients(pids, xs)
