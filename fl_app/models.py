"""Splittable models: ordered lists of named blocks (DESIGN.md §3).

A model is a :class:`BlockModel`: an ordered list of named ``nn.Module``
blocks. Split learning cuts it between two blocks (:func:`split_model`);
RingSFL runs arbitrary contiguous segments of it (:meth:`BlockModel.segment`).
Segments share the module objects with the whole model, and parameter names
(``blocks.<block>.<param>``) are the same in the whole and in any segment, so a
client part's ``state_dict`` and a server part's ``state_dict`` together are
exactly the whole model's ``state_dict``.

:func:`profile_blocks` reports, per block and per sample, the forward and
backward FLOPs (as counted by :class:`torch.utils.flop_counter.FlopCounterMode`:
a multiply-accumulate is 2 FLOPs; bias adds, activations and pooling count 0),
the parameter bytes and the output activation shape. The virtual clock and the
cut-layer tables use these figures.

Models:

* ``alexnet`` -- the AlexNet variant of the GAS reference code (GAS:
  "Generative Activation-Aided Asynchronous Split Federated Learning"),
  8 blocks ``conv1..conv5, fc1, fc2, fc3``; default cut 2 gives a 64x7x7
  activation on 1x28x28 input and 64x8x8 on 3x32x32.
* ``lenet5`` -- LeNet-5 (LeCun et al., "Gradient-based learning applied to
  document recognition", 1998) with ReLU and max pooling, in the 12 blocks
  RingSFL (Shen et al., "Ring-based Split Federated Learning") divides it into.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fl_app.errors import ConfigError

__all__ = [
    "MODELS",
    "BlockModel",
    "BlockProfile",
    "build_model",
    "split_model",
    "profile_blocks",
    "segment_profile",
]

MODELS: tuple[str, ...] = ("alexnet", "lenet5")
"""Names accepted by :func:`build_model`."""


class BlockModel(nn.Module):
    """An ordered list of named blocks.

    Parameters live in ``self.blocks``: an ``nn.ModuleDict`` keyed by block
    name, so that ``state_dict`` keys (``"blocks.<name>.<...>"``) are the same
    in the whole model and in any segment of it.

    Args:
        blocks: ``(name, module)`` pairs in execution order. Names must be
            unique, non-empty and contain no ``"."``.
        name: model name used in error messages (e.g. ``"alexnet"``).

    Raises:
        ValueError: no blocks, or a duplicate / invalid block name
            (a programming error, not user input).
    """

    def __init__(self, blocks: Sequence[tuple[str, nn.Module]], name: str = "model") -> None:
        super().__init__()
        blocks = list(blocks)
        if not blocks:
            raise ValueError("BlockModel needs at least one block")
        seen: set[str] = set()
        for block_name, module in blocks:
            if not block_name or "." in block_name:
                raise ValueError(f"invalid block name {block_name!r}")
            if block_name in seen:
                raise ValueError(f"duplicate block name {block_name!r}")
            if not isinstance(module, nn.Module):
                raise ValueError(f"block {block_name!r} is not an nn.Module")
            seen.add(block_name)
        self.model_name = name
        self.blocks = nn.ModuleDict(blocks)

    @property
    def names(self) -> list[str]:
        """Block names, in execution order."""
        return list(self.blocks.keys())

    def __len__(self) -> int:
        """Number of blocks."""
        return len(self.blocks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Run all blocks in order.

        Args:
            x: input batch, ``(N, *input shape of the first block)``; for a
                whole model an image batch ``(N, C, H, W)``.

        Returns:
            Output of the last block, ``(N, *output shape)``; for a whole
            model the logits ``(N, num_classes)``.
        """
        for block in self.blocks.values():
            x = block(x)
        return x

    def segment(self, start: int, end: int) -> "BlockModel":
        """Blocks ``[start, end)`` as a new :class:`BlockModel`.

        The segment SHARES the module objects with this model (no copy):
        training a segment trains the whole model, and its ``state_dict`` keys
        are the whole model's keys for those blocks.

        Raises:
            ConfigError: unless ``0 <= start < end <= len(self)``.
        """
        n = len(self)
        if not (isinstance(start, int) and isinstance(end, int) and 0 <= start < end <= n):
            raise ConfigError(
                f"segment [{start}, {end}) out of range for {self.model_name} "
                f"({n} blocks): need 0 <= start < end <= {n}"
            )
        items = list(self.blocks.items())[start:end]
        return BlockModel(items, name=f"{self.model_name}[{start}:{end}]")


# ---------------------------------------------------------------------------
# Model definitions
# ---------------------------------------------------------------------------


def _check_input_shape(input_shape: tuple[int, int, int]) -> tuple[int, int, int]:
    try:
        shape = tuple(int(v) for v in input_shape)
    except (TypeError, ValueError):
        raise ConfigError(f"input shape must be (channels, height, width), got {input_shape!r}") from None
    if len(shape) != 3 or min(shape) < 1:
        raise ConfigError(f"input shape must be 3 positive ints (channels, height, width), got {input_shape!r}")
    return shape  # type: ignore[return-value]


def _out_shape(modules: Sequence[nn.Module], input_shape: tuple[int, ...], model: str) -> tuple[int, ...]:
    """Per-sample output shape of ``modules`` applied in order (dry run, no RNG use)."""
    x = torch.zeros(1, *input_shape)
    try:
        with torch.no_grad():
            for m in modules:
                x = m(x)
    except RuntimeError:
        raise ConfigError(
            f"input shape {tuple(input_shape)} is too small for {model}"
        ) from None
    return tuple(x.shape[1:])


def _alexnet(input_shape: tuple[int, int, int], num_classes: int) -> list[tuple[str, nn.Module]]:
    """AlexNet, GAS variant: 5 conv blocks + 3 fc blocks (8 blocks)."""
    c = input_shape[0]
    convs: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Sequential(nn.Conv2d(c, 32, 3, 1, 1), nn.MaxPool2d(2), nn.ReLU())),
        ("conv2", nn.Sequential(nn.Conv2d(32, 64, 3, 1, 1), nn.MaxPool2d(2), nn.ReLU())),
        ("conv3", nn.Sequential(nn.Conv2d(64, 128, 3, 1, 1), nn.ReLU())),
        ("conv4", nn.Sequential(nn.Conv2d(128, 256, 3, 1, 1), nn.ReLU())),
        ("conv5", nn.Sequential(nn.Conv2d(256, 256, 3, 1, 1), nn.MaxPool2d(3, 2), nn.ReLU())),
    ]
    feat = _out_shape([m for _, m in convs], input_shape, "alexnet")
    flat = feat[0] * feat[1] * feat[2]
    fcs: list[tuple[str, nn.Module]] = [
        ("fc1", nn.Sequential(nn.Flatten(), nn.Linear(flat, 1024), nn.ReLU())),
        ("fc2", nn.Sequential(nn.Linear(1024, 512), nn.ReLU())),
        ("fc3", nn.Linear(512, num_classes)),
    ]
    return convs + fcs


def _lenet5(input_shape: tuple[int, int, int], num_classes: int) -> list[tuple[str, nn.Module]]:
    """LeNet-5 with ReLU and max pooling, in 12 blocks.

    Inputs smaller than 32x32 (e.g. 28x28 MNIST) get ``padding=2`` in conv1,
    the usual MNIST form, so 28x28 gives the classic 16x5x5 feature map;
    32x32 inputs use no padding (the original LeNet-5, also 16x5x5).
    """
    c, h, w = input_shape
    pad = 2 if min(h, w) < 32 else 0
    front: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Conv2d(c, 6, 5, 1, pad)),
        ("relu1", nn.ReLU()),
        ("pool1", nn.MaxPool2d(2)),
        ("conv2", nn.Conv2d(6, 16, 5)),
        ("relu2", nn.ReLU()),
        ("pool2", nn.MaxPool2d(2)),
        ("flatten", nn.Flatten()),
    ]
    (flat,) = _out_shape([m for _, m in front], input_shape, "lenet5")
    back: list[tuple[str, nn.Module]] = [
        ("fc1", nn.Linear(flat, 120)),
        ("relu3", nn.ReLU()),
        ("fc2", nn.Linear(120, 84)),
        ("relu4", nn.ReLU()),
        ("fc3", nn.Linear(84, num_classes)),
    ]
    return front + back


_BUILDERS: dict[str, Callable[[tuple[int, int, int], int], list[tuple[str, nn.Module]]]] = {
    "alexnet": _alexnet,
    "lenet5": _lenet5,
}


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int, seed: int = 0) -> BlockModel:
    """Build model ``name`` for per-sample inputs of shape ``(C, H, W)``.

    Initialisation is deterministic: the same ``seed`` gives identical
    weights. Conv and linear weights are He-normal (fan-in, ReLU gain), biases
    zero. The global torch RNG is left untouched (weights are drawn inside
    ``torch.random.fork_rng()`` after ``torch.manual_seed(seed)``).

    Args:
        name: one of :data:`MODELS`.
        input_shape: ``(channels, height, width)`` of one sample, e.g.
            ``(1, 28, 28)`` or ``(3, 32, 32)``.
        num_classes: number of logits of the last block (>= 1).
        seed: initialisation seed.

    Returns:
        A :class:`BlockModel` mapping ``(N, C, H, W)`` to logits
        ``(N, num_classes)``, in training mode.

    Raises:
        ConfigError: unknown ``name``, a bad ``input_shape`` (including one
            too small for the model), or ``num_classes < 1``.
    """
    if name not in _BUILDERS:
        raise ConfigError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}")
    shape = _check_input_shape(input_shape)
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive int, got {num_classes!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        blocks = _BUILDERS[name](shape, num_classes)
        for _, block in blocks:
            _he_init(block)
    return BlockModel(blocks, name=name)


def _he_init(module: nn.Module) -> None:
    """He (Kaiming) normal init, fan-in, for ReLU nets; zero biases.

    PyTorch's default (uniform, a = sqrt(5)) shrinks the signal through the
    eight plain-ReLU layers of AlexNet so much that SGD at lr 0.01 sits on the
    loss plateau of 2.30 for hundreds of steps; He init starts learning at once.
    """
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def split_model(model: BlockModel, cut: int) -> tuple[BlockModel, BlockModel]:
    """Split ``model`` at ``cut``.

    Returns:
        ``(client, server)``: the client-side model is blocks ``[0, cut)``,
        the server-side model blocks ``[cut, len(model))``. Both share the
        module objects with ``model``; ``server(client(x))`` equals
        ``model(x)``.

    Raises:
        ConfigError: unless ``1 <= cut <= len(model) - 1``, e.g.
            ``"cut-layer 9 out of range for alexnet (8 blocks): choose 1..7"``.
    """
    n = len(model)
    if isinstance(cut, bool) or not isinstance(cut, int) or not 1 <= cut <= n - 1:
        raise ConfigError(
            f"cut-layer {cut} out of range for {model.model_name} ({n} blocks): choose 1..{n - 1}"
        )
    return model.segment(0, cut), model.segment(cut, n)


# ---------------------------------------------------------------------------
# Profiling
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BlockProfile:
    """Cost figures of one block (or a segment of blocks), per sample.

    Attributes:
        name: block name (``"first..last"`` for a segment of several blocks).
        forward_flops: FLOPs per sample of the forward pass
            (FlopCounterMode convention: multiply-accumulate = 2 FLOPs; bias,
            activation and pooling not counted).
        backward_flops: FLOPs per sample of the backward pass, gradients with
            respect to the block input AND its parameters (about 2x forward
            for conv / linear blocks).
        param_bytes: bytes of the block's parameters plus buffers
            (``numel * element_size``; 4 bytes per float32 value).
        output_shape: per-sample output activation shape, e.g. ``(64, 7, 7)``.
    """

    name: str
    forward_flops: float
    backward_flops: float
    param_bytes: int
    output_shape: tuple[int, ...]


_PROFILE_BATCH = 2
_profile_cache: dict[tuple[str, tuple[int, ...]], tuple[BlockProfile, ...]] = {}


def _profile_block(name: str, block: nn.Module, x: torch.Tensor) -> tuple[BlockProfile, torch.Tensor]:
    """Profile ``block`` on batch ``x``; returns the profile and the (detached) output."""
    param_bytes = sum(t.numel() * t.element_size() for t in block.parameters())
    param_bytes += sum(t.numel() * t.element_size() for t in block.buffers())
    # Work on a copy so that profiling never touches the real block
    # (no .grad accumulation, no running-stat updates in norm layers).
    work = copy.deepcopy(block)
    x_in = x.detach().clone().requires_grad_(True)
    with FlopCounterMode(display=False) as fwd:
        out = work(x_in)
    params = [p for p in work.parameters() if p.requires_grad]
    inputs = [x_in] + params
    bwd_flops = 0
    if out.requires_grad:
        with FlopCounterMode(display=False) as bwd:
            torch.autograd.grad(out, inputs, grad_outputs=torch.ones_like(out), allow_unused=True)
        bwd_flops = bwd.get_total_flops()
    n = x.shape[0]
    profile = BlockProfile(
        name=name,
        forward_flops=fwd.get_total_flops() / n,
        backward_flops=bwd_flops / n,
        param_bytes=int(param_bytes),
        output_shape=tuple(int(d) for d in out.shape[1:]),
    )
    return profile, out.detach()


def profile_blocks(model: BlockModel, input_shape: tuple[int, ...]) -> list[BlockProfile]:
    """Per-block cost figures of ``model`` on per-sample inputs of ``input_shape``.

    FLOPs are measured with :class:`torch.utils.flop_counter.FlopCounterMode`
    on a batch of 2 random inputs, divided by the batch size. Backward FLOPs
    are measured with the block's input requiring grad, so they include the
    gradient with respect to the input (also for the first block). The real
    model is not modified (each block is profiled on a deep copy). Results are
    cached per (model architecture, input shape).

    Args:
        model: a whole model or a segment of one.
        input_shape: per-sample input shape of ``model``'s first block, e.g.
            ``(1, 28, 28)`` (for a segment: the previous block's output shape).

    Returns:
        One :class:`BlockProfile` per block, in block order.

    Raises:
        ConfigError: ``input_shape`` does not fit the model.
    """
    try:
        shape = tuple(int(v) for v in input_shape)
    except (TypeError, ValueError):
        raise ConfigError(f"input shape must be a tuple of ints, got {input_shape!r}") from None
    key = (repr(model.blocks), shape)
    cached = _profile_cache.get(key)
    if cached is not None:
        return list(cached)
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(_PROFILE_BATCH, *shape, generator=gen)
    profiles: list[BlockProfile] = []
    for name, block in model.blocks.items():
        try:
            prof, x = _profile_block(name, block, x)
        except RuntimeError:
            raise ConfigError(
                f"input shape {shape} does not fit {model.model_name} (failed at block {name})"
            ) from None
        profiles.append(prof)
    _profile_cache[key] = tuple(profiles)
    return profiles


def segment_profile(profiles: list[BlockProfile], start: int, end: int) -> BlockProfile:
    """Cost figures of blocks ``[start, end)`` as one :class:`BlockProfile`.

    FLOPs and ``param_bytes`` are summed over the blocks; ``output_shape`` is
    the last block's. The name is the block name for one block, else
    ``"first..last"``.

    Raises:
        ConfigError: unless ``0 <= start < end <= len(profiles)``.
    """
    n = len(profiles)
    if not 0 <= start < end <= n:
        raise ConfigError(f"segment [{start}, {end}) out of range ({n} blocks): need 0 <= start < end <= {n}")
    part = profiles[start:end]
    name = part[0].name if len(part) == 1 else f"{part[0].name}..{part[-1].name}"
    return BlockProfile(
        name=name,
        forward_flops=float(sum(p.forward_flops for p in part)),
        backward_flops=float(sum(p.backward_flops for p in part)),
        param_bytes=int(sum(p.param_bytes for p in part)),
        output_shape=part[-1].output_shape,
    )
