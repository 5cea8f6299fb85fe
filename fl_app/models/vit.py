"""A small ViT (GAS's "ViT-small") in 8 blocks ``embed, layer1..layer6, head`` (``vit-small``).

GAS appendix: 6 pre-norm layers, 8 heads, MLP 512, dropout 0.1; width 128,
4x4 patches. GAS's cut after the first transformer layer is ``cut-layer=2``.
Attention is written out with ``Linear`` layers and matmuls, so that the FLOP
counter (:mod:`fl_app.models.profiling`) counts all of it.
"""

from __future__ import annotations

import torch
from torch import nn

from fl_app.run.errors import ConfigError

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


def vit_small(input_shape: tuple[int, int, int], num_classes: int) -> list[tuple[str, nn.Module]]:
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
