"""The ClientApp: the client side of the message protocol (DESIGN.md section 4).

All per-node state lives in ``context.state`` (a RecordDict), never in
Python objects, because Flower may run a node's next message in another
process:

===================  ======  ==============================================
``task``             Config  the run configuration from the handshake
``client.weights``   Array   the client-side model
``client.optimizer`` Array   SGD momentum buffers of the client-side model
``client.sampler``   Config  ``epoch``, ``pos``, ``step`` of the batch sampler
``client.batch``     Config  ``indices``, ``step``, ``cut`` of the batch whose
                             activations were last sent
===================  ======  ==============================================

``train.backward`` recomputes the forward pass on the stored batch
(identical inputs: the augmentation is seeded by the step), applies the
received activation gradient, clips and steps.
"""

from __future__ import annotations

import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp

from fl_app import protocol as P
from fl_app.config import RunConfig
from fl_app.errors import ConfigError
from fl_app.models import BlockModel
from fl_app.task import Task, load_task
from fl_app.training import (
    clip_and_step,
    evaluate_model,
    load_batch,
    load_optimizer,
    local_fit,
    make_sgd,
    optimizer_record,
    sample_batch,
)


def one_torch_thread(msg: Message, context: Context, call_next) -> Message:
    """Flower mod: run the handler with one intra-op torch thread, then restore.

    Ray actors run with one thread; pinning it everywhere makes the client's
    floating-point results (and so whole runs) bit-identical across engines.
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return call_next(msg, context)
    finally:
        torch.set_num_threads(old)


app = ClientApp(mods=[one_torch_thread])

WEIGHTS_KEY = "client.weights"
OPTIMIZER_KEY = "client.optimizer"
SAMPLER_KEY = "client.sampler"
BATCH_KEY = "client.batch"


class _Node:
    """A view of one node's persistent state for the duration of a message."""

    def __init__(self, context: Context) -> None:
        if P.TASK not in context.state.config_records:
            raise RuntimeError("node has no task: the server must send query.info first")
        self.context = context
        self.cfg = RunConfig.from_mapping(dict(context.state.config_records[P.TASK]))
        self.task: Task = load_task(self.cfg)
        self.partition_id = _partition_id(context, self.cfg)

    @property
    def state(self) -> RecordDict:
        """The node's persistent ``context.state``."""
        return self.context.state

    def config(self, key: str) -> ConfigRecord:
        """The ConfigRecord ``key`` of the node state, created empty when absent."""
        if key not in self.state.config_records:
            self.state[key] = ConfigRecord()
        return self.state.config_records[key]

    def client_model(self, cut: int) -> BlockModel:
        """Blocks ``[0, cut)`` with this node's stored weights."""
        model = self.task.build_segment(0, cut)
        if WEIGHTS_KEY in self.state.array_records:
            stored = P.record_state(self.state.array_records[WEIGHTS_KEY])
            model.load_state_dict(stored)
        return model

    def save_model(self, model: BlockModel) -> None:
        """Store the client-side model's weights in the node state."""
        self.state[WEIGHTS_KEY] = P.state_record(model.state_dict())

    def forward(self, model: BlockModel, batch_size: int, cut: int) -> RecordDict:
        """Sample the next batch, run the client-side model, remember the batch."""
        sampler = self.config(SAMPLER_KEY)
        step = int(sampler.get("step", 0))
        idx = sample_batch(self.task, self.partition_id, sampler, batch_size)
        sampler["step"] = step + 1
        self.state[BATCH_KEY] = ConfigRecord({"indices": idx.tolist(), "step": step, "cut": cut})
        x, y = load_batch(self.task, self.partition_id, idx, step)
        with torch.no_grad():
            acts = model(x)
        return RecordDict({
            P.ACTIVATIONS: P.tensor_record("x", acts),
            P.LABELS: P.tensor_record("y", y),
        })


def _partition_id(context: Context, cfg: RunConfig) -> int:
    cfg_node = context.node_config
    if "partition-id" not in cfg_node:
        raise ConfigError("node_config has no 'partition-id' (start the SuperNode with --node-config 'partition-id=K num-partitions=N')")
    pid = int(cfg_node["partition-id"])
    num = int(cfg_node.get("num-partitions", cfg.num_clients))
    if num != cfg.num_clients:
        raise ConfigError(f"node has num-partitions={num} but the run has num-clients={cfg.num_clients}")
    if not 0 <= pid < cfg.num_clients:
        raise ConfigError(f"partition-id {pid} out of range 0..{cfg.num_clients - 1}")
    return pid


def _optimizer_settings(config: ConfigRecord) -> dict[str, float]:
    return {
        "lr": float(config["lr"]),
        "momentum": float(config.get("momentum", 0.0)),
        "weight_decay": float(config.get("weight-decay", 0.0)),
    }


@app.query("info")
def query_info(msg: Message, context: Context) -> Message:
    """Handshake: store the task, reply partition id, size and label histogram."""
    context.state[P.TASK] = ConfigRecord(dict(msg.content.config_records[P.TASK]))
    node = _Node(context)
    hist = node.task.histogram(node.partition_id)
    info = ConfigRecord({
        "partition-id": node.partition_id,
        "num-examples": node.task.num_examples(node.partition_id),
        "label-histogram": [int(v) for v in hist],
    })
    return Message(RecordDict({P.INFO: info}), reply_to=msg)


@app.train("forward")
def train_forward(msg: Message, context: Context) -> Message:
    """Optionally load sent weights (resetting the optimizer); forward one batch."""
    node = _Node(context)
    config = msg.content.config_records[P.CONFIG]
    cut = int(config.get("cut", node.task.cut_layer))
    if P.WEIGHTS in msg.content.array_records:
        node.state[WEIGHTS_KEY] = msg.content.array_records[P.WEIGHTS]
        if OPTIMIZER_KEY in node.state.array_records:
            del node.state[OPTIMIZER_KEY]
    model = node.client_model(cut)
    return Message(node.forward(model, int(config["batch-size"]), cut), reply_to=msg)


@app.train("backward")
def train_backward(msg: Message, context: Context) -> Message:
    """Recompute the stored batch, apply the activation gradient, clip, step.

    ``config["next"]`` is ``"forward"`` (piggyback the next batch's
    activations), ``"weights"`` (return the client-side model and the
    partition size) or ``"none"``.
    """
    node = _Node(context)
    config = msg.content.config_records[P.CONFIG]
    batch = node.state.config_records[BATCH_KEY]
    cut = int(batch["cut"])
    model = node.client_model(cut)
    opt = make_sgd(model, **_optimizer_settings(config))
    load_optimizer(model, opt, node.state.array_records.get(OPTIMIZER_KEY))
    x, _ = load_batch(node.task, node.partition_id, batch["indices"], int(batch["step"]))
    grad = P.record_tensor(msg.content.array_records[P.GRADIENT], "g")
    model.train()
    acts = model(x)
    if acts.shape != grad.shape:
        raise ValueError(f"gradient shape {tuple(grad.shape)} != activation shape {tuple(acts.shape)}")
    acts.backward(grad)
    clip_and_step(model, opt, float(config.get("clip-norm", 0.0)))
    node.save_model(model)
    node.state[OPTIMIZER_KEY] = optimizer_record(model, opt)

    nxt = str(config.get("next", P.NEXT_NONE))
    if nxt == P.NEXT_FORWARD:
        content = node.forward(model, int(config["batch-size"]), cut)
    elif nxt == P.NEXT_WEIGHTS:
        content = RecordDict({
            P.WEIGHTS: P.state_record(model.state_dict()),
            P.INFO: ConfigRecord({"num-examples": node.task.num_examples(node.partition_id)}),
        })
    else:
        content = RecordDict({P.INFO: ConfigRecord({"ok": True})})
    return Message(content, reply_to=msg)


@app.train("fit")
def train_fit(msg: Message, context: Context) -> Message:
    """Full-model local training for the FL baselines (FedAvg, FedBuff, CA2FL)."""
    node = _Node(context)
    config = msg.content.config_records[P.CONFIG]
    model = node.task.build_model()
    model.load_state_dict(P.record_state(msg.content.array_records[P.WEIGHTS]))
    loss = local_fit(
        model, node.task, node.partition_id, node.config(SAMPLER_KEY),
        iterations=int(config["local-iterations"]),
        batch_size=int(config["batch-size"]),
        clip_norm=float(config.get("clip-norm", 0.0)),
        **_optimizer_settings(config),
    )
    info = ConfigRecord({"num-examples": node.task.num_examples(node.partition_id), "train-loss": loss})
    return Message(RecordDict({P.WEIGHTS: P.state_record(model.state_dict()), P.INFO: info}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate sent full-model weights on the test set or the local partition."""
    node = _Node(context)
    config = msg.content.config_records.get(P.CONFIG, ConfigRecord())
    model = node.task.build_model()
    model.load_state_dict(P.record_state(msg.content.array_records[P.WEIGHTS]))
    if str(config.get("split", "test")) == "local":
        part = node.task.partitions[node.partition_id]
        batches = (node.task.data.train_batch(part[i:i + 1000]) for i in range(0, len(part), 1000))
    else:
        batches = node.task.data.test_batches()
    loss, acc, count = evaluate_model(model, batches)
    info = ConfigRecord({"loss": loss, "accuracy": acc, "num-examples": count})
    return Message(RecordDict({P.INFO: info}), reply_to=msg)

