"""The client message protocol: action names, record keys and codecs.

DESIGN.md section 4. Strategies compose a small, fixed set of actions; each
is a Flower message type ``"<category>.<action>"`` routed by the ClientApp.

Record keys used in message content (a :class:`flwr.app.RecordDict`):

=================  ==========  ==============================================
key                kind        meaning
=================  ==========  ==============================================
``task``           Config      the run configuration (handshake only)
``config``         Config      per-message settings (batch size, lr, ...)
``weights``        Array       model weights (a torch ``state_dict``)
``activations``    Array       one tensor ``"x"``: float32 ``[B, ...]``
``labels``         Array       one tensor ``"y"``: int64 ``[B]``
``gradient``       Array       one tensor ``"g"``: float32, shape of the
                               activations it answers
``info``           Config      handshake reply / example counts / metrics
=================  ==========  ==============================================
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np
import torch
from flwr.app import Array, ArrayRecord

# --- actions (message types) -------------------------------------------------
QUERY_INFO = "query.info"
TRAIN_FORWARD = "train.forward"
TRAIN_BACKWARD = "train.backward"
TRAIN_FIT = "train.fit"
EVALUATE = "evaluate"

ACTIONS = (QUERY_INFO, TRAIN_FORWARD, TRAIN_BACKWARD, TRAIN_FIT, EVALUATE)

# --- record keys ---------------------------------------------------------------
TASK = "task"
CONFIG = "config"
WEIGHTS = "weights"
ACTIVATIONS = "activations"
LABELS = "labels"
GRADIENT = "gradient"
INFO = "info"

# --- values of config["next"] in train.backward ----------------------------
NEXT_FORWARD = "forward"  # piggyback the next forward pass
NEXT_WEIGHTS = "weights"  # the local round is over: return the client-side model
NEXT_NONE = "none"


def tensor_record(name: str, tensor: torch.Tensor) -> ArrayRecord:
    """Wrap one tensor (any dtype, any shape) in an ArrayRecord under ``name``."""
    return ArrayRecord({name: Array(tensor.detach().cpu().contiguous().numpy())})


def record_tensor(record: ArrayRecord, name: str) -> torch.Tensor:
    """The tensor stored by :func:`tensor_record` (a fresh, writable copy)."""
    return torch.from_numpy(np.array(record[name].numpy(), copy=True))


def state_record(state: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """Encode a torch ``state_dict`` (or any name -> tensor mapping)."""
    return ArrayRecord(
        {k: Array(v.detach().cpu().contiguous().numpy()) for k, v in state.items()}
    )


def record_state(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """Decode an ArrayRecord made by :func:`state_record` into tensors."""
    return {k: torch.from_numpy(np.array(a.numpy(), copy=True)) for k, a in record.items()}


def record_bytes(record: ArrayRecord | None) -> int:
    """Payload size of an ArrayRecord in bytes (tensor data only, from shapes and dtypes;
    nothing is deserialised)."""
    if record is None:
        return 0
    return int(sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in record.values()))
