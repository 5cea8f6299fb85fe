"""The session transport's frames: a :class:`~flwr.app.RecordDict` and a small header as bytes, and back.

docs/explanation/design.md §4 (the session transport). A frame is::

    4 bytes   big-endian length H of the header
    H bytes   the header: UTF-8 JSON, an object
    rest      the blobs the header refers to, one after the other

The header's ``"records"`` entry describes a RecordDict with only the
records' public accessors: for each record its name, kind (``array``,
``config`` or ``metric``) and items. An :class:`~flwr.app.Array` is its
``dtype``, ``shape``, ``stype`` and ``data`` (a blob); a config value is a
JSON value, except ``bytes``, which become ``{"$blob": i}`` (also inside
lists). Python's JSON keeps ``int`` and ``float`` apart (``1`` and ``1.0``)
and writes NaN and infinities, so every value comes back with its type.
Nothing is pickled: a frame from the network can describe data, not code.
"""

from __future__ import annotations

import json
from typing import Any

from flwr.app import Array, ArrayRecord, ConfigRecord, MetricRecord, RecordDict

__all__ = ["FrameError", "decode_frame", "encode_frame"]

_LEN = 4
#: The largest frame either side accepts (bytes): 2 GiB - 1, gRPC's own limit.
MAX_FRAME_BYTES = 2**31 - 1


class FrameError(ValueError):
    """A frame that cannot be decoded (truncated, not JSON, an unknown record kind)."""


def encode_frame(header: dict[str, Any], content: RecordDict | None = None) -> bytes:
    """``header`` (a JSON object, without a ``records`` key) and ``content`` as one frame (module docstring)."""
    blobs: list[bytes] = []
    head = dict(header)
    if content is not None:
        head["records"] = [_describe(name, record, blobs) for name, record in content.items()]
    raw = json.dumps(head, separators=(",", ":")).encode()
    return b"".join([len(raw).to_bytes(_LEN, "big"), raw, *blobs])


def decode_frame(frame: bytes) -> tuple[dict[str, Any], RecordDict | None]:
    """The header and the RecordDict (None when the frame has none) of :func:`encode_frame`'s bytes.

    Raises:
        FrameError: the frame is malformed.
    """
    view = memoryview(frame)
    if len(view) < _LEN:
        raise FrameError("frame shorter than its length prefix")
    n = int.from_bytes(view[:_LEN], "big")
    try:
        head = json.loads(bytes(view[_LEN:_LEN + n]))
    except (UnicodeDecodeError, json.JSONDecodeError) as err:
        raise FrameError(f"frame header is not JSON: {err}") from None
    if not isinstance(head, dict):
        raise FrameError("frame header is not a JSON object")
    records = head.pop("records", None)
    if records is None:
        if len(view) != _LEN + n:
            raise FrameError(f"{len(view) - _LEN - n} trailing bytes after the frame's header")
        return head, None
    reader = _Blobs(view, _LEN + n)
    try:
        content = RecordDict({r["name"]: _build(r, reader) for r in records})
    except (KeyError, TypeError, ValueError) as err:  # a missing key, a wrong type, an item of the wrong length
        if isinstance(err, FrameError):
            raise
        raise FrameError(f"frame records are malformed: {err!r}") from None
    if reader.pos != len(view):
        raise FrameError(f"{len(view) - reader.pos} trailing bytes after the frame's blobs")
    return head, content


def _describe(name: str, record: Any, blobs: list[bytes]) -> dict[str, Any]:
    def blob(data: bytes) -> dict[str, int]:
        blobs.append(data)
        return {"$blob": len(data)}

    if isinstance(record, ArrayRecord):
        items = [[k, a.dtype, list(a.shape), a.stype, blob(a.data)] for k, a in record.items()]
        return {"name": name, "kind": "array", "items": items}
    kind = "config" if isinstance(record, ConfigRecord) else "metric" if isinstance(record, MetricRecord) else None
    if kind is None:
        raise TypeError(f"record {name!r} is a {type(record).__name__}, not an Array/Config/MetricRecord")

    def value(v: Any) -> Any:
        if isinstance(v, bytes):
            return blob(v)
        if isinstance(v, list):
            return [value(x) for x in v]
        return v

    return {"name": name, "kind": kind, "items": [[k, value(v)] for k, v in record.items()]}


class _Blobs:
    """Reads the frame's blobs in order."""

    def __init__(self, view: memoryview, pos: int) -> None:
        self.view, self.pos = view, pos

    def take(self, ref: Any) -> bytes:
        n = ref["$blob"]
        if type(n) is not int or n < 0 or self.pos + n > len(self.view):
            raise FrameError("a blob runs past the end of the frame")
        data = bytes(self.view[self.pos:self.pos + n])
        self.pos += n
        return data


def _build(desc: dict[str, Any], reader: _Blobs) -> Any:
    kind = desc["kind"]
    if kind == "array":
        return ArrayRecord({k: Array(dtype=dtype, shape=tuple(shape), stype=stype, data=reader.take(ref))
                            for k, dtype, shape, stype, ref in desc["items"]})

    def value(v: Any) -> Any:
        if isinstance(v, dict):
            return reader.take(v)
        if isinstance(v, list):
            return [value(x) for x in v]
        return v

    items = {k: value(v) for k, v in desc["items"]}
    if kind == "config":
        return ConfigRecord(items)
    if kind == "metric":
        return MetricRecord(items)
    raise FrameError(f"unknown record kind {kind!r}")
