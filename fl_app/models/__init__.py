"""Splittable models: ordered lists of named blocks, built by name (:func:`build_model`).

The package, by concern:

* :mod:`fl_app.models.blocks` -- :class:`BlockModel` (a model as named
  blocks), :func:`split_model`, :func:`fixed_rng` (seeded dropout masks).
* :mod:`fl_app.models.init` -- the weight initialisations (:data:`INITS`).
* :mod:`fl_app.models.profiling` -- FLOPs, bytes and output shape per block
  (:func:`profile_blocks`, :func:`segment_profile`).
* The architectures, one family a module: :mod:`~fl_app.models.lenet`
  (``lenet5``, ``lenet5-ringsfl``), :mod:`~fl_app.models.alexnet`
  (``alexnet``, ``alexnet-gas``, ``alexnet17``; 1x28x28 and 3x32x32 input
  alike), :mod:`~fl_app.models.vgg` (``vgg16``), :mod:`~fl_app.models.resnet`
  (``resnet18``), :mod:`~fl_app.models.vit` (``vit-small``),
  :mod:`~fl_app.models.minilm` (``minilm-l6``: pretrained, LoRA, text; the
  ``llm`` extra). Each module's
  docstring gives its paper and its blocks.

This module holds the registry (:data:`MODELS`) and :func:`build_model`, and
re-exports the public names of the package.

BatchNorm and dropout: a model built here is in training mode, and its
forward pass in training mode updates BatchNorm running statistics and draws
dropout masks from the global torch RNG. The split runtime recomputes a
client's forward pass (``train.backward``); it must see the same masks as the
first pass (the ClientApp, :mod:`fl_app.client.slots`, seeds the RNG around
both with :func:`fixed_rng`).

Imports: ``fl_app`` only (the bottom floor); nothing from ``strategies``, ``simulation`` or ``benchmarks``.
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import nn

from fl_app.run.errors import ConfigError
from fl_app.models.alexnet import alexnet, alexnet17, alexnet_gas
from fl_app.models.blocks import BlockModel, draws_random, fixed_rng, split_model
from fl_app.models.init import INITS, initialise
from fl_app.models.lenet import lenet5, lenet5_ringsfl
from fl_app.models.minilm import minilm_l6
from fl_app.models.profiling import BlockProfile, profile_blocks, segment_profile
from fl_app.models.resnet import BasicBlock, resnet18
from fl_app.models.vgg import vgg16
from fl_app.models.vit import ClassifierHead, EncoderLayer, PatchEmbedding, vit_small

__all__ = [
    "MODELS",
    "TEXT_MODELS",
    "INITS",
    "BlockModel",
    "BasicBlock",
    "PatchEmbedding",
    "EncoderLayer",
    "ClassifierHead",
    "BlockProfile",
    "build_model",
    "split_model",
    "profile_blocks",
    "segment_profile",
    "draws_random",
    "fixed_rng",
]

MODELS: tuple[str, ...] = ("alexnet", "alexnet-gas", "lenet5", "lenet5-ringsfl", "vgg16", "resnet18", "alexnet17",
                           "vit-small")
"""Image models accepted by :func:`build_model` (``(C, H, W)`` inputs)."""

TEXT_MODELS: tuple[str, ...] = ("minilm-l6",)
"""Pretrained text models accepted by :func:`build_model` (token ids from a text dataset; the ``llm`` extra)."""

#: Model name -> the function building its ``(name, module)`` blocks from ``(input shape, classes)``.
_BUILDERS: dict[str, Callable[[tuple[int, int, int], int], list[tuple[str, nn.Module]]]] = {
    "alexnet": alexnet,
    "alexnet-gas": alexnet_gas,
    "lenet5": lenet5,
    "lenet5-ringsfl": lenet5_ringsfl,
    "vgg16": vgg16,
    "resnet18": resnet18,
    "alexnet17": alexnet17,
    "vit-small": vit_small,
}

#: Pretrained models: built by their own function with the LoRA keys, never re-initialised by ``init``.
_PRETRAINED: dict[str, Callable[..., list[tuple[str, nn.Module]]]] = {"minilm-l6": minilm_l6}


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int, seed: int = 0,
                init: str = "default", **lora: object) -> BlockModel:
    """Build model ``name`` for per-sample inputs of shape ``(C, H, W)``.

    Initialisation is deterministic: the same ``seed`` and ``init`` give
    identical weights. The global torch RNG is left untouched (weights are
    drawn inside ``torch.random.fork_rng()`` after ``torch.manual_seed(seed)``).

    * ``init="default"``: conv and linear weights He-normal (fan-in, ReLU
      gain), biases zero, norm layers weight 1 / bias 0 (:func:`~fl_app.models.init.he_init`);
      for ``vit-small`` the usual transformer init instead: linear layers
      and the patch projection truncated-normal(0, 0.02), zero biases,
      LayerNorm 1 / 0, class token and position embedding
      truncated-normal(0, 0.02) (:func:`~fl_app.models.init.transformer_init`).
    * ``init="torch-default"``: PyTorch's own layer initialisation (what
      the GAS authors' code uses), drawn from the same seed.
    * ``init="ringsfl"``: RingSFL's init (section 4.1): conv weights
      Kaiming-normal (fan-out, ReLU gain), linear weights normal(0, 0.01),
      biases zero, BatchNorm weight 1 / bias 0 (:func:`~fl_app.models.init.ringsfl_init`), on
      the models with BatchNorm (``vgg16``, ``resnet18``), the only ones the
      authors' code applies it to (ShenJinglong/DistRingSFL: ResNet-18,
      VGG-16, MobileNet). A model without BatchNorm keeps PyTorch's own init,
      as their LeNet and AlexNet do, and one line is logged saying so (once
      per model and process): three stacked N(0, 0.01) linear layers
      without BatchNorm start at a saddle (loss 2.30).

    Args:
        name: one of :data:`MODELS` or :data:`TEXT_MODELS`.
        input_shape: ``(channels, height, width)`` of one sample, e.g.
            ``(1, 28, 28)`` or ``(3, 32, 32)``.
        num_classes: number of logits of the last block (>= 1).
        seed: initialisation seed.
        init: one of :data:`INITS` (ignored by a pretrained model: its base
            weights are the pretrained ones, its adapters and head drawn from ``seed``).
        lora: a pretrained model's keywords (``lora_rank``, ``lora_alpha``,
            ``lora_targets``; :func:`~fl_app.models.minilm.minilm_l6`); ignored by the others.

    Returns:
        A :class:`BlockModel` mapping ``(N, C, H, W)`` to logits
        ``(N, num_classes)``, in training mode.

    Raises:
        ConfigError: unknown ``name`` or ``init``, a bad ``input_shape``
            (including one too small for the model), or ``num_classes < 1``.
    """
    if name not in _BUILDERS and name not in _PRETRAINED:
        raise ConfigError(f"unknown model {name!r}: choose one of {', '.join(MODELS + TEXT_MODELS)}")
    if init not in INITS:
        raise ConfigError(f"unknown init {init!r}: choose one of {', '.join(INITS)}")
    shape = _check_input_shape(input_shape)
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive int, got {num_classes!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        if name in _PRETRAINED:
            blocks = _PRETRAINED[name](shape, num_classes, **lora)
        else:
            blocks = _BUILDERS[name](shape, num_classes)
            initialise(name, blocks, init)
    return BlockModel(blocks, name=name)


def _check_input_shape(input_shape: tuple[int, int, int]) -> tuple[int, int, int]:
    """``input_shape`` as 3 positive ints (channels, height, width).

    Raises:
        ConfigError: not 3 positive ints.
    """
    try:
        shape = tuple(int(v) for v in input_shape)
    except (TypeError, ValueError):
        raise ConfigError(f"input shape must be (channels, height, width), got {input_shape!r}") from None
    if len(shape) != 3 or min(shape) < 1:
        raise ConfigError(f"input shape must be 3 positive ints (channels, height, width), got {input_shape!r}")
    return shape  # type: ignore[return-value]
