"""Split-learning building blocks shared by every SFL strategy.

:class:`SplitMixin` holds the global model, its split at the cut layer, and
builds the ``train.forward`` / ``train.backward`` requests on any block
range and model slot from the run's settings, on the shared builders
(:mod:`strategies.core.requests`).

:class:`SyncSplitStrategy` is the synchronous SFL round shared by
SplitFed-V1/V2, MiniBatch-SFL, vanilla SL, PSL and the like: start the
cohort (from the current client-side model, or from each client's own),
run E local iterations (one activation exchange each, the next forward
piggybacked on the backward), collect the client-side models. Subclasses
supply the server side through :meth:`SyncSplitStrategy.server_iteration`.

:class:`PerClientModels` keeps a client-side model per client, never
averaged (the PSL family), and evaluates each as ``client_k ∘ server``.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from flwr.app import ArrayRecord, RecordDict
from torch import nn

from fl_app import protocol as P
from fl_app.run.config import RunConfig
from fl_app.run.options import Option
from fl_app.run.errors import ConfigError
from fl_app.models import BlockModel
from fl_app.learning.task import Task
from fl_app.learning.training import make_sgd
from strategies.core.loops import SyncStrategy
from strategies.core.dispatcher import Request
from strategies.core.hidden import HiddenClientModels, SealedModels
from strategies.core.requests import optimizer_settings
from strategies.core.server_compute import ServerCompute
from strategies.core.server_step import LossFn, zo_step
from strategies.core.ushaped import LabelPrivateSplit


#: Options of every strategy whose clients can train with zeroth-order updates (MU-SplitFed, docs/explanation/design.md §7).
ZO_OPTIONS = (
    Option("perturbations", 1, "ZO: P perturbation pairs per client step", at_least=1, source="MU-SplitFed eq. 3"),
    Option("zo-smoothing", 0.001, "ZO: smoothing parameter μ", above=0, source="MU-SplitFed eq. 3"),
    Option("zo-clip", 10.0, "ZO: clip the norm of every ZO estimate, client and server side (0 = none, as the "
           "paper, and as preset=mu-splitfed; unclipped ZO diverges at the global lr 0.01 and momentum 0.9). "
           "clip-norm clips first-order steps only", at_least=0),
)
#: ``client-optimizer``: ``zo`` gives the ZO baselines of MU-SplitFed (ZO-SplitFed, ZO-GAS).
CLIENT_OPTIMIZER_OPTION = Option("client-optimizer", "sgd", "client-side training: first-order SGD, or zeroth-order "
                                 "(forward passes only; MU-SplitFed's ZO baselines)", ("sgd", "zo"),
                                 source="MU-SplitFed §5")
#: ``server-optimizer``: ``zo`` makes the server side zeroth-order too, as MU-SplitFed §5 defines its baselines.
SERVER_OPTIMIZER_OPTION = Option("server-optimizer", "sgd", "server-side training: first-order SGD, or zeroth-order "
                                 "(ZO-SGD, eq. 5; with client-optimizer=zo: ZO-SplitFed, ZO-GAS as MU-SplitFed §5 "
                                 "defines them)", ("sgd", "zo"), source="MU-SplitFed eq. 5, §5")


@dataclass(frozen=True)
class ZOFeedback:
    """What a ZO client gets back instead of an activation gradient (MU-SplitFed eq. 6).

    Attributes:
        diffs: ``P`` loss differences ``l(h⁺_p) − l(h⁻_p)`` under the server-side model.
    """

    diffs: tuple[float, ...]


def loss_differences(model: nn.Module, plus: torch.Tensor, minus: torch.Tensor, labels: torch.Tensor,
                     loss_fn: LossFn | None = None) -> ZOFeedback:
    """``l(model(h⁺_p), y) − l(model(h⁻_p), y)`` for each of the ``P`` pairs (no gradients).

    Args:
        plus, minus: ``[P, B, ...]`` perturbed embeddings from ``train.zo_forward``.
        labels: int64 ``[B]``.
        loss_fn: ``(logits, labels) -> scalar`` (default: mean cross-entropy).
    """
    fn = loss_fn or nn.functional.cross_entropy
    with torch.no_grad():
        diffs = tuple(float(fn(model(a), labels) - fn(model(b), labels)) for a, b in zip(plus, minus))
    return ZOFeedback(diffs)


class SplitMixin(ServerCompute, HiddenClientModels, LabelPrivateSplit):
    """The global model split at the cut layer (or two: :mod:`strategies.core.ushaped`), and the requests. Hooks:

    - ``server_side_lr``, ``client_side_lr``, ``client_zo``, ``server_zo`` (properties): each side's rate; ZO or not.
    - ``client_losses(outputs, labels)``: each client's loss (U-shaped: ``ushaped_refusal``, the clients' tails)."""

    model: BlockModel
    client_model: BlockModel
    server_model: BlockModel

    @property
    def cut(self) -> int:
        """The cut layer: the client-side model is blocks ``[0, cut)``."""
        return self.task.cut_layer

    def initialize(self) -> None:
        """Build the global model and split it (the parts share parameters)."""
        super().initialize()
        self.model = self.task.build_model()
        if self.device.type != "cpu":
            self.model.to(self.device)
        self.client_model, self.server_model = self.split_parts(self.model)
        #: ``hide-client-models``: the server's blind-relay side (:mod:`strategies.core.hidden`), else None
        self.sealed = SealedModels(self) if self.cfg.get("hide-client-models") else None
        #: ZO clients: pid -> (h⁺, h⁻) of its latest forward, until :meth:`feedback` uses them
        self.zo_pairs: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}

    def global_model(self) -> BlockModel:
        """The full model: client-side ∘ server-side."""
        return self.model

    @property
    def server_side_lr(self) -> float:
        """The server-side model's learning rate: ``server-lr-split``, or ``lr`` when 0."""
        return self.cfg.server_lr_split or self.cfg.lr

    @property
    def client_side_lr(self) -> float:
        """The client-side model's learning rate: ``client-lr``, or ``lr`` when 0 (GAPSL: 0.005 vs 0.01)."""
        return self.cfg.client_lr or self.cfg.lr

    def server_optimizer(self, model: nn.Module) -> torch.optim.Optimizer:
        """The run's optimizer (SGD or AdamW) for a server-side model at :attr:`server_side_lr`."""
        c = self.cfg
        return make_sgd(model, self.server_side_lr, c.momentum, c.weight_decay, kind=c.optimizer)

    @property
    def client_zo(self) -> bool:
        """Whether clients train with zeroth-order updates (``client-optimizer=zo``)."""
        return self.cfg.get("client-optimizer") == "zo"

    @property
    def server_zo(self) -> bool:
        """Whether the server side trains with zeroth-order updates (``server-optimizer=zo``)."""
        return self.cfg.get("server-optimizer") == "zo"

    @classmethod
    def check_config(cls, cfg: RunConfig, task: Task) -> None:
        """A ZO server needs ZO clients: it computes no activation gradient to send.

        Raises:
            ConfigError: ``server-optimizer=zo`` without ``client-optimizer=zo``.
        """
        super().check_config(cfg, task)
        if cfg.get("server-optimizer") == "zo" and cfg.get("client-optimizer") != "zo":
            raise ConfigError("server-optimizer=zo needs client-optimizer=zo (a ZO server computes no "
                              "activation gradient for first-order clients)")

    def zo_server_update(self, model: nn.Module, x: torch.Tensor, y: torch.Tensor, key: int) -> float:
        """One ZO-SGD step of server-side model ``key`` (a client's copy: its partition id) at
        :attr:`server_side_lr` (:func:`~strategies.core.server_step.zo_step`); counts one server update
        and charges its ``2P + 1`` forward passes of ``x`` as server compute.
        Returns the loss before the step; raises ``DivergedError`` when it is not finite."""
        loss = zo_step(model, x, y, self.cfg, key, self.server_updates, self.server_side_lr)
        self.server_updates += 1
        self.charge_server((2 * self.cfg.perturbations + 1) * self.server_flops(x.shape[0], backward=False))
        return loss

    def optimizer_config(self, clip_norm: float | None = None) -> dict[str, Any]:
        """Client optimiser settings (:func:`~strategies.core.requests.optimizer_settings` at :attr:`client_side_lr`)
        sent with training messages; a ZO client's estimate is clipped at ``zo-clip``, not ``clip-norm``."""
        return optimizer_settings(self.cfg, self.client_side_lr, clip_norm=clip_norm)

    def forward_request(self, batch: int, weights: ArrayRecord | None, *, start: int = 0, end: int = 0,
                        slot: str = P.OWN_SLOT, tag: object = None, timed_end: int | None = None) -> Request:
        """``train.forward`` of own data through blocks ``[start, end)`` (``end`` 0: the client part), or a
        ``train.zo_forward`` with ZO clients; ``weights`` (encoded once by the caller), when given, replace
        the slot's; ``timed_end``: charge it as if the range ended there (S²FL's adaptive cut)."""
        end = P.range_end(end, self.cut)
        if self.client_zo:
            c = self.cfg
            config = P.ZOForwardConfig(slot=slot, end=end, batch_size=batch, perturbations=c.perturbations,
                                       smoothing=c.zo_smoothing, **self.optimizer_config(c.zo_clip))
            return self.requests.zo_forward(config, weights, tag=tag)
        config = P.ForwardConfig(slot=slot, start=start, end=end, batch_size=batch, label_slot=self.label_slot,
                                 **self.optimizer_config())
        return self.requests.forward(config, weights=weights, tag=tag, timed_end=timed_end)

    def backward_request(self, grad: torch.Tensor | ZOFeedback, nxt: str, next_batch: int = 0, *, start: int = 0,
                         end: int = 0, slot: str = P.OWN_SLOT, upload: bool = True,
                         tag: object = None, timed_end: int | None = None) -> Request:
        """``train.backward`` of the activation gradient ``grad`` through the slot's blocks ``[start, end)``.

        Args:
            nxt: what the reply carries besides: the next forward (``NEXT_FORWARD``, of ``next_batch``),
                the slot's weights (``NEXT_WEIGHTS``) or nothing more.
            upload: with ``NEXT_WEIGHTS``, whether the algorithm really uploads the model (timed and
                metered); False for a copy the server only needs for evaluation (PSL).
            timed_end: charge the compute and the next activations as if the range ended there.

        A :class:`ZOFeedback` instead of a gradient makes it a ``train.zo_update``
        (``32·P`` bits down, no backward pass).
        """
        if isinstance(grad, ZOFeedback):
            c = self.cfg
            config = P.ZOUpdateConfig(slot=slot, diffs=grad.diffs, smoothing=c.zo_smoothing, next=nxt,
                                      batch_size=next_batch, **self.optimizer_config(c.zo_clip))
            return self.requests.zo_update(config, c.perturbations, end=end, upload=upload, tag=tag)
        config = P.BackwardConfig(slot=slot, next=nxt, batch_size=next_batch, label_slot=self.label_slot,
                                  **self.optimizer_config())
        return self.requests.backward(config, grad, start=start, end=end, upload=upload, tag=tag,
                                      timed_end=timed_end)

    def weights_request(self, *, slot: str = P.OWN_SLOT, upload: bool = True, tag: object = None) -> Request:
        """``train.step`` with nothing accumulated: no step, the reply holds the slot's weights; timed and metered
        as the client-side model's upload, or neither with ``upload=False`` (a copy only evaluation needs)."""
        config = P.StepConfig(slot=slot, return_weights=True, **self.optimizer_config())
        return self.requests.step(config, upload=upload, tag=tag)

    def feedback(self, model: nn.Module, labels: torch.Tensor, grad: torch.Tensor, pid: int,
                 loss_fn: LossFn | None = None) -> torch.Tensor | ZOFeedback:
        """What client ``pid`` gets for its batch: ``grad`` (first-order), or with a ZO client the
        loss differences of its perturbed pairs under ``model`` (the model ``grad`` came from)."""
        if not self.client_zo:
            return grad
        plus, minus = self.zo_pairs.pop(pid)
        # the 2P forward passes of the perturbed pairs are server compute
        self.charge_server(2 * plus.shape[0] * self.server_flops(plus.shape[1], backward=False))
        return loss_differences(model, plus, minus, labels, loss_fn)

    def smashed_of(self, pid: int, content: RecordDict) -> tuple[torch.Tensor, torch.Tensor | None]:
        """``(activations [B, ...] float32, labels [B] int64)`` of a forward reply, on :attr:`device` (labels
        None in a U-shaped run: they stay on the client); with ZO clients, keep its perturbed pairs for
        :meth:`feedback`."""
        if self.client_zo:
            self.zo_pairs[pid] = tuple(self.on_device(t) for t in P.replies.perturbed(content))
        x, y = P.replies.activations(content)
        return self.on_device(x), (None if y is None else self.on_device(y))

class SyncSplitStrategy(SplitMixin, SyncStrategy):
    """A synchronous SFL round; subclasses define the server side.

    Hooks, beside :class:`SplitMixin`'s and :class:`~strategies.core.loops.SyncStrategy`'s
    (:class:`PerClientModels` is the same round with a client-side model per client):

    - ``server_iteration(batches)`` (required): ``pid -> (x, y)`` to ``pid -> gradient`` (or
      :class:`ZOFeedback`; None: the client gets no gradient and takes no step); the shared steps are in
      :mod:`strategies.core.server_step`.
    - ``server_iteration_flops(batches, grads)``: the first-order server FLOPs of that iteration, charged on
      the clock (``server-speed``; default: one forward and backward of each client's batch).
    - ``batch_size_for(pid, cohort)``: each client's batch size (default B).
    - ``begin_round(cohort)``: before the first forward (e.g. copy server models).
    - ``timed_cut(pid)``: the cut a client's work is charged at (S²FL).
    - ``start_weights()``: the client-side weights the round starts from.
    - ``collect_client_models(uploads)``: what to do with the uploaded models (default:
      ``aggregate_models`` of them; override that hook alone to change only how they are combined).
    - ``end_round(cohort)``: after the client-side models are collected.
    - ``next_request(pid, grad, nxt, batch)``: what a client gets after a server iteration.
    - ``uploads_models`` (class attribute): whether the client-side models travel to the server at the
      end of a round.
    """

    #: Whether the client-side models travel to the server at the end of a
    #: round (timed and metered); False for per-client models that only the
    #: server's evaluation needs.
    uploads_models: ClassVar[bool] = True

    def batch_size_for(self, pid: int, cohort: list[int]) -> int:
        """Batch size of ``pid`` this round."""
        return self.cfg.batch_size

    def begin_round(self, cohort: list[int]) -> None:
        """Prepare the server side for a round."""

    def timed_cut(self, pid: int) -> int | None:
        """The cut at which ``pid``'s work is charged this round (None: the real cut)."""
        return None

    def start_weights(self) -> ArrayRecord | None:
        """Weights every cohort member loads first: the current client-side model (encoded once); with
        ``hide-client-models``, the bundle of the last round's sealed uploads (:mod:`strategies.core.hidden`)."""
        if self.sealed is not None:
            return self.sealed.bundle()
        return P.state_record(self.client_model.state_dict())

    def server_iteration(self, batches: dict[int, tuple[torch.Tensor, torch.Tensor]],
                         ) -> dict[int, torch.Tensor | ZOFeedback | None]:
        """Server updates for one local iteration: ``pid -> (x, y)`` to ``pid -> dL/dx``.

        A client mapped to None receives no gradient (GAPSL's unselected
        clients): it takes no step and goes on with its next batch.
        """
        raise NotImplementedError

    def server_iteration_flops(self, batches: Mapping[int, tuple[torch.Tensor, torch.Tensor | None]],
                               grads: Mapping[int, Any]) -> float:
        """FLOPs of the first-order server work of one :meth:`server_iteration` on ``batches`` that returned
        ``grads``, charged as server compute after it (:meth:`serve`).

        Default: one forward and one backward (with the input gradient) of the server-side blocks per
        activation row, which is what SplitFed-V1/V2, MiniBatch-SFL, vanilla SL, PSL and EPSL compute
        (EPSL back-propagates once over all rows too); 0 with a ZO server, whose steps and feedback
        charge themselves (:meth:`zo_server_update`, :meth:`feedback`). S²FL, GAPSL and MU-SplitFed
        override it.
        """
        if self.server_zo:
            return 0.0
        return self.server_flops(sum(x.shape[0] for x, _ in batches.values()))

    def serve(self, batches: dict[int, tuple[torch.Tensor, torch.Tensor | None]],
              ) -> dict[int, torch.Tensor | ZOFeedback | None]:
        """:meth:`server_iteration`, then its FLOPs (:meth:`server_iteration_flops`) charged as server
        compute (:meth:`~strategies.core.server_compute.ServerCompute.charge_server`): every synchronous round runs its
        server side through here."""
        grads = self.server_iteration(batches)
        self.charge_server(self.server_iteration_flops(batches, grads))
        return grads

    def collect_client_models(self, uploads: Mapping[int, dict[str, torch.Tensor]]) -> None:
        """Aggregate the uploaded client-side models (:meth:`aggregate_models`, ascending pid; default the
        eq. 10 weighted mean) into the current one; sealed ones are kept for the clients to average."""
        if self.sealed is not None:
            self.sealed.collect(uploads)
        elif uploads:
            self.client_model.load_state_dict(self.aggregate_uploads(uploads))

    def end_round(self, cohort: list[int]) -> None:
        """Finish the server side of a round (e.g. average server copies)."""

    def next_request(self, pid: int, grad: torch.Tensor | ZOFeedback | None, nxt: str, batch: int) -> Request:
        """What ``pid`` gets after a server iteration: its gradient (or ZO feedback) with ``nxt`` piggybacked;
        with no gradient, only ``nxt``: the next forward, or the client-side weights, with no step."""
        if grad is not None:
            return self.backward_request(grad, nxt, batch, upload=self.uploads_models, timed_end=self.timed_cut(pid))
        if nxt == P.NEXT_FORWARD:
            return self.forward_request(batch, None, timed_end=self.timed_cut(pid))
        return self.weights_request(upload=self.uploads_models)

    def run_round(self, cohort: list[int]) -> None:
        """Forward from the start weights, E exchanges, collect the client-side models.

        Each client makes its own E (:meth:`~strategies.core.base.SFLStrategy.local_steps`):
        with ``local-epochs`` and unequal partitions, a client whose count is
        reached returns its model and leaves the round; the server's later
        iterations see the clients still training.
        """
        sizes = {pid: self.batch_size_for(pid, cohort) for pid in cohort}
        steps = {pid: self.local_steps(pid, sizes[pid]) for pid in cohort}
        self.begin_round(cohort)
        start = self.round_start(cohort)
        replies = self.gather({pid: self.forward_request(sizes[pid], start, timed_end=self.timed_cut(pid))
                               for pid in cohort})
        uploads: dict[int, dict[str, torch.Tensor]] = {}
        done = 0
        while replies:
            grads = self.serve({pid: self.smashed_of(pid, c) for pid, c in replies.items()})
            if self.cuts:  # a client whose tail failed is excluded: it gets nothing more
                grads = {pid: g for pid, g in grads.items() if pid not in self.membership.failed}
            done += 1
            replies = self.gather({pid: self.next_request(pid, g, P.NEXT_FORWARD if done < steps[pid] else
                                                          P.NEXT_WEIGHTS, sizes[pid]) for pid, g in grads.items()})
            uploads.update({pid: self.weights_of(c)[0] for pid, c in replies.items() if done >= steps[pid]})
            replies = {pid: c for pid, c in replies.items() if done < steps[pid]}
        uploads = self.with_tails(uploads)
        self.collect_client_models(uploads)
        self.end_round(sorted(uploads))


class PerClientModels(SyncSplitStrategy):
    """A client-side model per client, never averaged (PSL, EPSL, GAPSL).

    Clients start from the seeded initial weights, which every node builds
    itself, and keep training their own model; no weights are sent. The
    server keeps a copy of each client's latest model, returned (unmetered
    and untimed) at the end of its round, only to evaluate ``client_k ∘
    server``; clients never selected are evaluated with the initial weights.
    """

    uploads_models = False

    def initialize(self) -> None:
        """The initial client-side weights and an empty table of client models."""
        super().initialize()
        self.initial_client_state = {k: v.clone() for k, v in self.client_model.state_dict().items()}
        self.client_states: dict[int, dict[str, torch.Tensor]] = {}

    def start_weights(self) -> ArrayRecord | None:
        """None: each client continues its own model."""
        return None

    def collect_client_models(self, uploads: Mapping[int, dict[str, torch.Tensor]]) -> None:
        """Keep each client's model."""
        self.client_states.update(uploads)

    def evaluation_models(self) -> dict[int, BlockModel]:
        """``client_k ∘ server`` for every live client."""
        out = {}
        for pid in self.live_clients():
            model = copy.deepcopy(self.model)
            client = self.client_part(model)
            client.load_state_dict(self.client_states.get(pid, self.initial_client_state))
            out[pid] = model
        return out


def copy_model(model: BlockModel) -> BlockModel:
    """An independent deep copy of a (server-side) model."""
    return copy.deepcopy(model)
