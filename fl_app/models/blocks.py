"""Blocks: the :class:`BlockModel` every architecture is built as, and what runs on it.

A model is an ordered list of named ``nn.Module`` blocks. Split learning cuts
it between two blocks (:func:`split_model`); RingSFL runs arbitrary
contiguous segments of it (:meth:`BlockModel.segment`). Segments share the
module objects with the whole model, and parameter names
(``blocks.<block>.<param>``) are the same in the whole and in any segment, so
a client part's ``state_dict`` and a server part's ``state_dict`` together are
exactly the whole model's ``state_dict``.

Also here: :func:`fixed_rng`, the seeded torch RNG under which a training
forward pass draws its dropout masks (so that the split runtime's
recomputation in ``train.backward`` sees the same masks), and two helpers the
architectures share: :func:`out_shape` (a dry run for a layer's input size)
and :func:`linear_blocks` (a classifier of one layer per block).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator, Sequence

import torch
from torch import nn

from fl_app.run.errors import ConfigError


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


#: Module types whose forward pass draws nothing from the torch RNG (exact types: a subclass may).
NON_RANDOM_MODULES: frozenset[type] = frozenset({
    BlockModel, nn.ModuleDict, nn.ModuleList, nn.Sequential, nn.Identity, nn.Flatten,
    nn.Conv1d, nn.Conv2d, nn.Conv3d, nn.Linear,
    nn.ReLU, nn.GELU, nn.Tanh, nn.Sigmoid, nn.LeakyReLU,
    nn.MaxPool1d, nn.MaxPool2d, nn.AvgPool1d, nn.AvgPool2d, nn.AdaptiveAvgPool1d, nn.AdaptiveAvgPool2d,
    nn.AdaptiveMaxPool2d, nn.BatchNorm1d, nn.BatchNorm2d, nn.LayerNorm,
})
_DRAWS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def draws_random(model: nn.Module) -> bool:
    """Whether a forward pass of ``model`` may draw from the torch RNG (dropout masks).

    False only when every module is of a type in :data:`NON_RANDOM_MODULES`;
    any other module (dropout, or one this list does not know) counts as
    drawing. Such a model needs no seed and no :func:`fixed_rng`: its
    outputs are the same without them. Cached per model object.
    """
    draws = _DRAWS.get(model)
    if draws is None:
        draws = _DRAWS[model] = any(type(m) not in NON_RANDOM_MODULES for m in model.modules())
    return draws


@contextlib.contextmanager
def fixed_rng(seed: int | None, device: torch.device | None = None) -> Iterator[None]:
    """Run the body with the global CPU torch RNG seeded to ``seed``, then restore it.

    Dropout draws its masks from the global RNG, so two forward passes of
    the same model on the same input inside ``fixed_rng(s)`` with the same
    ``s`` give bit-identical outputs (the split runtime recomputes a
    client's forward pass this way). The RNG state outside is unchanged.
    ``seed=None`` does nothing (the body uses the RNG as it is). With a
    CUDA ``device`` (where the model runs), that GPU's generator is forked and
    seeded too, since dropout on GPU tensors draws from it.
    """
    if seed is None:
        yield
        return
    cuda = device is not None and device.type == "cuda"
    index = (device.index if device.index is not None else torch.cuda.current_device()) if cuda else None
    with torch.random.fork_rng(devices=[index] if cuda else []):
        # the CPU generator only: torch.manual_seed would also queue lazy seeds
        # for CUDA/XPU/MTIA, with a formatted stack trace each (about 1 ms)
        torch.default_generator.manual_seed(int(seed))
        if cuda:
            with torch.cuda.device(index):
                torch.cuda.manual_seed(int(seed))
        yield


def out_shape(modules: Sequence[nn.Module], input_shape: tuple[int, ...], model: str) -> tuple[int, ...]:
    """Per-sample output shape of ``modules`` applied in order.

    A dry run on one zero sample in eval mode (no RNG use, no BatchNorm
    running-stat update); the modules' training flags are restored after.
    """
    flags = [(m, m.training) for mod in modules for m in mod.modules()]
    x = torch.zeros(1, *input_shape)
    try:
        with torch.no_grad():
            for m in modules:
                m.eval()
                x = m(x)
    except RuntimeError:
        raise ConfigError(
            f"input shape {tuple(input_shape)} is too small for {model}"
        ) from None
    finally:
        for m, flag in flags:
            m.training = flag
    return tuple(x.shape[1:])


def linear_blocks(features: int, widths: Sequence[int], num_classes: int,
                  first_relu: int) -> list[tuple[str, nn.Module]]:
    """A classifier of one layer per block: ``fc1, relu<first_relu>, fc2, ..., fc<n>``.

    Linear layers ``features -> widths[0] -> ... -> num_classes``, built in
    that order, each hidden one followed by a ReLU block numbered from
    ``first_relu`` (LeNet-5's ``relu3, relu4``; RingSFL's AlexNet's
    ``relu4, relu5``).
    """
    sizes = [features, *widths, num_classes]
    blocks: list[tuple[str, nn.Module]] = []
    for i in range(len(sizes) - 1):
        blocks.append((f"fc{i + 1}", nn.Linear(sizes[i], sizes[i + 1])))
        if i < len(widths):
            blocks.append((f"relu{first_relu + i}", nn.ReLU()))
    return blocks
