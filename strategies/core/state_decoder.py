"""The reading half of :mod:`strategies.core.state_codec`: a graph and its blobs back to objects.

Only the node types of :data:`_NODE_TYPES` are read, and only what the
allowlist of :mod:`strategies.core.state_codec` names is rebuilt: no
callable named by the file is called but ``__new__`` and ``__setstate__`` of
the allowlisted classes, its :data:`~strategies.core.state_codec.RECONSTRUCTORS`
and fixed constructors.
"""

from __future__ import annotations

import collections
import enum
import random
import types
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from strategies.core.state_codec import RECONSTRUCTORS, CodecError, allowed_class, allowed_global

__all__ = ["decode"]


#: The node types a graph may hold (each a ``_<type>`` method of the decoder).
_NODE_TYPES = frozenset({"float", "env", "ref", "list", "dict", "odict", "ddict", "deque", "tuple", "set", "frozenset",
                         "bytes", "bytearray", "complex", "dtype", "device", "size", "tensor", "param", "torch_gen",
                         "ndarray", "np_scalar", "np_dtype", "np_bitgen", "np_gen", "np_rs", "random", "method",
                         "global", "enum", "call", "obj"})
_DTYPES = {str(d).removeprefix("torch."): d for d in vars(torch).values() if isinstance(d, torch.dtype)}


class _Decoder:
    def __init__(self, blobs: Mapping[str, torch.Tensor], env: Mapping[str, Any]) -> None:
        self.blobs, self.env = blobs, env
        self.memo: dict[int, Any] = {}
        self.storages: dict[tuple[str, str], Any] = {}

    def _blob(self, key: Any) -> torch.Tensor:
        if not isinstance(key, str) or key not in self.blobs:
            raise CodecError(f"checkpoint refers to a missing tensor {key!r}")
        return self.blobs[key]

    def _put(self, node: Mapping[str, Any], obj: Any) -> Any:
        self.memo[node["id"]] = obj
        return obj

    def dec(self, node: Any) -> Any:
        if node is None or isinstance(node, (bool, int, float, str)):
            return node
        if not isinstance(node, dict) or not isinstance(node.get("t"), str):
            raise CodecError(f"checkpoint graph holds an unknown value of type {type(node).__name__}")
        method = getattr(self, "_" + node["t"], None) if node["t"] in _NODE_TYPES else None
        if method is None:
            raise CodecError(f"checkpoint graph holds an unknown node type {node['t']!r}")
        return method(node)

    def _pairs(self, items: Any) -> list[tuple[Any, Any]]:
        return [(self.dec(k), self.dec(v)) for k, v in items]

    def _float(self, node):
        if node["v"] not in ("nan", "inf", "-inf"):
            raise CodecError(f"bad float {node['v']!r}")
        return float(node["v"])

    def _env(self, node):
        name = node["name"]
        if name not in self.env:
            raise CodecError(f"checkpoint refers to '{name}', which the resumed run does not provide")
        return self.env[name]

    def _ref(self, node):
        try:
            return self.memo[node["id"]]
        except KeyError:
            raise CodecError(f"checkpoint graph refers to object {node['id']!r} before defining it") from None

    def _list(self, node):
        out = self._put(node, [])
        out.extend(self.dec(v) for v in node["items"])
        return out

    def _dict(self, node, out=None):
        out = self._put(node, {} if out is None else out)
        for k, v in node["items"]:
            key = self.dec(k)
            out[key] = self.dec(v)
        return out

    def _odict(self, node):
        return self._dict(node, collections.OrderedDict())

    def _ddict(self, node):
        out = self._put(node, collections.defaultdict())
        out.default_factory = self.dec(node["factory"])
        return self._dict(node, out)

    def _deque(self, node):
        out = self._put(node, collections.deque(maxlen=node["maxlen"]))
        out.extend(self.dec(v) for v in node["items"])
        return out

    def _tuple(self, node):
        return self._put(node, tuple(self.dec(v) for v in node["items"]))

    def _set(self, node):
        out = self._put(node, set())
        out.update(self.dec(v) for v in node["items"])
        return out

    def _frozenset(self, node):
        return self._put(node, frozenset(self.dec(v) for v in node["items"]))

    def _bytes(self, node):
        return self._put(node, self._blob(node["blob"]).numpy().tobytes())

    def _bytearray(self, node):
        return self._put(node, bytearray(self._blob(node["blob"]).numpy().tobytes()))

    def _complex(self, node):
        return complex(self.dec(node["re"]), self.dec(node["im"]))

    def _dtype(self, node):
        try:
            return _DTYPES[node["v"]]
        except KeyError:
            raise CodecError(f"unknown torch dtype {node['v']!r}") from None

    def _device(self, node):
        return torch.device(str(node["v"]))

    def _size(self, node):
        return torch.Size(int(v) for v in node["v"])

    def _storage(self, key: str, device: str) -> Any:
        skey = (key, device)
        if skey not in self.storages:
            raw = self._blob(key).clone()
            self.storages[skey] = raw.to(torch.device(device)).untyped_storage()
        return self.storages[skey]

    def _tensor(self, node):
        dtype = self._dtype({"v": node["dtype"]})
        storage = self._storage(node["storage"], str(node["device"]))
        t = torch.empty(0, dtype=dtype, device=torch.device(str(node["device"])))
        t.set_(storage, int(node["offset"]), [int(s) for s in node["size"]], [int(s) for s in node["stride"]])
        if node["t"] == "param":
            t = torch.nn.Parameter(t, requires_grad=bool(node["requires_grad"]))
        elif node["requires_grad"]:
            t.requires_grad_(True)
        self._put(node, t)
        if "dict" in node:
            t.__dict__.update(self.dec(node["dict"]))
        return t

    _param = _tensor

    def _torch_gen(self, node):
        g = self._put(node, torch.Generator(device=torch.device(str(node["device"]))))
        g.set_state(self.dec(node["state"]))
        return g

    def _ndarray(self, node):
        dtype = np.dtype(str(node["dtype"]))
        if dtype.hasobject:
            raise CodecError("checkpoint holds a NumPy array of Python objects")
        data = self._blob(node["blob"]).numpy().tobytes()
        arr = np.frombuffer(data, dtype=dtype).reshape([int(s) for s in node["shape"]]).copy()
        return self._put(node, arr)

    def _np_scalar(self, node):
        dtype = np.dtype(str(node["dtype"]))
        if dtype.hasobject:
            raise CodecError("checkpoint holds a NumPy object scalar")
        return np.frombuffer(self.dec(node["v"]), dtype=dtype)[0]

    def _np_dtype(self, node):
        dtype = np.dtype(str(node["v"]))
        if dtype.hasobject:
            raise CodecError("checkpoint holds a NumPy object dtype")
        return dtype

    def _bitgen_class(self, name: Any) -> type:
        cls = getattr(np.random, str(name), None)
        if not (isinstance(cls, type) and issubclass(cls, np.random.BitGenerator)):
            raise CodecError(f"unknown NumPy bit generator {name!r}")
        return cls

    def _np_bitgen(self, node):
        bg = self._put(node, self._bitgen_class(node["bitgen"])())
        bg.state = self.dec(node["state"])
        return bg

    def _np_gen(self, node):
        bg = self._bitgen_class(node["bitgen"])()
        g = self._put(node, np.random.Generator(bg))
        bg.state = self.dec(node["state"])
        return g

    def _np_rs(self, node):
        rs = self._put(node, np.random.RandomState())
        rs.set_state(self.dec(node["state"]))
        return rs

    def _random(self, node):
        r = self._put(node, random.Random())
        r.setstate(self.dec(node["state"]))
        return r

    def _method(self, node):
        name = node["name"]
        if not isinstance(name, str) or name.startswith("__"):
            raise CodecError(f"checkpoint names method {name!r}")
        obj = self.dec(node["self"])
        method = getattr(obj, name)
        if not isinstance(method, types.MethodType):
            raise CodecError(f"checkpoint names {name!r}, not a method")
        return method

    def _global(self, node):
        return allowed_global(str(node["name"]))

    def _enum(self, node):
        cls = allowed_class(str(node["cls"]))
        if not issubclass(cls, enum.Enum):
            raise CodecError(f"{node['cls']} is not an enum")
        return cls[node["name"]]

    def _call(self, node):
        name = str(node["func"])
        if name not in RECONSTRUCTORS:
            raise CodecError(f"checkpoint calls {name}, which is not an allowed reconstructor")
        func = allowed_global(name)
        return self._put(node, func(*[self.dec(a) for a in node["args"]]))

    def _obj(self, node):
        cls = allowed_class(str(node["cls"]))
        args = [self.dec(a) for a in node.get("args", [])]
        kwargs = dict(self._pairs(node.get("kwargs", [])))
        obj = self._put(node, cls.__new__(cls, *args, **kwargs))
        if "state" in node:
            state = self.dec(node["state"])
            setstate = getattr(obj, "__setstate__", None)
            if setstate is not None:
                setstate(state)
            else:
                slots = None
                if isinstance(state, tuple) and len(state) == 2:
                    state, slots = state
                if state:
                    obj.__dict__.update(state)
                for k, v in (slots or {}).items():
                    setattr(obj, k, v)
        if "list" in node:
            items = [self.dec(v) for v in node["list"]]
            if hasattr(obj, "extend"):
                obj.extend(items)
            else:
                for v in items:
                    obj.append(v)
        for k, v in self._pairs(node.get("dictitems", [])):
            obj[k] = v
        return obj


def decode(graph: Any, blobs: Mapping[str, torch.Tensor], env: Mapping[str, Any]) -> Any:
    """Inverse of :func:`encode`: references to ``env`` names become the objects ``env`` gives now.

    Raises:
        CodecError: the graph is malformed, names something outside the allowlist, or refers to a name
            ``env`` lacks.
    """
    try:
        return _Decoder(blobs, env).dec(graph)
    except CodecError:
        raise
    except Exception as err:  # noqa: BLE001 - a malformed graph (KeyError, TypeError, RecursionError, ...)
        raise CodecError(f"malformed checkpoint graph ({type(err).__name__}: {err})") from None
