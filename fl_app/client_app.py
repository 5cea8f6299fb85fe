"""The ClientApp: the client side of the message protocol (DESIGN.md section 4).

All per-node state lives in ``context.state`` (a RecordDict), never in
Python objects, because Flower may run a node's next message in another
process. A node holds its data sampler and any number of named **model
slots** (:data:`fl_app.protocol.OWN_SLOT` for its own client-side model,
``relay:<origin>`` for a segment it trains for another client):

=========================  ======  ===========================================
``task``                   Config  the run configuration from the handshake
``data.sampler``           Config  ``epoch``, ``pos``, ``step`` of the sampler
``slot.<name>.weights``    Array   the slot's weights (absent: the seeded
                                   initial weights of its blocks)
``slot.<name>.optimizer``  Array   SGD momentum buffers of the slot (a
                                   ``train.backward`` carrying
                                   :data:`~fl_app.protocol.OPTIMIZER`
                                   replaces them and returns the new ones)
``slot.<name>.accum``      Array   accumulated weighted parameter gradients
``slot.<name>.batch``      Config  ``start``, ``end`` of the slot's range;
                                   for own data ``indices`` and ``step`` of
                                   the batch last forwarded; ``rng-seed``,
                                   the dropout seed of the last forward
``rng``                    Config  ``forwards``: training forward passes so
                                   far (draws the dropout seeds)
``slot.<name>.input``      Array   a relayed input ``x`` (and labels ``y``)
                                   of the slot's last forward
=========================  ======  ===========================================

``train.backward`` recomputes the forward pass on the stored input
(identical inputs: the augmentation is seeded by the step; identical
dropout masks: every training forward pass runs under a stored seed, see
:func:`fl_app.models.fixed_rng`), then applies
the received gradient: clipped and stepped at once, or accumulated (weighted)
for a later ``train.step``.

Where a node's ``context.state`` is the same object from one message to the
next (the in-process engine), the node also keeps its live models and the
autograd graphs of its forward passes, only as a cache of what the state
holds (:mod:`fl_app.live`): a message then skips rebuilding its model, and
``train.backward`` reuses the forward pass's own graph instead of recomputing
it. Nothing changes numerically; under Ray and in deployment nothing is kept.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from flwr.clientapp import ClientApp
from torch import nn

from fl_app import protocol as P
from fl_app.config import RunConfig
from fl_app.device import resolve_device, to_device
from fl_app.errors import ConfigError
from fl_app.live import committing, live_cache
from fl_app.models import BlockModel, fixed_rng
from fl_app.task import Task, load_device_task, load_task
from fl_app.zo import STREAM_ZO_CLIENT, direction, num_parameters, perturbed_outputs, shapes_of, spsa_gradient, zo_seed
from fl_app.training import (
    accumulate_gradients,
    clip_and_step,
    evaluate_model,
    load_batch,
    load_gradients,
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

SAMPLER_KEY = "data.sampler"
#: Key of the ZO direction seeds in a slot's batch record.
ZO_SEEDS = "zo-seeds"
#: ConfigRecord of the node's forward-pass counter (``forwards``), which seeds dropout.
RNG_KEY = "rng"
#: Key of the dropout seed of a slot's last forward in its batch record.
RNG_SEED = "rng-seed"
#: Seed-stream tag of the dropout seeds of the client's forward passes.
STREAM_DROPOUT = 29


def slot_key(slot: str, part: str) -> str:
    """The ``context.state`` key of a slot's record ``part`` (``weights``, ``optimizer``, ``accum``, ``batch``, ``input``)."""
    return f"slot.{slot}.{part}"


#: The parts of a slot that make up its model (another slot's when it names a ``model_slot``).
MODEL_PARTS = ("weights", "optimizer", "accum")


class _Slot:
    """One named model slot of a node: weights, optimizer, accumulator, stored input.

    With ``model_slot`` the weights, optimizer state and accumulator are
    those of that slot (RingSFL: the paths through a node share its model).
    """

    def __init__(self, node: _Node, name: str, model_slot: str = "") -> None:
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
        self.node.state[self._key(part)] = record

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
        if self.node.live is not None:  # the node's live model, where its state persists (fl_app.live)
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

    def run_forward(self, model: BlockModel, x: torch.Tensor, seed: int, start: int) -> torch.Tensor:
        """The training forward pass of the slot's stored batch (stored first), without its gradient.

        Under ``no_grad``; or, where the node keeps live objects
        (:mod:`fl_app.live`), with autograd on, keeping the graph for the
        slot's ``train.backward`` (the same outputs either way).
        """
        live = self.node.live
        if live is None or live.checked_out(model) is None:
            with torch.no_grad(), fixed_rng(seed, self.node.device):
                return model(x)
        x.requires_grad_(start > 0)  # as train.backward would set it
        with fixed_rng(seed):
            out = model(x)
        live.keep_graph(self.name, model, self.batch, self.array("input") if start > 0 else None, x, out)
        return out.detach()

    def load_weights(self, record: ArrayRecord) -> None:
        """Replace the weights; reset the optimizer and the accumulator."""
        self.put("weights", record)
        self.drop("optimizer", "accum")

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
            if any(True for _ in model.buffers()):
                # keep the BatchNorm running statistics this forward pass updated
                self.store_weights(model)
            return
        if cfg.weight != 1.0:
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(cfg.weight)
        self.step(model, self.optimizer(model, cfg), cfg.clip_norm)

    def stored_input(self) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The input of the slot's last forward: own data (recomputed) or the relayed tensor."""
        batch = self.batch
        if self.range[0] == 0:
            x, y = load_batch(self.node.task, self.node.partition_id, batch["indices"], int(batch["step"]))
            return self.node.on_device(x), self.node.on_device(y)
        record = self.array("input")
        labels = self.node.on_device(P.record_tensor(record, "y")) if "y" in record else None
        return self.node.on_device(P.record_tensor(record, "x")), labels


class _Node:
    """A view of one node's persistent state for the duration of a message."""

    def __init__(self, context: Context, *, need_id: bool = True) -> None:
        task = P.get_config(context.state, P.TASK)
        if task is None:
            raise RuntimeError("node has no task: the server must send query.info first")
        self.context = context
        data_dir = _data_dir(context)
        self.cfg, self.task = _device_task_of(task, data_dir) if data_dir else _task_of(task)
        #: this node's partition id (:data:`UNASSIGNED` only during the handshake, see :func:`_partition_id`)
        self.partition_id = _partition_id(context, self.cfg, need_id)
        #: where this node computes: ``device`` in its node_config, else the run's key (:mod:`fl_app.device`)
        self.device = resolve_device(str(context.node_config.get(NODE_DEVICE, "") or self.cfg.device))
        #: the node's live models and graphs, where its state persists between messages (:mod:`fl_app.live`);
        #: CPU nodes only (the cache builds its models on the CPU)
        self.live = live_cache(context.state) if self.device.type == "cpu" else None

    def on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (decoded from a message or loaded from data: CPU) moved to :attr:`device`."""
        return to_device(tensor, self.device)

    def place(self, model: BlockModel) -> BlockModel:
        """``model`` moved to :attr:`device` (untouched on the CPU)."""
        return model if self.device.type == "cpu" else model.to(self.device)

    @property
    def state(self) -> RecordDict:
        """The node's persistent ``context.state``."""
        return self.context.state

    def config(self, key: str) -> ConfigRecord:
        """The ConfigRecord ``key`` of the node state, created empty when absent."""
        record = P.get_config(self.state, key)
        if record is None:
            record = self.state[key] = ConfigRecord()
        return record

    def slot(self, name: str, model_slot: str = "") -> _Slot:
        """The model slot ``name`` (using ``model_slot``'s model when given)."""
        return _Slot(self, name, model_slot)

    def sample(self, batch_size: int) -> tuple[ConfigRecord, torch.Tensor, torch.Tensor]:
        """Sample the next batch of own data: ``(batch record, x, y)``."""
        sampler = self.config(SAMPLER_KEY)
        step = int(sampler.get("step", 0))
        idx = sample_batch(self.task, self.partition_id, sampler, batch_size)
        sampler["step"] = step + 1
        x, y = load_batch(self.task, self.partition_id, idx, step)
        x, y = self.on_device(x), self.on_device(y)
        return ConfigRecord({"indices": idx.tolist(), "step": step}), x, y

    def forward_seed(self) -> int:
        """A fresh dropout seed for a training forward pass, from ``(seed, partition, counter)``.

        Stored in the slot's batch record, so that ``train.backward``
        recomputes the forward pass with the same dropout masks.
        """
        rec = self.config(RNG_KEY)
        count = int(rec.get("forwards", 0))
        rec["forwards"] = count + 1
        return zo_seed(self.task.seed, STREAM_DROPOUT, self.partition_id, count)

    def forward(self, slot: _Slot, model: BlockModel, start: int, end: int, batch_size: int) -> RecordDict:
        """Sample the next own batch, run blocks ``[start, end)``, remember the batch (and its dropout seed)."""
        record, x, y = self.sample(batch_size)
        record["start"], record["end"] = start, end
        record[RNG_SEED] = seed = self.forward_seed()
        slot.put("batch", record)
        acts = slot.run_forward(model, x, seed, start)
        return RecordDict({P.ACTIVATIONS: P.tensor_record("x", acts), P.LABELS: P.tensor_record("y", y)})

    def zo_forward(self, slot: _Slot, model: BlockModel, end: int, batch_size: int, perturbations: int,
                   smoothing: float) -> RecordDict:
        """Sample the next own batch; ``h`` and ``P`` pairs ``h(w ± μ u_p)`` (MU-SplitFed eq. 4).

        The seeds of the ``u_p`` are drawn from ``(seed, partition, step, p)``
        and kept in the slot's batch record for ``train.zo_update``.
        """
        record, x, y = self.sample(batch_size)
        step = int(record["step"])
        seeds = [zo_seed(self.task.seed, STREAM_ZO_CLIENT, self.partition_id, step, p) for p in range(perturbations)]
        record["start"], record["end"], record[ZO_SEEDS] = 0, end, seeds
        slot.put("batch", record)
        h, plus, minus = perturbed_outputs(model, x, seeds, smoothing)
        return RecordDict({P.ACTIVATIONS: P.tensor_record("x", h), P.LABELS: P.tensor_record("y", y),
                           P.PERTURBED: P.state_record({"plus": plus, "minus": minus})})

    def weights_reply(self, model: BlockModel) -> RecordDict:
        """The slot's weights and this node's example count."""
        return RecordDict({
            P.WEIGHTS: P.state_record(model.state_dict()),
            P.INFO: ConfigRecord({P.INFO_NUM_EXAMPLES: self.task.num_examples(self.partition_id)}),
        })


#: Recent task records (snapshots of their contents), their RunConfig and task, newest first (see :func:`_task_of`).
_CONFIGS: list[tuple[dict, RunConfig, Task]] = []


def _task_of(record: ConfigRecord) -> tuple[RunConfig, Task]:
    """The run configuration and task of a node's task record.

    ``RunConfig.from_mapping`` checks every key, which cost more than a small
    relay message's compute, so the configurations (and their tasks, from
    :func:`~fl_app.task.load_task`) of the last few task records are kept,
    matched by the records' contents, not their identity: a node whose state
    was copied (Ray, deployment) gets what a fresh computation gives.
    """
    values = dict(record.items())
    for snapshot, cfg, task in _CONFIGS:
        if snapshot == values:
            return cfg, task
    cfg = RunConfig.from_mapping(values)
    task = load_task(cfg)
    _CONFIGS.insert(0, ({k: list(v) if isinstance(v, list) else v for k, v in values.items()}, cfg, task))
    del _CONFIGS[4:]
    return cfg, task


def _partition_id(context: Context, cfg: RunConfig, required: bool = True) -> int:
    """The node's identity: the partition id that seeds its randomness and that the server knows it by.

    * ``partition-id`` in ``node_config`` (simulation, or a device that is
      given one): that id; without ``data-dir`` the node trains on that
      partition of the run's dataset.
    * Only ``data-dir``: the id the server assigned in the handshake (kept in
      ``context.state`` under :data:`IDENTITY_KEY` for the rest of the run);
      :data:`UNASSIGNED` before that when not ``required``.

    Raises:
        ConfigError: neither key; ``num-partitions`` differs from the run's
            ``num-clients``; the id is out of range.
        RuntimeError: ``required`` and no id has been assigned yet.
    """
    cfg_node = context.node_config
    num = int(cfg_node.get("num-partitions", cfg.num_clients))
    if num != cfg.num_clients:
        raise ConfigError(f"node has num-partitions={num} but the run has num-clients={cfg.num_clients}")
    if "partition-id" in cfg_node:
        pid = int(cfg_node["partition-id"])
    elif _data_dir(context):
        record = context.state.get(IDENTITY_KEY)
        if not isinstance(record, ConfigRecord):
            if required:
                raise RuntimeError("node has no partition id yet: the server assigns one in the handshake (query.info)")
            return UNASSIGNED
        pid = int(record[P.INFO_PARTITION_ID])
    else:
        raise ConfigError("node_config has neither 'data-dir' nor 'partition-id' (start the SuperNode with "
                          "--node-config 'data-dir=DIR' or, in simulation, 'partition-id=K num-partitions=N')")
    if not 0 <= pid < cfg.num_clients:
        raise ConfigError(f"partition-id {pid} out of range 0..{cfg.num_clients - 1}")
    return pid


#: ``node_config`` key of a node's own data directory (device-local data, ``--node-config data-dir=DIR``).
NODE_DATA_DIR = "data-dir"
#: ``node_config`` key of the torch device a node computes on (``--node-config 'device="cuda"'``);
#: absent: the run's ``device`` key
NODE_DEVICE = "device"
#: ConfigRecord of the node state holding (``partition-id``) the id the server assigned at the handshake.
IDENTITY_KEY = "node.identity"
#: The partition id a node reports in the handshake before it has one (device-local data, none given).
UNASSIGNED = -1
#: (task record contents, data dir) -> (RunConfig, device Task), for this process (see :func:`_device_task_of`).
_DEVICE_TASKS: dict[tuple, tuple[RunConfig, Task]] = {}


def _data_dir(context: Context) -> str:
    """The node's own data directory from its ``node_config`` (``""``: none, the simulation path)."""
    return str(context.node_config.get(NODE_DATA_DIR, "") or "").strip()


def _device_task_of(record: ConfigRecord, data_dir: str) -> tuple[RunConfig, Task]:
    """The run configuration and the task of a node that holds its own data in ``data_dir``.

    The task is :func:`~fl_app.task.load_device_task`'s (the run's model, the
    examples in ``data_dir``); the run's own ``data-dir`` is not read. Cached
    per record contents and directory.

    Raises:
        ConfigError: bad configuration, or bad data in ``data_dir`` (one line).
    """
    key = (tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in record.items()), data_dir)
    hit = _DEVICE_TASKS.get(key)
    if hit is None:
        cfg = RunConfig.from_mapping(dict(record))
        hit = (cfg, load_device_task(cfg, data_dir))
        if len(_DEVICE_TASKS) >= 8:
            _DEVICE_TASKS.clear()
        _DEVICE_TASKS[key] = hit
    return hit


@app.query("info")
def query_info(msg: Message, context: Context) -> Message:
    """Handshake: store the task, reply partition id, size and label histogram.

    Size and histogram are those of the node's training examples: its
    partition of the run's dataset, or every example in its own ``data-dir``.
    A node with its own data and no ``partition-id`` replies
    :data:`UNASSIGNED` until the server assigns it an id: a second
    ``query.info`` whose ``info`` record carries ``partition-id``.
    """
    context.state[P.TASK] = ConfigRecord(dict(P.config_of(msg.content, P.TASK)))
    assigned = P.get_config(msg.content, P.INFO)
    if assigned is not None and P.INFO_PARTITION_ID in assigned:
        if "partition-id" in context.node_config:
            raise ConfigError(f"the server assigned partition {assigned[P.INFO_PARTITION_ID]} to a node whose "
                              f"node_config sets partition-id={context.node_config['partition-id']}")
        context.state[IDENTITY_KEY] = ConfigRecord({P.INFO_PARTITION_ID: int(assigned[P.INFO_PARTITION_ID])})
    node = _Node(context, need_id=False)
    hist = node.task.histogram(node.partition_id)
    info = ConfigRecord({
        P.INFO_PARTITION_ID: node.partition_id,
        P.INFO_NUM_EXAMPLES: node.task.num_examples(node.partition_id),
        P.INFO_LABEL_HISTOGRAM: [int(v) for v in hist],
    })
    return Message(RecordDict({P.INFO: info}), reply_to=msg)


def _input_gradient_record(x: torch.Tensor, start: int) -> dict[str, ArrayRecord]:
    """``{GRADIENT: dL/dx}`` for a range that does not start at block 0, else nothing."""
    return {P.GRADIENT: P.tensor_record("g", x.grad)} if start > 0 else {}


def _then(node: _Node, model: BlockModel, nxt: str, forward: Callable[[], RecordDict],
          content: RecordDict | None = None) -> RecordDict:
    """The rest of a reply after an update, by ``next``: the next forward's
    records, the slot's weights, or (when nothing else is returned) an acknowledgement."""
    content = content if content is not None else RecordDict()
    if nxt == P.NEXT_FORWARD:
        extra = forward()
    elif nxt == P.NEXT_WEIGHTS:
        extra = node.weights_reply(model)
    else:
        extra = RecordDict() if content else RecordDict({P.INFO: ConfigRecord({P.INFO_OK: True})})
    for key, record in extra.items():
        content[key] = record
    return content


@app.train("forward")
@committing
def train_forward(msg: Message, context: Context) -> Message:
    """Run a block range of a slot on own data or a relayed input (see :class:`~fl_app.protocol.ForwardConfig`)."""
    node = _Node(context)
    cfg = P.ForwardConfig.from_record(P.config_of(msg.content, P.CONFIG))
    slot = node.slot(cfg.slot, cfg.model_slot)
    weights = P.get_array(msg.content, P.WEIGHTS)
    if weights is not None:
        slot.load_weights(weights)
    end = cfg.end or node.task.cut_layer
    model = slot.model(cfg.start, end)
    if cfg.start == 0:
        if not cfg.loss:
            return Message(node.forward(slot, model, cfg.start, end, cfg.batch_size), reply_to=msg)
        record, x, y = node.sample(cfg.batch_size)
        record["start"], record["end"] = cfg.start, end
    else:
        acts, labels = P.array_of(msg.content, P.ACTIVATIONS), P.get_array(msg.content, P.LABELS)
        x = node.on_device(P.record_tensor(acts, "x"))
        y = node.on_device(P.record_tensor(labels, "y")) if labels is not None else None
        # kept (and the labels passed on) as received: the bytes that re-encoding x and y gives
        inputs = {"x": P.canonical(acts["x"])} if labels is None else \
            {"x": P.canonical(acts["x"]), "y": P.canonical(labels["y"])}
        slot.put("input", P.array_record(inputs))
        record = ConfigRecord({"start": cfg.start, "end": end})
    record[RNG_SEED] = seed = node.forward_seed()
    slot.put("batch", record)
    if not cfg.loss:
        out = slot.run_forward(model, x, seed, cfg.start)
        content = RecordDict({P.ACTIVATIONS: P.tensor_record("x", out)})
        if y is not None:
            content[P.LABELS] = P.array_record({"y": inputs["y"]}) if cfg.start > 0 else P.tensor_record("y", y)
        return Message(content, reply_to=msg)
    if y is None:
        raise ValueError("train.forward with loss=true needs labels")
    x.requires_grad_(cfg.start > 0)
    model.train()
    with fixed_rng(seed, node.device):
        loss = nn.functional.cross_entropy(model(x), y)
    loss.backward()
    slot.apply_gradients(model, cfg)
    content = RecordDict({**_input_gradient_record(x, cfg.start),
                          P.INFO: ConfigRecord({P.INFO_LOSS: float(loss.detach())})})
    return Message(content, reply_to=msg)


@app.train("backward")
@committing
def train_backward(msg: Message, context: Context) -> Message:
    """Recompute the slot's stored forward, apply the received gradient (see :class:`~fl_app.protocol.BackwardConfig`)."""
    node = _Node(context)
    cfg = P.BackwardConfig.from_record(P.config_of(msg.content, P.CONFIG))
    slot = node.slot(cfg.slot, cfg.model_slot)
    start, end = slot.range
    model = slot.model(start, end)
    grad = node.on_device(P.record_tensor(P.array_of(msg.content, P.GRADIENT), "g"))
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
    acts.backward(grad)
    shared = P.get_array(msg.content, P.OPTIMIZER)
    if shared is not None:  # the server's optimizer state replaces the slot's (GAS client-momentum=shared)
        slot.drop("optimizer")  # replaced, not merged: an empty record means no momentum yet
        if len(shared):
            slot.put("optimizer", shared)
    slot.apply_gradients(model, cfg)

    content = RecordDict(_input_gradient_record(x, start))
    if shared is not None:
        content[P.OPTIMIZER] = slot.array("optimizer")
    content = _then(node, model, cfg.next, lambda: node.forward(slot, model, start, end, cfg.batch_size), content)
    return Message(content, reply_to=msg)


@app.train("step")
@committing
def train_step(msg: Message, context: Context) -> Message:
    """Apply a slot's accumulated gradient (see :class:`~fl_app.protocol.StepConfig`)."""
    node = _Node(context)
    cfg = P.StepConfig.from_record(P.config_of(msg.content, P.CONFIG))
    slot = node.slot(cfg.slot)
    model = slot.model(*((cfg.start, cfg.end) if cfg.end else slot.range))
    opt = slot.optimizer(model, cfg)
    if load_gradients(model, slot.array("accum")):
        slot.step(model, opt, cfg.clip_norm)
    slot.drop("accum")
    content = node.weights_reply(model) if cfg.return_weights else RecordDict({P.INFO: ConfigRecord({P.INFO_OK: True})})
    return Message(content, reply_to=msg)


@app.train("zo_forward")
@committing
def train_zo_forward(msg: Message, context: Context) -> Message:
    """Unperturbed and perturbed embeddings of a new batch (see :class:`~fl_app.protocol.ZOForwardConfig`)."""
    node = _Node(context)
    cfg = P.ZOForwardConfig.from_record(P.config_of(msg.content, P.CONFIG))
    slot = node.slot(cfg.slot)
    weights = P.get_array(msg.content, P.WEIGHTS)
    if weights is not None:
        slot.load_weights(weights)
    end = cfg.end or node.task.cut_layer
    content = node.zo_forward(slot, slot.model(0, end), end, cfg.batch_size, cfg.perturbations, cfg.smoothing)
    return Message(content, reply_to=msg)


@app.train("zo_update")
@committing
def train_zo_update(msg: Message, context: Context) -> Message:
    """ZO step from the loss differences; no backward pass (see :class:`~fl_app.protocol.ZOUpdateConfig`)."""
    node = _Node(context)
    cfg = P.ZOUpdateConfig.from_record(P.config_of(msg.content, P.CONFIG))
    slot = node.slot(cfg.slot)
    start, end = slot.range
    model = slot.model(start, end)
    seeds = list(slot.batch.get(ZO_SEEDS, []))
    if len(seeds) != len(cfg.diffs):
        raise ValueError(f"{len(cfg.diffs)} loss differences for {len(seeds)} perturbations")
    shapes = shapes_of(model)
    grads = spsa_gradient(cfg.diffs, (direction(shapes, s) for s in seeds), cfg.smoothing, num_parameters(model))
    for p, g in zip((p for p in model.parameters() if p.requires_grad), grads):
        p.grad = to_device(g, p.device)
    slot.step(model, slot.optimizer(model, cfg), cfg.clip_norm)
    content = _then(node, model, cfg.next,
                    lambda: node.zo_forward(slot, model, end, cfg.batch_size, len(cfg.diffs), cfg.smoothing))
    return Message(content, reply_to=msg)


@app.train("fit")
def train_fit(msg: Message, context: Context) -> Message:
    """Full-model local training for the FL baselines (FedAvg, FedBuff, CA2FL)."""
    node = _Node(context)
    cfg = P.FitConfig.from_record(P.config_of(msg.content, P.CONFIG))
    model = node.task.build_model()
    model.load_state_dict(P.record_state(P.array_of(msg.content, P.WEIGHTS)))
    model = node.place(model)
    with fixed_rng(node.forward_seed(), node.device):  # dropout masks reproducible on every engine
        loss = local_fit(
            model, node.task, node.partition_id, node.config(SAMPLER_KEY),
            iterations=cfg.local_iterations, batch_size=cfg.batch_size, clip_norm=cfg.clip_norm,
            lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, optimizer=cfg.optimizer,
        )
    info = ConfigRecord({P.INFO_NUM_EXAMPLES: node.task.num_examples(node.partition_id), P.INFO_TRAIN_LOSS: loss})
    return Message(RecordDict({P.WEIGHTS: P.state_record(model.state_dict()), P.INFO: info}), reply_to=msg)


@app.evaluate()
def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate sent full-model weights on the test set or the local partition."""
    node = _Node(context)
    cfg = P.EvaluateConfig.from_record(P.get_config(msg.content, P.CONFIG))
    model = node.task.build_model()
    model.load_state_dict(P.record_state(P.array_of(msg.content, P.WEIGHTS)))
    model = node.place(model)
    if cfg.split == P.SPLIT_LOCAL:
        part = node.task.partitions[node.partition_id]
        batches = (node.task.data.train_batch(part[i:i + 1000]) for i in range(0, len(part), 1000))
    else:
        batches = node.task.data.test_batches()
    loss, acc, count = evaluate_model(model, batches)
    info = ConfigRecord({P.INFO_LOSS: loss, P.INFO_ACCURACY: acc, P.INFO_NUM_EXAMPLES: count})
    return Message(RecordDict({P.INFO: info}), reply_to=msg)
