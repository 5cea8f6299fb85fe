"""The ClientApp's whole-model handlers: ``train.fit`` (the FL baselines) and ``evaluate``.

Both receive the whole model's weights. ``train.fit`` trains it locally for a
number of steps on the node's own data (FedAvg, FedBuff, CA2FL;
:func:`fl_app.learning.training.local_fit`) and returns it; ``evaluate`` scores it on
the test set or on the node's own partition, for every strategy.
"""

from __future__ import annotations

from flwr.app import ConfigRecord, Context, Message, RecordDict

from fl_app import protocol as P
from fl_app.client.node import Node, node_and_config
from fl_app.client.state import SAMPLER_KEY
from fl_app.models import fixed_rng
from fl_app.learning.training import evaluate_model, local_fit


def train_fit(msg: Message, context: Context) -> Message:
    """Full-model local training for the FL baselines (FedAvg, FedBuff, CA2FL)."""
    node, cfg = node_and_config(msg, context, P.FitConfig)
    model = node.full_model(msg.content)
    with fixed_rng(node.forward_seed(), node.device):  # dropout masks reproducible on every engine
        loss = local_fit(
            model, node.task, node.partition_id, node.config(SAMPLER_KEY),
            iterations=cfg.local_iterations, batch_size=cfg.batch_size, clip_norm=cfg.clip_norm,
            lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, optimizer=cfg.optimizer,
        )
    info = ConfigRecord({P.INFO_NUM_EXAMPLES: node.task.num_examples(node.partition_id), P.INFO_TRAIN_LOSS: loss})
    return Message(RecordDict({P.WEIGHTS: P.state_record(model.state_dict()), P.INFO: info}), reply_to=msg)


def evaluate(msg: Message, context: Context) -> Message:
    """Evaluate sent full-model weights on the test set or the local partition."""
    node = Node(context)
    cfg = P.EvaluateConfig.from_record(P.get_config(msg.content, P.CONFIG))
    model = node.full_model(msg.content)
    if cfg.split == P.SPLIT_LOCAL:
        part = node.task.partitions[node.partition_id]
        batches = (node.task.data.train_batch(part[i:i + 1000]) for i in range(0, len(part), 1000))
    else:
        batches = node.task.data.test_batches()
    loss, acc, count = evaluate_model(model, batches)
    info = ConfigRecord({P.INFO_LOSS: loss, P.INFO_ACCURACY: acc, P.INFO_NUM_EXAMPLES: count})
    return Message(RecordDict({P.INFO: info}), reply_to=msg)
