"""The clients' side of ``hide-client-models``: the fed server's role, played by the clients (issue 43).

The server relays; the clients (:mod:`fl_app.privacy.hidden` has the cryptography):

* seal their client-side uploads under the group key (:func:`sealed_reply`,
  the hook of :meth:`~fl_app.client.node.Node.weights_reply`);
* open the round's *bundle*, the previous round's sealed uploads with their
  aggregation weights, and average them themselves (:func:`open_bundle`, the
  hook of :meth:`~fl_app.client.slots.Slot.load_weights`). Every client
  decrypts the same ciphertexts and averages them in ascending partition id
  with :func:`fl_app.learning.averaging.weighted_average`, the server's own default
  rule, so all agree on the same float32 weights with no leader and no extra
  message. The first round's bundle holds no upload: the client-side model
  is then built from the group's hidden init seed.

A bundle is :func:`fl_app.privacy.hidden.bundle_record`.

The node keeps its private key and the group secret in ``context.state``
(:data:`STATE_KEY`), which is why checkpoints (which carry the whole state to
the server) are refused in this mode.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fl_app import protocol as P
from fl_app.learning.averaging import weighted_average
from fl_app.privacy.hidden import MARK, SEALED, WEIGHT, GroupSecret, HiddenError, seal_state, unseal_state, upload_aad
from fl_app.models import BlockModel, build_model
from fl_app.run.options import parse_cut_layers

if TYPE_CHECKING:
    from fl_app.client.node import Node

#: The node-state ConfigRecord of this mode: ``private`` (X25519, raw) and ``secret`` (:class:`GroupSecret`).
STATE_KEY = "hidden"


def hides(node: Node) -> bool:
    """Whether the run hides the client-side models (``hide-client-models``)."""
    return bool(node.cfg.get("hide-client-models"))


def group_secret(node: Node) -> GroupSecret:
    """The group secret this node received in the key agreement.

    Raises:
        HiddenError: the key agreement has not run on this node.
    """
    record = P.get_config(node.state, STATE_KEY)
    if record is None or "secret" not in record:
        raise HiddenError("hide-client-models: this node has no group key yet (query.hidden join first)")
    return GroupSecret.from_bytes(bytes(record["secret"]))


def store(node: Node, **values: bytes) -> None:
    """Keep ``values`` (raw bytes) in this node's :data:`STATE_KEY` record."""
    record = P.get_config(node.state, STATE_KEY)
    if record is None:
        record = node.state[STATE_KEY] = ConfigRecord()
    for k, v in values.items():
        record[k] = v


def client_keys(node: Node, model: BlockModel) -> list[str]:
    """The client-side tensors of a full ``model``: all but the server's blocks (``[c1, c2)`` U-shaped, else
    ``[cut, L)``)."""
    cuts = parse_cut_layers(str(node.cfg.get("cut-layers")))
    c1, c2 = cuts if cuts else (node.task.cut_layer, len(model))
    server = set(model.segment(c1, c2).state_dict())
    return [k for k in model.state_dict() if k not in server]


def initial_state(node: Node, secret: GroupSecret) -> dict[str, torch.Tensor]:
    """The client-side model's initial weights, built from the group's hidden seed (same initialiser as the
    public one: only the seed differs)."""
    task = node.task
    model = build_model(task.model_name, task.data.input_shape, task.data.num_classes, secret.init_seed,
                        init=task.init, **dict(task.lora))
    state = model.state_dict()
    return {k: state[k] for k in client_keys(node, model)}


def open_bundle(node: Node, record: ArrayRecord) -> dict[str, torch.Tensor]:
    """The client-side weights a bundle stands for: the weighted mean of its uploads, or the hidden init.

    Raises:
        HiddenError: no group key yet, or a ciphertext fails authentication.
    """
    secret = group_secret(node)
    names = [k for k in record.keys() if k != MARK]
    if not names:
        return initial_state(node, secret)
    pids = sorted({int(k.split("/", 1)[0]) for k in names})
    states, weights = [], []
    for pid in pids:
        state: dict[str, torch.Tensor] = {}
        for name in sorted(k for k in names if k.startswith(f"{pid}/") and not k.endswith(f"/{WEIGHT}")):
            state.update(unseal_state(secret.key, record[name].numpy(), upload_aad(pid)))
        states.append(state)
        weights.append(float(record[f"{pid}/{WEIGHT}"].numpy()[0]))
    return weighted_average(states, weights)


def bundle_slots(node: Node, record: ArrayRecord) -> dict[str, ArrayRecord]:
    """``slot -> weights`` that a bundle loads: the opened client-side weights into the own slot and, in a
    U-shaped run, the tail slot too (each slot's model takes its own blocks from them)."""
    weights = P.state_record(open_bundle(node, record))
    slots = {P.OWN_SLOT: weights}
    if parse_cut_layers(str(node.cfg.get("cut-layers"))):
        slots[P.TAIL_SLOT] = weights
    return slots


def sealed_reply(node: Node, model: BlockModel) -> RecordDict:
    """A weights reply with the slot's state sealed under the group key (:data:`~fl_app.privacy.hidden.SEALED`,
    one uint8 array named after the state's first tensor) and this node's example count."""
    state = model.state_dict()
    blob = seal_state(group_secret(node).key, state, upload_aad(node.partition_id))
    return P.record_dict({
        SEALED: ArrayRecord({next(iter(state)): Array(blob)}),
        P.INFO: ConfigRecord({P.INFO_NUM_EXAMPLES: node.task.num_examples(node.partition_id)}),
    })
