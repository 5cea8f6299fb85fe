"""A typed object-graph codec that executes nothing on load: JSON for the graph, safetensors for tensor bytes.

:func:`encode` walks the graph :mod:`pickle` would walk (the same
``__reduce_ex__(4)`` protocol, the same identity memo, so an optimizer's
state keeps referring to the model's Parameters and views keep sharing
their storage) and returns ``(graph, blobs)``: ``graph`` is plain JSON,
``blobs`` maps keys to uint8 tensors (tensor storages and NumPy buffers)
for one safetensors file. :func:`strategies.core.state_decoder.decode` rebuilds the graph.

JSON values: ``None``, booleans, integers, strings and finite floats stand
for themselves; anything else is an object with a type tag ``"t"``. Objects
of classes are rebuilt as pickle's default protocol does (``cls.__new__``,
then ``__setstate__`` or ``__dict__``), but only for classes of an
allowlist of modules (:data:`ALLOWED_MODULES`): a class outside it raises
:class:`CodecError` when writing (so a strategy attribute of a new type is
caught by the resume tests) and is refused when reading. No callable named
by the file is ever called but ``__new__`` and ``__setstate__`` of the
allowlisted classes, the few functions of :data:`RECONSTRUCTORS` and fixed
constructors (``torch.Generator``, NumPy's bit generators); functions may be
held as values only when listed in :data:`FUNCTIONS`. What remains trusted
is the code of the allowlisted classes: the file chooses their attribute
values (as any data file chooses the values it holds).

Objects of the run's environment (``env``: name -> object) are written as
references by name and resolve to the objects ``env`` gives when decoding.
"""

from __future__ import annotations

import builtins
import collections
import copyreg
import enum
import importlib
import math
import random
import types
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

__all__ = ["ALLOWED_MODULES", "RECONSTRUCTORS", "FUNCTIONS", "CodecError", "encode"]


class CodecError(ValueError):
    """An object cannot be written, or a graph refers to something it may not (one line)."""


#: Modules (and their submodules) whose classes and functions a graph may name.
ALLOWED_MODULES = ("fl_app", "strategies", "simulation", "torch.nn", "torch.optim", "flwr.common", "flwr.app",
                   "collections")
#: Functions (``module:qualname``) other than a class's ``__new__`` that an allowed class's ``__reduce__`` may
#: return and that reading therefore calls, with the graph's arguments: each builds a value and nothing else.
RECONSTRUCTORS = frozenset({
    "fl_app.protocol.codec:_plain_array",  # DeferredArray pickles as the plain flwr Array of its bytes
})
#: Functions (``module:qualname``) a graph may hold as values (an attribute or a hook holding a function):
#: classes of the allowed modules may be named, functions only when listed here, since they may be called
#: later with the run's data.
FUNCTIONS: frozenset[str] = frozenset(
    # Flower's record dicts hold their key and value checks (flwr.app.message.typeddict.TypedDict)
    f"flwr.app.message.{module}:{check}" for module in ("arrayrecord", "configrecord", "metricrecord", "recorddict")
    for check in ("_check_key", "_check_value"))
#: Builtins a graph may name (as values, e.g. a defaultdict's factory).
_BUILTINS = {n: getattr(builtins, n) for n in ("dict", "list", "set", "frozenset", "tuple", "int", "float", "str",
                                                 "bytes", "bool", "object")}


def _allowed_module(module: str) -> bool:
    return any(module == m or module.startswith(m + ".") for m in ALLOWED_MODULES)


def _name_of(obj: Any) -> str:
    module = getattr(obj, "__module__", None) or ""
    qual = getattr(obj, "__qualname__", None) or getattr(obj, "__name__", "")
    return f"{module}:{qual}"


def allowed_global(name: str) -> Any:
    """The class or function ``module:qualname`` of an allowed module (importing it).

    Raises:
        CodecError: a name outside :data:`ALLOWED_MODULES`, a dunder part, something that is not a class
            or function defined under that name, or a function not in :data:`RECONSTRUCTORS` or :data:`FUNCTIONS`.
    """
    module, _, qual = name.partition(":")
    if module == "builtins":
        if qual not in _BUILTINS:
            raise CodecError(f"checkpoint names builtins.{qual}, which is not allowed")
        return _BUILTINS[qual]
    if not _allowed_module(module) or "<" in qual or not qual:
        raise CodecError(f"checkpoint names {module}.{qual}, outside the allowed modules")
    obj: Any = importlib.import_module(module)
    for part in qual.split("."):
        if part.startswith("__"):
            raise CodecError(f"checkpoint names {module}.{qual}, which is not allowed")
        obj = getattr(obj, part)
    if not isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)) or _name_of(obj) != name:
        raise CodecError(f"checkpoint names {module}.{qual}, which is not a class or function defined there")
    if not isinstance(obj, type) and name not in RECONSTRUCTORS | FUNCTIONS:
        raise CodecError(f"checkpoint names the function {module}.{qual}, which is not in the codec's FUNCTIONS")
    return obj


def allowed_class(name: str) -> type:
    """The class ``module:qualname`` (:func:`allowed_global`).

    Raises:
        CodecError: as :func:`allowed_global`, or the name is a function.
    """
    cls = allowed_global(name)
    if not isinstance(cls, type):
        raise CodecError(f"checkpoint names {name} as a class")
    return cls


class _Encoder:
    def __init__(self, env: Mapping[str, Any]) -> None:
        self.env = {id(v): k for k, v in env.items()}
        self.memo: dict[int, int] = {}
        self.keep: list[Any] = []  # keeps temporaries alive, so their ids stay unique
        self.blobs: dict[str, torch.Tensor] = {}
        self.storages: dict[tuple[str, int, int], str] = {}

    def _blob(self, tensor: torch.Tensor) -> str:
        key = str(len(self.blobs))
        self.blobs[key] = tensor
        return key

    def _new(self, obj: Any, node: dict[str, Any]) -> dict[str, Any]:
        node["id"] = self.memo[id(obj)] = len(self.memo)
        self.keep.append(obj)
        return node

    def enc(self, obj: Any) -> Any:
        if obj is None or type(obj) in (bool, str, int):  # not their subclasses (an enum.StrEnum member)
            return obj
        if type(obj) is float:
            return obj if math.isfinite(obj) else {"t": "float", "v": repr(obj)}
        name = self.env.get(id(obj))
        if name is not None:
            return {"t": "env", "name": name}
        ref = self.memo.get(id(obj))
        if ref is not None:
            return {"t": "ref", "id": ref}
        return self._compound(obj)

    def _items(self, pairs: Any) -> list[list[Any]]:
        return [[self.enc(k), self.enc(v)] for k, v in pairs]

    def _compound(self, obj: Any) -> Any:  # noqa: C901 - one branch per type
        t = type(obj)
        if t is list:
            node = self._new(obj, {"t": "list"})
            node["items"] = [self.enc(v) for v in obj]
            return node
        if t is dict:
            node = self._new(obj, {"t": "dict"})
            node["items"] = self._items(obj.items())
            return node
        if t is tuple:
            items = [self.enc(v) for v in obj]
            if id(obj) in self.memo:  # reached through its own items
                raise CodecError("cannot write a recursive tuple")
            node = self._new(obj, {"t": "tuple"})
            node["items"] = items
            return node
        if t in (set, frozenset):
            items = [self.enc(v) for v in obj]
            node = self._new(obj, {"t": t.__name__})
            node["items"] = items
            return node
        if t is bytes or t is bytearray:
            blob = torch.frombuffer(bytearray(obj), dtype=torch.uint8) if obj else torch.empty(0, dtype=torch.uint8)
            return self._new(obj, {"t": t.__name__, "blob": self._blob(blob.clone())})
        if t is complex:
            return {"t": "complex", "re": self.enc(obj.real), "im": self.enc(obj.imag)}
        if t is collections.OrderedDict:
            node = self._new(obj, {"t": "odict"})
            node["items"] = self._items(obj.items())
            return node
        if t is collections.defaultdict:
            node = self._new(obj, {"t": "ddict"})
            node["factory"] = self.enc(obj.default_factory)
            node["items"] = self._items(obj.items())
            return node
        if t is collections.deque:
            node = self._new(obj, {"t": "deque", "maxlen": obj.maxlen})
            node["items"] = [self.enc(v) for v in obj]
            return node
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj)
        if t is torch.dtype:
            return {"t": "dtype", "v": str(obj).removeprefix("torch.")}
        if t is torch.device:
            return {"t": "device", "v": str(obj)}
        if t is torch.Size:
            return {"t": "size", "v": list(obj)}
        if t is torch.Generator:
            return self._new(obj, {"t": "torch_gen", "device": str(obj.device), "state": self.enc(obj.get_state())})
        if t is np.ndarray:
            return self._ndarray(obj)
        if isinstance(obj, np.generic):
            return {"t": "np_scalar", "dtype": obj.dtype.str, "v": self.enc(np.array(obj).tobytes())}
        if t is np.dtype or isinstance(obj, np.dtype):
            return {"t": "np_dtype", "v": obj.str}
        if t is np.random.Generator:
            bg = obj.bit_generator
            return self._new(obj, {"t": "np_gen", "bitgen": type(bg).__name__, "state": self.enc(bg.state)})
        if isinstance(obj, np.random.BitGenerator):
            return self._new(obj, {"t": "np_bitgen", "bitgen": type(obj).__name__, "state": self.enc(obj.state)})
        if t is np.random.RandomState:
            return self._new(obj, {"t": "np_rs", "state": self.enc(obj.get_state(legacy=False))})
        if t is random.Random:
            return self._new(obj, {"t": "random", "state": self.enc(obj.getstate())})
        if t is types.MethodType:
            return {"t": "method", "self": self.enc(obj.__self__), "name": obj.__func__.__name__}
        if isinstance(obj, (type, types.FunctionType, types.BuiltinFunctionType)):
            name = _name_of(obj)
            allowed_global(name)  # refuse now what reading would refuse
            return {"t": "global", "name": name}
        if isinstance(obj, enum.Enum):
            allowed_class(_name_of(t))
            return {"t": "enum", "cls": _name_of(t), "name": obj.name}
        return self._object(obj)

    def _tensor(self, obj: torch.Tensor) -> dict[str, Any]:
        if type(obj) not in (torch.Tensor, torch.nn.Parameter):
            raise CodecError(f"cannot write a tensor of type {type(obj).__name__}")
        if obj.layout != torch.strided or obj.is_quantized or obj.device.type == "meta":
            raise CodecError(f"cannot write a {obj.layout} / quantized / meta tensor")
        if obj.requires_grad and not obj.is_leaf:
            raise CodecError("cannot write a non-leaf tensor that requires grad")
        node = self._new(obj, {"t": "param" if type(obj) is torch.nn.Parameter else "tensor"})
        storage = obj.untyped_storage()
        skey = (obj.device.type, obj.device.index or 0, storage.data_ptr(), storage.nbytes())
        key = self.storages.get(skey)
        if key is None:
            raw = torch.empty(0, dtype=torch.uint8, device=obj.device).set_(storage)
            key = self.storages[skey] = self._blob(raw.detach().cpu().clone())
        node.update({"storage": key, "device": str(obj.device), "dtype": str(obj.dtype).removeprefix("torch."),
                     "offset": obj.storage_offset(), "size": list(obj.size()), "stride": list(obj.stride()),
                     "requires_grad": obj.requires_grad})
        extra = getattr(obj, "__dict__", None)
        if extra:
            node["dict"] = self.enc(dict(extra))
        return node

    def _ndarray(self, obj: np.ndarray) -> dict[str, Any]:
        if obj.dtype.hasobject:
            raise CodecError("cannot write a NumPy array of Python objects")
        data = np.ascontiguousarray(obj)
        blob = torch.frombuffer(bytearray(data.tobytes()), dtype=torch.uint8) if data.nbytes else \
            torch.empty(0, dtype=torch.uint8)
        return self._new(obj, {"t": "ndarray", "dtype": obj.dtype.str, "shape": list(obj.shape),
                               "blob": self._blob(blob)})

    def _object(self, obj: Any) -> dict[str, Any]:
        t = type(obj)
        module = getattr(t, "__module__", "") or ""
        if not _allowed_module(module):
            raise CodecError(f"cannot write an object of type {module}.{t.__qualname__} (outside the allowed "
                             f"modules of strategies.core.state_codec)")
        try:
            rv = obj.__reduce_ex__(4)
        except Exception as err:  # noqa: BLE001
            raise CodecError(f"cannot write {module}.{t.__qualname__}: {err}") from None
        if isinstance(rv, str):
            return {"t": "global", "name": f"{module}:{rv}"}
        rv = tuple(rv) + (None,) * (6 - len(rv))
        func, args, state, listitems, dictitems, setter = rv
        kwargs: dict[str, Any] = {}
        if _name_of(func) in RECONSTRUCTORS:
            node = self._new(obj, {"t": "call", "func": _name_of(func)})
            node["args"] = [self.enc(a) for a in args]
            for key, value in (("state", state), ("list", listitems), ("dictitems", dictitems)):
                if value is not None:
                    raise CodecError(f"cannot write {module}.{t.__qualname__}: its reduction has {key}")
            return node
        if func is copyreg.__newobj__:
            cls, args = args[0], tuple(args[1:])
        elif func is copyreg.__newobj_ex__:
            cls, args, kwargs = args
        else:
            raise CodecError(f"cannot write {module}.{t.__qualname__}: it reduces to {_name_of(func)}, "
                             "not to its class")
        if setter is not None or not isinstance(cls, type):
            raise CodecError(f"cannot write {module}.{t.__qualname__}: custom state setter")
        name = _name_of(cls)
        allowed_class(name)
        node = self._new(obj, {"t": "obj", "cls": name})
        if args:
            node["args"] = [self.enc(a) for a in args]
        if kwargs:
            node["kwargs"] = self._items(kwargs.items())
        if state is not None:
            node["state"] = self.enc(state)
        if listitems is not None:
            node["list"] = [self.enc(v) for v in listitems]
        if dictitems is not None:
            node["dictitems"] = self._items(dictitems)
        return node


def encode(obj: Any, env: Mapping[str, Any]) -> tuple[Any, dict[str, torch.Tensor]]:
    """``obj`` as ``(JSON-able graph, {key: uint8 CPU tensor})``, with ``env``'s objects as references.

    Raises:
        CodecError: something in ``obj`` is of a type that cannot be written (outside the allowlist).
    """
    enc = _Encoder(env)
    graph = enc.enc(obj)
    return graph, enc.blobs
