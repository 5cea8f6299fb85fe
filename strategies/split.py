"""Split-learning building blocks shared by every SFL strategy.

:class:`SplitMixin` holds the global model, its split at the cut layer, and
builds the ``train.forward`` / ``train.backward`` requests with their
compute and upload figures. :func:`server_step` is one SGD step of a
server-side model on received activations.

:class:`SyncSplitStrategy` is the synchronous SFL round shared by
SplitFed-V1, MiniBatch-SFL and the like: start the cohort from the current
client-side model, run E local iterations (one activation exchange each,
the next forward piggybacked on the backward), collect and average the
client-side models. Subclasses supply the server side through
:meth:`SyncSplitStrategy.server_iteration`.
"""

from __future__ import annotations

import copy
from collections.abc import Callable

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict
from torch import nn

from fl_app import protocol as P
from fl_app.models import BlockModel, split_model
from fl_app.training import clip_and_step, make_sgd
from strategies.aggregation import weighted_average
from strategies.base import SFLStrategy, SyncStrategy

#: (action, content, flops, bits_up) as :meth:`SFLStrategy.gather` takes it.
Request = tuple[str, RecordDict, float, float]
LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def server_step(model: nn.Module, opt: torch.optim.Optimizer, activations: torch.Tensor,
                labels: torch.Tensor, clip_norm: float, loss_fn: LossFn | None = None,
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """One step of a server-side model on smashed data.

    Args:
        activations: float32 ``[B, ...]`` received from clients.
        labels: int64 ``[B]``.
        loss_fn: ``(logits, labels) -> scalar`` (default: mean cross-entropy).

    Returns:
        ``(grad, loss)``: ``grad`` = dL/d(activations), same shape; the loss
        before the step (detached).
    """
    x = activations.detach().requires_grad_(True)
    logits = model(x)
    loss = (loss_fn or nn.functional.cross_entropy)(logits, labels)
    SFLStrategy.check_loss(loss.detach(), "server step")
    opt.zero_grad(set_to_none=True)
    loss.backward()
    clip_and_step(model, opt, clip_norm)
    return x.grad.detach(), loss.detach()


class SplitMixin(SFLStrategy):
    """The global model split at the cut layer, and the split-learning requests."""

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
        self.client_model, self.server_model = split_model(self.model, self.cut)

    def global_model(self) -> BlockModel:
        """The full model: client-side ∘ server-side."""
        return self.model

    def server_optimizer(self, model: nn.Module) -> torch.optim.SGD:
        """SGD for a server-side model, with the run's lr, momentum and weight decay."""
        c = self.cfg
        return make_sgd(model, c.lr, c.momentum, c.weight_decay)

    def optimizer_config(self) -> dict[str, float]:
        """Client optimiser settings sent with every training message."""
        c = self.cfg
        return {"lr": c.lr, "momentum": c.momentum, "weight-decay": c.weight_decay, "clip-norm": c.clip_norm}

    def forward_request(self, batch: int, weights: ArrayRecord | None) -> Request:
        """``train.forward``: optionally load ``weights`` (encoded once by the caller), run one batch."""
        content = RecordDict({P.CONFIG: ConfigRecord({"batch-size": batch, "cut": self.cut, **self.optimizer_config()})})
        if weights is not None:
            content[P.WEIGHTS] = weights
        return (P.TRAIN_FORWARD, content, self.client_flops(self.cut, batch), self.activation_bits(self.cut, batch))

    def backward_request(self, grad: torch.Tensor, nxt: str, next_batch: int = 0) -> Request:
        """``train.backward`` with the activation gradient; ``nxt`` says what to return."""
        batch = int(grad.shape[0])
        flops = self.client_flops(self.cut, batch, forward=False, backward=True)
        bits = 0.0
        if nxt == P.NEXT_FORWARD:
            flops += self.client_flops(self.cut, next_batch)
            bits = self.activation_bits(self.cut, next_batch)
        elif nxt == P.NEXT_WEIGHTS:
            bits = self.model_bits(0, self.cut)
        config = ConfigRecord({"next": nxt, "batch-size": next_batch, **self.optimizer_config()})
        content = RecordDict({P.GRADIENT: P.tensor_record("g", grad), P.CONFIG: config})
        return (P.TRAIN_BACKWARD, content, flops, bits)

    @staticmethod
    def activations_of(content: RecordDict) -> tuple[torch.Tensor, torch.Tensor]:
        """``(activations [B, ...] float32, labels [B] int64)`` of a forward reply."""
        return (P.record_tensor(content.array_records[P.ACTIVATIONS], "x"),
                P.record_tensor(content.array_records[P.LABELS], "y"))

    @staticmethod
    def weights_of(content: RecordDict) -> tuple[dict[str, torch.Tensor], int]:
        """``(state_dict, num_examples)`` of a weights reply."""
        return (P.record_state(content.array_records[P.WEIGHTS]),
                int(content.config_records[P.INFO]["num-examples"]))


class SyncSplitStrategy(SplitMixin, SyncStrategy):
    """A synchronous SFL round; subclasses define the server side.

    Hooks:
        :meth:`batch_size_for`: each client's batch size (default B).
        :meth:`begin_round`: before the first forward (e.g. copy server models).
        :meth:`server_iteration`: activations of the cohort -> gradients.
        :meth:`end_round`: after the client-side models are averaged.
    """

    def batch_size_for(self, pid: int, cohort: list[int]) -> int:
        """Batch size of ``pid`` this round."""
        return self.cfg.batch_size

    def begin_round(self, cohort: list[int]) -> None:
        """Prepare the server side for a round."""

    def server_iteration(self, batches: dict[int, tuple[torch.Tensor, torch.Tensor]]) -> dict[int, torch.Tensor]:
        """Server updates for one local iteration: ``pid -> (x, y)`` to ``pid -> dL/dx``."""
        raise NotImplementedError

    def end_round(self, cohort: list[int]) -> None:
        """Finish the server side of a round (e.g. average server copies)."""

    def run_round(self, cohort: list[int]) -> None:
        """Forward from the current client model, E exchanges, average the uploads."""
        sizes = {pid: self.batch_size_for(pid, cohort) for pid in cohort}
        self.begin_round(cohort)
        start = P.state_record(self.client_model.state_dict())
        replies = self.gather({pid: self.forward_request(sizes[pid], start) for pid in cohort})
        local = self.cfg.local_iterations
        for e in range(local):
            grads = self.server_iteration({pid: self.activations_of(c) for pid, c in replies.items()})
            nxt = P.NEXT_FORWARD if e < local - 1 else P.NEXT_WEIGHTS
            replies = self.gather({pid: self.backward_request(g, nxt, sizes[pid]) for pid, g in grads.items()})
        uploads = {pid: self.weights_of(c)[0] for pid, c in replies.items()}
        if uploads:
            pids = sorted(uploads)
            avg = weighted_average([uploads[p] for p in pids], [self.aggregation_weight(p) for p in pids])
            self.client_model.load_state_dict(avg)
        self.end_round(sorted(uploads))


def copy_model(model: BlockModel) -> BlockModel:
    """An independent deep copy of a (server-side) model."""
    return copy.deepcopy(model)
