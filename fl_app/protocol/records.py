"""Records of a message's content: tensors and state dicts in ArrayRecords, and copy-free record access.

``RecordDict.array_records`` and ``ArrayRecord(dict)`` copy on every access;
the relay path reads and forwards records many times, so these helpers reach
the records themselves.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TypeVar

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

from fl_app.protocol.codec import DeferredArray, decode_array, tensor_array

R = TypeVar("R", ArrayRecord, ConfigRecord)


def _item_store(record: object) -> dict | None:
    """The plain dict in which a Flower record keeps its items (flwr 1.41/1.42's ``TypedDict._data``), or None.

    Flower checks the type of every key and value it stores with two
    ``typing.cast(Callable[...])`` calls, each building a generic alias: about
    as slow as the rest of a small relay message's bookkeeping. The helpers
    below make the same checks themselves and store into this dict; with any
    other layout (None) they use the records' own ``__setitem__``.
    """
    store = record.__dict__.get("_data")
    return store if type(store) is dict else None


def array_record(arrays: Mapping[str, Array]) -> ArrayRecord:
    """An ArrayRecord holding ``arrays`` themselves.

    ``ArrayRecord(dict)`` copies every :class:`~flwr.app.Array` (the same
    fields, the same bytes): a cost on the relay path and nothing more.

    Raises:
        TypeError: a key that is not a ``str`` or a value that is not an Array.
    """
    record = ArrayRecord()
    store = _item_store(record)
    for name, array in arrays.items():
        if store is None:
            record[name] = array
            continue
        if not isinstance(name, str) or not isinstance(array, Array):
            raise TypeError(f"an ArrayRecord maps str to Array, not {type(name).__name__} to {type(array).__name__}")
        store[name] = array
    record.is_dirty = True  # as ArrayRecord.__setitem__ marks it
    return record


def record_dict(records: Mapping[str, ArrayRecord | ConfigRecord | MetricRecord]) -> RecordDict:
    """``RecordDict(records)``, the records themselves (see :func:`_item_store`).

    Raises:
        TypeError: a key that is not a ``str`` or a value that is not a record.
    """
    content = RecordDict()
    for key, record in records.items():
        set_record(content, key, record)
    return content


def set_record(content: RecordDict, key: str, record: ArrayRecord | ConfigRecord | MetricRecord) -> None:
    """``content[key] = record`` (see :func:`_item_store`); Flower's own path where it would warn (a key's
    record replaced by one of another type).

    Raises:
        TypeError: a key that is not a ``str`` or a value that is not a record.
    """
    store = _item_store(content)
    old = store.get(key) if store is not None else None
    if store is None or (old is not None and type(old) is not type(record)):
        content[key] = record
        return
    if not isinstance(key, str) or not isinstance(record, (ArrayRecord, ConfigRecord, MetricRecord)):
        raise TypeError(f"a RecordDict maps str to records, not {type(key).__name__} to {type(record).__name__}")
    store[key] = record


def tensor_record(name: str, tensor: torch.Tensor) -> ArrayRecord:
    """Wrap one tensor (any dtype, any shape) in an ArrayRecord under ``name``."""
    return array_record({name: tensor_array(tensor)})


def record_tensor(record: ArrayRecord, name: str) -> torch.Tensor:
    """The tensor stored by :func:`tensor_record` (a fresh, writable copy)."""
    return torch.from_numpy(decode_array(record[name]))


def record_input(record: ArrayRecord, name: str) -> torch.Tensor:
    """The tensor stored by :func:`tensor_record`, for reading only: the sender's tensor itself where it
    is a :class:`~fl_app.protocol.codec.DeferredArray` (in-process: no copy), else a fresh copy.

    The caller must not change it in place (a relayed input or gradient that is only computed on).
    """
    array = record[name]
    if type(array) is DeferredArray:
        return array.tensor()
    return torch.from_numpy(decode_array(array))


def state_record(state: Mapping[str, torch.Tensor]) -> ArrayRecord:
    """Encode a torch ``state_dict`` (or any name -> tensor mapping): a snapshot of its values now (each
    tensor copied, its ``.npy`` bytes written when Flower serialises them, see
    :class:`~fl_app.protocol.codec.DeferredArray`)."""
    return array_record({k: tensor_array(v.detach().cpu().clone(memory_format=torch.contiguous_format))
                         for k, v in state.items()})


def record_state(record: ArrayRecord) -> dict[str, torch.Tensor]:
    """Decode an ArrayRecord made by :func:`state_record` into tensors."""
    return {k: torch.from_numpy(decode_array(a)) for k, a in record.items()}


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
    store = _item_store(content)
    value = store.get(key) if store is not None else content.get(key)
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
