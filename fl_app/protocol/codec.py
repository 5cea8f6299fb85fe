"""The array codec: tensors and NumPy arrays as Flower :class:`~flwr.app.Array` bytes (``.npy``), fast.

An :class:`~flwr.app.Array` holds its tensor as the bytes of a ``.npy`` file
(``np.save``). ``np.save``/``np.load`` format and parse the ``.npy`` header on
every call (``np.load`` through ``ast.literal_eval``), which dominated the
cost of small relayed records. The header depends only on the dtype and the
shape, so :func:`encode_array` caches it per ``(dtype, shape)`` and
:func:`decode_array` caches the parsed header per header bytes; the bytes
written are exactly ``np.save``'s, and an unusual array (not C-contiguous,
empty, object dtype) takes the plain ``np.save``/``np.load`` path.

A fresh tensor (activations, gradients, an accumulator's sum) becomes a
:class:`DeferredArray`: it writes those bytes only when ``data`` is first
read, which the in-process engine never does (its readers take the values
through :func:`view_array`); Ray and deployment read ``data`` to send the
message, and get the same bytes.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from flwr.app import Array, ArrayRecord
from flwr.common.constant import SType

_NPY_HEADERS: dict[tuple[np.dtype, tuple[int, ...]], bytes] = {}
_NPY_PARSED: dict[bytes, tuple[np.dtype, tuple[int, ...], int]] = {}
_NPY_MAGIC = b"\x93NUMPY"
#: ``str(dtype)`` per dtype (``np.dtype.__str__`` is slow for a per-message cost)
_DTYPE_NAMES: dict[np.dtype, str] = {}


def _dtype_name(dtype: np.dtype) -> str:
    name = _DTYPE_NAMES.get(dtype)
    if name is None:
        name = _DTYPE_NAMES[dtype] = str(dtype)
    return name


def encode_array(arr: np.ndarray) -> Array:
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
    return Array(dtype=_dtype_name(arr.dtype), shape=tuple(arr.shape), stype=SType.NUMPY, data=data)


class DeferredArray(Array):
    """An :class:`~flwr.app.Array` of a fresh NumPy array whose ``.npy`` bytes are written on first read.

    ``dtype``, ``shape`` and ``stype`` are set at once; ``data`` is
    :func:`encode_array`'s bytes, written (and kept) when first read, so the
    object is indistinguishable from ``encode_array(values)`` to Flower
    (serialisation, object ids, ``numpy()``) and pickles as a plain Array.
    :func:`view_array` reads the values without writing the bytes.

    The values must not change afterwards: ``tensor`` (when given: the tensor
    that ``values`` views) is checked by its autograd version counter.

    Args:
        values: a C-contiguous, non-empty, non-object array [any shape].
        tensor: the CPU tensor ``values`` shares memory with, or None.

    Raises:
        RuntimeError: on reading, the tensor was updated in place since (a bug in the caller).
    """

    def __init__(self, values: np.ndarray, tensor: torch.Tensor | None = None) -> None:  # noqa: D107
        d = self.__dict__
        d["_is_dirty"] = True
        d["dtype"], d["shape"], d["stype"] = _dtype_name(values.dtype), tuple(values.shape), SType.NUMPY
        d["_values"], d["_tensor"] = values, tensor
        d["_version"] = tensor._version if tensor is not None else 0  # noqa: SLF001

    def tensor(self) -> torch.Tensor:
        """The values as a tensor sharing their memory (a new tensor object, not to be changed in place)."""
        tensor = self.__dict__["_tensor"]
        if tensor is None:
            return torch.from_numpy(self.values())
        self.values()  # checked unchanged
        return tensor.detach()

    def values(self) -> np.ndarray:
        """The array's values (read-only use), checked unchanged."""
        tensor = self.__dict__["_tensor"]
        if tensor is not None and tensor._version != self.__dict__["_version"]:  # noqa: SLF001
            raise RuntimeError("a tensor sent in a message was changed in place before it was encoded")
        return self.__dict__["_values"]

    @property
    def data(self) -> bytes:  # type: ignore[override]
        """The ``.npy`` bytes (:func:`encode_array`'s), written on first read."""
        data = self.__dict__.get("_data")
        if data is None:
            data = self.__dict__["_data"] = encode_array(self.values()).data
        return data

    @data.setter
    def data(self, value: bytes) -> None:
        self.__dict__["_data"] = value
        self.__dict__["_tensor"] = None
        self.__dict__["_values"] = view_array(Array(dtype=self.dtype, shape=tuple(self.shape), stype=self.stype,
                                                    data=value))

    def deflate(self) -> bytes:
        """Flower's serialised form of the plain Array of these bytes (the receiver inflates an Array)."""
        return _plain_array(self.dtype, tuple(self.shape), self.stype, self.data).deflate()

    def __reduce__(self):  # pickles as a plain Array, bytes written
        return (_plain_array, (self.dtype, tuple(self.shape), self.stype, self.data))


def _plain_array(dtype: str, shape: tuple[int, ...], stype: str, data: bytes) -> Array:
    """An :class:`~flwr.app.Array` of these fields (unpickling a :class:`DeferredArray`)."""
    return Array(dtype=dtype, shape=shape, stype=stype, data=data)


def value_token(array: Array) -> object:
    """An object that stands for ``array``'s values as long as it is alive: ``array.data`` (immutable
    bytes), or a :class:`DeferredArray`'s values, whose bytes need not be written for it."""
    if type(array) is DeferredArray:
        return array.__dict__["_values"]
    return array.data


def decode_array(array: Array) -> np.ndarray:
    """``array.numpy()`` as a fresh, writable copy, with the parsed ``.npy`` header cached."""
    view = view_array(array)
    return view.copy() if view is not None else np.array(array.numpy(), copy=True)


def view_array(array: Array) -> np.ndarray | None:
    """A read-only view of ``array``'s values on its bytes (no copy), or None for an unusual array."""
    if type(array) is DeferredArray:
        return array.values()
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
    """One tensor (any dtype, any shape) as an :class:`~flwr.app.Array` (``.npy`` bytes).

    The tensor must not be changed in place afterwards (a :class:`DeferredArray` may still read it;
    checked when it does)."""
    t = tensor.detach().cpu().contiguous()
    values = t.numpy()
    if values.dtype.hasobject or values.size == 0:
        return encode_array(values)
    return DeferredArray(values, t)


def record_view(record: ArrayRecord, name: str) -> np.ndarray:
    """The values of ``record[name]`` as a read-only NumPy array, without a copy where possible
    (for reading only; :func:`record_tensor` gives a writable tensor)."""
    view = view_array(record[name])
    return view if view is not None else record[name].numpy()


def canonical(array: Array) -> Array:
    """``array`` itself when it holds exactly the bytes that decoding and re-encoding it give
    (what :func:`tensor_array` writes, as any array it wrote does), else that re-encoding.

    Lets a record keep or pass on arrays it received without a decode and
    encode round trip, and without changing a byte.
    """
    if type(array) is DeferredArray:
        return array
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
    return encode_array(decode_array(array))
