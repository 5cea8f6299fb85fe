"""Compute and transfer figures of any block range, from the block profiles.

docs/explanation/design.md §3 and §6. The virtual clock charges each request the
FLOPs it makes a device compute and the bits it makes it send; both come
from here, for any block range ``[start, end)`` of the model, so that a
strategy (prefix, server-side suffix, RingSFL segment) never sums profiles
itself.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fl_app.models import BlockProfile

#: Bits of one float32 value and of one int64 label.
FLOAT_BITS = 32.0
LABEL_BITS = 64.0


@dataclass(frozen=True)
class BlockCosts:
    """FLOPs and bits of block ranges of one model.

    Args:
        profiles: per-block profiles (:func:`fl_app.models.profile_blocks`).
        batch_parallel: GAS reference-code accounting (docs/explanation/design.md §6): a batch
            costs one sample's FLOPs, as if processed in parallel.
        up: the uplink codec (:class:`fl_app.cut.compression.Codec`, ``compress-up``); None: float32.
            Uploads are charged its :meth:`~fl_app.cut.compression.Codec.nbytes`, exactly the bytes
            :mod:`fl_app.cut.link` puts in the reply.
        down: the downlink codec (``compress-down``); None: float32.
        param_shapes: per block, ``(shape, itemsize, is_float32)`` of each state-dict tensor: what an
            encoded model upload is charged by (needed only with ``up``).
    """

    profiles: Sequence[BlockProfile]
    batch_parallel: bool = False
    up: Any = None
    down: Any = None
    param_shapes: Sequence[Sequence[tuple[tuple[int, ...], int, bool]]] = ()

    @property
    def num_blocks(self) -> int:
        """Blocks in the model (W in RingSFL)."""
        return len(self.profiles)

    def flops(self, start: int, end: int, batch: int, *, forward: bool = True, backward: bool = False) -> float:
        """FLOPs of blocks ``[start, end)`` on a batch of ``batch`` samples.

        The backward pass of a range that starts at block 0 excludes the input
        gradient, which real training never computes (approximated by the
        first block's forward FLOPs, as the profile counts the input gradient
        of every block).

        Raises:
            ValueError: unless ``0 <= start < end <= num_blocks``.
        """
        self._check(start, end)
        if self.batch_parallel:
            batch = 1
        prof = self.profiles[start:end]
        total = 0.0
        if forward:
            total += sum(b.forward_flops for b in prof)
        if backward:
            total += sum(b.backward_flops for b in prof) - (prof[0].forward_flops if start == 0 else 0.0)
        return total * batch

    def activation_bits(self, end: int, batch: int, *, labels: bool = True, down: bool = False) -> float:
        """Bits of the output of block ``end - 1`` for ``batch`` samples as the uplink codec encodes it
        (``down``: the downlink's; float32 without one), plus int64 labels.

        This is also the size of the gradient w.r.t. that output (without labels).
        """
        self._check(0, end)
        codec = self.down if down else self.up
        if codec is not None:
            shape = (batch, *self.profiles[end - 1].output_shape)
            return 8.0 * codec.nbytes(shape, 1) + (LABEL_BITS * batch if labels else 0.0)
        per_sample = FLOAT_BITS * math.prod(self.profiles[end - 1].output_shape)
        return batch * (per_sample + (LABEL_BITS if labels else 0.0))

    def stack_bits(self, end: int, batch: int, stack: int) -> float:
        """Bits of ``stack`` outputs of block ``end - 1`` sent as one ``[stack, batch, ...]`` tensor (ZO
        perturbations), as the uplink codec encodes it."""
        self._check(0, end)
        if self.up is None:
            return stack * self.activation_bits(end, batch, labels=False)
        return 8.0 * self.up.nbytes((stack, batch, *self.profiles[end - 1].output_shape), 1)

    def param_bits(self, start: int, end: int, *, encoded: bool = True) -> float:
        """Bits of the parameters (and buffers) of blocks ``[start, end)``, as the uplink codec encodes
        each float32 tensor (``encoded=False``, no codec or one that leaves models alone: as they are)."""
        self._check(start, end)
        if self.up is None or not encoded or not self.up.models:
            return 8.0 * sum(b.param_bytes for b in self.profiles[start:end])
        return 8.0 * sum(self.up.nbytes(shape, 0) if is_float else math.prod(shape) * itemsize
                         for block in self.param_shapes[start:end] for shape, itemsize, is_float in block)

    def _check(self, start: int, end: int) -> None:
        if not 0 <= start < end <= self.num_blocks:
            raise ValueError(f"block range [{start}, {end}) out of range ({self.num_blocks} blocks)")
