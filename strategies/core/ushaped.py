"""The label-private (U-shaped) split: the client keeps the last blocks, the loss and the labels.

With ``cut-layers=c1,c2`` a client holds the head, blocks ``[0, c1)``, and
the tail, blocks ``[c2, L)`` with the loss and the labels; the server holds
the middle, ``[c1, c2)`` (Vepakomma et al. 2018, "Split learning for health",
arXiv:1812.00564, the "U-shaped configuration without label sharing"; SLPerf's
U-shaped split). One local iteration is four legs, each a protocol message
already in :mod:`fl_app.protocol`:

1. the head's activations at ``c1`` go up: ``train.forward`` of own data on the
   own slot with ``label_slot`` (its reply carries no labels);
2. the server runs the middle and sends its output at ``c2`` down to the tail:
   ``train.forward`` with ``loss`` on the relayed input, slot :data:`~fl_app.protocol.TAIL_SLOT`,
   blocks ``[c2, L)``, scored against the labels of the own slot's batch, which
   never leave the node; the tail steps at once;
3. its reply carries the gradient at ``c2`` up (and the loss value);
4. the server back-propagates it through the middle, steps, and sends the
   gradient at ``c1`` down: the head's ``train.backward``.

The server's side of leg 2-3 is one hook, :meth:`LabelPrivateSplit.client_losses`:
per client, the loss of the server's outputs, computed on the server from the
labels in a prefix split, and by the clients' tails (one parallel exchange)
in a U-shaped one, where it is the surrogate :func:`surrogate_loss` whose
gradient w.r.t. the outputs is exactly the one the client returned. Every
strategy that supports the U-shaped form expresses its server step through it
(:mod:`strategies.algorithms.splitfed`, :mod:`strategies.algorithms.psl`).
The tail is aggregated wherever the head is: the client-side model of a
U-shaped run is head and tail together (:meth:`LabelPrivateSplit.client_part`);
the round's start weights are split between the head's first forward and the
tail's first exchange (:meth:`LabelPrivateSplit.round_start`), and the tails
are uploaded with the heads (:meth:`LabelPrivateSplit.with_tails`). Every leg
is timed and metered by the shared request builder.

A strategy declares whether it has a U-shaped form with the class attribute
``ushaped_refusal``: ``""`` when it has, else the one-line reason it does not;
:func:`check_cut_layers` (called by ``plan_run``) refuses the others.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from flwr.app import ArrayRecord
from torch import nn

from fl_app import protocol as P
from fl_app.run.config import RunConfig
from fl_app.run.errors import ConfigError
from fl_app.models import BlockModel, split_model
from fl_app.learning.task import Task
from strategies.core.base import SFLStrategy

#: The reason a strategy class that declares nothing gives (a plugin, say).
UNDECLARED = "it declares no label-private form (a class attribute ushaped_refusal = '' would say it has one)"


def check_cut_layers(cls: type, cfg: RunConfig, task: Task) -> None:
    """Refuse ``cut-layers`` where it cannot run: a strategy without a U-shaped form, or cuts out of the model.

    Raises:
        ConfigError: ``label-defence`` without ``cut-layers``; ``label-noise`` without ``label-defence=iso``
            or ``iso`` without it; ``label-power`` and ``marvell`` likewise; ``label-defence-tail=perturbed``
            without a defence; the strategy's ``ushaped_refusal`` is not
            empty; ``c2 > L - 1`` (the tail must hold at least the last block; ``1 <= c1 < c2`` is the key's
            own check); zeroth-order clients or server. One line.
    """
    defence, t, s = cfg.get("label-defence"), float(cfg.get("label-noise")), float(cfg.get("label-power"))
    if (defence == "iso") != (t > 0):
        raise ConfigError(f"label-noise={t:g} goes with label-defence=iso, and iso needs label-noise > 0 "
                          f"(got label-defence={defence})")
    if (defence == "marvell") != (s > 0):
        raise ConfigError(f"label-power={s:g} goes with label-defence=marvell, and marvell needs label-power > 0 "
                          f"(got label-defence={defence})")
    if cfg.get("label-defence-tail") != "exact" and defence == "none":
        raise ConfigError(f"label-defence-tail={cfg.get('label-defence-tail')} needs a label-defence "
                          "(max-norm, iso or marvell)")
    cuts = cfg.cuts
    if cuts is None:
        if cfg.get("label-defence") != "none":
            raise ConfigError(f"label-defence={cfg.get('label-defence')} needs a U-shaped split (cut-layers=c1,c2): "
                              "in a prefix split the labels go to the server")
        return
    reason = getattr(cls, "ushaped_refusal", UNDECLARED)
    if reason:
        raise ConfigError(f"cut-layers does not apply to {cls.name}: {reason}")
    n = len(task.build_model())
    if cuts[1] > n - 1:
        raise ConfigError(f"cut-layers={cuts[0]},{cuts[1]} out of range for {task.model_name} ({n} blocks): "
                          f"need 1 <= c1 < c2 <= {n - 1}, so that the client's tail [c2, {n}) holds the last block")
    if cfg.get("client-optimizer") == "zo" or cfg.get("server-optimizer") == "zo":
        raise ConfigError("cut-layers needs first-order clients and server: a zeroth-order client returns loss "
                          "differences computed on the server from the labels (client/server-optimizer=zo)")


def surrogate_loss(outputs: torch.Tensor, grad: torch.Tensor, value: float) -> torch.Tensor:
    """A scalar equal to ``value`` whose gradient w.r.t. ``outputs`` is exactly ``grad``.

    ``⟨outputs, grad⟩ − ⟨outputs, grad⟩.detach() + value``: back-propagating it
    through the server's blocks gives the parameter and input gradients that
    back-propagating the client's loss would (the chain rule at ``c2``).

    Args:
        outputs: the server's output ``[B, ...]`` (in the autograd graph).
        grad: the client's ``∂L/∂outputs``, same shape.
        value: the client's loss (its finiteness is what the server's step checks).
    """
    inner = (outputs * grad).sum()
    return inner - inner.detach() + value


def split_weights(record: ArrayRecord, tail_keys: set[str]) -> tuple[ArrayRecord, ArrayRecord]:
    """``(head, tail)``: the arrays of ``record`` not in ``tail_keys``, and those in it."""
    head = {k: record[k] for k in record.keys() if k not in tail_keys}
    tail = {k: record[k] for k in record.keys() if k in tail_keys}
    return P.array_record(head), P.array_record(tail)


class LabelPrivateSplit(SFLStrategy):
    """The U-shaped hooks of the split strategies (see the module docstring); a prefix split passes through."""

    cut: int
    model: BlockModel

    def initialize(self) -> None:
        """No tail start weights yet (see :meth:`round_start`)."""
        super().initialize()
        #: the tail's start weights of the round, and the cohort members that have not had them yet
        self.tail_start: ArrayRecord | None = None
        self.tail_fresh: set[int] = set()

    @property
    def cuts(self) -> tuple[int, int] | None:
        """``(c1, c2)`` of a U-shaped run, None for a prefix split."""
        return self.cfg.cuts

    @property
    def label_slot(self) -> str:
        """Where a client keeps its labels: its own slot in a U-shaped run; ``""`` (they go up) otherwise."""
        return P.OWN_SLOT if self.cuts else ""

    def split_parts(self, model: BlockModel) -> tuple[BlockModel, BlockModel]:
        """``(client part, server part)`` of ``model`` (sharing its parameters): head and tail against the
        middle in a U-shaped run, else :func:`~fl_app.models.split_model` at the cut."""
        if not self.cuts:
            return split_model(model, self.cut)
        c1, c2 = self.cuts
        items = list(model.blocks.items())
        return BlockModel(items[:c1] + items[c2:], name=f"{model.model_name}[client]"), model.segment(c1, c2)

    def client_part(self, model: BlockModel) -> BlockModel:
        """The client-side blocks of ``model`` (:meth:`split_parts`)."""
        return self.split_parts(model)[0]

    def client_losses(self, outputs: Mapping[int, torch.Tensor],
                      labels: Mapping[int, torch.Tensor | None]) -> dict[int, torch.Tensor]:
        """Each client's mean loss on the server's outputs ``pid -> [B_k, ...]``.

        A prefix split: the cross-entropy against ``labels``. A U-shaped one:
        the outputs go to the clients' tails in one exchange (legs 2-3), and
        each loss is the :func:`surrogate_loss` of the gradient its client
        returned; a client that fails is left out (it is excluded, the server
        takes no step for it).
        """
        if not self.cuts:
            return {p: nn.functional.cross_entropy(z, labels[p]) for p, z in outputs.items()}
        c2, n = self.cuts[1], self.costs.num_blocks
        requests = {}
        for pid in sorted(outputs):
            z = outputs[pid].detach()
            config = P.ForwardConfig(slot=P.TAIL_SLOT, start=c2, end=n, batch_size=int(z.shape[0]), loss=True,
                                     label_slot=P.OWN_SLOT, **self.optimizer_config())
            weights = self.tail_start if pid in self.tail_fresh else None
            self.tail_fresh.discard(pid)
            requests[pid] = self.requests.forward(config, weights=weights,
                                                  relayed=P.record_dict({P.ACTIVATIONS: P.tensor_record("x", z.cpu())}))
        out = {}
        for pid, content in self.gather(requests).items():
            grad = self.on_device(P.record_tensor(P.array_of(content, P.GRADIENT), "g"))
            out[pid] = surrogate_loss(outputs[pid], grad, P.replies.loss(content))
        return out

    def batch_loss(self, pids: list[int], sizes: list[int]) -> Any:
        """The loss function of one server step on the cohort's concatenated outputs (rows in ``pids``
        order, ``sizes`` each): None in a prefix split (the cross-entropy over the concatenated batch);
        U-shaped, ``(outputs, _) -> Σ_k (B_k / ΣB) L_k`` over the clients whose tails answered."""
        if not self.cuts:
            return None
        total = float(sum(sizes))

        def loss(outputs: torch.Tensor, _labels: object) -> torch.Tensor:
            parts = dict(zip(pids, outputs.split(sizes)))
            got = self.client_losses(parts, {})
            if not got:  # every tail failed (their clients are excluded): a step of zero gradient
                return outputs.sum() * 0.0
            return sum(got[p] * (parts[p].shape[0] / total) for p in sorted(got))
        return loss

    def round_start(self, cohort: list[int]) -> ArrayRecord | None:
        """The round's start weights for the heads' first forward (``start_weights``); U-shaped, the tail's
        part of them waits for each cohort member's first tail exchange."""
        start = self.start_weights()
        self.tail_start, self.tail_fresh = None, set()
        if start is None or not self.cuts or getattr(self, "sealed", None) is not None:  # a bundle: whole
            return start
        tail_keys = set(self.model.segment(self.cuts[1], self.costs.num_blocks).state_dict())
        start, self.tail_start = split_weights(start, tail_keys)
        self.tail_fresh = set(cohort)
        return start

    def with_tails(self, uploads: Mapping[int, dict[str, torch.Tensor]]) -> dict[int, dict[str, torch.Tensor]]:
        """The clients' uploaded heads, with their tails fetched and merged in a U-shaped run (a
        ``train.step`` of the tail slot that returns its weights; timed and metered as the head's upload)."""
        self.tail_start, self.tail_fresh = None, set()  # the round is over
        if not self.cuts or not uploads:
            return dict(uploads)
        c2, n = self.cuts[1], self.costs.num_blocks
        config = P.StepConfig(slot=P.TAIL_SLOT, start=c2, end=n, return_weights=True, **self.optimizer_config())
        upload = getattr(self, "uploads_models", True)
        replies = self.gather({pid: self.requests.step(config, upload=upload) for pid in sorted(uploads)})
        return {pid: {**uploads[pid], **self.weights_of(content)[0]} for pid, content in replies.items()}
