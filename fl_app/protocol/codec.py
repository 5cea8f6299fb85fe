"""The array codec: tensors and NumPy arrays as Flower :class:`~flwr.app.Array` bytes (``.npy``), fast.

An :class:`~flwr.app.Array` holds its tensor as the bytes of a ``.npy`` file
(``np.save``). ``np.save``/``np.load`` format and parse the ``.npy`` header on
every call (``np.load`` through ``ast.literal_eval``), which dominated the
cost of small relayed records. The header depends only on the dtype and the
shape, so :func:`encode_array` caches it per ``(dtype, shape)`` and
:func:`decode_array` caches the parsed header per header bytes; the bytes
written are exactly ``np.save``'s, and an unusual array (not C-contiguous,
empty, object dtype) takes the plain ``np.save``/``np.load`` path.
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
    return Array(dtype=str(arr.dtype), shape=tuple(arr.shape), stype=SType.NUMPY, data=data)


def decode_array(array: Array) -> np.ndarray:
    """``array.numpy()`` as a fresh, writable copy, with the parsed ``.npy`` header cached."""
    view = view_array(array)
    return view.copy() if view is not None else np.array(array.numpy(), copy=True)


def view_array(array: Array) -> np.ndarray | None:
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
    return encode_array(tensor.detach().cpu().contiguous().numpy())


def numpy_array(arr: np.ndarray) -> Array:
    """One NumPy array as an :class:`~flwr.app.Array`, the bytes :func:`tensor_array` writes for it."""
    return encode_array(np.ascontiguousarray(arr))


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
