"""The ClientApp's node: who a node is (its partition id), its task and data, and the handshake.

:class:`Node` is a view of one node's ``context.state`` for the duration of a
message: its run configuration and task (cached per task record), its
partition id (:func:`_partition_id`: from its ``node_config``, or assigned by
the server in the handshake, :func:`query_info`), its torch device, its live
cache (:mod:`fl_app.client.live`) and its model slots (:mod:`fl_app.client.slots`).
It samples the node's own batches and draws the dropout seeds of its training
forward passes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

import torch
from torch import nn
from flwr.app import ConfigRecord, Context, Message, RecordDict

from fl_app import protocol as P
from fl_app.client.hidden import hides, sealed_reply
from fl_app.client.slots import Slot
from fl_app.client.state import IDENTITY_KEY, RNG_KEY, RNG_SEED, SAMPLER_KEY, STREAM_DROPOUT
from fl_app.run.config import RunConfig
from fl_app.run.device import resolve_device, to_device
from fl_app.run.errors import ConfigError
from fl_app.client.live import live_cache
from fl_app.models import BlockModel, draws_random
from fl_app.run.numerics import establish
from fl_app.privacy.activations import NOISE_SEED, ActivationDefence, noise_seed, write_ground_truth
from fl_app.learning.task import Task, load_device_task, load_task
from fl_app.learning.training import next_batch
from fl_app.learning.zo import zo_seed

#: A message config type of :mod:`fl_app.protocol` (``from_record``).
C = TypeVar("C")
#: ``node_config`` key of a node's own data directory (device-local data, ``--node-config data-dir=DIR``).
NODE_DATA_DIR = "data-dir"
#: ``node_config`` key of the torch device a node computes on (``--node-config 'device="cuda"'``);
#: absent: the run's ``device`` key
NODE_DEVICE = "device"
#: The partition id a node reports in the handshake before it has one (device-local data, none given).
UNASSIGNED = -1


class Node:
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
        #: where this node computes: ``device`` in its node_config, else the run's key (:mod:`fl_app.run.device`)
        self.device = resolve_device(str(context.node_config.get(NODE_DEVICE, "") or self.cfg.device))
        #: the node's live models and graphs, where its state persists between messages (:mod:`fl_app.client.live`);
        #: CPU nodes only (the cache builds its models on the CPU)
        self.live = live_cache(context.state) if self.device.type == "cpu" else None
        #: the run's defences on uploaded activations (:mod:`fl_app.privacy.activations`); None: off
        self.defence = ActivationDefence.from_config(self.cfg)

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

    def slot(self, name: str, model_slot: str = "") -> Slot:
        """The model slot ``name`` (using ``model_slot``'s model when given)."""
        return Slot(self, name, model_slot)

    def sample(self, batch_size: int) -> tuple[ConfigRecord, torch.Tensor, torch.Tensor]:
        """Sample the next batch of own data: ``(batch record, x, y)``."""
        idx, step, x, y = next_batch(self.task, self.partition_id, self.config(SAMPLER_KEY), batch_size)
        x, y = self.on_device(x), self.on_device(y)
        return ConfigRecord({"indices": idx.tolist(), "step": step}), x, y

    def forward_seed(self, model: nn.Module | None = None) -> int | None:
        """A fresh dropout seed for a training forward pass of ``model``, from ``(seed, partition, counter)``;
        None for a model that draws no random numbers (:func:`~fl_app.models.draws_random`; the counter
        counts the pass all the same). Without a model (a local training loop): always a seed.

        Stored in the slot's batch record, so that ``train.backward``
        recomputes the forward pass with the same dropout masks.
        """
        rec = self.config(RNG_KEY)
        count = int(rec.get("forwards", 0))
        rec["forwards"] = count + 1
        if model is not None and not draws_random(model):
            return None
        return zo_seed(self.task.seed, STREAM_DROPOUT, self.partition_id, count)

    def remember_batch(self, slot: Slot, record: ConfigRecord, model: nn.Module) -> int | None:
        """Store ``record`` as ``slot``'s batch with the forward pass's dropout seed (see :meth:`forward_seed`,
        left out when None); the seed."""
        count = int(self.config(RNG_KEY).get("forwards", 0))
        seed = self.forward_seed(model)
        if seed is not None:
            record[RNG_SEED] = seed
        if self.defence is not None and self.defence.noisy and int(record.get("start", 0)) == 0:
            record[NOISE_SEED] = noise_seed(self.task.seed, self.partition_id, count)
        slot.put("batch", record)
        return seed

    def forward(self, slot: Slot, model: BlockModel, start: int, end: int, batch_size: int,
                labels: bool = True) -> RecordDict:
        """Sample the next own batch, run blocks ``[start, end)``, remember the batch (and its dropout seed);
        the reply's activations, and its labels unless ``labels`` is False (they stay on the node: U-shaped).

        With defences on (:mod:`fl_app.privacy.activations`) the activations are what the defence releases; with
        ``privacy-record`` the evaluator's ground truth of the batch is written too.
        """
        record, x, y = self.sample(batch_size)
        record["start"], record["end"] = start, end
        seed = self.remember_batch(slot, record, model)
        defence = self.defence if start == 0 else None
        release = None if defence is None else lambda out: defence.release(out, record.get(NOISE_SEED))
        acts = slot.run_forward(model, x, seed, start, release)
        if self.cfg.get("privacy-record") and start == 0:
            write_ground_truth(str(self.cfg.get("output-dir")), self.partition_id, x, acts)
        content = P.record_dict({P.ACTIVATIONS: P.tensor_record("x", acts)})
        if labels:
            content[P.LABELS] = P.tensor_record("y", y)
        return content

    def weights_reply(self, model: BlockModel) -> RecordDict:
        """The slot's weights and this node's example count; sealed with ``hide-client-models``
        (:func:`fl_app.client.hidden.sealed_reply`)."""
        if hides(self):
            return sealed_reply(self, model)
        return P.record_dict({
            P.WEIGHTS: P.state_record(model.state_dict()),
            P.INFO: ConfigRecord({P.INFO_NUM_EXAMPLES: self.task.num_examples(self.partition_id)}),
        })

    def reply_after_update(self, model: BlockModel, nxt: str, forward: Callable[[], RecordDict],
                           content: RecordDict | None = None) -> RecordDict:
        """The rest of a reply after an update, by ``next``: the next forward's
        records, the slot's weights, or (when nothing else is returned) an acknowledgement."""
        content = content if content is not None else RecordDict()
        if nxt == P.NEXT_FORWARD:
            extra = forward()
        elif nxt == P.NEXT_WEIGHTS:
            extra = self.weights_reply(model)
        else:
            extra = RecordDict() if content else acknowledgement()
        for key, record in extra.items():
            P.set_record(content, key, record)
        return content

    def full_model(self, content: RecordDict) -> BlockModel:
        """The whole model with the message's :data:`~fl_app.protocol.WEIGHTS`, on :attr:`device`."""
        model = self.task.build_model()
        model.load_state_dict(P.record_state(P.array_of(content, P.WEIGHTS)))
        return self.place(model)


def node_and_config(msg: Message, context: Context, config_type: type[C]) -> tuple[Node, C]:
    """The :class:`Node` of ``context`` and the message's ``config`` record read as ``config_type``.

    Raises:
        RuntimeError: the node has no task yet (see :class:`Node`).
        KeyError: the message has no ``config`` record (a bad one raises what
            ``config_type.from_record`` raises).
    """
    node = Node(context)
    return node, config_type.from_record(P.config_of(msg.content, P.CONFIG))


def acknowledgement() -> RecordDict:
    """The reply content that only says the message was applied (``info.ok``)."""
    return P.record_dict({P.INFO: ConfigRecord({P.INFO_OK: True})})


#: Recent task records (snapshots of their contents), their RunConfig and task, newest first (see :func:`_task_of`).
_CONFIGS: list[tuple[dict, RunConfig, Task]] = []


def _task_of(record: ConfigRecord) -> tuple[RunConfig, Task]:
    """The run configuration and task of a node's task record.

    ``RunConfig.from_mapping`` checks every key, which cost more than a small
    relay message's compute, so the configurations (and their tasks, from
    :func:`~fl_app.learning.task.load_task`) of the last few task records are kept,
    matched by the records' contents, not their identity: a node whose state
    was copied (Ray, deployment) gets what a fresh computation gives. A
    record seen before (in-process, the same object in every message) is
    found by its identity first.
    """
    hit = _TASK_RECORDS.get(id(record))
    if hit is not None and hit[0] is record:  # a record read before (a node's state kept in-process)
        return hit[1], hit[2]
    cfg, task = _task_of_contents(record)
    if len(_TASK_RECORDS) >= 64:
        _TASK_RECORDS.clear()
    _TASK_RECORDS[id(record)] = (record, cfg, task)
    return cfg, task


#: ``id(record) -> (record, RunConfig, Task)`` of the task records :func:`_task_of` read (kept alive, so
#: ids stay unique; a handshake writes a new record, and nothing changes one after)
_TASK_RECORDS: dict[int, tuple[ConfigRecord, RunConfig, Task]] = {}


def _task_of_contents(record: ConfigRecord) -> tuple[RunConfig, Task]:
    """:func:`_task_of` by the record's contents."""
    values = dict(record.items())
    for snapshot, cfg, task in _CONFIGS:
        if snapshot == values:
            return cfg, task
    cfg = RunConfig.from_mapping(values)
    establish(cfg.numerics)  # a Ray actor or a SuperNode started without portable numerics stops here
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


#: (task record contents, data dir) -> (RunConfig, device Task), for this process (see :func:`_device_task_of`).
_DEVICE_TASKS: dict[tuple, tuple[RunConfig, Task]] = {}


def _data_dir(context: Context) -> str:
    """The node's own data directory from its ``node_config`` (``""``: none, the simulation path)."""
    return str(context.node_config.get(NODE_DATA_DIR, "") or "").strip()


def _device_task_of(record: ConfigRecord, data_dir: str) -> tuple[RunConfig, Task]:
    """The run configuration and the task of a node that holds its own data in ``data_dir``.

    The task is :func:`~fl_app.learning.task.load_device_task`'s (the run's model, the
    examples in ``data_dir``); the run's own ``data-dir`` is not read. Cached
    per record contents and directory.

    Raises:
        ConfigError: bad configuration, or bad data in ``data_dir`` (one line).
    """
    key = (tuple((k, tuple(v) if isinstance(v, list) else v) for k, v in record.items()), data_dir)
    hit = _DEVICE_TASKS.get(key)
    if hit is None:
        cfg = RunConfig.from_mapping(dict(record))
        establish(cfg.numerics)
        hit = (cfg, load_device_task(cfg, data_dir))
        if len(_DEVICE_TASKS) >= 8:
            _DEVICE_TASKS.clear()
        _DEVICE_TASKS[key] = hit
    return hit


def _shared_task_record(incoming: ConfigRecord) -> ConfigRecord:
    """The task record a node keeps: one ConfigRecord per distinct task in this process, shared by its nodes.

    A ConfigRecord of the run's ~110 keys checks every value when built (about 4 ms): one per node
    was most of a 10,000-client handshake, and 10,000 copies of the same record in memory. Nothing
    changes a task record once stored (a new handshake stores a new one), so nodes with equal
    records share one. The incoming record is matched by identity first (in-process, every
    ``query.info`` carries the same object), then by contents (Ray, deployment: a copy each).
    """
    for source, values, shared in _SHARED_TASKS:
        if source is incoming:
            return shared
    snapshot = dict(incoming.items())
    for _, values, shared in _SHARED_TASKS:
        if values == snapshot:
            break
    else:
        shared = ConfigRecord(dict(snapshot))
    _SHARED_TASKS.insert(0, (incoming, snapshot, shared))  # the source kept alive, so its identity stays unique
    del _SHARED_TASKS[4:]
    return shared


#: ``(incoming record, its contents, the shared record)`` of the last task records :func:`query_info` stored
_SHARED_TASKS: list[tuple[ConfigRecord, dict, ConfigRecord]] = []


def query_info(msg: Message, context: Context) -> Message:
    """Handshake: store the task, reply partition id, size and label histogram (not in a U-shaped run,
    ``cut-layers``: the node keeps its label counts).

    Size and histogram are those of the node's training examples: its
    partition of the run's dataset, or every example in its own ``data-dir``.
    A node with its own data and no ``partition-id`` replies
    :data:`UNASSIGNED` until the server assigns it an id: a second
    ``query.info`` whose ``info`` record carries ``partition-id``.
    """
    context.state[P.TASK] = _shared_task_record(P.config_of(msg.content, P.TASK))
    assigned = P.get_config(msg.content, P.INFO)
    if assigned is not None and P.INFO_PARTITION_ID in assigned:
        if "partition-id" in context.node_config:
            raise ConfigError(f"the server assigned partition {assigned[P.INFO_PARTITION_ID]} to a node whose "
                              f"node_config sets partition-id={context.node_config['partition-id']}")
        context.state[IDENTITY_KEY] = ConfigRecord({P.INFO_PARTITION_ID: int(assigned[P.INFO_PARTITION_ID])})
    node = Node(context, need_id=False)
    info = ConfigRecord({
        P.INFO_PARTITION_ID: node.partition_id,
        P.INFO_NUM_EXAMPLES: node.task.num_examples(node.partition_id),
    })
    if not node.cfg.ushaped:  # a label-private (U-shaped) node keeps its label counts too
        info[P.INFO_LABEL_HISTOGRAM] = [int(v) for v in node.task.histogram(node.partition_id)]
    return Message(RecordDict({P.INFO: info}), reply_to=msg)
