"""A vertical party's side of the protocol: the ``query.vertical`` handler and its ``ClientApp``.

Every message is ``query.vertical`` with a config record ``vertical`` whose ``op`` says what to do; the
ServerApp relays the parties' bytes and tensors (Flower has no node-to-node channel). A node's party
index is its ``node_config`` ``vertical-party`` (0: the label party); it reads only its own table
(:func:`fl_app.data.vertical.load_party`: its own file alone, its ``data-dir`` from its node config when given).

=================  ========================================================================
``op``             what the party does (state in ``context.state``)
=================  ========================================================================
``info``           reply its index, rows, feature count, whether it holds labels
``psi_request``    PSI receiver, step 1 (:class:`fl_app.vertical.psi.Receiver`; the key stays here)
``psi_respond``    PSI sender, step 2, over its own IDs (feature party) or the intersection
                   (label party, round 2)
``psi_intersect``  PSI receiver, step 3: the label party narrows its shared set; a feature
                   party fixes its aligned rows (the sorted intersection). Replies a count
                   (``reveal`` false: the count only, learnt without the IDs; nothing kept).
``psi_finish``     label party: the final intersection, sorted; its seeded train/test split
``batch``          label party: the next training mini-batch (positions in the aligned
                   order), or the test positions
``forward``        embeddings of its bottom model at the given positions
``backward``       back-propagate the given ``∂L/∂e`` at those positions; SGD step
``top``            label party: join, top model, loss, step; ``∂L/∂e_k`` for the others
``evaluate``       label party: test loss and accuracy from the others' test embeddings
=================  ========================================================================

A checkpoint (``checkpoint-every``) takes a party's whole ``context.state`` (its models, its aligned rows and
the label party's split: the PSI's result) with ``query.checkpoint``, sealed on the node under its party
index, and ``query.restore`` puts it back at a resume (:mod:`fl_app.client.checkpoint`, as for every strategy;
:data:`~fl_app.client.state.CHECKPOINT_IDENTITY` says who the node is).

What a feature party ever receives: PSI messages (encrypted points), positions in the aligned order
and gradients; never an ID outside the intersection (:mod:`fl_app.vertical.psi`).
"""

from __future__ import annotations

import functools
from typing import Any

import numpy as np
import torch
from flwr.app import (
    ArrayRecord,
    ConfigRecord,
    Context,
    Message,
    MetricRecord,
    RecordDict,
)
from flwr.clientapp import ClientApp

from fl_app.vertical import psi
from fl_app.vertical import models as V
from fl_app.client.checkpoint import query_checkpoint, query_restore
from fl_app.client.state import CHECKPOINT_IDENTITY
from fl_app.data.vertical import load_party, party_count
from fl_app.run.errors import ConfigError
from fl_app.protocol.codec import tensor_array
from fl_app.protocol.records import (
    record_state,
    record_tensor,
    state_record,
    tensor_record,
)

CFG, PSI_KEY, ROWS, BOTTOM, TOP, SPLIT = "vertical", "vertical.psi", "vertical.rows", "vertical.bottom", \
    "vertical.top", "vertical.split"
#: node_config key of a node's party index (0: the label party).
PARTY = "vertical-party"


@functools.lru_cache(maxsize=8)
def _table(name: str, data_dir: str, overlap: float, seed: int, parties: int, rows: int, index: int):
    """Party ``index``'s own table and the class count: only its own file is read (:func:`load_party`)."""
    return load_party(name, data_dir, index, overlap=overlap, seed=seed, parties=parties, rows=rows)


class Party:
    """One party's view of its ``context.state`` during a message (its table, models, aligned rows)."""

    def __init__(self, state: RecordDict, node_config: dict[str, Any], cfg: ConfigRecord) -> None:
        self.state, self.cfg = state, cfg
        self.index = party_index(node_config, str(cfg["label-holder"]))
        k = party_count(str(cfg["dataset"]), int(cfg["parties"]))
        if not 0 <= self.index < k:
            raise ConfigError(f"node has {PARTY}={self.index}: the run has parties 0..{k - 1}")
        self.table, self.classes = _table(str(cfg["dataset"]), str(node_config.get("data-dir") or cfg["data-dir"]),
                                          float(cfg["overlap"]), int(cfg["seed"]), int(cfg["parties"]),
                                          int(cfg["rows"]), self.index)  # only its own file is read
        self.join, self.lr, self.h = str(cfg["join"]), float(cfg["lr"]), int(cfg["embedding"])

    def rows(self, positions: np.ndarray) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Features ``[B, d]`` (and labels ``[B]``) at positions of the aligned order."""
        idx = np.asarray(self.state[ROWS]["rows"].numpy(), dtype=np.int64)[positions]
        y = None if self.table.y is None else torch.from_numpy(self.table.y[idx])
        return torch.from_numpy(self.table.x[idx]), y

    def bottom(self) -> torch.nn.Module:
        """This party's bottom model, at its current weights."""
        model = V.bottom_model(self.table.x.shape[1], self.h, int(self.cfg["seed"]), self.index)
        if BOTTOM in self.state:
            model.load_state_dict(record_state(self.state[BOTTOM]))
        return model

    def top(self) -> torch.nn.Module:
        """The label party's top model, at its current weights."""
        model = V.top_model(V.joined_width(self.h, int(self.cfg["parties"]), self.join), self.classes,
                            int(self.cfg["seed"]))
        if TOP in self.state:
            model.load_state_dict(record_state(self.state[TOP]))
        return model

    def keep(self, key: str, model: torch.nn.Module) -> None:
        """Store ``model``'s weights under ``key``."""
        self.state[key] = state_record({k: v.detach().clone() for k, v in model.state_dict().items()})

    def set_aligned(self, rows: list[int]) -> None:
        """Fix the aligned order: ``rows[i]`` is the table row of the ``i``-th shared ID (sorted)."""
        self.state[ROWS] = tensor_record("rows", torch.tensor(rows, dtype=torch.int64))


def party_index(node_config: dict[str, Any], label_party: str) -> int:
    """A node's party: its ``vertical-party``, else (a simulation's nodes) its ``partition-id``, shifted by one
    when the ServerApp is the label party (``label-party=server``: the nodes are the feature parties)."""
    if PARTY in node_config:
        return int(node_config[PARTY])
    return int(node_config.get("partition-id", -1)) + (1 if label_party == "server" else 0)


def _positions(content: RecordDict) -> np.ndarray:
    return record_tensor(content["positions"], "positions").numpy()


def _bytes_reply(blob: bytes, **extra: Any) -> RecordDict:
    return RecordDict({CFG: ConfigRecord({"blob": blob, **extra})})


def _label_only(party: Party, op: str) -> None:
    if party.table.y is None:
        raise ConfigError(f"op {op} is the label party's; this node is feature party {party.index}")


def handle(content: RecordDict, state: RecordDict, node_config: dict[str, Any]) -> RecordDict:
    """Run one ``query.vertical`` operation (see the module's table) and return the reply's content."""
    cfg = content[CFG]
    if "run" in cfg:  # the run's settings arrive with every message; kept for the node's later messages
        state[CFG] = ConfigRecord({k: v for k, v in cfg.items() if k not in ("op", "blob", "source", "phase")})
    op, party = str(cfg["op"]), Party(state, node_config, state[CFG])
    if "run" in cfg:  # who this node is for its sealed checkpoint state (fl_app.client.checkpoint)
        state[CHECKPOINT_IDENTITY] = ConfigRecord({"run-dir": str(cfg["run-dir"]), "partition-id": party.index})
    if op == "info":
        return RecordDict({CFG: ConfigRecord({"party": party.index, "rows": len(party.table.ids),
                                              "features": int(party.table.x.shape[1]),
                                              "labels": party.table.y is not None})})
    if op == "psi_request":
        rec = psi.Receiver(party.table.ids, str(cfg["backend"]), reveal=bool(cfg["reveal"]))
        state[PSI_KEY] = ConfigRecord({"key": rec.key_bytes(), "shared": state[PSI_KEY]["shared"]
                                       if PSI_KEY in state and "shared" in state[PSI_KEY] else b""})
        return _bytes_reply(rec.request())
    if op == "psi_respond":
        ids = party.table.ids if str(cfg["source"]) == "own" else _shared_ids(party)
        return _bytes_reply(psi.Sender(ids, str(cfg["backend"]), reveal=bool(cfg["reveal"]),
                                       seed=int(cfg["seed"]) + party.index).respond(bytes(cfg["blob"])))
    if op == "psi_intersect":
        rec = psi.Receiver(party.table.ids, str(cfg["backend"]), reveal=bool(cfg["reveal"]),
                           key=bytes(state[PSI_KEY]["key"]))
        pos = rec.intersect(bytes(cfg["blob"]))
        if not cfg["reveal"]:  # cardinality only: the count, and nothing kept
            return RecordDict({CFG: ConfigRecord({"count": int(pos)})})
        if party.table.y is not None:  # label party, round 1: narrow the shared set
            prev = state[PSI_KEY]["shared"]
            mask = np.zeros(len(party.table.ids), dtype=bool)
            mask[pos] = True
            if prev:
                mask &= np.frombuffer(bytes(prev), dtype=bool)
            state[PSI_KEY] = ConfigRecord({"key": b"", "shared": mask.tobytes()})
        else:  # feature party, round 2: its aligned rows
            party.set_aligned(sorted((int(i) for i in pos), key=lambda i: party.table.ids[i]))
        return RecordDict({CFG: ConfigRecord({"count": len(pos)})})
    _label_only(party, op) if op in ("psi_finish", "batch", "top", "evaluate") else None
    if op == "psi_finish":
        ids = _shared_ids(party)
        if not ids:
            raise ConfigError("PSI: the parties share no sample ID (empty intersection)")
        where = {i: k for k, i in enumerate(party.table.ids)}
        party.set_aligned([where[i] for i in ids])
        train, test = V.split_positions(len(ids), int(cfg["seed"]), float(cfg["test-fraction"]))
        n_test = len(test)
        state[SPLIT] = ArrayRecord({"test": tensor_array(torch.from_numpy(test)),
                                    "train": tensor_array(torch.from_numpy(train))})
        return RecordDict({CFG: ConfigRecord({"count": len(ids), "test": n_test})})
    if op == "batch":
        return _batch(party, cfg)
    if op in ("forward", "backward", "top", "evaluate"):
        return _train(party, op, content)
    raise ConfigError(f"query.vertical: unknown op {op!r}")


def _shared_ids(party: Party) -> list[str]:
    mask = np.frombuffer(bytes(party.state[PSI_KEY]["shared"]), dtype=bool)
    return sorted(party.table.ids[i] for i in np.flatnonzero(mask))


def _batch(party: Party, cfg: ConfigRecord) -> RecordDict:
    """The label party's next mini-batch: a seeded pass over its training positions, batch by batch."""
    split = party.state[SPLIT]
    if str(cfg["phase"]) == "test":
        return RecordDict({"positions": tensor_record("positions", record_tensor(split, "test"))})
    train = record_tensor(split, "train").numpy()
    pos = V.batch_positions(train, int(cfg["batch-size"]), int(cfg["iteration"]), int(cfg["seed"]))
    return RecordDict({"positions": tensor_record("positions", torch.from_numpy(pos))})


def _train(party: Party, op: str, content: RecordDict) -> RecordDict:
    pos = _positions(content)
    x, y = party.rows(pos)
    bottom = party.bottom()
    if op == "forward":
        with torch.no_grad():
            return RecordDict({"embedding": tensor_record("e", bottom(x))})
    if op == "backward":
        V.bottom_backward(bottom, x, record_tensor(content["grad"], "g"), party.lr)
        party.keep(BOTTOM, bottom)
        return RecordDict({CFG: ConfigRecord({"ok": True})})
    others = [record_tensor(content[f"e{k}"], "e") for k in range(1, int(party.cfg["parties"]))]
    with torch.no_grad():
        own = bottom(x)
    top = party.top()
    if op == "evaluate":
        loss, acc = V.predict(top, [own, *others], y, party.join)
        return RecordDict({"metrics": MetricRecord({"loss": loss, "accuracy": acc})})
    loss, grads = V.top_step(top, [own, *others], y, party.join, party.lr)
    V.bottom_backward(bottom, x, grads[0], party.lr)  # its own bottom steps on the exact gradient
    party.keep(TOP, top)
    party.keep(BOTTOM, bottom)
    released, power = _released(party.cfg, grads[1:], y)
    out = RecordDict({"metrics": MetricRecord({"loss": loss, "noise_power": power})})
    for k, g in enumerate(released, start=1):
        out[f"g{k}"] = tensor_record("g", g)
    return out


def _released(cfg: ConfigRecord, grads: list[torch.Tensor], y: torch.Tensor) -> tuple[list[torch.Tensor], float]:
    """The gradients as the label party releases them (``label-defence``: none, max-norm, iso, Marvell; Li et al.
    2022, :mod:`fl_app.privacy.label_defence`), and the noise's mean squared norm per row, summed over the parties."""
    defence = str(cfg["defence"])
    if defence == "none":
        return grads, 0.0
    from fl_app.privacy.label_defence import defence_generator, perturb

    strength = float(cfg["noise"]) if defence == "iso" else float(cfg["power"])
    out = [perturb(g, defence, strength, defence_generator(int(cfg["seed"]), k, int(cfg["iteration"])), labels=y)
           for k, g in enumerate(grads, start=1)]
    return out, float(sum(((r - g) ** 2).sum(1).mean() for r, g in zip(out, grads)))


app = ClientApp()


@app.query("vertical")
def query_vertical(msg: Message, context: Context) -> Message:
    """``query.vertical``: one operation of a vertical party (:func:`handle`)."""
    return Message(handle(msg.content, context.state, dict(context.node_config)), reply_to=msg)


app.query("checkpoint")(query_checkpoint)  # the party's whole state, sealed (fl_app.client.checkpoint)
app.query("restore")(query_restore)
