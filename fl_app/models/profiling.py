"""Profiling: FLOPs, parameter bytes and output shape per block and per sample (:func:`profile_blocks`).

Forward and backward FLOPs are counted by
:class:`torch.utils.flop_counter.FlopCounterMode` (a multiply-accumulate is
2 FLOPs; bias adds, activations and pooling count 0). The virtual clock and
the cut-layer tables use these figures; :func:`segment_profile` sums them over
a range of blocks.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fl_app.run.errors import ConfigError
from fl_app.models.blocks import BlockModel


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
