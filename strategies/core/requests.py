"""Requests with their compute and transfer figures: the protocol's typed content plus the costs.

:class:`RequestBuilder` turns a typed config (:mod:`fl_app.protocol.configs`)
into a :class:`~strategies.core.dispatcher.Request`: the message content from
:mod:`fl_app.protocol.requests`, and the FLOPs and bits the virtual clock
charges, from :class:`~fl_app.learning.costs.BlockCosts`. Every strategy builds its
requests here, the split ones through :class:`~strategies.core.split.SplitMixin`'s
shorthands, RingSFL's relay hops directly. :func:`optimizer_settings` is
the one reading of the run's optimizer keys.
"""

from __future__ import annotations

from typing import Any

import torch
from flwr.app import ArrayRecord, RecordDict

from fl_app import protocol as P
from fl_app.run.config import RunConfig
from fl_app.learning.costs import LABEL_BITS, BlockCosts
from strategies.core.dispatcher import Request


def optimizer_settings(cfg: RunConfig, lr: float, *, clip_norm: float | None = None) -> dict[str, Any]:
    """The :class:`~fl_app.protocol.OptimizerConfig` fields of a training message: the run's momentum,
    weight decay, gradient clip (``clip-norm``, or ``clip_norm`` when given) and optimizer, at ``lr``."""
    return {"lr": lr, "momentum": cfg.momentum, "weight_decay": cfg.weight_decay,
            "clip_norm": cfg.clip_norm if clip_norm is None else clip_norm, "optimizer": cfg.optimizer}


class RequestBuilder:
    """Typed configs to timed requests (see the module docstring).

    Args:
        costs: compute and transfer figures of any block range.
        cut: the run's cut layer (a config's ``end`` 0).
    """

    def __init__(self, costs: BlockCosts, cut: int) -> None:
        self.costs = costs
        self.cut = cut

    def forward(self, config: P.ForwardConfig, *, weights: ArrayRecord | None = None,
                relayed: RecordDict | None = None, tag: object = None, timed_end: int | None = None,
                d2d: bool = False) -> Request:
        """``train.forward`` (:func:`fl_app.protocol.requests.forward`).

        Timed as the range's forward FLOPs (and backward with ``loss``) plus
        what the reply sends: the range's activations and labels, or with
        ``loss`` the input gradient of a range not starting at 0.
        ``timed_end`` charges them as if the range ended there (S²FL's
        adaptive cut changes time only). With ``d2d`` (a relay hop) the reply
        goes to the next node over a device-to-device link and a relayed
        input came the same way (no download).
        """
        plan = config.plan(self.cut)
        timed = plan.end if timed_end is None else timed_end
        flops = self.costs.flops(plan.start, timed, plan.batch_size, backward=plan.loss)
        if not plan.loss:
            bits = self.costs.activation_bits(timed, plan.batch_size, labels=not plan.private_labels)
        elif plan.replies_input_gradient:
            bits = self.costs.activation_bits(plan.start, plan.batch_size, labels=False)
        else:
            bits = 0.0
        content = P.requests.forward(config, weights=weights, relayed=relayed)
        if d2d:
            return Request(P.TRAIN_FORWARD, content, flops, bits_down=None if relayed is None else 0.0,
                           tag=tag, d2d_bits=bits)
        return Request(P.TRAIN_FORWARD, content, flops, bits, tag=tag)

    def backward(self, config: P.BackwardConfig, gradient: torch.Tensor | RecordDict, *, start: int = 0,
                 end: int = 0, batch: int | None = None, upload: bool = True, tag: object = None,
                 timed_end: int | None = None, d2d: bool = False) -> Request:
        """``train.backward`` of ``gradient`` (of ``batch`` rows, default its own) through the slot's blocks
        ``[start, end)`` (``end`` 0: the cut, :func:`~fl_app.protocol.configs.range_end`).

        Timed as the range's backward FLOPs plus, by ``config.next``, the
        piggybacked forward and its activations, or the slot's weights
        (timed and metered only with ``upload``; False: a copy the server
        needs only for evaluation). With ``d2d`` (a relay hop: ``gradient``
        is the next hop's reply) the input gradient goes to the previous
        node over a device-to-device link, and nothing is downloaded.
        """
        end = P.range_end(end, self.cut)
        timed = end if timed_end is None else timed_end
        batch = _batch(gradient) if batch is None else batch
        flops = self.costs.flops(start, timed, batch, forward=False, backward=True)
        content = P.requests.backward(config, gradient)
        if d2d:
            bits = self.costs.activation_bits(start, batch, labels=False) if start > 0 else 0.0
            return Request(P.TRAIN_BACKWARD, content, flops, bits_down=0.0, tag=tag, d2d_bits=bits)
        bits = 0.0
        if config.next == P.NEXT_FORWARD:
            flops += self.costs.flops(start, timed, config.batch_size)
            bits = self.costs.activation_bits(timed, config.batch_size, labels=not config.label_slot)
        elif config.next == P.NEXT_WEIGHTS and upload:
            bits = self.costs.param_bits(start, end)
        return Request(P.TRAIN_BACKWARD, content, flops, bits, tag=tag, metered=upload or config.next != P.NEXT_WEIGHTS)

    def step(self, config: P.StepConfig, *, upload: bool = True, tag: object = None) -> Request:
        """``train.step``; with ``return_weights`` timed as the upload of the stepped blocks (``[start, end)``,
        end 0: the cut), or, with ``upload=False``, neither timed nor metered."""
        end = P.range_end(config.end, self.cut)
        bits = self.costs.param_bits(config.start, end) if config.return_weights and upload else 0.0
        return Request(P.TRAIN_STEP, P.requests.step(config), 0.0, bits, tag=tag, metered=upload)

    def fit(self, config: P.FitConfig, weights: ArrayRecord) -> Request:
        """``train.fit``: ``local_iterations`` full-model forward+backward passes, then the model's upload."""
        n = self.costs.num_blocks
        flops = config.local_iterations * self.costs.flops(0, n, config.batch_size, forward=True, backward=True)
        return Request(P.TRAIN_FIT, P.requests.fit(config, weights), flops, self.costs.param_bits(0, n))

    def zo_bits(self, end: int, batch: int, perturbations: int) -> float:
        """Upload of a ZO forward: ``2P + 1`` embeddings of ``batch`` samples, and their labels once."""
        if self.costs.up is None:
            per = self.costs.activation_bits(end, batch, labels=False)
            return (2 * perturbations + 1) * per + LABEL_BITS * batch
        # encoded as sent: the activations, then h+ and h- as [P, batch, ...] stacks
        return self.costs.activation_bits(end, batch) + 2 * self.costs.stack_bits(end, batch, perturbations)

    def zo_forward(self, config: P.ZOForwardConfig, weights: ArrayRecord | None = None,
                   tag: object = None) -> Request:
        """``train.zo_forward``: ``2P + 1`` forward passes of blocks ``[0, end)``, their upload."""
        end, p = P.range_end(config.end, self.cut), config.perturbations
        flops = (2 * p + 1) * self.costs.flops(0, end, config.batch_size)
        return Request(P.TRAIN_ZO_FORWARD, P.requests.zo_forward(config, weights), flops,
                       self.zo_bits(end, config.batch_size, p), tag=tag)

    def zo_update(self, config: P.ZOUpdateConfig, perturbations: int, *, end: int = 0,
                  upload: bool = True, tag: object = None) -> Request:
        """``train.zo_update`` (``32·P`` bits down; no backward pass), timed by ``config.next`` as
        :meth:`backward` with a piggybacked ``train.zo_forward`` of ``perturbations`` pairs."""
        end = P.range_end(end, self.cut)
        flops, bits = 0.0, 0.0
        if config.next == P.NEXT_FORWARD:
            flops = (2 * perturbations + 1) * self.costs.flops(0, end, config.batch_size)
            bits = self.zo_bits(end, config.batch_size, perturbations)
        elif config.next == P.NEXT_WEIGHTS and upload:
            bits = self.costs.param_bits(0, end)
        return Request(P.TRAIN_ZO_UPDATE, P.requests.zo_update(config), flops, bits,
                       bits_down=32.0 * len(config.diffs), tag=tag, metered=upload or config.next != P.NEXT_WEIGHTS)


def _batch(gradient: torch.Tensor | RecordDict) -> int:
    """The batch size of a gradient tensor, or of the relayed ``gradient`` record of a reply."""
    if isinstance(gradient, RecordDict):
        return int(P.array_of(gradient, P.GRADIENT)["g"].shape[0])
    return int(gradient.shape[0])
