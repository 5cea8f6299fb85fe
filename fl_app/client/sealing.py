"""A node's checkpointed state, sealed on the node: AES-256-GCM under a key that never leaves it.

``query.checkpoint`` (:mod:`fl_app.client.checkpoint`) replies with the node's whole ``context.state``:
its last batches' indices (which give the labels wherever the server holds the dataset), its client-side
models (a U-shaped client's tail included), their momentum buffers, its sampler and RNG counters. The
server keeps that reply in its checkpoint file and sends it back at a resume, so it only needs to *store*
it: :func:`seal` serialises the records (Flower's own protobuf form of a RecordDict) and encrypts them with
AES-GCM (the ``cryptography`` package), the partition id as associated data; the reply is one
ConfigRecord ``sealed`` = ``{format, nonce, blob}``, opaque to the server. :func:`unseal` refuses, in one
line, a state that is not sealed, was sealed for another partition or under another key, or was changed.

**Where the key lives** (:func:`key_path`): generated once per node (32 random bytes, file mode 0600) and
read back from then on, never put in a message or in ``context.state``:

* ``state-dir`` in the node's ``node_config`` (a SuperNode started with ``--node-config
  "state-dir='/var/lib/sflower'"``): ``STATE_DIR/checkpoint.key``;
* otherwise ``RUN_DIR/nodes/node-K/checkpoint.key`` (``K`` the partition id), written by the node itself:
  on a device that is the device's own disk (as the clients' privacy records are), and a resumed run
  (``output-dir`` = the same ``RUN_DIR``) finds it again.

What a simulation can and cannot guarantee: in a simulation (the in-process engine, Ray's virtual
SuperNodes) every virtual node runs on the server's machine, under the server's user, and the in-process
engine in the server's own process: the key file sits next to the checkpoint, and nothing stops the
server's code from reading it. The simulation shows that the protocol never sends the key and that the
server's checkpoint holds only ciphertext; the secrecy itself holds only where a node's disk is its own
(deployment).
"""

from __future__ import annotations

import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from flwr.app import ConfigRecord, Context, RecordDict
from flwr.common.serde import recorddict_from_proto, recorddict_to_proto
from flwr.proto.recorddict_pb2 import RecordDict as ProtoRecordDict

#: Record key of a sealed state (the only record of a ``query.checkpoint`` reply).
SEALED = "sealed"
#: Version of the sealed form (``format`` in the record).
SEAL_FORMAT = 1
#: ``node_config`` key of the node's own state directory, where its checkpoint key lives.
NODE_STATE_DIR = "state-dir"
#: File name of a node's checkpoint key.
KEY_FILE = "checkpoint.key"
#: Bytes of an AES-256 key, and of a GCM nonce.
KEY_BYTES, NONCE_BYTES = 32, 12


class SealError(ValueError):
    """A sealed state cannot be opened on this node (one line)."""


def key_path(context: Context, run_dir: str, partition_id: int) -> Path:
    """Where this node's checkpoint key lives: ``state-dir`` in its ``node_config``, else
    ``run_dir/nodes/node-K/checkpoint.key`` (see the module docstring).

    Raises:
        SealError: neither a ``state-dir`` nor a run directory (``output-dir`` empty).
    """
    state_dir = str(context.node_config.get(NODE_STATE_DIR, "") or "").strip()
    if state_dir:
        return Path(state_dir) / KEY_FILE
    if not str(run_dir or "").strip():
        raise SealError("the node has no place for its checkpoint key: give its node_config a state-dir, "
                        "or the run an output-dir")
    return Path(run_dir) / "nodes" / f"node-{partition_id}" / KEY_FILE


def node_key(path: Path) -> bytes:
    """The key at ``path``, made there (32 random bytes, mode 0600, created exclusively) if there is none.

    Raises:
        SealError: the file exists and is not a key (wrong length), or cannot be read or written.
    """
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            key = path.read_bytes()
        else:
            key = AESGCM.generate_key(bit_length=8 * KEY_BYTES)
            with os.fdopen(fd, "wb") as fh:
                fh.write(key)
                fh.flush()
                os.fsync(fh.fileno())
    except OSError as err:
        raise SealError(f"the node's checkpoint key {path}: {err.strerror or err}") from None
    if len(key) != KEY_BYTES:
        raise SealError(f"{path} is not a checkpoint key ({len(key)} bytes, not {KEY_BYTES})")
    return key


def _aad(partition_id: int) -> bytes:
    return f"sflower/checkpoint/{SEAL_FORMAT}/partition={partition_id}".encode()


def seal(state: RecordDict, key: bytes, partition_id: int) -> RecordDict:
    """``state`` sealed: ``{SEALED: {format, nonce, blob}}``, ``blob`` = AES-GCM of its protobuf bytes
    (a fresh random 12-byte nonce; the partition id as associated data)."""
    nonce = os.urandom(NONCE_BYTES)
    plain = recorddict_to_proto(state).SerializeToString()
    blob = AESGCM(key).encrypt(nonce, plain, _aad(partition_id))
    return RecordDict({SEALED: ConfigRecord({"format": SEAL_FORMAT, "nonce": nonce, "blob": blob})})


def unseal(content: RecordDict, key: bytes, partition_id: int) -> RecordDict:
    """The state :func:`seal` sealed in ``content``.

    Raises:
        SealError: ``content`` is not a sealed state (a checkpoint of an older sflower), has another format,
            or fails authentication (changed, sealed for another partition or under another key).
    """
    record = content.get(SEALED) if SEALED in content else None
    if not isinstance(record, ConfigRecord) or set(content.keys()) != {SEALED}:
        raise SealError("the state to restore is not sealed by a node (a checkpoint of an older sflower?)")
    if record.get("format") != SEAL_FORMAT:
        raise SealError(f"the sealed state has format {record.get('format')!r}; this node reads {SEAL_FORMAT}")
    try:
        plain = AESGCM(key).decrypt(bytes(record["nonce"]), bytes(record["blob"]), _aad(partition_id))
    except (InvalidTag, KeyError, TypeError, ValueError):
        raise SealError(f"the sealed state fails authentication on client {partition_id}: changed, or sealed "
                        "by another node or under another key") from None
    return recorddict_from_proto(ProtoRecordDict.FromString(plain))
