"""The ClientApp's model slots: a node's named models (weights, optimizer, accumulator, last batch).

A slot (:class:`Slot`) is a view of the ``slot.<name>.*`` records of a node's
``context.state`` (the layout: :mod:`fl_app.client.state`): the node's own
client-side model (:data:`fl_app.protocol.OWN_SLOT`), or a segment it trains
for another client (``relay:<origin>``). It builds its model from the stored
weights, runs the training forward pass under the stored dropout seed, and
applies gradients: stepped at once, or accumulated (weighted) for a later
``train.step``.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fl_app import protocol as P
from fl_app.client.hidden import bundle_slots
from fl_app.client.state import MODEL_PARTS, slot_key
from fl_app.privacy.hidden import is_bundle
from fl_app.models import BlockModel, fixed_rng
from fl_app.learning.training import (
    accumulate_gradients,
    clip_and_step,
    load_batch,
    load_optimizer,
    make_sgd,
    optimizer_record,
)

if TYPE_CHECKING:
    from fl_app.client.node import Node


class Slot:
    """One named model slot of a node: weights, optimizer, accumulator, stored input.

    With ``model_slot`` the weights, optimizer state and accumulator are
    those of that slot (RingSFL: the paths through a node share its model).
    """

    def __init__(self, node: Node, name: str, model_slot: str = "") -> None:
        self.node = node
        self.name = name
        self.store = model_slot or name

    def _key(self, part: str) -> str:
        return slot_key(self.store if part in MODEL_PARTS else self.name, part)

    def array(self, part: str) -> ArrayRecord | None:
        """The slot's ArrayRecord ``part`` (``weights``, ``optimizer``, ...), or None."""
        return P.get_array(self.node.state, self._key(part))

    def put(self, part: str, record: ArrayRecord | ConfigRecord) -> None:
        """Store a record of the slot.

        A ``weights`` or ``optimizer`` record updates the tensors it names and
        keeps the others, so that a range of a larger stored model (a shared
        ``model_slot``) updates only its own blocks.
        """
        if part in ("weights", "optimizer") and isinstance(record, ArrayRecord):
            stored = self.array(part)
            if stored is not None and not set(stored.keys()) <= set(record.keys()):
                record = P.array_record({**{k: stored[k] for k in stored.keys()}, **{k: record[k] for k in record.keys()}})
        P.set_record(self.node.state, self._key(part), record)

    def drop(self, *parts: str) -> None:
        """Remove records of the slot (absent ones are ignored)."""
        for part in parts:
            key = self._key(part)
            if isinstance(self.node.state.get(key), (ArrayRecord, ConfigRecord)):
                del self.node.state[key]

    @property
    def batch(self) -> ConfigRecord:
        """The slot's range and last batch.

        Raises:
            RuntimeError: the slot has run no forward pass yet.
        """
        record = P.get_config(self.node.state, self._key("batch"))
        if record is None:
            raise RuntimeError(f"slot '{self.name}' has no stored forward pass: send train.forward first")
        return record

    @property
    def range(self) -> tuple[int, int]:
        """``(start, end)`` of the slot's last forward."""
        batch = self.batch
        return int(batch["start"]), int(batch["end"])

    def model(self, start: int, end: int) -> BlockModel:
        """Blocks ``[start, end)`` with the slot's stored weights (which may hold more blocks).

        Raises:
            ValueError: the stored weights lack some of these blocks.
        """
        stored = self.array("weights")
        if self.node.live is not None:  # the node's live model, where its state persists (fl_app.client.live)
            model = self.node.live.checkout(self.node.task, self.store, start, end, stored, self.name)
            if model is not None:
                return model
        model = self.node.task.build_segment(start, end)
        if stored is not None:
            keys = list(model.state_dict())
            if not set(keys) <= set(stored.keys()):
                raise ValueError(f"slot '{self.name}' holds other blocks than [{start}, {end}); send weights")
            model.load_state_dict({k: P.record_tensor(stored, k) for k in keys})
        return self.node.place(model)

    def store_weights(self, model: BlockModel) -> None:
        """Store ``model``'s weights (a larger stored model keeps its other blocks)."""
        self.put("weights", P.state_record(model.state_dict()))
        if self.node.live is not None:
            self.node.live.stored(model, self.array("weights"))

    def run_forward(self, model: BlockModel, x: torch.Tensor, seed: int | None, start: int,
                    release: Callable[[torch.Tensor], torch.Tensor] | None = None) -> torch.Tensor:
        """The training forward pass of the slot's stored batch (stored first), without its gradient
        (``seed``: its dropout seed, None for a model that draws none; ``release``: a defence applied to
        the output, :mod:`fl_app.privacy.activations`, whose ``train.backward`` always recomputes).

        Under ``no_grad``; or, where the node keeps live objects
        (:mod:`fl_app.client.live`), with autograd on, keeping the graph for the
        slot's ``train.backward`` (the same outputs either way).
        """
        live = self.node.live
        if release is not None:
            with torch.no_grad(), fixed_rng(seed, self.node.device):
                return release(model(x))
        if live is None or live.checked_out(model) is None:
            with torch.no_grad(), fixed_rng(seed, self.node.device):
                return model(x)
        x.requires_grad_(start > 0)  # as train.backward would set it
        with fixed_rng(seed):
            out = model(x)
        live.keep_graph(self.name, model, self.batch, self.array("input") if start > 0 else None, x, out)
        return out.detach()

    def load_weights(self, record: ArrayRecord) -> None:
        """Replace the weights; reset the optimizer and the accumulator. A bundle of sealed uploads
        (``hide-client-models``) loads the clients' own average of them (:mod:`fl_app.client.hidden`)."""
        if is_bundle(record):
            for name, weights in bundle_slots(self.node, record).items():
                Slot(self.node, name).load_weights(weights)
            return
        self.put("weights", record)
        self.drop("optimizer", "accum")

    def take_weights(self, content: RecordDict) -> None:
        """:meth:`load_weights` of the message's :data:`~fl_app.protocol.WEIGHTS` record, where it carries one."""
        weights = P.get_array(content, P.WEIGHTS)
        if weights is not None:
            self.load_weights(weights)

    def optimizer(self, model: BlockModel, cfg: P.OptimizerConfig) -> torch.optim.Optimizer:
        """The message's optimizer (SGD or AdamW) over ``model``, with the slot's saved state."""
        opt = make_sgd(model, cfg.lr, cfg.momentum, cfg.weight_decay, cfg.lr_scale, kind=cfg.optimizer)
        load_optimizer(model, opt, self.array("optimizer"))
        return opt

    def step(self, model: BlockModel, opt: torch.optim.SGD, clip_norm: float) -> None:
        """Clip, step and store the weights and momentum buffers."""
        clip_and_step(model, opt, clip_norm)
        self.store_weights(model)
        self.put("optimizer", optimizer_record(model, opt))

    def apply_gradients(self, model: BlockModel, cfg: P.ForwardConfig | P.BackwardConfig) -> None:
        """After ``backward()``: accumulate ``weight``·grad, or step at once."""
        if cfg.accumulate:
            self.put("accum", accumulate_gradients(model, self.array("accum"), cfg.weight))
            if _has_buffers(model):
                # keep the BatchNorm running statistics this forward pass updated
                self.store_weights(model)
            return
        if cfg.weight != 1.0:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(cfg.weight)
        self.step(model, self.optimizer(model, cfg), cfg.clip_norm)

    def labels(self) -> torch.Tensor:
        """int64 ``[B]``: the labels of the slot's last own batch (CPU; a U-shaped tail's, which never leave the node).

        Raises:
            RuntimeError: the slot has run no forward pass yet.
            ValueError: its last forward ran on a relayed input, not on own data.
        """
        batch = self.batch
        if self.range[0] != 0:
            raise ValueError(f"slot '{self.name}' last ran on a relayed input: it holds no labels of its own")
        return self.node.task.data.y_train[torch.as_tensor(list(batch["indices"]), dtype=torch.int64)]

    def stored_input(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The input of the slot's last forward: own data (recomputed) or the relayed tensor."""
        batch = self.batch
        if self.range[0] == 0:
            x, y = load_batch(self.node.task, self.node.partition_id, batch["indices"], int(batch["step"]))
            return self.node.on_device(x), self.node.on_device(y)
        record = self.array("input")
        labels = self.node.on_device(P.record_tensor(record, "y")) if "y" in record else None
        return self.node.on_device(P.record_tensor(record, "x")), labels


#: model -> whether it has buffers (BatchNorm statistics), per model object (modules never gain buffers here)
_BUFFERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _has_buffers(model: BlockModel) -> bool:
    """Whether ``model`` has buffers (cached per model object: a live segment runs every step)."""
    has = _BUFFERS.get(model)
    if has is None:
        has = _BUFFERS[model] = any(True for _ in model.buffers())
    return has
