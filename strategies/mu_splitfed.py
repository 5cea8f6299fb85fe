"""MU-SplitFed: zeroth-order SFL with unbalanced server updates.

Source: ``papers/mu-splitfed.txt`` (Sec. 3, Algorithm 1). Its equations were
lost in extraction; DESIGN.md section 7 fixes the standard form used here
(SPSA with directions on the unit sphere, :mod:`fl_app.zo`).

One communication round (global iteration) with the cohort:

* each client runs ``train.zo_forward``: its embedding ``h`` and ``P`` pairs
  ``h(w ± μ u_p)`` of a new batch (eq. 4), forward passes only;
* the split server keeps a copy of the server-side model per client and
  makes ``τ = server-steps`` ZO updates of it on ``h`` (eq. 5), with its own
  random directions and the server learning rate ``η_s`` (default ``η/τ``,
  as the convergence analysis requires);
* it then returns the ``P`` loss differences of the perturbed pairs under the
  updated copy (eq. 6); the client forms the SPSA estimate from its own seeds
  and steps (``train.zo_update``), piggybacking its next ``zo_forward``;
* after E such exchanges (the paper: E = 1) the fed server averages the
  client models and the split server the copies, each with the global
  learning rate ``η_g = server-lr``: ``w ← w + η_g·(avg_k w_k − w)`` (eq. 7;
  the average weighted by ``aggregation``).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from fl_app.config import Option
from fl_app.device import to_device
from fl_app.zo import STREAM_ZO_SERVER, perturbed_outputs, spsa_gradient, zo_seed
from strategies.aggregation import AGGREGATION_OPTION, average_uploads
from strategies.registry import register
from strategies.split import ZO_OPTIONS, SyncSplitStrategy, copy_model


@torch.no_grad()
def zo_server_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, seeds: list[int], mu: float,
                   lr: float, clip_norm: float = 0.0) -> float:
    """One ZO-SGD step of a server-side model on embeddings ``x`` (MU-SplitFed eq. 5).

    ``g = (d/(2μP)) Σ_p [l(w + μu_p) − l(w − μu_p)] u_p`` with one direction
    per seed, its norm clipped to ``clip_norm`` (0 = none; the run's
    clipping, as on every other update), then ``w ← w − lr·g``.

    Returns:
        the loss at ``w`` before the step.
    """
    params = [p for p in model.parameters() if p.requires_grad]
    dirs: list[list[torch.Tensor]] = []
    logits, plus, minus = perturbed_outputs(model, x, seeds, mu, dirs)
    loss = float(nn.functional.cross_entropy(logits, y))
    diffs = [float(nn.functional.cross_entropy(a, y) - nn.functional.cross_entropy(b, y)) for a, b in zip(plus, minus)]
    grads = spsa_gradient(diffs, dirs, mu, sum(p.numel() for p in params))
    norm = float(torch.sqrt(sum((g.double() ** 2).sum() for g in grads)))
    factor = min(1.0, clip_norm / (norm + 1e-6)) if clip_norm > 0 else 1.0
    for p, g in zip(params, grads):
        p.sub_(to_device(g, p.device), alpha=lr * factor)
    return loss


@register
class MUSplitFed(SyncSplitStrategy):
    """MU-SplitFed: ZO clients, τ ZO server updates per exchange, per-client server copies, η_g aggregation."""

    name = "mu-splitfed"
    options = (
        Option("server-steps", 1, "τ: ZO updates of a client's server-side copy per exchange"),
        *ZO_OPTIONS,
        Option("server-lr", 1.0, "global learning rate η_g of eq. 7"),
        AGGREGATION_OPTION,
    )

    @property
    def client_zo(self) -> bool:
        """Clients always train with ZO updates."""
        return True

    @property
    def server_side_lr(self) -> float:
        """η_s: ``server-lr-split``, or ``lr / τ``."""
        c = self.cfg
        return c.server_lr_split or c.lr / c.server_steps

    def begin_round(self, cohort: list[int]) -> None:
        """A copy of the server-side model per cohort member."""
        self.copies = {pid: copy_model(self.server_model) for pid in cohort}

    def server_iteration(self, batches: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> dict:
        """τ ZO steps of each client's copy on its ``h``; then its loss differences (eq. 6)."""
        c, feedback = self.cfg, {}
        for pid in sorted(batches):
            x, y = batches[pid]
            for _ in range(c.server_steps):
                seeds = [zo_seed(c.seed, STREAM_ZO_SERVER, pid, self.server_updates, p) for p in range(c.perturbations)]
                loss = zo_server_step(self.copies[pid], x, y, seeds, c.zo_smoothing, self.server_side_lr, c.clip_norm)
                self.check_loss(torch.tensor(loss), "server ZO step")
                self.server_updates += 1
            feedback[pid] = self.feedback(self.copies[pid], y, None, pid)
        return feedback

    def collect_client_models(self, uploads: Mapping[int, dict[str, torch.Tensor]]) -> None:
        """Fed server, eq. 7: ``w ← w + η_g·(avg_k w_k − w)``."""
        if uploads:
            self.client_model.load_state_dict(self._step_towards(self.client_model, uploads))

    def end_round(self, cohort: list[int]) -> None:
        """Split server, eq. 7, on the copies of the clients that finished."""
        if cohort:
            states = {p: self.copies[p].state_dict() for p in cohort}
            self.server_model.load_state_dict(self._step_towards(self.server_model, states))
        self.copies = {}

    def _step_towards(self, model: nn.Module, states: Mapping[int, dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
        avg = {k: self.on_device(v) for k, v in average_uploads(states, self.aggregation_weight).items()}
        eta = self.cfg.server_lr
        return {k: v + eta * (avg[k] - v) if torch.is_floating_point(v) else avg[k]
                for k, v in model.state_dict().items()}
