"""Request builders: the content of every message a strategy sends, from its typed config.

One builder per action; each puts the config under :data:`~fl_app.protocol.keys.CONFIG`
(encoded once per config object, :meth:`~fl_app.protocol.configs.ActionConfig.record`)
and the records the action reads. The compute and transfer figures a
strategy attaches to a request are not the protocol's: see
:mod:`strategies.core.requests`. Relayed records (RingSFL's hops) are passed on
as they arrived, without a decode and encode round trip.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from flwr.app import ArrayRecord, ConfigRecord, RecordDict

from fl_app.protocol import keys as K
from fl_app.protocol.configs import (
    ActionConfig,
    BackwardConfig,
    EvaluateConfig,
    FitConfig,
    ForwardConfig,
    StepConfig,
    ZOForwardConfig,
    ZOUpdateConfig,
)
from fl_app.protocol.records import array_of, get_array, record_dict, set_record, tensor_record


class RelayTag(NamedTuple):
    """The tag of a relayed hop's request (RingSFL): which batch, where on its path.

    Attributes:
        kind: ``"fwd"``, ``"bwd"`` or ``"step"``.
        step: the ring step (0-based) within the round.
        origin: ring position of the client whose batch it is (for ``"step"``: the node's position).
        hop: the hop along the origin's path (0: the origin itself).
    """

    kind: str
    step: int
    origin: int
    hop: int


def content(config: ActionConfig, **records: ArrayRecord | ConfigRecord | None) -> RecordDict:
    """A message's content: ``config`` under ``config``, then each record given (None: left out)."""
    out = record_dict({K.CONFIG: config.record()})
    for key, record in records.items():
        if record is not None:
            set_record(out, key, record)
    return out


def forward(config: ForwardConfig, *, weights: ArrayRecord | None = None,
            relayed: RecordDict | None = None) -> RecordDict:
    """``train.forward``: ``weights`` (when given) replace the slot's; ``relayed``, the previous hop's
    forward reply, gives the input (its ``activations`` and, where it has them, ``labels`` records, passed
    on as they are; a U-shaped tail's input has none)."""
    if relayed is None:
        return content(config, weights=weights)
    return content(config, weights=weights, activations=array_of(relayed, K.ACTIVATIONS),
                   labels=get_array(relayed, K.LABELS))


def backward(config: BackwardConfig, gradient: torch.Tensor | RecordDict, *,
             optimizer: ArrayRecord | None = None) -> RecordDict:
    """``train.backward`` of ``gradient``: a tensor shaped like the slot's last output, or the next
    hop's reply whose ``gradient`` record is relayed as it is; ``optimizer`` replaces the slot's
    optimizer state (GAS ``client-momentum=shared``)."""
    grad = array_of(gradient, K.GRADIENT) if isinstance(gradient, RecordDict) else tensor_record("g", gradient)
    out = record_dict({K.GRADIENT: grad, K.CONFIG: config.record()})
    if optimizer is not None:
        out[K.OPTIMIZER] = optimizer
    return out


def step(config: StepConfig) -> RecordDict:
    """``train.step``: apply the slot's accumulated gradient (or, with nothing accumulated, only reply)."""
    return content(config)


def fit(config: FitConfig, weights: ArrayRecord) -> RecordDict:
    """``train.fit`` from full-model ``weights``."""
    return RecordDict({K.WEIGHTS: weights, K.CONFIG: config.record()})


def evaluate(config: EvaluateConfig, weights: ArrayRecord) -> RecordDict:
    """``evaluate`` the full-model ``weights``."""
    return RecordDict({K.WEIGHTS: weights, K.CONFIG: config.record()})


def zo_forward(config: ZOForwardConfig, weights: ArrayRecord | None = None) -> RecordDict:
    """``train.zo_forward``: ``weights`` (when given) replace the slot's."""
    return content(config, weights=weights)


def zo_update(config: ZOUpdateConfig) -> RecordDict:
    """``train.zo_update`` with the loss differences in ``config.diffs``."""
    return content(config)


def query_info(task: ConfigRecord, partition_id: int | None = None) -> RecordDict:
    """``query.info``: the run configuration; ``partition_id`` assigns one to a node holding its own data."""
    out = RecordDict({K.TASK: task})
    if partition_id is not None:
        out[K.INFO] = ConfigRecord({K.INFO_PARTITION_ID: partition_id})
    return out
