"""Codecs for what crosses the cut: fp16/bf16 casts, int8 quantisation, top-k sparsification.

Every tensor a split or FL message carries is float32 unless the
run's ``compress-up`` / ``compress-down`` keys name a codec for that link
(:class:`fl_app.cut.link.LinkCodecs` applies them at the seam). A codec turns one
float32 array into a few plain NumPy arrays that travel as Flower
:class:`~flwr.app.Array` entries of the same ArrayRecord, under the tensor's
name and ``name::part`` names:

==============  ===========================================  ==================================================
codec           arrays (for ``n`` values of shape ``S``)      encoded bytes
==============  ===========================================  ==================================================
``fp16``        ``name`` float16 ``S``                       ``2n``
``bf16``        ``name`` uint16 ``S`` (bfloat16 bit pattern)  ``2n``
``int8``        ``name`` int8 ``S``; ``::scale`` float32,     ``n + 5``
                ``::zero`` int8 (one each)
``int8-channel`` as ``int8``, one scale and zero-point per    ``n + 5·C`` (C = ``S[axis]``; a 0-/1-D
                channel, shaped to broadcast against ``S``    tensor is quantised per tensor: ``n + 5``)
``topk``        ``name`` float32 ``[k]``, ``::idx`` int32     ``8k + 4·ndim`` (int64 indices, ``12k + 4·ndim``,
                ``[k]`` (flat, ascending), ``::shape`` int32  when ``n ≥ 2³¹``); ``k = ceil(ratio·n)``;
                ``[ndim]``; model weights stay float32       model weights: ``4n``
==============  ===========================================  ==================================================

The encoded form is self-describing: :func:`decode_arrays` needs no codec
name (float16 is fp16, uint16 is bf16, a ``::scale`` part is int8, an
``::idx`` part is top-k). :meth:`Codec.nbytes` gives the bytes of a shape
without encoding anything, equal to the sum of ``nbytes`` of the encoded
arrays (tests/test_compression.py checks it): the virtual clock charges it.

**int8** is affine (asymmetric) uniform quantisation with a zero-point, as
PyTorch's ``torch.quantize_per_tensor(x, scale, zero_point, torch.qint8)``
and ``torch.quantize_per_channel``: the range ``[lo, hi]`` =
``[min(x, 0), max(x, 0)]`` (0 always exactly representable),
``scale = (hi - lo) / 255``, ``zero = -128 - round(lo / scale)``,
``q = clamp(round(x / scale) + zero, -128, 127)``, decoded ``(q - zero)·scale``;
the error is at most ``scale / 2``. Compared with torch's own quantizers: the
same formula and rounding (half to even), but torch's quantized tensors
cannot be handed to Flower as arrays without ``int_repr()`` and separate
scale/zero-point tensors anyway, and ``quantize_per_channel`` needs the
scales computed by hand too (an observer), and torch 2.13 deprecates its
quantized tensor constructors (a warning on every call), so the codec is a dozen lines of
NumPy, with torch needed only for bf16 (NumPy has no bfloat16). The channel
axis is **dim 1 for batched tensors** (activations and gradients
``N×C×…``; ``P×N×…`` perturbation stacks too) and **dim 0 for weights**
(``out×in×…``, PyTorch's per-channel weight convention).

**top-k** keeps the ``k = ceil(ratio·n)`` entries of largest magnitude, with
error feedback (Stich et al., "Sparsified SGD with memory", NeurIPS 2018;
the design of SecretFlow's ``TopkSparse`` compressor, ``secretflow/utils/
compressor.py``, which sends values, indices and the dense shape): the
sender keeps what it dropped, per stream (a link's tensor name), and adds it
to that stream's next message; a stream whose shape changes (a smaller last
batch) starts with no residual. SecretFlow's compressors were the anchor for
the split (a sender-side ``compress`` returning plain arrays, a receiver-side
``decompress``); its ``QuantizedZeroPoint`` is the same int8 affine scheme,
computed per tensor only.

**Compute cost** of encoding and decoding is not charged to the virtual clock:
measured with ``python -m fl_app.cut.compression`` (this machine: 2 shared CPU
cores, torch 2.13 CPU) on a GAS-sized activation batch (32×64×7×7 float32,
100,352 values: AlexNet's output at cut 2, GAS's default, for 32 MNIST images), encode plus
decode took 0.6 ms (fp16), 1.0 ms (bf16), 1.0 ms (int8), 0.6 ms (int8-channel),
0.6 ms (topk 0.1), against 109 ms for the client's forward+backward of
AlexNet blocks [0, 2) on the same 32 images: at most 1 % of the step, left
out as negligible.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import numpy as np

from fl_app.run.codec_names import CODECS as CODECS  # re-exported: the codec names (compress-up, compress-down)
from fl_app.run.errors import ConfigError

#: Separator of a tensor's name and the name of one of its encoded parts.
SEP = "::"
_QMIN, _QMAX = -128, 127


class Codec:
    """A float32 array to a few NumPy arrays and back (see the module docstring).

    Attributes:
        name: the codec's key value (:data:`CODECS`).
        models: whether model weights are encoded too (top-k: no, see :class:`TopK`).
    """

    name = "none"
    models = True

    def encode(self, name: str, x: np.ndarray, *, axis: int = 1, stream: object = None) -> dict[str, np.ndarray]:
        """``{name: ..., name::part: ...}``: the encoded form of float32 ``x`` (any shape).

        Args:
            name: the tensor's name in its record.
            x: float32 values.
            axis: the channel axis (``int8-channel`` only): 1 for batched tensors, 0 for weights.
            stream: the error-feedback stream (``topk`` only; None: no memory).
        """
        return {name: x}

    def nbytes(self, shape: tuple[int, ...], axis: int = 1) -> int:
        """Bytes of the encoded form of a float32 tensor of ``shape`` (all its arrays, overhead included)."""
        return 4 * math.prod(shape)


class Cast(Codec):
    """``fp16`` (IEEE half) or ``bf16`` (bfloat16, round to nearest even, sent as its uint16 bit pattern)."""

    def __init__(self, name: str) -> None:  # noqa: D107
        self.name = name

    def encode(self, name, x, *, axis=1, stream=None):  # noqa: D102
        if self.name == "fp16":
            return {name: x.astype(np.float16)}
        import torch

        bits = torch.from_numpy(np.ascontiguousarray(x)).to(torch.bfloat16).view(torch.int16).numpy()
        return {name: bits.view(np.uint16)}

    def nbytes(self, shape, axis=1):  # noqa: D102
        return 2 * math.prod(shape)


class Int8(Codec):
    """Affine int8 quantisation with a zero-point, per tensor or (``channel``) per channel of ``axis``."""

    def __init__(self, channel: bool) -> None:  # noqa: D107
        self.channel = channel
        self.name = "int8-channel" if channel else "int8"

    def _axis(self, ndim: int, axis: int) -> int | None:
        return axis if self.channel and ndim >= 2 and axis < ndim else None

    def encode(self, name, x, *, axis=1, stream=None):  # noqa: D102
        ax = self._axis(x.ndim, axis)
        if ax is None:
            lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
            lo_a, hi_a = np.float32(lo), np.float32(hi)
        else:
            other = tuple(d for d in range(x.ndim) if d != ax)
            lo_a = np.minimum(x.min(axis=other, keepdims=True), 0).astype(np.float32)
            hi_a = np.maximum(x.max(axis=other, keepdims=True), 0).astype(np.float32)
        scale = ((hi_a - lo_a) / np.float32(255)).astype(np.float32)
        scale = np.where(scale > 0, scale, np.float32(1)).astype(np.float32)
        zero = (_QMIN - np.rint(lo_a / scale)).clip(_QMIN, _QMAX).astype(np.int8)
        q = (np.rint(x / scale) + zero.astype(np.float32)).clip(_QMIN, _QMAX).astype(np.int8)
        return {name: q, name + SEP + "scale": np.asarray(scale, np.float32).reshape(np.shape(scale)),
                name + SEP + "zero": np.asarray(zero, np.int8).reshape(np.shape(zero))}

    def nbytes(self, shape, axis=1):  # noqa: D102
        ax = self._axis(len(shape), axis)
        channels = 1 if ax is None else shape[ax]
        return math.prod(shape) + 5 * channels


class TopK(Codec):
    """Top-k by magnitude with error feedback; ``k = ceil(ratio·n)`` (at least 1).

    Batched tensors only (activations, gradients, ZO stacks): a link whose
    codec is top-k sends model weights as float32, since the top-k of a model
    (not of an update) would zero most of it (``models`` False).

    Args:
        ratio: the kept fraction, in (0, 1].

    Attributes:
        residuals: ``stream -> float32 array``: what earlier messages of the stream dropped.
    """

    name = "topk"
    models = False

    def __init__(self, ratio: float) -> None:  # noqa: D107
        check_ratio(ratio)
        self.ratio = float(ratio)
        self.residuals: dict[object, np.ndarray] = {}

    def k(self, n: int) -> int:
        """Entries kept of ``n``."""
        return max(1, min(n, math.ceil(self.ratio * n)))

    def encode(self, name, x, *, axis=1, stream=None):  # noqa: D102
        acc = np.array(x, dtype=np.float32, copy=True).reshape(-1)
        if stream is not None:
            old = self.residuals.get(stream)
            if old is not None and old.shape == acc.shape:
                acc += old
        k = self.k(acc.size)
        idx = np.argpartition(np.abs(acc), acc.size - k)[acc.size - k:] if k < acc.size else np.arange(acc.size)
        idx = np.sort(idx).astype(np.int32 if acc.size < 2**31 else np.int64)
        values = acc[idx]
        if stream is not None:
            acc[idx] = 0.0
            self.residuals[stream] = acc
        return {name: values, name + SEP + "idx": idx,
                name + SEP + "shape": np.asarray(x.shape, dtype=np.int32)}

    def nbytes(self, shape, axis=1):  # noqa: D102
        n = math.prod(shape)
        return self.k(n) * (4 + (4 if n < 2**31 else 8)) + 4 * len(shape)


def check_ratio(ratio: float) -> None:
    """Raise :class:`ConfigError` (one line) unless ``0 < ratio <= 1``."""
    if not (isinstance(ratio, (int, float)) and 0 < ratio <= 1):
        raise ConfigError(f"topk-ratio must be in (0, 1], got {ratio!r}")


def make_codec(name: str, ratio: float = 0.1) -> Codec:
    """The codec called ``name`` (:data:`CODECS`); ``ratio``: top-k's kept fraction.

    Raises:
        ConfigError: an unknown codec, or a top-k ratio outside (0, 1] (one line).
    """
    if name == "none":
        return Codec()
    if name in ("fp16", "bf16"):
        return Cast(name)
    if name in ("int8", "int8-channel"):
        return Int8(name == "int8-channel")
    if name == "topk":
        return TopK(ratio)
    raise ConfigError(f"unknown codec {name!r}; one of {', '.join(CODECS)}")


def decode_arrays(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The float32 tensors of an encoded mapping (parts folded back into their tensor; arrays that no codec
    made, such as int64 labels or float32 tensors sent as they are, unchanged)."""
    out: dict[str, np.ndarray] = {}
    for name, a in arrays.items():
        if SEP in name:
            continue
        scale, idx = arrays.get(name + SEP + "scale"), arrays.get(name + SEP + "idx")
        if scale is not None:
            zero = arrays[name + SEP + "zero"].astype(np.float32)
            out[name] = ((a.astype(np.float32) - zero) * scale).astype(np.float32)
        elif idx is not None:
            shape = tuple(int(s) for s in arrays[name + SEP + "shape"])
            dense = np.zeros(math.prod(shape), dtype=np.float32)
            dense[idx] = a
            out[name] = dense.reshape(shape)
        elif a.dtype == np.float16:
            out[name] = a.astype(np.float32)
        elif a.dtype == np.uint16:
            out[name] = (a.astype(np.uint32) << 16).view(np.float32)
        else:
            out[name] = a
    return out


def is_encoded(names: object) -> bool:
    """Whether a record's names include an encoded part (``name::part``)."""
    return any(SEP in n for n in names)  # type: ignore[attr-defined]


def _measure(repeats: int = 20) -> dict[str, float]:
    """Milliseconds of encode+decode per codec of a 32×64×7×7 float32 batch, and of AlexNet blocks [0, 2)'s
    forward+backward on 32 MNIST images (the client's step at GAS's default cut), on this machine."""
    import time

    import torch

    from fl_app.models import build_model

    rng = np.random.default_rng(0)
    x = rng.standard_normal((32, 64, 7, 7)).astype(np.float32)
    out: dict[str, float] = {}
    for name in CODECS[1:]:
        codec = make_codec(name, 0.1)
        t0 = time.perf_counter()
        for _ in range(repeats):
            decode_arrays(codec.encode("x", x, stream="s"))
        out[name] = 1e3 * (time.perf_counter() - t0) / repeats
    model = build_model("alexnet", (1, 28, 28), 10)
    from fl_app.models.blocks import split_model

    client, _ = split_model(model, 2)
    images = torch.randn(32, 1, 28, 28)
    if True:
        t0 = time.perf_counter()
        for _ in range(repeats):
            client(images).sum().backward()
        out["client-step"] = 1e3 * (time.perf_counter() - t0) / repeats
    return out


if __name__ == "__main__":
    print(_measure())
