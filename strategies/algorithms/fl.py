"""Federated-learning baselines on the full model: FedAvg, FedBuff, CA²FL.

Clients train the whole model locally through ``train.fit`` (E iterations
of batch B), on the same clock and device profiles as the SFL strategies,
so time-to-accuracy comparisons are meaningful. The update rules are the
pure functions of :mod:`strategies.core.aggregation`.
"""

from __future__ import annotations

import logging

import torch
from flwr.app import ArrayRecord

from fl_app import protocol as P
from fl_app.run.config import RunConfig
from fl_app.models import BlockModel
from fl_app.run.options import Option
from strategies.core.aggregation import (
    AGGREGATION_OPTION,
    SERVER_LR_OPTION,
    ModelAggregation,
    ca2fl_step,
    fedbuff_step,
    staleness_weight,
    state_delta,
)
from strategies.core.base import SFLStrategy
from strategies.core.loops import AsyncStrategy, SyncStrategy
from strategies.core.dispatcher import Reply, Request
from strategies.core.registry import register
from strategies.core.requests import optimizer_settings

log = logging.getLogger("sflower")


class FullModelMixin(SFLStrategy):
    """The global model trained whole on clients (no split)."""

    ushaped_refusal = "it trains the whole model on the client (train.fit): no cut, and the labels never leave it"
    model: BlockModel

    @classmethod
    def weights_only_links(cls, cfg: RunConfig) -> frozenset[str]:
        """Both: the model goes down and comes back up, nothing else."""
        return frozenset({"up", "down"})

    def initialize(self) -> None:
        """Build the global model from the run's seed."""
        super().initialize()
        self.model = self.task.build_model()

    def global_model(self) -> BlockModel:
        """The global model."""
        return self.model

    def fit_request(self, weights: ArrayRecord, pid: int) -> Request:
        """``train.fit``: E local iterations (:meth:`local_steps` of ``pid``) from ``weights`` (encoded once
        by the caller); timed as E·B forward+backward passes."""
        c = self.cfg
        config = P.FitConfig(local_iterations=self.local_steps(pid), batch_size=c.batch_size,
                             **optimizer_settings(c, c.client_lr or c.lr))
        return self.requests.fit(config, weights)


@register
class FedAvg(FullModelMixin, SyncStrategy):
    """FedAvg (McMahan et al. 2017): C clients per round, average weighted by ``|D_k|``."""

    name = "fedavg"
    options = (AGGREGATION_OPTION,)

    def run_round(self, cohort: list[int]) -> None:
        """Local training on the cohort, then the weighted average."""
        start = P.state_record(self.model.state_dict())
        replies = self.gather({pid: self.fit_request(start, pid) for pid in cohort})
        if replies:
            states = {p: P.record_state(P.array_of(c, P.WEIGHTS)) for p, c in replies.items()}
            self.model.load_state_dict(self.aggregate_uploads(states))
        self.server_updates += 1


class BufferedFL(FullModelMixin, AsyncStrategy):
    """Asynchronous buffered FL: C clients train at once; K updates make a global iteration.

    Hook: :meth:`apply_buffer` turns the buffered ``(pid, Δ, staleness)``
    into the new global state. It combines updates, not models, so
    :meth:`~strategies.core.aggregation.ModelAggregation.aggregate_models` is
    not called (its docstring says why); override :meth:`apply_buffer` instead.
    """

    options = (
        SERVER_LR_OPTION,
        Option("fl-buffer", 0, "buffer size K (0 = concurrency)", at_least=0, source="FedBuff Algorithm 1"),
    )

    def initialize(self) -> None:
        """Version counter, buffer, snapshots of the models clients started from."""
        super().initialize()
        if type(self).aggregate_models is not ModelAggregation.aggregate_models:
            log.warning("%s: aggregate_models is overridden but never called: buffered FL combines updates in "
                        "apply_buffer; override that instead", self.name)
        self.k = self.cfg.fl_buffer or self.cfg.concurrency
        self.version = 0
        #: version -> (state, its encoded ArrayRecord) of the models clients started from
        self.snapshots: dict[int, tuple[dict[str, torch.Tensor], ArrayRecord]] = {}
        self.started: dict[int, int] = {}
        self.buffer: list[tuple[int, dict[str, torch.Tensor], int]] = []

    def launch(self, pid: int) -> None:
        """Send the current global model for E local iterations."""
        if self.version not in self.snapshots:
            state = {k: v.clone() for k, v in self.model.state_dict().items()}
            self.snapshots[self.version] = (state, P.state_record(state))
        self.started[pid] = self.version
        self.send(pid, self.fit_request(self.snapshots[self.version][1], pid))

    def on_reply(self, reply: Reply) -> None:
        """Buffer ``Δ_k = w_k − w_start``; flush K updates into the global model."""
        pid = reply.pid
        v0 = self.started.pop(pid)
        new = P.record_state(P.array_of(reply.content, P.WEIGHTS))
        self.buffer.append((pid, state_delta(new, self.snapshots[v0][0]), self.version - v0))
        self._forget_snapshots()
        if len(self.buffer) >= self.k:
            self.model.load_state_dict(self.apply_buffer(self.model.state_dict(), self.buffer))
            self.buffer = []
            self.version += 1
            self.server_updates += 1
            self.end_global_iteration()
        self.refill()

    def on_failure(self, partition_id: int, action: str, reason: str) -> None:
        """Forget the failed client's start version."""
        self.started.pop(partition_id, None)
        self._forget_snapshots()

    def _forget_snapshots(self) -> None:
        live = set(self.started.values()) | {self.version}
        for v in [v for v in self.snapshots if v not in live]:
            del self.snapshots[v]

    def apply_buffer(self, state: dict[str, torch.Tensor],
                     buffer: list[tuple[int, dict[str, torch.Tensor], int]]) -> dict[str, torch.Tensor]:
        """New global state from the buffered updates."""
        raise NotImplementedError


@register
class FedBuff(BufferedFL):
    """FedBuff (Nguyen et al. 2022): ``w ← w + η_g · mean_k s(τ_k) Δ_k`` over K buffered updates."""

    name = "fedbuff"
    options = (Option("staleness", "none", "staleness weight s(τ)", ("none", "polynomial"), source="FedBuff §5"),)

    def apply_buffer(self, state, buffer):
        """FedBuff's server step (``server-lr`` = η_g, ``staleness`` = s)."""
        weights = [staleness_weight(tau, self.cfg.staleness) for _, _, tau in buffer]
        return fedbuff_step(state, [d for _, d, _ in buffer], weights, self.cfg.server_lr)


@register
class CA2FL(BufferedFL):
    """CA²FL (Wang et al. 2023): buffered updates calibrated by each client's cached latest update."""

    name = "ca2fl"

    def initialize(self) -> None:
        """Empty cache ``h_i = 0``."""
        super().initialize()
        self.cache: dict[int, dict[str, torch.Tensor]] = {}

    def apply_buffer(self, state, buffer):
        """CA²FL's calibrated server step (see :func:`strategies.core.aggregation.ca2fl_step`)."""
        new, self.cache = ca2fl_step(state, self.cache, [(p, d) for p, d, _ in buffer],
                                     self.cfg.num_clients, self.cfg.server_lr)
        return new
