"""The label audit: what each client's replies carried of its labels (``privacy-record=true``).

A Flower mod, the outermost of the ClientApp, so that it sees every reply as
it leaves the node (after the cut's codecs): for each reply to the server
(not the ``query.session`` wrapper, whose requests pass through the mod one
by one) it looks for

* a record named ``labels`` (:data:`fl_app.protocol.LABELS`), or a label
  histogram in the handshake's ``info`` record,
* any integer array (an array of an ArrayRecord, or a list of integers in a
  ConfigRecord) equal to the labels of a batch of the node's own data that it
  holds (the last own batch of each model slot), and
* any such integer array equal to that batch's *indices* into the dataset
  (which give its labels wherever the server holds the dataset),

in every reply, the checkpoint's (``query.checkpoint``) included (a sealed
state, :mod:`fl_app.client.sealing`, is bytes, and passes), and appends one
line per reply checked to ``RUN_DIR/privacy/evaluator/audit-K.jsonl`` (``K``
the partition id; one write per reply, never read back on the node):
``{"reply": "train.forward", "label_record": false, "label_arrays":
["activations/y", ...], "index_arrays": ["slot.own.batch/indices", ...]}``.
:func:`read_audit` sums a file into ``{"replies": n, "label_records":
["train.forward", ...], "label_arrays": ["train.forward:labels/y", ...],
"index_arrays": ["query.checkpoint:slot.own.batch/indices", ...]}``. In a prefix split the server holds
the labels by construction, and the audit lists them; in a label-private
(U-shaped) split it must find none. The file is written on the node itself,
so the check holds on real devices (the evaluator collects it; the server
never reads it). Off (no ``privacy-record``), the mod only reads one key.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from flwr.app import ArrayRecord, ConfigRecord, Context, Message

from fl_app import protocol as P
from fl_app.client.node import Node
from fl_app.privacy.activations import EVALUATOR_DIR, PRIVACY_DIR

#: The messages the audit does not check: the session's wrapper (its requests are checked one by one).
UNCHECKED = ("query.session",)


def own_batches(node: Node) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """``(labels, indices)`` of every own-data batch the node's slots hold (int64 ``[B]`` each, in slot order)."""
    y = node.task.data.y_train.numpy()
    labels, indices = [], []
    for key, record in node.state.items():
        if key.startswith("slot.") and key.endswith(".batch") and isinstance(record, ConfigRecord):
            if int(record.get("start", 0)) == 0 and "indices" in record:
                idx = np.asarray(list(record["indices"]), dtype=np.int64)
                indices.append(idx)
                labels.append(y[idx])
    return labels, indices


def _integer_arrays(reply: Message):
    """``("record/name", int array)`` of every integer array of ``reply``: ArrayRecords' integer arrays and
    ConfigRecords' non-empty lists of integers (bytes, such as a sealed state, are not arrays)."""
    for key, record in reply.content.items():
        if isinstance(record, ArrayRecord):
            for name in record.keys():
                arr = P.record_tensor(record, name).numpy()
                if arr.dtype.kind in "iu":
                    yield f"{key}/{name}", arr
        elif isinstance(record, ConfigRecord):
            for name, value in record.items():
                if isinstance(value, list) and value and all(isinstance(v, int) and not isinstance(v, bool)
                                                              for v in value):
                    yield f"{key}/{name}", np.asarray(value, dtype=np.int64)


def _equal_to_one(arr: np.ndarray, of: list[np.ndarray]) -> bool:
    return any(arr.shape == ref.shape and np.array_equal(arr, ref) for ref in of)


def findings(reply: Message, labels: list[np.ndarray],
             indices: list[np.ndarray] | None = None) -> tuple[bool, list[str], list[str]]:
    """``(has a labels record or a label histogram, ["record/array" of each integer array equal to one of
    labels], ["record/array" of each integer array equal to one of indices])`` of ``reply``."""
    found, index_found = [], []
    for where, arr in _integer_arrays(reply):
        if _equal_to_one(arr, labels):
            found.append(where)
        if _equal_to_one(arr, indices or []):
            index_found.append(where)
    info = P.get_config(reply.content, P.INFO)
    return P.LABELS in reply.content or (info is not None and P.INFO_LABEL_HISTOGRAM in info), found, index_found


def audit_path(run_dir: str | Path, partition_id: int) -> Path:
    """``RUN_DIR/privacy/evaluator/audit-K.jsonl``."""
    return Path(run_dir) / PRIVACY_DIR / EVALUATOR_DIR / f"audit-{partition_id}.jsonl"


def read_audit(path: str | Path) -> dict:
    """The audit of one node, summed: ``{"replies": n, "label_records": [message type of each reply with a
    labels record or a label histogram], "label_arrays": ["type:record/array", ...], "index_arrays":
    ["type:record/array", ...]}`` (a line cut short, as by a killed node, is left out).

    Raises:
        OSError: ``path`` cannot be read.
    """
    total: dict = {"replies": 0, "label_records": [], "label_arrays": [], "index_arrays": []}
    for line in Path(path).read_text().splitlines():
        try:
            entry = json.loads(line)
        except json.JSONDecodeError:
            continue
        total["replies"] += 1
        if entry["label_record"]:
            total["label_records"].append(entry["reply"])
        total["label_arrays"] += [f"{entry['reply']}:{a}" for a in entry["label_arrays"]]
        total["index_arrays"] += [f"{entry['reply']}:{a}" for a in entry.get("index_arrays", [])]
    return total


def label_audit(msg: Message, context: Context, call_next) -> Message:
    """Flower mod: the reply of ``call_next``, audited for the node's labels when ``privacy-record`` is on."""
    reply = call_next(msg, context)
    task = P.get_config(context.state, P.TASK)
    kind = msg.metadata.message_type
    if task is None or not task.get("privacy-record") or kind in UNCHECKED or reply.has_error():
        return reply
    node = Node(context, need_id=False)
    if node.partition_id < 0:
        return reply
    has_record, arrays, index_arrays = findings(reply, *own_batches(node))
    path = audit_path(str(node.cfg.get("output-dir")), node.partition_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as fh:
        fh.write(json.dumps({"reply": kind, "label_record": has_record, "label_arrays": arrays,
                             "index_arrays": index_arrays}) + "\n")
    return reply
