"""A node's checkpointed state sealed on the node (fl_app/client/sealing.py), and the audit of every reply.

* A sealed state holds no plaintext of the batch indices or the weights, and round-trips on the node.
* A changed blob, another partition's blob, another key's blob, a state that is not sealed: refused in one line.
* The node's key is made once (32 bytes, mode 0600) and read back; ``state-dir`` places it on the node.
* The audit flags an integer array or list equal to a batch's indices in any reply (a plain checkpoint's
  ``indices``), and passes the sealed one; a U-shaped run with checkpoints and ``privacy-record`` audits its
  ``query.checkpoint`` replies, and finds nothing in them.
"""

from __future__ import annotations

import stat

import numpy as np
import pytest
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fl_app.client.audit import audit_path, findings
from fl_app.client.sealing import SEALED, SealError, key_path, node_key, seal, unseal
from fl_app.run.config import RunConfig
from simulation.engine import run_inprocess
from simulation.server_app import plan_run
from tests.test_ushaped import BASE

pytestmark = pytest.mark.usefixtures("one_torch_thread")

INDICES = [4012, 77, 1999, 3, 2500, 618, 4242, 1234]


def _state() -> RecordDict:
    weights = torch.arange(24, dtype=torch.float32).reshape(4, 6) / 7 + 0.123
    momentum = torch.full((4, 6), 0.5)
    return RecordDict({
        "slot.own.batch": ConfigRecord({"start": 0, "end": 2, "indices": INDICES, "step": 3}),
        "slot.tail.weights": ArrayRecord({"w": Array(weights.numpy())}),
        "slot.tail.optimizer": ArrayRecord({"momentum": Array(momentum.numpy())}),
        "rng": ConfigRecord({"forwards": 17}),
    })


def _varints(values: list[int]) -> bytes:
    """Protobuf's packed zigzag-varint (``sint64``) form of non-negative ints (how a ConfigRecord's int list
    travels)."""
    out = bytearray()
    for v in (2 * x for x in values):
        while True:
            byte, v = v & 0x7F, v >> 7
            out.append(byte | (0x80 if v else 0))
            if not v:
                break
    return bytes(out)


def _plaintexts() -> list[bytes]:
    """The state's secrets as a reply carries them in the clear (indices as packed varints, the tail's weights
    and momentum as float32 bytes), then other forms a reply could carry them in."""
    idx = np.asarray(INDICES)
    weights = (torch.arange(24, dtype=torch.float32).reshape(4, 6) / 7 + 0.123).numpy()
    return [_varints(INDICES), weights.tobytes(), np.full(24, 0.5, np.float32).tobytes(),
            idx.astype(np.int64).tobytes(), idx.astype(np.int32).tobytes(), weights[0].tobytes()]


def test_a_sealed_state_holds_no_plaintext_and_round_trips(tmp_path):
    """The sealed record's bytes (nonce and ciphertext, and the whole reply as Flower serialises it) contain none
    of the indices' or weights' bytes, while the unsealed plaintext does; unsealing gives every record back."""
    from flwr.common.serde import recorddict_to_proto

    key = node_key(tmp_path / "checkpoint.key")
    state = _state()
    sealed = seal(state, key, partition_id=2)
    assert list(sealed.keys()) == [SEALED]
    wire = recorddict_to_proto(sealed).SerializeToString()
    plain = recorddict_to_proto(state).SerializeToString()
    assert all(secret in plain for secret in _plaintexts()[:3])  # the check would see them in the clear
    assert not [s for s in _plaintexts() if s in wire]
    back = unseal(sealed, key, partition_id=2)
    assert set(back.keys()) == set(state.keys())
    assert list(back["slot.own.batch"]["indices"]) == INDICES and back["rng"]["forwards"] == 17
    assert np.array_equal(back["slot.tail.weights"]["w"].numpy(), state["slot.tail.weights"]["w"].numpy())
    assert np.array_equal(back["slot.tail.optimizer"]["momentum"].numpy(), np.full((4, 6), 0.5, np.float32))
    assert bytes(seal(state, key, 2)[SEALED]["blob"]) != bytes(sealed[SEALED]["blob"])  # a fresh nonce each time


@pytest.mark.parametrize("how, message", [
    ("flip", "fails authentication on client 2"),
    ("partition", "fails authentication on client 3"),
    ("key", "fails authentication on client 2"),
    ("plain", "not sealed"),
    ("format", "has format 9"),
])
def test_a_changed_or_foreign_state_is_refused_in_one_line(tmp_path, how, message):
    key = node_key(tmp_path / "a.key")
    sealed = seal(_state(), key, partition_id=2)
    record = sealed[SEALED]
    pid = 2
    if how == "flip":
        blob = bytearray(bytes(record["blob"]))
        blob[len(blob) // 2] ^= 1
        record["blob"] = bytes(blob)
    elif how == "partition":
        pid = 3
    elif how == "key":
        key = node_key(tmp_path / "b.key")
    elif how == "plain":
        sealed = _state()
    else:
        record["format"] = 9
    with pytest.raises(SealError, match=message) as err:
        unseal(sealed, key, pid)
    assert len(str(err.value).splitlines()) == 1


def test_the_node_key_is_made_once_and_stays_on_the_node(tmp_path):
    """32 bytes, mode 0600, the same on every read; a file of another length is refused; ``state-dir`` in the
    node_config places it there, else ``RUN_DIR/nodes/node-K``; no run directory and no state-dir: one line."""
    path = tmp_path / "k" / "checkpoint.key"
    first = node_key(path)
    assert len(first) == 32 and node_key(path) == first and stat.S_IMODE(path.stat().st_mode) == 0o600
    (tmp_path / "bad.key").write_bytes(b"short")
    with pytest.raises(SealError, match="not a checkpoint key"):
        node_key(tmp_path / "bad.key")
    ctx = Context(run_id=1, node_id=5, node_config={"state-dir": str(tmp_path / "mine")}, state=RecordDict(),
                  run_config={})
    assert key_path(ctx, str(tmp_path / "run"), 4) == tmp_path / "mine" / "checkpoint.key"
    ctx = Context(run_id=1, node_id=5, node_config={}, state=RecordDict(), run_config={})
    assert key_path(ctx, str(tmp_path / "run"), 4) == tmp_path / "run" / "nodes" / "node-4" / "checkpoint.key"
    with pytest.raises(SealError, match="no place for its checkpoint key"):
        key_path(ctx, "", 4)


def test_the_audit_flags_indices_in_a_plain_checkpoint_and_passes_a_sealed_one(tmp_path, server_identity):
    """An integer list equal to a batch's indices (a plain checkpoint's ``slot.own.batch/indices``) and an
    integer array equal to them are flagged; the same state sealed is not; other integers are not."""
    idx = np.asarray(INDICES, dtype=np.int64)
    labels = np.arange(8) % 10
    plain = Message(_state(), dst_node_id=1, message_type="query.checkpoint")
    _, lab, ind = findings(plain, [labels], [idx])
    assert ind == ["slot.own.batch/indices"] and lab == []
    as_array = Message(RecordDict({"x": ArrayRecord({"i": Array(idx)})}), dst_node_id=1, message_type="query.x")
    assert findings(as_array, [labels], [idx])[2] == ["x/i"]
    sealed = Message(seal(_state(), node_key(tmp_path / "k"), 0), dst_node_id=1, message_type="query.checkpoint")
    assert findings(sealed, [labels], [idx]) == (False, [], [])
    assert findings(plain, [labels], [idx[::-1].copy()])[2] == []


def test_a_ushaped_run_with_checkpoints_audits_them_clean_and_resumes(tmp_path):
    """splitfed-v1, U-shaped, 2 global iterations, checkpoint-every=1, privacy-record: every node's audit has
    its ``query.checkpoint`` replies, none with labels or indices; the keys are on disk; no reply held a key."""
    from fl_app.client.audit import read_audit

    cfg = RunConfig.from_mapping({**BASE, "strategy": "splitfed-v1", "checkpoint-every": 1,
                                  "privacy-record": True, "output-dir": str(tmp_path)})
    summary = run_inprocess(plan_run(cfg), progress=False)
    assert summary["status"] == "completed"
    for pid in range(3):
        lines = audit_path(tmp_path, pid).read_text().splitlines()
        assert sum('"query.checkpoint"' in line for line in lines) >= 1, pid
        audit = read_audit(audit_path(tmp_path, pid))
        assert audit["label_records"] == [] and audit["label_arrays"] == [] and audit["index_arrays"] == []
        key = (tmp_path / "nodes" / f"node-{pid}" / "checkpoint.key").read_bytes()
        assert len(key) == 32 and key not in (tmp_path / "checkpoint.sfl").read_bytes()
