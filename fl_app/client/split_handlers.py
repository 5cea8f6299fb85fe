"""The ClientApp's split-learning handlers: ``train.forward``, ``train.backward``, ``train.step``.

``train.forward`` runs a block range of a model slot on own data or on a
relayed input (:class:`~fl_app.protocol.ForwardConfig`), and with
``loss=true`` also the loss and its backward pass. ``train.backward``
recomputes the slot's stored forward pass (identical inputs: the augmentation
is seeded by the step; identical dropout masks: every training forward pass
runs under a stored seed, see :func:`fl_app.models.fixed_rng`), or reuses its
live graph (:mod:`fl_app.client.live`), then applies the received gradient: clipped
and stepped at once, or accumulated (weighted) for a later ``train.step``.
With a defence on (:mod:`fl_app.privacy.activations`) the received gradient is w.r.t. the
released (clipped, noisy) activations, back-propagated through the release,
plus NoPeek's ``α·dCor`` term. A U-shaped client's tail perturbs the gradient it
returns with ``label-defence`` (:mod:`fl_app.privacy.label_defence`), after its own step
on the exact gradient or, with ``label-defence-tail=perturbed``, before it, on
``∂L/∂logits``, so that its step and what it returns agree.
"""

from __future__ import annotations

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from torch import nn

from fl_app import protocol as P
from fl_app.client.node import Node, acknowledgement, node_and_config
from fl_app.client.state import RNG_KEY, RNG_SEED
from fl_app.privacy.label_defence import defence_generator, perturb, tail_backward
from fl_app.client.live import committing
from fl_app.models import fixed_rng
from fl_app.privacy.activations import NOISE_SEED, append_tail_truth
from fl_app.learning.training import load_gradients


def _input_gradient_record(x: torch.Tensor, start: int) -> dict[str, ArrayRecord]:
    """``{GRADIENT: dL/dx}`` for a range that does not start at block 0, else nothing."""
    return {P.GRADIENT: P.tensor_record("g", x.grad)} if start > 0 else {}


@committing
def train_forward(msg: Message, context: Context) -> Message:
    """Run a block range of a slot on own data or a relayed input (see :class:`~fl_app.protocol.ForwardConfig`)."""
    node = Node(context)
    cfg = P.ForwardConfig.from_record(P.config_of(msg.content, P.CONFIG))
    slot = node.slot(cfg.slot, cfg.model_slot)
    weights = P.get_array(msg.content, P.WEIGHTS)
    if weights is not None:
        slot.load_weights(weights)
    plan = cfg.plan(node.task.cut_layer)
    start, end = plan.start, plan.end
    model = slot.model(start, end)
    if plan.own_data:
        if plan.replies_activations:
            return Message(node.forward(slot, model, start, end, plan.batch_size, not plan.private_labels),
                           reply_to=msg)
        record, x, y = node.sample(plan.batch_size)
        record["start"], record["end"] = start, end
    else:
        acts, labels = P.array_of(msg.content, P.ACTIVATIONS), P.get_array(msg.content, P.LABELS)
        x = node.on_device(P.record_input(acts, "x"))  # only computed on: no copy where none is needed
        y = node.on_device(P.record_input(labels, "y")) if labels is not None else None
        if y is None and cfg.label_slot:  # a U-shaped tail: the labels of the node's own batch, never sent
            y = node.on_device(node.slot(cfg.label_slot).labels())
        # kept (and the labels passed on) as received: the bytes that re-encoding x and y gives
        inputs = {"x": P.canonical(acts["x"])} if labels is None else \
            {"x": P.canonical(acts["x"]), "y": P.canonical(labels["y"])}
        slot.put("input", P.array_record(inputs))
        record = ConfigRecord({"start": start, "end": end})
    seed = node.remember_batch(slot, record, model)
    if plan.replies_activations:
        out = slot.run_forward(model, x, seed, start)
        content = P.record_dict({P.ACTIVATIONS: P.tensor_record("x", out)})
        if plan.replies_labels(y is not None):
            content[P.LABELS] = P.tensor_record("y", y) if plan.own_data else P.array_record({"y": inputs["y"]})
        return Message(content, reply_to=msg)
    if y is None:
        raise ValueError("train.forward with loss=true needs labels")
    x.requires_grad_(not plan.own_data)
    model.train()
    with fixed_rng(seed, node.device):
        logits = model(x)
        loss = nn.functional.cross_entropy(logits, y)
    defended = cfg.label_slot and start > 0 and node.cfg.label_defence != "none"  # a U-shaped tail's defence
    if defended:
        defence = node.cfg.label_defence
        strength = float(node.cfg.get("label-power" if defence == "marvell" else "label-noise"))
        gen = defence_generator(node.task.seed, node.partition_id, int(node.config(RNG_KEY).get("forwards", 0)))
        release = lambda g: perturb(g, defence, strength, gen, y)  # noqa: E731
    on_logits = defended and node.cfg.get("label-defence-tail") == "perturbed"
    if on_logits:  # one perturbed ∂L/∂logits gives both the tail's step and what it returns
        tail_backward(logits, loss, release)
    else:
        loss.backward()
    slot.apply_gradients(model, cfg)
    if defended and not on_logits:  # the tail stepped on the exact gradient; only what leaves is perturbed
        x.grad = release(x.grad)
    if cfg.label_slot and start > 0 and node.cfg.get("privacy-record"):  # the label attack's ground truth
        append_tail_truth(str(node.cfg.get("output-dir")), node.partition_id, x.grad, y)
    content = P.record_dict({**_input_gradient_record(x, start),
                          P.INFO: ConfigRecord({P.INFO_LOSS: float(loss.detach())})})
    return Message(content, reply_to=msg)


@committing
def train_backward(msg: Message, context: Context) -> Message:
    """Recompute the slot's stored forward, apply the received gradient (see :class:`~fl_app.protocol.BackwardConfig`)."""
    node, cfg = node_and_config(msg, context, P.BackwardConfig)
    slot = node.slot(cfg.slot, cfg.model_slot)
    start, end = slot.range
    model = slot.model(start, end)
    grad = node.on_device(P.record_input(P.array_of(msg.content, P.GRADIENT), "g"))
    graph = None
    if node.live is not None:  # the forward pass's own graph, where it is exactly what recomputing gives
        graph = node.live.take_graph(slot.name, model, slot.batch, slot.array("input") if start > 0 else None)
    if graph is not None:
        x, acts = graph.x, graph.out
    else:
        x, _ = slot.stored_input()
        x.requires_grad_(start > 0)
        model.train()
        with fixed_rng(slot.batch.get(RNG_SEED), node.device):  # the first pass's dropout masks
            acts = model(x)
    if acts.shape != grad.shape:
        raise ValueError(f"gradient shape {tuple(grad.shape)} != activation shape {tuple(acts.shape)}")
    if node.defence is not None and start == 0:  # grad is w.r.t. the released activations (fl_app.privacy.activations)
        node.defence.objective(x, acts, grad, slot.batch.get(NOISE_SEED)).backward()
    else:
        acts.backward(grad)
    shared = P.get_array(msg.content, P.OPTIMIZER)
    if shared is not None:  # the server's optimizer state replaces the slot's (GAS client-momentum=shared)
        slot.drop("optimizer")  # replaced, not merged: an empty record means no momentum yet
        if len(shared):
            slot.put("optimizer", shared)
    slot.apply_gradients(model, cfg)

    content = P.record_dict(_input_gradient_record(x, start))
    if shared is not None:
        content[P.OPTIMIZER] = slot.array("optimizer")
    content = node.reply_after_update(
        model, cfg.next, lambda: node.forward(slot, model, start, end, cfg.batch_size, not cfg.label_slot), content)
    return Message(content, reply_to=msg)


@committing
def train_step(msg: Message, context: Context) -> Message:
    """Apply a slot's accumulated gradient (see :class:`~fl_app.protocol.StepConfig`)."""
    node, cfg = node_and_config(msg, context, P.StepConfig)
    slot = node.slot(cfg.slot)
    model = slot.model(*((cfg.start, cfg.end) if cfg.end else slot.range))
    opt = slot.optimizer(model, cfg)
    if load_gradients(model, slot.array("accum")):
        slot.step(model, opt, cfg.clip_norm)
    slot.drop("accum")
    content = node.weights_reply(model) if cfg.return_weights else acknowledgement()
    return Message(content, reply_to=msg)
