"""The ClientApp's zeroth-order handlers (MU-SplitFed): ``train.zo_forward``, ``train.zo_update``.

A ZO client never runs a backward pass: ``train.zo_forward`` returns the
embeddings of a new batch, unperturbed and at ``w ± μ u_p`` for ``P`` seeded
directions (MU-SplitFed eq. 4), and ``train.zo_update`` forms the SPSA
estimate from the loss differences the server sends back and steps
(:mod:`fl_app.learning.zo`). The direction seeds are kept in the slot's batch record
(:data:`~fl_app.client.state.ZO_SEEDS`), never sent.
"""

from __future__ import annotations

from flwr.app import Context, Message, RecordDict

from fl_app import protocol as P
from fl_app.client.node import Node, node_and_config
from fl_app.client.slots import Slot
from fl_app.client.state import ZO_SEEDS
from fl_app.run.device import to_device
from fl_app.client.live import committing
from fl_app.models import BlockModel
from fl_app.learning.zo import STREAM_ZO_CLIENT, direction, num_parameters, perturbed_outputs, shapes_of, spsa_gradient, \
    trainable, zo_seed


def zo_forward(node: Node, slot: Slot, model: BlockModel, end: int, batch_size: int, perturbations: int,
               smoothing: float) -> RecordDict:
    """Sample the next own batch; ``h`` and ``P`` pairs ``h(w ± μ u_p)`` (MU-SplitFed eq. 4).

    The seeds of the ``u_p`` are drawn from ``(seed, partition, step, p)``
    and kept in the slot's batch record for ``train.zo_update``.
    """
    record, x, y = node.sample(batch_size)
    step = int(record["step"])
    seeds = [zo_seed(node.task.seed, STREAM_ZO_CLIENT, node.partition_id, step, p) for p in range(perturbations)]
    record["start"], record["end"], record[ZO_SEEDS] = 0, end, seeds
    slot.put("batch", record)
    h, plus, minus = perturbed_outputs(model, x, seeds, smoothing)
    return RecordDict({P.ACTIVATIONS: P.tensor_record("x", h), P.LABELS: P.tensor_record("y", y),
                       P.PERTURBED: P.state_record({"plus": plus, "minus": minus})})


@committing
def train_zo_forward(msg: Message, context: Context) -> Message:
    """Unperturbed and perturbed embeddings of a new batch (see :class:`~fl_app.protocol.ZOForwardConfig`)."""
    node, cfg = node_and_config(msg, context, P.ZOForwardConfig)
    slot = node.slot(cfg.slot)
    slot.take_weights(msg.content)
    end = P.range_end(cfg.end, node.task.cut_layer)
    content = zo_forward(node, slot, slot.model(0, end), end, cfg.batch_size, cfg.perturbations, cfg.smoothing)
    return Message(content, reply_to=msg)


@committing
def train_zo_update(msg: Message, context: Context) -> Message:
    """ZO step from the loss differences; no backward pass (see :class:`~fl_app.protocol.ZOUpdateConfig`)."""
    node, cfg = node_and_config(msg, context, P.ZOUpdateConfig)
    slot = node.slot(cfg.slot)
    start, end = slot.range
    model = slot.model(start, end)
    seeds = list(slot.batch.get(ZO_SEEDS, []))
    if len(seeds) != len(cfg.diffs):
        raise ValueError(f"{len(cfg.diffs)} loss differences for {len(seeds)} perturbations")
    shapes = shapes_of(model)
    grads = spsa_gradient(cfg.diffs, (direction(shapes, s) for s in seeds), cfg.smoothing, num_parameters(model))
    for p, g in zip(trainable(model), grads):
        p.grad = to_device(g, p.device)
    slot.step(model, slot.optimizer(model, cfg), cfg.clip_norm)
    content = node.reply_after_update(
        model, cfg.next, lambda: zo_forward(node, slot, model, end, cfg.batch_size, len(cfg.diffs), cfg.smoothing))
    return Message(content, reply_to=msg)
