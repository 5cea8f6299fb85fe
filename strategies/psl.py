"""The parallel split learning (PSL) family: per-client client-side models, one server-side model.

Source: GAPSL (``papers/gapsl.txt``, Section III: "PSL") and DESIGN.md
section 7. Client-side models are per client and never aggregated
(:class:`~strategies.split.PerClientModels`); each is evaluated as
``client_k ∘ server``.
"""

from __future__ import annotations

import torch
from torch import nn

from strategies.base import SFLStrategy
from strategies.registry import register
from strategies.split import PerClientModels
from fl_app.training import clip_and_step


def per_client_losses(model: nn.Module, batches: dict[int, tuple[torch.Tensor, torch.Tensor]],
                      ) -> tuple[list[int], list[torch.Tensor], list[torch.Tensor]]:
    """Run the server-side model once on the cohort's concatenated activations.

    Args:
        batches: ``pid -> (activations [B_k, ...], labels [B_k])``.

    Returns:
        ``(pids, inputs, losses)``: pids ascending; each client's activations
        as a leaf that requires grad; each client's mean cross-entropy ``L_k``
        (scalars in the autograd graph of the server-side parameters).
    """
    pids = sorted(batches)
    xs = [batches[p][0].detach().requires_grad_(True) for p in pids]
    logits = model(torch.cat(xs))
    losses, start = [], 0
    for p, x in zip(pids, xs):
        b = x.shape[0]
        losses.append(nn.functional.cross_entropy(logits[start:start + b], batches[p][1]))
        start += b
    return pids, xs, losses


@register
class PSL(PerClientModels):
    """Parallel split learning: per-client client-side models, one server step per local iteration.

    The server-side model steps once per local iteration on
    ``L = (1/C) Σ_k L_k``, the mean of the cohort's per-client mean losses.
    Each client receives ``∇_{A_k} L_k = C · ∇_{A_k} L``, the gradient of its
    own loss, so its step does not shrink with the cohort size (as in
    MiniBatch-SFL).
    """

    name = "psl"

    def initialize(self) -> None:
        """One server-side model with a persistent optimizer."""
        super().initialize()
        self.server_opt = self.server_optimizer(self.server_model)

    def server_loss(self, pids: list[int], losses: list[torch.Tensor]) -> torch.Tensor:
        """The server's objective from the per-client losses (hook; PSL: their mean)."""
        return torch.stack(losses).mean()

    def server_iteration(self, batches: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> dict[int, torch.Tensor]:
        """One step on the mean of the per-client losses; each client gets ``∇_{A_k} L_k``."""
        pids, xs, losses = per_client_losses(self.server_model, batches)
        loss = self.server_loss(pids, losses)
        SFLStrategy.check_loss(loss.detach(), "server step")
        self.server_opt.zero_grad(set_to_none=True)
        loss.backward()
        clip_and_step(self.server_model, self.server_opt, self.cfg.clip_norm)
        self.server_updates += 1
        return {p: x.grad.detach() * len(pids) for p, x in zip(pids, xs)}
