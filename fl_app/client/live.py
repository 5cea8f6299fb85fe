"""Live objects between a node's messages, kept only as a cache of its ``context.state``.

docs/explanation/design.md §4: live Python objects do not survive between a node's
messages under Ray and in deployment, so the ClientApp keeps all state in
``context.state`` and rebuilds its models from the stored weights in every
message, and ``train.backward`` recomputes the forward pass. In the
in-process engine a node's ``context.state`` is the same object from one
message to the next, and rebuilding cost more than the compute of a small
relayed segment (RingSFL's hot path). There, a node keeps its live models and
the autograd graphs of its last forward passes in a :class:`LiveCache`, but
only as a cache of what the state holds, so that no number changes:

* **Models.** A node keeps one live full model per model slot store
  (:class:`LiveModel`); a message gets a segment of it that shares its
  modules. Each tensor is known to hold one stored record's values: the
  ``Array.data`` (immutable bytes; for a deferred array, its values:
  :func:`~fl_app.protocol.value_token`) it was loaded from or encoded into when
  its weights were stored, or the initial weights. A tensor whose stored
  record is another object is loaded again, exactly as a fresh model loads
  it. While a message uses a tensor it counts as unknown; it is known again
  only when the handler succeeds (a failed one may leave it half-updated)
  and only if its autograd version counter shows no in-place update since
  it was loaded or stored. Models with buffers (BatchNorm statistics change
  in every training forward pass) are never kept, nor models whose mode or
  ``requires_grad`` flags a handler changed. Before reuse, every ``.grad``
  is cleared, as in a fresh model.
* **Forward graphs.** A training forward pass on a live segment is run with
  autograd on (the same operations on the same values as under
  ``no_grad``: the same outputs) and kept for the slot's next
  ``train.backward``, which then skips the recomputation, provided that the
  segment is the same object, its tensors hold the same records and were not
  updated in place since (version counters), and that the slot's batch
  record and stored input are the very records written with the forward
  pass, their contents unchanged.

**Where it applies.** :func:`live_cache` returns None the first time it sees a
state object and only registers it (weakly), so a state that is a fresh copy
in every message (Ray, deployment) never gets a cache and never pays for one.
"""

from __future__ import annotations

import functools
import threading
import weakref
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict
from torch import nn

from fl_app.protocol import record_tensor, value_token

#: ``(key, value token)`` pairs: the identities a cached object is checked against (None: no record); a
#: value token (:func:`~fl_app.protocol.value_token`) is ``Array.data`` or a deferred array's values.
Datas = tuple[tuple[str, bytes], ...] | None


def datas(record: ArrayRecord | None, keys: Iterable[str]) -> Datas:
    """``(key, value_token(record[key]))`` for ``keys``; None when there is no record."""
    if record is None:
        return None
    return tuple((k, value_token(record[k])) for k in keys)


def same(record: ArrayRecord | None, expected: Datas) -> bool:
    """Whether ``record`` still holds exactly the values (tokens) of ``expected``."""
    if record is None or expected is None:
        return record is None and expected is None
    for k, data in expected:
        if k not in record or value_token(record[k]) is not data:
            return False
    return True


def cacheable(model: nn.Module) -> bool:
    """Whether a live model may be kept: no buffers (BatchNorm statistics change in every training
    forward pass, also under ``no_grad``) and every module in training mode."""
    return not any(True for _ in model.buffers()) and all(m.training for m in model.modules())


#: The value a live tensor has before any weights are stored: the task's seeded initial weights.
INITIAL = object()
#: A live tensor that a message is using (or that a failed message may have changed).
DIRTY = object()


class LiveModel:
    """The live full model of one slot store of a node, tensor by tensor a copy of the stored weights.

    ``equals[name]`` says which value tensor ``name`` holds: the value token
    (:func:`~fl_app.protocol.value_token`: ``Array.data``, immutable bytes) of a
    stored weight record it was loaded from or stored as,
    :data:`INITIAL`, or :data:`DIRTY` (unknown: in use, or left by a failed
    message). Segments are views sharing the full model's modules, kept per
    range so that a forward graph can be matched to its model by identity.

    Args:
        model: a fresh full model with the task's initial weights.
    """

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.modules = list(model.modules())
        self.initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
        self.equals: dict[str, Any] = dict.fromkeys(self.initial, INITIAL)
        self.segments: dict[tuple[int, int], tuple[nn.Module, list[str], list[torch.Tensor]]] = {}
        self._params = list(model.parameters())
        self._grad_flags = [p.requires_grad for p in self._params]

    def pristine(self) -> bool:
        """Whether every module is in training mode and every parameter requires its gradient, as in
        a fresh model (the segments' own wrappers included)."""
        return (all(m.training for m in self.modules) and all(s[0].training for s in self.segments.values())
                and [p.requires_grad for p in self._params] == self._grad_flags)

    def segment(self, start: int, end: int) -> tuple[nn.Module, list[str], list[torch.Tensor]]:
        """Blocks ``[start, end)`` (sharing the modules), their state keys and tensors."""
        hit = self.segments.get((start, end))
        if hit is None:
            seg = self.model.segment(start, end)
            state = seg.state_dict(keep_vars=True)
            hit = self.segments[(start, end)] = (seg, list(state), list(state.values()))
        return hit


@dataclass
class Checkout:
    """A segment of a live model that one message uses.

    Attributes:
        key: the live model's cache key.
        live: the live model.
        model: the segment.
        keys: its state keys, and ``tensors`` its tensors.
        equals: what each of them holds (a value token or :data:`INITIAL`), updated by :meth:`LiveCache.stored`.
        since: the version counter of each tensor when ``equals`` was last established: a tensor
            updated in place after that (and not stored) no longer holds what ``equals`` says.
    """

    key: tuple[Any, ...]
    live: LiveModel
    model: nn.Module
    keys: list[str]
    tensors: list[torch.Tensor]
    equals: dict[str, Any]
    since: list[int]

    def versions(self) -> tuple[int, ...]:
        """The autograd version counters of its tensors (they change with any in-place update)."""
        return tuple(t._version for t in self.tensors)  # noqa: SLF001


@dataclass
class Graph:
    """A training forward pass of a slot, kept for the slot's next backward.

    Attributes:
        model: the segment it ran (checked out in that message).
        equals: what the segment's tensors held (see :class:`Checkout`).
        versions: their version counters then.
        batch: the slot's batch record written with it, and ``batch_values`` its contents.
        inputs: the slot's stored input records written with it (None: own data).
        x: the input (``requires_grad`` as the backward needs) and ``out`` the output.
    """

    model: nn.Module
    equals: dict[str, Any]
    versions: tuple[int, ...]
    batch: ConfigRecord
    batch_values: dict[str, Any]
    inputs: Datas
    x: torch.Tensor
    out: torch.Tensor


class LiveCache:
    """One node's live models and forward graphs (see the module docstring).

    Attributes:
        models: ``(task, slot store) -> LiveModel``; None for a model that is
            never kept (it has buffers).
        graphs: slot name -> its last kept forward pass.
    """

    #: Live models kept per node; the least recently used go first.
    MAX_MODELS = 8

    def __init__(self) -> None:
        self.models: dict[tuple[Any, ...], LiveModel | None] = {}
        self.graphs: dict[str, Graph] = {}
        self._out: list[Checkout] = []
        self._new_graphs: dict[str, Graph] = {}

    # ------------------------------------------------------------------ models
    def checkout(self, task: Any, store: str, start: int, end: int, stored: ArrayRecord | None,
                 slot: str = "") -> nn.Module | None:
        """Blocks ``[start, end)`` of the live model of ``store``, equal to ``stored`` (grads cleared).

        Tensors that do not hold the stored records (or, without records, the
        initial weights) are loaded first, exactly as a fresh model would load
        them. None where no live model is kept (the caller builds one).

        Raises:
            ValueError: ``stored`` lacks some of these blocks' tensors (``slot`` names it in the message).
        """
        key = (task, store)
        if key in self.models:
            live = self.models.pop(key)
        else:
            model = task.build_model()
            live = LiveModel(model) if cacheable(model) else None
        self.models[key] = live  # most recently used last
        while len(self.models) > self.MAX_MODELS:
            del self.models[next(iter(self.models))]
        if live is None:
            return None
        seg, keys, tensors = live.segment(start, end)
        if stored is not None and not all(k in stored for k in keys):
            raise ValueError(f"slot '{slot}' holds other blocks than [{start}, {end}); send weights")
        equals: dict[str, Any] = {}
        load: dict[str, torch.Tensor] = {}
        for k in keys:
            want = value_token(stored[k]) if stored is not None else INITIAL
            if live.equals[k] is not want:
                load[k] = record_tensor(stored, k) if stored is not None else live.initial[k]
            equals[k] = want
            live.equals[k] = DIRTY  # until the message succeeds
        if load:
            seg.load_state_dict(load, strict=False)
        for t in tensors:
            t.grad = None
        self._out.append(Checkout(key, live, seg, keys, tensors, equals, [t._version for t in tensors]))  # noqa: SLF001
        return seg

    def checked_out(self, model: nn.Module) -> Checkout | None:
        """The checkout of ``model`` in this message, if any."""
        for c in self._out:
            if c.model is model:
                return c
        return None

    def stored(self, model: nn.Module, record: ArrayRecord) -> None:
        """``model``'s weights were just stored in ``record``: its tensors hold those records now."""
        c = self.checked_out(model)
        if c is not None:
            for i, k in enumerate(c.keys):
                c.equals[k] = value_token(record[k])
                c.since[i] = c.tensors[i]._version  # noqa: SLF001

    # ------------------------------------------------------------------ graphs
    def keep_graph(self, slot: str, model: nn.Module, batch: ConfigRecord, inputs: ArrayRecord | None,
                   x: torch.Tensor, out: torch.Tensor) -> bool:
        """Keep a forward pass of ``slot`` that ran ``model`` (kept from :meth:`commit` on).

        Returns:
            False when ``model`` is not a live segment checked out in this message (nothing kept).
        """
        c = self.checked_out(model)
        if c is None:
            return False
        self._new_graphs[slot] = Graph(
            model, dict(c.equals), c.versions(), batch,
            {k: list(v) if isinstance(v, list) else v for k, v in batch.items()},
            datas(inputs, inputs.keys()) if inputs is not None else None, x, out)
        return True

    def take_graph(self, slot: str, model: nn.Module, batch: ConfigRecord, inputs: ArrayRecord | None,
                   ) -> Graph | None:
        """The kept forward pass of ``slot`` if it is exactly what a recomputation would give.

        That is: ``model`` is the segment that ran it, checked out in this
        message, its tensors holding the same records and not updated in
        place since; ``batch`` is the batch record written with it, its
        contents unchanged; ``inputs`` (the stored input record, None for own
        data) holds the same arrays. A graph is used once.
        """
        graph = self.graphs.pop(slot, None)
        if graph is None or graph.model is not model or graph.batch is not batch:
            return None
        c = self.checked_out(model)
        if c is None or c.equals != graph.equals or c.versions() != graph.versions:
            return None
        if dict(batch.items()) != graph.batch_values:
            return None
        if (inputs is None) != (graph.inputs is None) or not same(inputs, graph.inputs):
            return None
        return graph

    # ------------------------------------------------------------------ messages
    def commit(self) -> None:
        """The message succeeded: its tensors hold what their checkouts say, unless updated in place
        since (then :data:`DIRTY`: reloaded when next used); its graphs are kept."""
        pristine = {id(c.live): c.live.pristine() for c in self._out}  # once per live model
        for c in self._out:
            if not pristine[id(c.live)]:  # a handler changed a mode or flag: rebuilt when next used
                self.models.pop(c.key, None)
                continue
            for k, t, v in zip(c.keys, c.tensors, c.since):
                c.live.equals[k] = c.equals[k] if t._version == v else DIRTY  # noqa: SLF001
        for slot, graph in self._new_graphs.items():
            c = self.checked_out(graph.model)
            if c is not None and c.equals == graph.equals and c.versions() == graph.versions \
                    and pristine[id(c.live)]:
                self.graphs[slot] = graph
        self._out = []
        self._new_graphs = {}

    def abort(self) -> None:
        """The message failed: its tensors stay :data:`DIRTY` (reloaded when next used); no graph is kept."""
        self._out = []
        self._new_graphs = {}
        self.graphs.clear()


#: Keep live objects where a node's state persists (False: rebuild everything in every message, as
#: under Ray; for measurements and tests, which compare the two).
ENABLED = True

#: Nodes that keep a live cache, the least recently used dropped first: an idle node of a large population
#: keeps no model copy or graph (issue 47). A node dropped is one whose next message finds no cache, as under
#: Ray: it rebuilds from its state, the same numbers.
MAX_NODES = 256

#: ``id(context.state)`` -> (weak reference to it, its cache), least recently used first
_LIVE: dict[int, tuple[weakref.ref, LiveCache]] = {}
_LOCK = threading.Lock()


def live_cache(state: RecordDict, register: bool = True) -> LiveCache | None:
    """The live cache of the node whose ``context.state`` is ``state``, or None.

    None the first time a state object is seen (it is then registered, when
    ``register``): a state that is a fresh copy in every message never gets a
    cache. A registering call (a message starting on the node) makes the node
    the most recently used; beyond :data:`MAX_NODES` nodes the least recently
    used lose their caches (and registration: their next message is a first one).
    """
    if not ENABLED:
        return None
    key = id(state)
    with _LOCK:
        entry = _LIVE.get(key)
        if entry is not None and entry[0]() is state:
            if register:
                _LIVE[key] = _LIVE.pop(key)  # most recently used last
            return entry[1]
        if register:
            try:
                ref = weakref.ref(state, functools.partial(_forget, key))
            except TypeError:
                return None
            _LIVE.pop(key, None)  # a dead state's entry under a reused id
            _LIVE[key] = (ref, LiveCache())
            while len(_LIVE) > MAX_NODES:
                del _LIVE[next(iter(_LIVE))]
    return None


def forget(state: RecordDict) -> None:
    """Drop the live cache of the node whose ``context.state`` is ``state`` (its records are about to be replaced
    wholesale, e.g. by a resume); the next message registers the state again, as a new one."""
    with _LOCK:
        entry = _LIVE.get(id(state))
        if entry is not None and entry[0]() is state:
            del _LIVE[id(state)]


def _forget(key: int, ref: weakref.ref, lock: threading.Lock = _LOCK, live: dict = _LIVE) -> None:
    # the lock and table bound at definition: a weakref callback may run at interpreter exit, after the
    # module's globals are gone (they were None there: a TypeError logged at every exit)
    with lock:
        entry = live.get(key)
        if entry is not None and entry[0] is ref:
            del live[key]


def committing(handler: Callable[[Message, Context], Message]) -> Callable[[Message, Context], Message]:
    """Wrap a ClientApp handler: commit the node's live cache when it succeeds, forget its checkouts when it fails."""

    @functools.wraps(handler)
    def run(msg: Message, context: Context) -> Message:
        try:
            reply = handler(msg, context)
        except BaseException:
            live = live_cache(context.state, register=False)
            if live is not None:
                live.abort()
            raise
        live = live_cache(context.state, register=False)
        if live is not None:
            live.commit()
        return reply

    return run
