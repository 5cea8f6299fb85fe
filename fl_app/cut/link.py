"""The seam at the cut: what a message's tensors become on the wire, in one place per side.

The run's ``compress-up`` codec (:mod:`fl_app.cut.compression`)
encodes what the clients send up (activations, input gradients, ZO
perturbation stacks, model uploads), ``compress-down`` what the server sends
down (gradients, relayed activations, model downloads). The encoded tensors
replace the float32 ones in the same ArrayRecords (``name`` and
``name::part`` arrays), so they are what Flower carries, what
``bytes_up``/``bytes_down`` count and what the virtual clock charges
(:class:`~fl_app.learning.costs.BlockCosts` with the same codecs).

Where it happens, and nowhere else:

* client side, :func:`client_mod` (a Flower mod of the ClientApp): it decodes
  every request before its handler runs, and passes every reply through
  :data:`UPLINK_STAGES`, the client's uplink pipeline (now only
  ``compress``). A stage is a function ``(links, content, owner) -> content``;
  the order is the tuple's. The activation defences (clipping and noise,
  :mod:`fl_app.privacy.activations`) are not a stage: they run inside the client's
  forward pass, before this pipeline, because the noise must be seeded by the
  forward pass and the client's ``train.backward`` must recompute exactly
  what it sent, which a stage without the node's state could not do;
* server side, :class:`strategies.core.exchange.Exchange`: ``send`` encodes
  each request's content with the downlink codec (the request keeps its
  float32 content; the dispatcher sends the encoded one), ``receive`` counts
  a reply's encoded bytes and then decodes it, before validation.

Records encoded: :data:`ENCODED` (their float32 arrays; labels, counts and
other dtypes pass as they are; top-k leaves model weights float32). The optimizer state that GAS's shared
momentum carries is not encoded. Top-k's error feedback keeps one residual
per stream: on a client per (record, tensor name), on the server per
(client, record, tensor name); residuals live in memory and are not
checkpointed (a resumed run starts them at zero).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, RecordDict

from fl_app import protocol as P
from fl_app.cut.compression import Codec, decode_arrays, is_encoded, make_codec
from fl_app.learning.costs import BlockCosts
from fl_app.run.errors import ConfigError
from fl_app.protocol.codec import DeferredArray, encode_array, view_array

#: Records whose float32 arrays a link encodes, with the int8-channel axis (1: batched, 0: weights).
ENCODED: dict[str, int] = {P.ACTIVATIONS: 1, P.GRADIENT: 1, P.PERTURBED: 1, P.WEIGHTS: 0}


class LinkCodecs:
    """The run's codec per link (see the module docstring).

    Args:
        up: the codec of client-to-server content.
        down: the codec of server-to-client content.
    """

    def __init__(self, up: Codec, down: Codec) -> None:  # noqa: D107
        self.up, self.down = up, down

    @classmethod
    def from_config(cls, cfg: Any) -> LinkCodecs | None:
        """The codecs of a :class:`~fl_app.run.config.RunConfig` (``compress-up``, ``compress-down``,
        ``topk-ratio``); None when both links send float32 (the lossless path, untouched).

        Raises:
            ConfigError: an unknown codec or a top-k ratio outside (0, 1] (one line).
        """
        up, down = str(cfg.get("compress-up")), str(cfg.get("compress-down"))
        if up == "none" and down == "none":
            return None
        ratio = float(cfg.get("topk-ratio"))
        return cls(make_codec(up, ratio), make_codec(down, ratio))

    def encode(self, content: RecordDict, *, up: bool, owner: object = None) -> RecordDict:
        """``content`` with the :data:`ENCODED` records' float32 arrays encoded by the link's codec (a new
        RecordDict; the other records are the same objects). ``owner``: top-k streams' prefix."""
        codec = self.up if up else self.down
        if codec.name == "none":
            return content
        out = {}
        for key, record in content.items():
            axis = ENCODED.get(key) if isinstance(record, ArrayRecord) else None
            if axis is None or (key == P.WEIGHTS and not codec.models):
                out[key] = record
            else:
                out[key] = _encode_record(codec, key, record, axis, owner)
        return P.record_dict(out)


def check_links(strategy: str, weights_only: frozenset[str], cfg: Any) -> None:
    """Refuse a codec on a link where it has nothing to encode.

    Args:
        strategy: the strategy's name (for the message).
        weights_only: the links on which the strategy, so configured, sends only model weights
            (:meth:`strategies.core.base.SFLStrategy.weights_only_links`).
        cfg: the run configuration (``compress-up``, ``compress-down``).

    Raises:
        ConfigError: a codec that leaves model weights float32 (top-k) on such a link (one line).
    """
    for link in ("up", "down"):
        name = str(cfg.get(f"compress-{link}"))
        if link in weights_only and name != "none" and not make_codec(name, 1.0).models:
            side = f"{strategy}'s clients send" if link == "up" else f"{strategy}'s server sends"
            raise ConfigError(f"compress-{link}={name}: {side} only model weights {link}, which {name} leaves "
                              f"float32; choose fp16, bf16, int8 or int8-channel for that link")


def block_costs(task: Any, batch_parallel: bool, links: LinkCodecs | None) -> BlockCosts:
    """The run's :class:`~fl_app.learning.costs.BlockCosts` (``task``: a :class:`~fl_app.learning.task.Task`), charging the
    links' encoded sizes; with ``links`` None exactly the float32 figures of before."""
    if links is None:
        return BlockCosts(task.profiles, batch_parallel)
    model = task.build_model()
    shapes = tuple(tuple((tuple(t.shape), t.element_size(), t.dtype == torch.float32)
                         for t in model.blocks[name].state_dict().values()) for name in model.blocks)
    up = None if links.up.name == "none" else links.up
    down = None if links.down.name == "none" else links.down
    return BlockCosts(task.profiles, batch_parallel, up=up, down=down, param_shapes=shapes)


def _array(values: np.ndarray) -> Array:
    values = np.ascontiguousarray(values)
    return DeferredArray(values) if values.size and not values.dtype.hasobject else encode_array(values)


def _values(array: Array) -> np.ndarray:
    view = view_array(array)
    return view if view is not None else array.numpy()


def _encode_record(codec: Codec, key: str, record: ArrayRecord, axis: int, owner: object) -> ArrayRecord:
    arrays: dict[str, Array] = {}
    for name, array in record.items():
        if array.dtype != "float32":
            arrays[name] = array
            continue
        parts = codec.encode(name, _values(array), axis=axis, stream=(owner, key, name))
        arrays.update({n: _array(v) for n, v in parts.items()})
    return P.array_record(arrays)


def _is_encoded(record: ArrayRecord) -> bool:
    return is_encoded(record.keys()) or any(a.dtype in ("float16", "uint16") for a in record.values())


def _plain(record: ArrayRecord, name: str) -> bool:
    """Whether ``record[name]`` is sent as it is (no codec made it)."""
    sep = name + "::"
    return record[name].dtype not in ("float16", "uint16") and not any(n.startswith(sep) for n in record.keys())


def decode(content: RecordDict) -> RecordDict:
    """``content`` with every encoded record decoded to float32 (a new RecordDict), or ``content`` itself
    when nothing in it is encoded."""
    todo = [k for k, r in content.items() if isinstance(r, ArrayRecord) and k in ENCODED and _is_encoded(r)]
    if not todo:
        return content
    out = dict(content.items())
    for key in todo:
        record = content[key]
        decoded = decode_arrays({n: _values(a) for n, a in record.items()})
        out[key] = P.array_record({n: record[n] if _plain(record, n) else _array(v) for n, v in decoded.items()})
    return P.record_dict(out)


def _compress(links: LinkCodecs, content: RecordDict, owner: object) -> RecordDict:
    return links.encode(content, up=True, owner=owner)


#: The client's uplink pipeline, in order: ``(name, stage)``; each stage maps float32 content to content.
#: ``compress`` must stay last. (The activation defences run earlier, in the forward pass: fl_app.privacy.activations.)
UPLINK_STAGES: tuple[tuple[str, Callable[[LinkCodecs, RecordDict, object], RecordDict]], ...] = (
    ("compress", _compress),
)

#: ``(node id, up, down, ratio) -> LinkCodecs`` of the clients in this process (their top-k residuals)
_CLIENT_LINKS: dict[tuple, LinkCodecs] = {}


def client_links(context: Any) -> LinkCodecs | None:
    """This node's codecs, from the task its handshake stored (None: before it, or both links float32)."""
    task = P.get_config(context.state, P.TASK)
    if task is None or task.get("compress-up") == "none" and task.get("compress-down") == "none":
        return None
    key = (context.node_id, task.get("compress-up"), task.get("compress-down"), task.get("topk-ratio"))
    links = _CLIENT_LINKS.get(key)
    if links is None:
        links = _CLIENT_LINKS[key] = LinkCodecs(make_codec(str(key[1]), float(key[3])),
                                                make_codec(str(key[2]), float(key[3])))
    return links


def client_mod(msg: Any, context: Any, call_next: Callable) -> Any:
    """Flower mod: decode a request's encoded records, run the handler, pass its reply through
    :data:`UPLINK_STAGES` (nothing at all when both links are float32)."""
    links = client_links(context)
    if links is None:
        return call_next(msg, context)
    msg.content = decode(msg.content)
    reply = call_next(msg, context)
    if not reply.has_error():
        content = reply.content
        for _, stage in UPLINK_STAGES:
            content = stage(links, content, None)
        reply.content = content
    return reply
