"""``query.hidden``: the clients' key agreement and federated evaluation with ``hide-client-models`` (issue 43).

One message type, four phases (the request's ``config`` record names it; the
server relays, :mod:`strategies.core.hidden`):

``keys``
    the node draws an X25519 key pair, keeps the private key, and replies
    its public key (``hidden/public``, uint8 ``[32]``).
``lead``
    to the lowest-id client, with the other members' public keys
    (``hidden/public/{pid}``): it draws the :class:`~fl_app.privacy.hidden.GroupSecret`
    and replies it sealed for each member under their pairwise key
    (``hidden/envelope/{pid}``, uint8 ``[68]``).
``join``
    to every other member, with the leader's public key and its envelope
    (``hidden/public``, ``hidden/envelope``): the node opens and keeps the secret.
``evaluate``
    the server-side weights in plaintext (:data:`~fl_app.protocol.WEIGHTS`)
    and the current bundle (:data:`~fl_app.privacy.hidden.BUNDLE`): the node puts the
    whole model together and scores its shard of the test set (the test
    set's 1000-image chunks ``shard, shard + shards, ...``; ``limit``: only
    the first ``limit`` test images, 0 all); the reply's ``info`` holds the
    loss, accuracy and example count, which the server combines.
"""

from __future__ import annotations

import numpy as np
from flwr.app import Array, ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fl_app import protocol as P
from fl_app.client.hidden import STATE_KEY, group_secret, open_bundle, store
from fl_app.client.node import Node, acknowledgement
from fl_app.privacy.hidden import (
    BUNDLE,
    GroupSecret,
    HiddenError,
    envelope_aad,
    new_private_key,
    pairwise_key,
    public_key,
    seal,
    unseal,
)
from fl_app.learning.training import evaluate_model

#: The request's and reply's ArrayRecord of keys and envelopes.
KEYS = "hidden"


def _bytes(record: ArrayRecord, name: str) -> bytes:
    return record[name].numpy().tobytes()


def _array(data: bytes) -> Array:
    return Array(np.frombuffer(data, dtype=np.uint8).copy())


def _private(node: Node) -> bytes:
    record = P.get_config(node.state, STATE_KEY)
    if record is None or "private" not in record:
        raise HiddenError("hide-client-models: query.hidden keys must come first")
    return bytes(record["private"])


def shard_batches(node: Node, shard: int, shards: int, limit: int):
    """The test set's 1000-image chunks ``shard, shard + shards, ...`` (cut at ``limit`` images when > 0)."""
    seen = 0
    for i, (x, y) in enumerate(node.task.data.test_batches()):
        if limit and seen >= limit:
            return
        if limit:
            x, y = x[:limit - seen], y[:limit - seen]
        seen += int(y.shape[0])
        if i % shards == shard:
            yield x, y


def query_hidden(msg: Message, context: Context) -> Message:
    """The phases of the module docstring.

    Raises:
        HiddenError: a phase out of order, or an envelope that fails authentication (the reply is an error).
        ValueError: an unknown phase.
    """
    node = Node(context)
    cfg = P.config_of(msg.content, P.CONFIG)
    phase = str(cfg["phase"])
    keys = P.get_array(msg.content, KEYS)
    if phase == "keys":
        private = new_private_key()
        store(node, private=private)
        return Message(RecordDict({KEYS: ArrayRecord({"public": _array(public_key(private))})}), reply_to=msg)
    if phase == "lead":
        secret = GroupSecret.draw()
        store(node, secret=secret.to_bytes())
        me, private = node.partition_id, _private(node)
        out = {}
        for name in keys.keys():
            pid = int(name.split("/")[1])
            aad = envelope_aad(me, pid)
            out[f"envelope/{pid}"] = _array(seal(pairwise_key(private, _bytes(keys, name), aad),
                                                 secret.to_bytes(), aad))
        return Message(RecordDict({KEYS: ArrayRecord(out)}), reply_to=msg)
    if phase == "join":
        aad = envelope_aad(int(cfg["leader"]), node.partition_id)
        key = pairwise_key(_private(node), _bytes(keys, "public"), aad)
        store(node, secret=GroupSecret.from_bytes(unseal(key, _bytes(keys, "envelope"), aad)).to_bytes())
        return Message(acknowledgement(), reply_to=msg)
    if phase == "evaluate":
        group_secret(node)  # a clear error before any work
        model = node.task.build_model()
        state = {**P.record_state(P.array_of(msg.content, P.WEIGHTS)), **open_bundle(node, P.array_of(msg.content, BUNDLE))}
        model.load_state_dict(state)
        loss, acc, count = evaluate_model(node.place(model), shard_batches(node, int(cfg["shard"]), int(cfg["shards"]),
                                                                          int(cfg["limit"])))
        info = ConfigRecord({P.INFO_LOSS: loss if count else 0.0, P.INFO_ACCURACY: acc if count else 0.0,
                             P.INFO_NUM_EXAMPLES: count})
        return Message(RecordDict({P.INFO: info}), reply_to=msg)
    raise ValueError(f"query.hidden: unknown phase {phase!r}")
