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

* ``alexnet`` -- an AlexNet with the GAS authors' layer sizes (GAS:
  "Generative Activation-Aided Asynchronous Split Federated Learning"),
  8 blocks ``conv1..conv5, fc1, fc2, fc3``, with a ReLU after every conv and
  hidden linear layer; default cut 2 gives a 64x7x7 activation on 1x28x28
  input and 64x8x8 on 3x32x32. This is **not** the authors' model: theirs is
  ``alexnet-gas``.
* ``alexnet-gas`` -- the GAS authors' AlexNet exactly (``utils/network.py``
  of github.com/eejiarong/GAS: ``AlexNetDown``/``AlexNetUp`` for 1x28x28,
  ``AlexNetDownCifar``/``AlexNetUpCifar`` for 3x32x32, the same layers):
  as ``alexnet`` but with no ReLU after conv3 or conv4 and none between the
  three linear layers. Cut 2 is their split.
* ``lenet5`` -- LeNet-5 (LeCun et al., "Gradient-based learning applied to
  document recognition", 1998) with ReLU and max pooling, in the 12 blocks
  RingSFL (Shen et al., "Ring-based Split Federated Learning") divides it into.
* ``lenet5-ringsfl`` -- RingSFL's LeNet exactly (``LeNet_Mnist`` of
  github.com/ShenJinglong/DistRingSFL): as ``lenet5`` with average pooling.
* ``vgg16`` -- VGG-16 with BatchNorm (Simonyan & Zisserman 2014) for
  CIFAR-size input, in RingSFL's 16 blocks ``conv1..conv13, fc1..fc3``
  (pools folded into conv2, 4, 7, 10, 13; classifier 512-512-classes).
  GAPSL's client part (the first four conv layers) is ``cut-layer=4``
  (128x8x8 activation); GAS's cuts after torchvision layers 10, 17, 24, 31
  (the pools of the plain VGG-16 ``features``) are cut-layers 4, 7, 10, 13.
  1x28x28 input is zero-padded to 32x32 by conv1's padding.
* ``resnet18`` -- CIFAR-style ResNet-18 (He et al. 2016) in RingSFL's 10
  blocks ``stem, layer1_0 .. layer4_1, head``. GAS's cut "after the first
  residual layer" (stage 1) is ``cut-layer=3``.
* ``alexnet17`` -- RingSFL's MNIST AlexNet, one layer per block (17 blocks,
  as in the authors' code).
* ``vit-small`` -- a small ViT (GAS appendix: 6 pre-norm layers, 8 heads,
  MLP 512, dropout 0.1; width 128, 4x4 patches) in 8 blocks
  ``embed, layer1..layer6, head``. GAS's cut after the first transformer
  layer is ``cut-layer=2``.

:func:`build_model` takes ``init="default"`` (He init; a transformer init for
``vit-small``), ``init="ringsfl"`` (RingSFL's init) or ``init="torch-default"``.

BatchNorm and dropout: a model built here is in training mode, and its
forward pass in training mode updates BatchNorm running statistics and draws
dropout masks from the global torch RNG. The split runtime recomputes a
client's forward pass (``train.backward``); it must see the same masks as the
first pass (:mod:`fl_app.client_app` seeds the RNG around both).
"""

from __future__ import annotations

import contextlib
import copy
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Callable, Sequence

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from fl_app.errors import ConfigError

__all__ = [
    "MODELS",
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
    "fixed_rng",
]

MODELS: tuple[str, ...] = ("alexnet", "alexnet-gas", "lenet5", "lenet5-ringsfl", "vgg16", "resnet18", "alexnet17",
                           "vit-small")
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


def _alexnet(input_shape: tuple[int, int, int], num_classes: int,
             hidden_relu: bool = True) -> list[tuple[str, nn.Module]]:
    """AlexNet with the GAS authors' layer sizes: 5 conv blocks + 3 fc blocks (8 blocks).

    ``hidden_relu=False`` is the authors' model (``alexnet-gas``): no ReLU
    after conv3 or conv4, none after fc1 or fc2. The parameters' names are
    the same either way (a ReLU holds none).
    """
    c = input_shape[0]

    def act(*layers: nn.Module) -> nn.Sequential:
        return nn.Sequential(*layers, nn.ReLU()) if hidden_relu else nn.Sequential(*layers)

    convs: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Sequential(nn.Conv2d(c, 32, 3, 1, 1), nn.MaxPool2d(2), nn.ReLU())),
        ("conv2", nn.Sequential(nn.Conv2d(32, 64, 3, 1, 1), nn.MaxPool2d(2), nn.ReLU())),
        ("conv3", act(nn.Conv2d(64, 128, 3, 1, 1))),
        ("conv4", act(nn.Conv2d(128, 256, 3, 1, 1))),
        ("conv5", nn.Sequential(nn.Conv2d(256, 256, 3, 1, 1), nn.MaxPool2d(3, 2), nn.ReLU())),
    ]
    feat = _out_shape([m for _, m in convs], input_shape, "alexnet" if hidden_relu else "alexnet-gas")
    flat = feat[0] * feat[1] * feat[2]
    fcs: list[tuple[str, nn.Module]] = [
        ("fc1", act(nn.Flatten(), nn.Linear(flat, 1024))),
        ("fc2", act(nn.Linear(1024, 512))),
        ("fc3", nn.Linear(512, num_classes)),
    ]
    return convs + fcs


def _alexnet_gas(input_shape: tuple[int, int, int], num_classes: int) -> list[tuple[str, nn.Module]]:
    """The GAS authors' AlexNet (``AlexNetDown``/``AlexNetUp``, and their CIFAR twins): :func:`_alexnet`
    without the hidden ReLUs after conv3, conv4, fc1 and fc2."""
    return _alexnet(input_shape, num_classes, hidden_relu=False)


def _lenet5(input_shape: tuple[int, int, int], num_classes: int,
            pool: type[nn.Module] = nn.MaxPool2d) -> list[tuple[str, nn.Module]]:
    """LeNet-5 with ReLU and max pooling (``pool``: the pooling layer class), in 12 blocks.

    Inputs smaller than 32x32 (e.g. 28x28 MNIST) get ``padding=2`` in conv1,
    the usual MNIST form, so 28x28 gives the classic 16x5x5 feature map;
    32x32 inputs use no padding (the original LeNet-5, also 16x5x5).
    """
    c, h, w = input_shape
    pad = 2 if min(h, w) < 32 else 0
    front: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Conv2d(c, 6, 5, 1, pad)),
        ("relu1", nn.ReLU()),
        ("pool1", pool(2, 2)),
        ("conv2", nn.Conv2d(6, 16, 5)),
        ("relu2", nn.ReLU()),
        ("pool2", pool(2, 2)),
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


def _lenet5_ringsfl(input_shape: tuple[int, int, int], num_classes: int) -> list[tuple[str, nn.Module]]:
    """RingSFL's LeNet (``LeNet_Mnist`` in ShenJinglong/DistRingSFL ``model/LeNet.py``): :func:`_lenet5`
    with average pooling, the same 12 blocks."""
    return _lenet5(input_shape, num_classes, pool=nn.AvgPool2d)


# ----------------------------------------------------------------- VGG-16


#: VGG-16's 13 conv layers: output channels, and whether a 2x2 max pool follows.
_VGG16_CONVS: tuple[tuple[int, bool], ...] = (
    (64, False), (64, True),
    (128, False), (128, True),
    (256, False), (256, False), (256, True),
    (512, False), (512, False), (512, True),
    (512, False), (512, False), (512, True),
)


def _vgg16(input_shape: tuple[int, int, int], num_classes: int) -> list[tuple[str, nn.Module]]:
    """VGG-16 with BatchNorm for CIFAR-size inputs, in RingSFL's 16 blocks.

    ``conv1..conv13``: ``Conv2d(3x3, padding 1) -> BatchNorm2d -> ReLU``, with
    the 2x2 max pool folded into conv2, conv4, conv7, conv10 and conv13.
    ``fc1``: ``Flatten -> Linear(512*h*w, 512) -> ReLU``; ``fc2``:
    ``Linear(512, 512) -> ReLU``; ``fc3``: ``Linear(512, classes)``. No
    dropout (the common CIFAR classifier; RingSFL's reference code uses the
    ImageNet head ``AdaptiveAvgPool(7x7) -> 4096 -> 4096`` with dropout, which
    is 120M parameters on a 1x1 feature map).

    Inputs whose sides are not multiples of 32 are zero-padded to the next
    multiple by conv1's own padding: on 28x28, conv1 has ``padding=3``, which
    is exactly "pad to 32x32, then a padding-1 conv" (odd differences round
    the padding up; the floor of the pools absorbs the extra row). So 28x28
    and 32x32 both give 512x1x1 after conv13.
    """
    c, h, w = input_shape
    th, tw = -(-h // 32) * 32, -(-w // 32) * 32
    pad1 = (1 + (th - h + 1) // 2, 1 + (tw - w + 1) // 2)
    blocks: list[tuple[str, nn.Module]] = []
    cin = c
    for i, (cout, pool) in enumerate(_VGG16_CONVS, start=1):
        layers: list[nn.Module] = [
            nn.Conv2d(cin, cout, 3, 1, pad1 if i == 1 else 1),
            nn.BatchNorm2d(cout),
            nn.ReLU(),
        ]
        if pool:
            layers.append(nn.MaxPool2d(2))
        blocks.append((f"conv{i}", nn.Sequential(*layers)))
        cin = cout
    flat = 512 * (th // 32) * (tw // 32)
    blocks += [
        ("fc1", nn.Sequential(nn.Flatten(), nn.Linear(flat, 512), nn.ReLU())),
        ("fc2", nn.Sequential(nn.Linear(512, 512), nn.ReLU())),
        ("fc3", nn.Linear(512, num_classes)),
    ]
    return blocks


# -------------------------------------------------------------- ResNet-18


class BasicBlock(nn.Module):
    """ResNet basic block (He et al. 2016): two 3x3 conv+BN, identity or 1x1-conv shortcut.

    ``(N, in_channels, H, W) -> (N, out_channels, ceil(H/stride), ceil(W/stride))``:
    ``relu(bn2(conv2(relu(bn1(conv1(x))))) + shortcut(x))``. The shortcut is
    ``Conv2d(1x1, stride) -> BatchNorm2d`` when the stride or the channel
    count changes, else the identity (an empty ``nn.Sequential``).

    Args:
        in_channels: input channels.
        out_channels: output channels.
        stride: stride of conv1 and of the shortcut (1 or 2).
    """

    def __init__(self, in_channels: int, out_channels: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(in_channels, out_channels, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(out_channels)
        self.conv2 = nn.Conv2d(out_channels, out_channels, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(out_channels)
        self.shortcut = nn.Sequential()
        if stride != 1 or in_channels != out_channels:
            self.shortcut = nn.Sequential(
                nn.Conv2d(in_channels, out_channels, 1, stride, bias=False),
                nn.BatchNorm2d(out_channels),
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, C_in, H, W) -> (N, C_out, H', W')`` (see the class docstring)."""
        out = torch.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return torch.relu(out + self.shortcut(x))


def _resnet18(input_shape: tuple[int, int, int], num_classes: int) -> list[tuple[str, nn.Module]]:
    """CIFAR-style ResNet-18 in RingSFL's 10 blocks.

    ``stem``: ``Conv2d(C, 64, 3x3, padding 1, no bias) -> BatchNorm2d -> ReLU``
    (no max pool); ``layer1_0 .. layer4_1``: the 8 :class:`BasicBlock` s of
    the four stages (64, 128, 256, 512 channels; the first block of stages
    2-4 has stride 2); ``head``: ``AdaptiveAvgPool2d(1) -> Flatten ->
    Linear(512, classes)``. 32x32 gives 32, 16, 8, 4 pixel stages; 28x28
    gives 28, 14, 7, 4. The adaptive pool equals RingSFL's ``AvgPool2d(4)``
    on the 4x4 map of both.
    """
    c = input_shape[0]
    blocks: list[tuple[str, nn.Module]] = [
        ("stem", nn.Sequential(nn.Conv2d(c, 64, 3, 1, 1, bias=False), nn.BatchNorm2d(64), nn.ReLU())),
    ]
    cin = 64
    for stage, cout in enumerate((64, 128, 256, 512), start=1):
        for j in range(2):
            stride = 2 if stage > 1 and j == 0 else 1
            blocks.append((f"layer{stage}_{j}", BasicBlock(cin, cout, stride)))
            cin = cout
    blocks.append(("head", nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(512, num_classes))))
    return blocks


# ------------------------------------------------------- AlexNet (RingSFL)


def _alexnet17(input_shape: tuple[int, int, int], num_classes: int) -> list[tuple[str, nn.Module]]:
    """RingSFL's AlexNet for MNIST, one layer per block (17 blocks).

    The paper only says "AlexNet is divided into 17 blocks". The authors'
    code (GitHub ``ShenJinglong/DistRingSFL``, ``model/AlexNet.py``,
    ``AlexNet_Mnist``) lists exactly 17 layers, reproduced here::

        conv1 Conv2d(C, 32, 3, padding 1)   pool1 MaxPool2d(2)   relu1
        conv2 Conv2d(32, 64, 3, padding 1)  pool2 MaxPool2d(2)   relu2
        conv3 Conv2d(64, 128, 3, padding 1)
        conv4 Conv2d(128, 256, 3, padding 1)
        conv5 Conv2d(256, 256, 3, padding 1) pool3 MaxPool2d(2)  relu3
        flatten  fc1 Linear(256*h*w, 1024)  relu4
        fc2 Linear(1024, 512)  relu5  fc3 Linear(512, classes)

    It is the GAS AlexNet (``alexnet``) without the ReLUs after conv3 and
    conv4 (as in that code) and with a 2x2 last pool. 28x28 gives a 256x3x3
    feature map (2304 features), 32x32 gives 256x4x4 (4096).
    """
    c = input_shape[0]
    front: list[tuple[str, nn.Module]] = [
        ("conv1", nn.Conv2d(c, 32, 3, 1, 1)),
        ("pool1", nn.MaxPool2d(2)),
        ("relu1", nn.ReLU()),
        ("conv2", nn.Conv2d(32, 64, 3, 1, 1)),
        ("pool2", nn.MaxPool2d(2)),
        ("relu2", nn.ReLU()),
        ("conv3", nn.Conv2d(64, 128, 3, 1, 1)),
        ("conv4", nn.Conv2d(128, 256, 3, 1, 1)),
        ("conv5", nn.Conv2d(256, 256, 3, 1, 1)),
        ("pool3", nn.MaxPool2d(2)),
        ("relu3", nn.ReLU()),
        ("flatten", nn.Flatten()),
    ]
    (flat,) = _out_shape([m for _, m in front], input_shape, "alexnet17")
    back: list[tuple[str, nn.Module]] = [
        ("fc1", nn.Linear(flat, 1024)),
        ("relu4", nn.ReLU()),
        ("fc2", nn.Linear(1024, 512)),
        ("relu5", nn.ReLU()),
        ("fc3", nn.Linear(512, num_classes)),
    ]
    return front + back


# --------------------------------------------------------------- ViT-small

#: ViT-small hyper-parameters (GAS appendix: 6 layers, 8 heads, MLP 512, dropout 0.1).
VIT_DIM, VIT_DEPTH, VIT_HEADS, VIT_MLP, VIT_DROPOUT, VIT_PATCH = 128, 6, 8, 512, 0.1, 4


class PatchEmbedding(nn.Module):
    """ViT input block: patches -> tokens, plus a class token and position embeddings.

    ``(N, C, H, W) -> (N, 1 + (H // patch) * (W // patch), dim)``: a
    ``Conv2d(C, dim, patch, stride=patch)`` embeds each non-overlapping
    patch (a trailing remainder of fewer than ``patch`` pixels is dropped),
    the learned class token is prepended, the learned position embedding
    ``(1, tokens, dim)`` added, then dropout.

    Args:
        in_channels: image channels ``C``.
        dim: embedding width.
        patch: patch side in pixels.
        grid: ``(H // patch, W // patch)``.
        dropout: dropout probability on the embedded tokens.
    """

    def __init__(self, in_channels: int, dim: int, patch: int, grid: tuple[int, int], dropout: float) -> None:
        super().__init__()
        self.grid = grid
        self.proj = nn.Conv2d(in_channels, dim, patch, patch)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, dim))
        self.pos_embed = nn.Parameter(torch.zeros(1, 1 + grid[0] * grid[1], dim))
        self.dropout = nn.Dropout(dropout)

    def extra_repr(self) -> str:
        """Grid and token count (part of the profile cache key)."""
        return f"grid={self.grid}, tokens={self.pos_embed.shape[1]}"

    def reset_tokens(self) -> None:
        """Class token and position embedding ~ truncated normal(0, 0.02) (ViT / timm)."""
        nn.init.trunc_normal_(self.cls_token, std=0.02)
        nn.init.trunc_normal_(self.pos_embed, std=0.02)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, C, H, W) -> (N, tokens, dim)``."""
        t = self.proj(x).flatten(2).transpose(1, 2)  # (N, patches, dim)
        cls = self.cls_token.expand(t.shape[0], -1, -1)
        return self.dropout(torch.cat([cls, t], dim=1) + self.pos_embed)


class EncoderLayer(nn.Module):
    """Pre-norm transformer encoder layer.

    ``(N, T, dim) -> (N, T, dim)``::

        x = x + drop(proj(attention(ln1(x))))
        x = x + drop(fc2(drop(gelu(fc1(ln2(x))))))

    Multi-head self-attention is written out with ``Linear`` layers and
    matmuls (``softmax(q k^T / sqrt(d_head))``, dropout on the attention
    weights), so :class:`~torch.utils.flop_counter.FlopCounterMode` counts
    all of it and every dropout draws from the global torch RNG. The same
    dropout placement as ``nn.TransformerEncoderLayer(norm_first=True)``,
    with GELU.

    Args:
        dim: token width (divisible by ``heads``).
        heads: attention heads.
        mlp: hidden width of the MLP.
        dropout: dropout probability (attention weights, both residual
            branches, MLP hidden layer).
    """

    def __init__(self, dim: int, heads: int, mlp: int, dropout: float) -> None:
        super().__init__()
        if dim % heads:
            raise ValueError(f"dim {dim} is not divisible by {heads} heads")
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.attn_drop = nn.Dropout(dropout)
        self.proj = nn.Linear(dim, dim)
        self.drop1 = nn.Dropout(dropout)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, mlp)
        self.act = nn.GELU()
        self.drop2 = nn.Dropout(dropout)
        self.fc2 = nn.Linear(mlp, dim)
        self.drop3 = nn.Dropout(dropout)

    def attention(self, x: torch.Tensor) -> torch.Tensor:
        """Multi-head self-attention, ``(N, T, dim) -> (N, T, dim)`` (before ``proj``)."""
        n, t, d = x.shape
        qkv = self.qkv(x).reshape(n, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        q, k, v = qkv[0], qkv[1], qkv[2]  # (N, heads, T, d_head)
        w = torch.softmax(q @ k.transpose(-2, -1) * (d // self.heads) ** -0.5, dim=-1)
        out = self.attn_drop(w) @ v  # (N, heads, T, d_head)
        return out.transpose(1, 2).reshape(n, t, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, T, dim) -> (N, T, dim)``."""
        x = x + self.drop1(self.proj(self.attention(self.ln1(x))))
        return x + self.drop3(self.fc2(self.drop2(self.act(self.fc1(self.ln2(x))))))


class ClassifierHead(nn.Module):
    """ViT head: LayerNorm and a linear layer on the class token.

    ``(N, T, dim) -> (N, num_classes)``, from token 0.
    """

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, T, dim) -> (N, num_classes)``."""
        return self.fc(self.norm(x[:, 0]))


def _vit_small(input_shape: tuple[int, int, int], num_classes: int) -> list[tuple[str, nn.Module]]:
    """A small ViT (GAS's "ViT-small"), 8 blocks: ``embed, layer1..layer6, head``.

    Width 128 (GAS does not give it; 128 = 8 heads x 16 and the usual
    4x MLP ratio for its MLP of 512), 6 pre-norm layers, 8 heads, MLP 512,
    dropout 0.1 on the embedding and in the layers (GAS appendix), 4x4
    patches: 28x28 -> 7x7 patches (50 tokens), 32x32 -> 8x8 (65 tokens).
    GAS's cut "after the first transformer layer" is ``cut-layer=2``.
    """
    c, h, w = input_shape
    grid = (h // VIT_PATCH, w // VIT_PATCH)
    if min(grid) < 1:
        raise ConfigError(f"input shape {tuple(input_shape)} is too small for vit-small (patch {VIT_PATCH})")
    blocks: list[tuple[str, nn.Module]] = [("embed", PatchEmbedding(c, VIT_DIM, VIT_PATCH, grid, VIT_DROPOUT))]
    blocks += [(f"layer{i}", EncoderLayer(VIT_DIM, VIT_HEADS, VIT_MLP, VIT_DROPOUT)) for i in range(1, VIT_DEPTH + 1)]
    blocks.append(("head", ClassifierHead(VIT_DIM, num_classes)))
    return blocks


_BUILDERS: dict[str, Callable[[tuple[int, int, int], int], list[tuple[str, nn.Module]]]] = {
    "alexnet": _alexnet,
    "alexnet-gas": _alexnet_gas,
    "lenet5": _lenet5,
    "lenet5-ringsfl": _lenet5_ringsfl,
    "vgg16": _vgg16,
    "resnet18": _resnet18,
    "alexnet17": _alexnet17,
    "vit-small": _vit_small,
}

INITS: tuple[str, ...] = ("default", "ringsfl", "torch-default")
"""Weight initialisations accepted by :func:`build_model` (run-config key ``init``)."""


def build_model(name: str, input_shape: tuple[int, int, int], num_classes: int, seed: int = 0,
                init: str = "default") -> BlockModel:
    """Build model ``name`` for per-sample inputs of shape ``(C, H, W)``.

    Initialisation is deterministic: the same ``seed`` and ``init`` give
    identical weights. The global torch RNG is left untouched (weights are
    drawn inside ``torch.random.fork_rng()`` after ``torch.manual_seed(seed)``).

    * ``init="default"``: conv and linear weights He-normal (fan-in, ReLU
      gain), biases zero, norm layers weight 1 / bias 0 (:func:`_he_init`);
      for ``vit-small`` the usual transformer init instead: linear layers
      and the patch projection truncated-normal(0, 0.02), zero biases,
      LayerNorm 1 / 0, class token and position embedding
      truncated-normal(0, 0.02) (:func:`_transformer_init`).
    * ``init="torch-default"``: PyTorch's own layer initialisation (what
      the GAS authors' code uses), drawn from the same seed.
    * ``init="ringsfl"``: RingSFL's init (section 4.1): conv weights
      Kaiming-normal (fan-out, ReLU gain), linear weights normal(0, 0.01),
      biases zero, BatchNorm weight 1 / bias 0 (:func:`_ringsfl_init`), on
      the models with BatchNorm (``vgg16``, ``resnet18``), the only ones the
      authors' code applies it to (ShenJinglong/DistRingSFL: ResNet-18,
      VGG-16, MobileNet). A model without BatchNorm keeps PyTorch's own init,
      as their LeNet and AlexNet do, and one line is logged saying so (once
      per model and process): three stacked N(0, 0.01) linear layers
      without BatchNorm start at a saddle (loss 2.30).

    Args:
        name: one of :data:`MODELS`.
        input_shape: ``(channels, height, width)`` of one sample, e.g.
            ``(1, 28, 28)`` or ``(3, 32, 32)``.
        num_classes: number of logits of the last block (>= 1).
        seed: initialisation seed.
        init: one of :data:`INITS`.

    Returns:
        A :class:`BlockModel` mapping ``(N, C, H, W)`` to logits
        ``(N, num_classes)``, in training mode.

    Raises:
        ConfigError: unknown ``name`` or ``init``, a bad ``input_shape``
            (including one too small for the model), or ``num_classes < 1``.
    """
    if name not in _BUILDERS:
        raise ConfigError(f"unknown model {name!r}: choose one of {', '.join(MODELS)}")
    if init not in INITS:
        raise ConfigError(f"unknown init {init!r}: choose one of {', '.join(INITS)}")
    shape = _check_input_shape(input_shape)
    if not isinstance(num_classes, int) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive int, got {num_classes!r}")
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        blocks = _BUILDERS[name](shape, num_classes)
        if init == "ringsfl" and not any(isinstance(m, nn.BatchNorm2d) for _, b in blocks for m in b.modules()):
            _note_once(name, f"init=ringsfl: {name} has no BatchNorm, and the RingSFL authors apply their init only "
                             "to their BatchNorm models; using PyTorch's default init, as their code does")
            init = "torch-default"
        if init == "ringsfl":
            init_fn = _ringsfl_init
        elif init == "torch-default":
            init_fn = lambda block: None  # noqa: E731 - keep the layers' own reset_parameters()
        else:
            init_fn = _transformer_init if name == "vit-small" else _he_init
        for _, block in blocks:
            init_fn(block)
    return BlockModel(blocks, name=name)


_NOTED: set[str] = set()


def _note_once(key: str, message: str) -> None:
    """Log ``message`` on the ``sflower`` logger the first time ``key`` is seen in this process."""
    if key not in _NOTED:
        _NOTED.add(key)
        logging.getLogger("sflower").warning(message)


def _he_init(module: nn.Module) -> None:
    """He (Kaiming) normal init, fan-in, for ReLU nets; zero biases.

    PyTorch's default (uniform, a = sqrt(5)) shrinks the signal through the
    eight plain-ReLU layers of AlexNet so much that SGD at lr 0.01 sits on the
    loss plateau of 2.30 for hundreds of steps; He init starts learning at once.
    Norm layers keep PyTorch's weight 1 / bias 0.
    """
    for m in module.modules():
        if isinstance(m, (nn.Conv2d, nn.Linear)):
            nn.init.kaiming_normal_(m.weight, nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)


def _ringsfl_init(module: nn.Module) -> None:
    """RingSFL's init: conv Kaiming-normal (fan-out, ReLU), linear N(0, 0.01), zero biases, norms 1 / 0."""
    for m in module.modules():
        if isinstance(m, nn.Conv2d):
            nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.Linear):
            nn.init.normal_(m.weight, 0.0, 0.01)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, (nn.BatchNorm2d, nn.LayerNorm)):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, PatchEmbedding):
            m.reset_tokens()


def _transformer_init(module: nn.Module) -> None:
    """ViT init: linear and patch-conv weights truncated-normal(0, 0.02), zero biases,
    LayerNorm 1 / 0, class token and position embedding truncated-normal(0, 0.02)."""
    for m in module.modules():
        if isinstance(m, (nn.Linear, nn.Conv2d)):
            nn.init.trunc_normal_(m.weight, std=0.02)
            if m.bias is not None:
                nn.init.zeros_(m.bias)
        elif isinstance(m, nn.LayerNorm):
            nn.init.ones_(m.weight)
            nn.init.zeros_(m.bias)
        elif isinstance(m, PatchEmbedding):
            m.reset_tokens()


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
