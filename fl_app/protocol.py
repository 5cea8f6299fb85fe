"""The client message protocol: actions, record keys, typed action configs, codecs.

DESIGN.md section 4. Strategies compose a small, fixed set of actions; each
is a Flower message type ``"<category>.<action>"`` routed by the ClientApp.

Record keys used in message content (a :class:`flwr.app.RecordDict`):

=================  ==========  ==============================================
key                kind        meaning
=================  ==========  ==============================================
``task``           Config      the run configuration (handshake only)
``config``         Config      per-message settings: one of the typed
                               ``*Config`` classes below
``weights``        Array       model weights (a torch ``state_dict``)
``activations``    Array       one tensor ``"x"``: float32 ``[B, ...]``; the
                               input of a forward on a block range that does
                               not start at 0, or the output of a forward
``labels``         Array       one tensor ``"y"``: int64 ``[B]``
``gradient``       Array       one tensor ``"g"``: float32, shape of the
                               activations it answers (a backward's input),
                               or the gradient w.r.t. a range's input (reply)
``perturbed``      Array       ``"plus"``, ``"minus"``: float32 ``[P, B, ...]``
                               embeddings at ``w ± μ u_p`` (``train.zo_forward``)
``info``           Config      handshake reply / example counts / metrics
                               (keys ``INFO_*``)
=================  ==========  ==============================================

Every training action names a **block range** ``[start, end)`` of the model
and a **model slot** on the node (:data:`OWN_SLOT`, the node's own client-side
model, or e.g. ``relay_slot(origin)`` for a segment it trains for another
client). Config keys are never written as bare strings: each action has a
frozen dataclass whose fields are the keys (``batch_size`` <-> ``"batch-size"``)
with their types, encoded by :meth:`ActionConfig.to_record` and decoded by
:meth:`ActionConfig.from_record`.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import typing
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict
from flwr.common.constant import SType

# --- actions (message types) -------------------------------------------------
QUERY_INFO = "query.info"
TRAIN_FORWARD = "train.forward"
TRAIN_BACKWARD = "train.backward"
TRAIN_STEP = "train.step"
TRAIN_FIT = "train.fit"
TRAIN_ZO_FORWARD = "train.zo_forward"
TRAIN_ZO_UPDATE = "train.zo_update"
EVALUATE = "evaluate"

ACTIONS = (QUERY_INFO, TRAIN_FORWARD, TRAIN_BACKWARD, TRAIN_STEP, TRAIN_FIT, TRAIN_ZO_FORWARD, TRAIN_ZO_UPDATE,
           EVALUATE)

# --- record keys ---------------------------------------------------------------
TASK = "task"
CONFIG = "config"
WEIGHTS = "weights"
ACTIVATIONS = "activations"
LABELS = "labels"
GRADIENT = "gradient"
PERTURBED = "perturbed"
INFO = "info"
#: An optimizer state the server holds for its clients (SGD momentum buffers keyed by parameter
#: name, as ``slot.<name>.optimizer``): sent with a ``train.backward``, it replaces the slot's before
#: the step, and the reply returns the slot's new state under the same key (GAS's shared client
#: optimizer, ``client-momentum=shared``). An empty record means "no state yet".
OPTIMIZER = "optimizer"

# --- keys of the "info" ConfigRecord in replies ----------------------------------
INFO_PARTITION_ID = "partition-id"
INFO_NUM_EXAMPLES = "num-examples"
INFO_LABEL_HISTOGRAM = "label-histogram"
INFO_LOSS = "loss"
INFO_ACCURACY = "accuracy"
INFO_TRAIN_LOSS = "train-loss"
INFO_OK = "ok"  # an acknowledgement with nothing else to return

# --- values of BackwardConfig.next --------------------------------------------
NEXT_FORWARD = "forward"  # piggyback the next forward pass
NEXT_WEIGHTS = "weights"  # the local round is over: return the slot's weights
NEXT_NONE = "none"
NEXT_VALUES = (NEXT_FORWARD, NEXT_WEIGHTS, NEXT_NONE)

# --- values of EvaluateConfig.split --------------------------------------------
SPLIT_TEST = "test"
SPLIT_LOCAL = "local"

#: The node's own client-side model.
OWN_SLOT = "own"


def relay_slot(origin: int) -> str:
    """Name of the slot in which a node trains a segment for client ``origin`` (RingSFL)."""
    return f"relay:{int(origin)}"


C = TypeVar("C", bound="ActionConfig")
R = TypeVar("R", ArrayRecord, ConfigRecord)


def _key(field_name: str) -> str:
    return field_name.replace("_", "-")


@dataclass(frozen=True)
class ActionConfig:
    """Base of the typed per-action configs carried under :data:`CONFIG`.

    Field ``batch_size`` travels as key ``"batch-size"``; values are encoded
    with their declared types (``int``, ``float``, ``bool``, ``str``,
    ``list[float]``).
    """

    action: ClassVar[str] = ""

    def to_record(self) -> ConfigRecord:
        """The ConfigRecord sent in the message."""
        out: dict[str, Any] = {}
        for key, (name, _) in _fields(type(self)).items():
            value = getattr(self, name)
            out[key] = list(value) if isinstance(value, tuple) else value
        return ConfigRecord(out)

    @classmethod
    def from_record(cls: type[C], record: Mapping[str, Any] | None) -> C:
        """Decode a record made by :meth:`to_record`; absent keys take their defaults.

        Raises:
            ValueError: an unknown key, or a value that cannot be converted to its field's type.
        """
        given = dict(record.items()) if record else {}
        fields = _fields(cls)
        unknown = given.keys() - fields.keys()
        if unknown:
            raise ValueError(f"unknown {cls.action or cls.__name__} config keys: {', '.join(sorted(unknown))}")
        values: dict[str, Any] = {}
        for key, raw in given.items():
            name, kind = fields[key]
            if kind is bool:
                values[name] = bool(raw)
            elif kind in (int, float, str):
                values[name] = kind(raw)
            else:  # tuple[float, ...]
                values[name] = tuple(float(v) for v in raw)
        return cls(**values)


@functools.cache
def _fields(cls: type) -> dict[str, tuple[str, Any]]:
    """``record key -> (field name, type)`` of an :class:`ActionConfig` class, in field order (cached:
    ``typing.get_type_hints`` is slow)."""
    hints = typing.get_type_hints(cls)
    return {_key(f.name): (f.name, hints[f.name]) for f in dataclasses.fields(cls)}


@dataclass(frozen=True)
class OptimizerConfig(ActionConfig):
    """SGD settings of a training message (both sides use GAS's SGD by default).

    Attributes:
        lr: learning rate.
        momentum: SGD momentum.
        weight_decay: L2 weight decay.
        clip_norm: gradient-norm clipping threshold (0 = none).
        lr_scale: per-block learning-rate multipliers for the slot's blocks
            ``[start, end)`` (empty = all 1). RingSFL v2 (eq. 7) multiplies an
            overlapping block's rate by its overlap count.
        optimizer: ``"sgd"`` or ``"adamw"`` (``momentum`` then unused).
    """

    lr: float = 0.01
    momentum: float = 0.0
    weight_decay: float = 0.0
    clip_norm: float = 0.0
    lr_scale: tuple[float, ...] = ()
    optimizer: str = "sgd"


@dataclass(frozen=True)
class ForwardConfig(OptimizerConfig):
    """``train.forward``: run blocks ``[start, end)`` of the model in ``slot``.

    With ``start == 0`` the node samples ``batch_size`` examples of its own
    data; otherwise the input arrives as :data:`ACTIVATIONS` (and the labels
    as :data:`LABELS`) from the previous hop. Sent :data:`WEIGHTS` replace
    the slot's weights and reset its optimizer and accumulator.

    With ``loss`` the range ends the model: the node computes the mean
    cross-entropy on the labels, back-propagates it at once (weighted by
    ``weight``; accumulated or stepped as ``accumulate`` says) and replies
    with the gradient w.r.t. the range's input (when ``start > 0``) and the
    loss in :data:`INFO`. Otherwise it replies with the range's output
    (:data:`ACTIVATIONS`) and the labels.

    ``model_slot`` names another slot whose weights, optimizer state and
    accumulator this slot uses (empty: its own); the slot keeps only its
    stored input. RingSFL: every path through a node trains blocks of that
    node's one local model, each path keeping its input in its own slot.
    """

    action: ClassVar[str] = TRAIN_FORWARD
    slot: str = OWN_SLOT
    start: int = 0
    end: int = 0  # 0: the run's cut layer
    batch_size: int = 0
    loss: bool = False
    accumulate: bool = False
    weight: float = 1.0
    model_slot: str = ""


@dataclass(frozen=True)
class BackwardConfig(OptimizerConfig):
    """``train.backward``: back-propagate :data:`GRADIENT` through the slot's last forward.

    The forward pass of the stored input is recomputed (live objects do not
    survive between messages). The parameter gradient, times ``weight``, is
    either added to the slot's accumulator (``accumulate``; applied later by
    ``train.step``) or clipped and stepped at once. The reply holds the
    gradient w.r.t. the range's input when the range does not start at 0,
    plus, by ``next``: the next batch's activations (``batch_size``), the
    slot's weights and example count, or nothing more. ``model_slot`` as in
    :class:`ForwardConfig`.
    """

    action: ClassVar[str] = TRAIN_BACKWARD
    slot: str = OWN_SLOT
    next: str = NEXT_NONE
    batch_size: int = 0
    accumulate: bool = False
    weight: float = 1.0
    model_slot: str = ""


@dataclass(frozen=True)
class StepConfig(OptimizerConfig):
    """``train.step``: apply the slot's accumulated gradient (clip, SGD step with ``lr_scale``), clear it.

    The blocks ``[start, end)`` are stepped (``end`` 0: the range of the
    slot's last forward); RingSFL steps a node's whole model, ``[0, W)``.
    With ``return_weights`` the reply holds the slot's new weights.
    """

    action: ClassVar[str] = TRAIN_STEP
    slot: str = OWN_SLOT
    return_weights: bool = False
    start: int = 0
    end: int = 0


@dataclass(frozen=True)
class ZOForwardConfig(OptimizerConfig):
    """``train.zo_forward``: sample ``batch_size`` own examples; reply the embedding ``h``
    of blocks ``[0, end)`` (:data:`ACTIVATIONS`) and ``P = perturbations`` pairs
    ``h(w ± μ u_p)`` (:data:`PERTURBED`), ``μ = smoothing`` (MU-SplitFed eq. 4).

    The directions ``u_p`` stay on the node: it keeps their seeds. Sent
    :data:`WEIGHTS` replace the slot's weights and reset its optimizer.
    """

    action: ClassVar[str] = TRAIN_ZO_FORWARD
    slot: str = OWN_SLOT
    end: int = 0  # 0: the run's cut layer
    batch_size: int = 0
    perturbations: int = 1
    smoothing: float = 1e-3


@dataclass(frozen=True)
class ZOUpdateConfig(OptimizerConfig):
    """``train.zo_update``: the ``P`` loss differences ``diffs`` of the last
    ``train.zo_forward``; the node regenerates each ``u_p`` from its seed, forms
    the SPSA estimate (:func:`fl_app.zo.spsa_gradient`), clips and steps. No
    backward pass. ``next`` and ``batch_size`` as in :class:`BackwardConfig`;
    a piggybacked forward is a ``train.zo_forward`` with the same ``P`` and ``μ``.
    """

    action: ClassVar[str] = TRAIN_ZO_UPDATE
    slot: str = OWN_SLOT
    diffs: tuple[float, ...] = ()
    smoothing: float = 1e-3
    next: str = NEXT_NONE
    batch_size: int = 0


@dataclass(frozen=True)
class FitConfig(OptimizerConfig):
    """``train.fit``: ``local_iterations`` full-model SGD steps of ``batch_size`` (FL baselines)."""

    action: ClassVar[str] = TRAIN_FIT
    local_iterations: int = 1
    batch_size: int = 32


@dataclass(frozen=True)
class EvaluateConfig(ActionConfig):
    """``evaluate``: evaluate sent full-model weights on the test set or the local partition."""

    action: ClassVar[str] = EVALUATE
    split: str = SPLIT_TEST


# --- codecs --------------------------------------------------------------------
#
# An :class:`~flwr.app.Array` holds its tensor as the bytes of a ``.npy`` file
# (``np.save``). ``np.save``/``np.load`` format and parse the ``.npy`` header on
# every call (``np.load`` through ``ast.literal_eval``), which dominated the
# cost of small relayed records. The header depends only on the dtype and the
# shape, so :func:`_encode` caches it per ``(dtype, shape)`` and :func:`_decode`
# caches the parsed header per header bytes; the bytes written are exactly
# ``np.save``'s, and an unusual array (not C-contiguous, empty, object dtype)
# takes the plain ``np.save``/``np.load`` path.

_NPY_HEADERS: dict[tuple[np.dtype, tuple[int, ...]], bytes] = {}
_NPY_PARSED: dict[bytes, tuple[np.dtype, tuple[int, ...], int]] = {}
_NPY_MAGIC = b"\x93NUMPY"


def _encode(arr: np.ndarray) -> Array:
    """``Array(arr)``, byte for byte, with the ``.npy`` header cached per dtype and shape."""
    if not arr.flags.c_contiguous or arr.dtype.hasobject or arr.size == 0:
        return Array(arr)
    key = (arr.dtype, arr.shape)
    header = _NPY_HEADERS.get(key)
    if header is None:
        full = Array(arr)
        if len(_NPY_HEADERS) < 4096:
            _NPY_HEADERS[key] = full.data[:len(full.data) - arr.nbytes]
        return full
    data = b"".join((header, arr.data)) if arr.ndim else header + arr.tobytes()  # one copy
    return Array(dtype=str(arr.dtype), shape=tuple(arr.shape), stype=SType.NUMPY, data=data)


def _decode(array: Array) -> np.ndarray:
    """``array.numpy()`` as a fresh, writable copy, with the parsed ``.npy`` header cached."""
    view = _view(array)
    return view.copy() if view is not None else np.array(array.numpy(), copy=True)


def _view(array: Array) -> np.ndarray | None:
    """A read-only view of ``array``'s values on its bytes (no copy), or None for an unusual array."""
    data = array.data
    if array.stype == SType.NUMPY and data[:6] == _NPY_MAGIC and len(data) > 12:
        if data[6] == 1:
            offset = 10 + int.from_bytes(data[8:10], "little")
        else:
            offset = 12 + int.from_bytes(data[8:12], "little")
        header = data[:offset]
        parsed = _NPY_PARSED.get(header)
        if parsed is None:
            parsed = _parse_header(header, len(data) - offset)
        if parsed is not None and len(data) - offset == parsed[2] * parsed[0].itemsize:
            dtype, shape, count = parsed
            return np.frombuffer(data, dtype=dtype, count=count, offset=offset).reshape(shape)
    return None


def _parse_header(header: bytes, payload: int) -> tuple[np.dtype, tuple[int, ...], int] | None:
    """``(dtype, shape, count)`` of a C-order, non-empty, non-object ``.npy`` header whose
    payload has the expected size (cached); None for anything else."""
    import io

    from numpy.lib import format as npy

    fh = io.BytesIO(header)
    try:
        version = npy.read_magic(fh)
        if version == (1, 0):
            shape, fortran, dtype = npy.read_array_header_1_0(fh)
        elif version == (2, 0):
            shape, fortran, dtype = npy.read_array_header_2_0(fh)
        else:
            return None
    except Exception:  # noqa: BLE001 - np.load will report it
        return None
    count = math.prod(shape)
    if fortran or dtype.hasobject or count == 0 or count * dtype.itemsize != payload or fh.read():
        return None
    out = (dtype, tuple(shape), count)
    if len(_NPY_PARSED) < 4096:
        _NPY_PARSED[header] = out
    return out


def tensor_array(tensor: torch.Tensor) -> Array:
    """One tensor (any dtype, any shape) as an :class:`~flwr.app.Array` (``.npy`` bytes)."""
    return _encode(tensor.detach().cpu().contiguous().numpy())


def numpy_array(arr: np.ndarray) -> Array:
    """One NumPy array as an :class:`~flwr.app.Array`, the bytes :func:`tensor_array` writes for it."""
    return _encode(np.ascontiguousarray(arr))


def record_view(record: ArrayRecord, name: str) -> np.ndarray:
    """The values of ``record[name]`` as a read-only NumPy array, without a copy where possible
    (for reading only; :func:`record_tensor` gives a writable tensor)."""
    view = _view(record[name])
    return view if view is not None else record[name].numpy()


def canonical(array: Array) -> Array:
    """``array`` itself when it holds exactly the bytes that decoding and re-encoding it give
    (what :func:`tensor_array` writes, as any array it wrote does), else that re-encoding.

    Lets a record keep or pass on arrays it received without a decode and
    encode round trip, and without changing a byte.
    """
    if array.stype == SType.NUMPY:
        try:
            dtype = np.dtype(array.dtype)
        except TypeError:
            dtype = None
        if dtype is not None:
            shape = tuple(array.shape)
            header = _NPY_HEADERS.get((dtype, shape))
            if header is not None and len(array.data) == len(header) + dtype.itemsize * math.prod(shape) \
                    and array.data.startswith(header):
                return array
    return _encode(_decode(array))


def array_record(arrays: Mapping[str, Array]) -> ArrayRecord:
    """An ArrayRecord holding ``arrays`` themselves.

    ``ArrayRecord(dict)`` copies every :class:`~flwr.app.Array` (the same
    fields, the same bytes): a cost on the relay path and nothing more.
    """
    record = ArrayRecord()
    for name, array in arrays.items():
        record[name] = array
    return record


def tensor_record(name: str, tensor: torch.Tensor) -> ArrayRecord:
    """Wrap one tensor (any dtype, any shape) in an ArrayRecord under ``name``."""
    return array_record({name: tensor_array(tensor)})


def record_tensor(record: ArrayRecord, name: str) -> torch.Tensor:
    """The tensor stored by :func:`tensor_record` (a fresh, writable copy)."""
    return torch.from_numpy(_decode(record[name]))


def state_record(state: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """Encode a torch ``state_dict`` (or any name -> tensor mapping)."""
    return array_record({k: _encode(v.detach().cpu().contiguous().numpy()) for k, v in state.items()})


def record_state(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """Decode an ArrayRecord made by :func:`state_record` into tensors."""
    return {k: torch.from_numpy(_decode(a)) for k, a in record.items()}


def record_bytes(record: ArrayRecord | None) -> int:
    """Payload size of an ArrayRecord in bytes (tensor data only, from shapes and dtypes;
    nothing is deserialised)."""
    if record is None:
        return 0
    return int(sum(math.prod(a.shape) * np.dtype(a.dtype).itemsize for a in record.values()))


def array_records(content: RecordDict) -> dict[str, ArrayRecord]:
    """The ArrayRecords of ``content`` by key, as a plain dict.

    Equal to ``dict(content.array_records)``, which builds a synchronised copy
    of the records on every access (a cost on the relay path).
    """
    return {k: v for k, v in content.items() if isinstance(v, ArrayRecord)}


def config_records(content: RecordDict) -> dict[str, ConfigRecord]:
    """The ConfigRecords of ``content`` by key, as a plain dict (see :func:`array_records`)."""
    return {k: v for k, v in content.items() if isinstance(v, ConfigRecord)}


def _record(content: RecordDict, key: str, kind: type[R]) -> R | None:
    """``content[key]`` when it is a record of type ``kind`` (no copy of the records), else None."""
    value = content.get(key)
    return value if isinstance(value, kind) else None


def _required(content: RecordDict, key: str, kind: type[R]) -> R:
    """:func:`_record`, or KeyError when ``content`` has no record ``key`` of type ``kind``."""
    value = _record(content, key, kind)
    if value is None:
        raise KeyError(key)
    return value


def get_array(content: RecordDict, key: str) -> ArrayRecord | None:
    """``content.array_records.get(key)`` without copying the records."""
    return _record(content, key, ArrayRecord)


def get_config(content: RecordDict, key: str) -> ConfigRecord | None:
    """``content.config_records.get(key)`` without copying the records."""
    return _record(content, key, ConfigRecord)


def array_of(content: RecordDict, key: str) -> ArrayRecord:
    """``content.array_records[key]`` without copying the records.

    Raises:
        KeyError: ``content`` has no ArrayRecord ``key``.
    """
    return _required(content, key, ArrayRecord)


def config_of(content: RecordDict, key: str) -> ConfigRecord:
    """``content.config_records[key]`` without copying the records.

    Raises:
        KeyError: ``content`` has no ConfigRecord ``key``.
    """
    return _required(content, key, ConfigRecord)
