"""MU-SplitFed: zeroth-order SFL with unbalanced server updates.

Source: the MU-SplitFed paper (Sec. 3, Algorithm 1). Its equations were
lost in extraction; docs/explanation/design.md §7 fixes the standard form used here
(SPSA with directions on the unit sphere, :mod:`fl_app.learning.zo`).

One communication round (global iteration) with the cohort:

* each client runs ``train.zo_forward``: its embedding ``h`` and ``P`` pairs
  ``h(w ± μ u_p)`` of a new batch (eq. 4), forward passes only;
* the split server keeps a copy of the server-side model per client and
  makes ``τ = server-steps`` ZO updates of it on ``h`` (eq. 5), with its own
  random directions and the server learning rate ``η_s`` (default ``η/τ``,
  as the convergence analysis requires), unclipped unless ``zo-clip`` > 0
  (the paper clips nothing);
* it then returns the ``P`` loss differences of the perturbed pairs under the
  updated copy (eq. 6); the client forms the SPSA estimate from its own seeds
  and steps (``train.zo_update``), piggybacking its next ``zo_forward``;
* after E such exchanges (the paper: E = 1) the fed server averages the
  client models and the split server the copies, each with the global
  learning rate ``η_g = server-lr``: ``w ← w + η_g·(avg_k w_k − w)`` (eq. 7;
  the average weighted by ``aggregation``). ``η_g = 1`` is the plain average.
  Corollary 4.4 ties ``η_g`` to ``τ``, but its formula was lost in extraction:
  the MU-SplitFed results page's Table 1 tries ``η_g ∈ {1, τ}``.

At ``τ = 1`` and ``η_g = 1`` this is ZO-SplitFed, the paper's balanced
baseline (Appendix A.2: τ = 1 "represents the balanced update scenario …
combining ZOO with traditional SFL"): ``splitfed-v1 client-optimizer=zo
server-optimizer=zo`` gives bit-identical metrics (a test checks).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from fl_app.run.config import RunConfig
from fl_app.run.options import Option
from strategies.core.aggregation import AGGREGATION_OPTION, SERVER_LR_OPTION
from strategies.core.registry import register
from strategies.core.split import ZO_OPTIONS, SyncSplitStrategy, copy_model


@register
class MUSplitFed(SyncSplitStrategy):
    """MU-SplitFed: ZO clients, τ ZO server updates per exchange, η_g aggregation; learns under preset=mu-splitfed."""

    name = "mu-splitfed"
    ushaped_refusal = ("its clients are zeroth-order and its split server makes tau ZO updates per exchange from "
                       "losses it computes with the labels, without waiting for the clients (MU-SplitFed Sec. 3, "
                       "eq. 5)")
    run_with = "preset=mu-splitfed (the paper's §5 setting, under which it learns: LeNet-5, tau = 2, no clipping)"
    options = (
        Option("server-steps", 1, "τ: ZO updates of a client's server-side copy per exchange", at_least=1,
               source="MU-SplitFed Algorithm 1"),
        *ZO_OPTIONS,
        SERVER_LR_OPTION,
        AGGREGATION_OPTION,
    )

    @property
    def client_zo(self) -> bool:
        """Clients always train with ZO updates."""
        return True

    @classmethod
    def weights_only_links(cls, cfg: RunConfig) -> frozenset[str]:
        """The downlink: ZO clients get loss differences (numbers in a config) and models, no gradient."""
        return frozenset({"down"})

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
        feedback = {}
        for pid in sorted(batches):
            x, y = batches[pid]
            for _ in range(self.cfg.server_steps):
                self.zo_server_update(self.copies[pid], x, y, pid)
            feedback[pid] = self.feedback(self.copies[pid], y, None, pid)
        return feedback

    def server_iteration_flops(self, batches: Mapping[int, tuple[torch.Tensor, torch.Tensor]],
                               grads: Mapping[int, object]) -> float:
        """0: the τ ZO steps (``2P + 1`` server forwards each) and the ``2P`` forwards of each client's loss
        differences charge themselves as server compute where they run
        (:meth:`~strategies.core.split.SplitMixin.zo_server_update`, :meth:`~strategies.core.split.SplitMixin.feedback`)."""
        return 0.0

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
        """``w + η_g·(agg − w)`` per tensor, ``agg`` from :meth:`aggregate_models`; exactly ``agg`` at ``η_g = 1``."""
        avg = {k: self.on_device(v) for k, v in self.aggregate_uploads(states).items()}
        eta = self.cfg.server_lr
        if eta == 1.0:
            return avg
        return {k: v + eta * (avg[k] - v) if torch.is_floating_point(v) else avg[k]
                for k, v in model.state_dict().items()}
