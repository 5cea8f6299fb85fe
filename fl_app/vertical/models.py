"""Vertical split learning's models and steps: bottom models per party, the join, the top model.

Each party ``k`` holds columns ``x_k`` (``[B, d_k]``) of the same samples and a **bottom model**
``f_k`` (one linear layer and a ReLU: ``[B, d_k] -> [B, h]``, ``h = vertical-embedding``). The
**label party** (party 0, which also holds columns of its own, FATE's *guest*) joins the embeddings
``e_k = f_k(x_k)``, by concatenation (``[B, K·h]``, the default) or by their sum (``[B, h]``), runs the
**top model** ``g`` (linear, ReLU, linear to the classes) and the cross-entropy, and returns to each
party ``∂L/∂e_k`` (``[B, h]``), with which the party back-propagates and steps its bottom model.

Split this way the step is exactly the step of the unsplit model ``g(join(f_1(x_1), ..., f_K(x_K)))``
on the concatenated columns (``tests/test_vertical.py`` checks it to 1e-6): plain SGD, every party
with the same learning rate. Vepakomma et al. 2018 ("Split learning for health", the vertically
partitioned configuration); Li et al. 2022 (label leakage) use the same two-party form.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import nn

JOINS = ("concat", "sum")


def _seeded(seed: int, salt: int) -> torch.Generator:
    return torch.Generator().manual_seed(int(seed) * 1000 + 45 * 7 + salt)


def _init(layer: nn.Linear, gen: torch.Generator) -> nn.Linear:
    bound = 1.0 / layer.in_features ** 0.5  # torch's default range, drawn from our generator
    with torch.no_grad():
        layer.weight.uniform_(-bound, bound, generator=gen)
        layer.bias.uniform_(-bound, bound, generator=gen)
    return layer


def bottom_model(features: int, embedding: int, seed: int, party: int) -> nn.Sequential:
    """Party ``party``'s bottom model ``[B, features] -> [B, embedding]`` (linear + ReLU), seeded."""
    return nn.Sequential(_init(nn.Linear(features, embedding), _seeded(seed, party)), nn.ReLU())


def top_model(joined: int, classes: int, seed: int, hidden: int = 16) -> nn.Sequential:
    """The label party's top model ``[B, joined] -> [B, classes]`` logits (linear, ReLU, linear), seeded."""
    gen = _seeded(seed, 99)
    return nn.Sequential(_init(nn.Linear(joined, hidden), gen), nn.ReLU(), _init(nn.Linear(hidden, classes), gen))


def joined_width(embedding: int, parties: int, join: str) -> int:
    """The top model's input width: ``parties·embedding`` (concat) or ``embedding`` (sum)."""
    return embedding * parties if join == "concat" else embedding


def join_embeddings(embeddings: Sequence[torch.Tensor], join: str) -> torch.Tensor:
    """``[B, h]`` per party -> ``[B, K·h]`` (concat, in party order) or ``[B, h]`` (sum).

    Raises:
        ValueError: an unknown join, or embeddings of different batch sizes.
    """
    if join not in JOINS:
        raise ValueError(f"vertical-join={join!r}: choose concat or sum")
    if len({e.shape[0] for e in embeddings}) != 1:
        raise ValueError(f"embeddings of different batch sizes {[tuple(e.shape) for e in embeddings]}")
    return torch.cat(list(embeddings), dim=1) if join == "concat" else torch.stack(list(embeddings)).sum(0)


def top_step(top: nn.Module, embeddings: Sequence[torch.Tensor], labels: torch.Tensor, join: str,
             lr: float) -> tuple[float, list[torch.Tensor]]:
    """The label party's step: loss of the joined batch, an SGD step of ``top``, each ``∂L/∂e_k``.

    Args:
        embeddings: ``[B, h]`` float32 per party (party order).
        labels: ``[B]`` int64.
    Returns:
        the mean cross-entropy (before the step) and ``[B, h]`` gradients, one per party.
    """
    leaves = [e.detach().clone().requires_grad_(True) for e in embeddings]
    loss = nn.functional.cross_entropy(top(join_embeddings(leaves, join)), labels)
    top.zero_grad(set_to_none=True)
    loss.backward()
    with torch.no_grad():
        for p in top.parameters():
            p -= lr * p.grad
    return float(loss.detach()), [e.grad.detach() for e in leaves]


def bottom_backward(bottom: nn.Module, x: torch.Tensor, grad: torch.Tensor, lr: float) -> None:
    """A party's step: back-propagate ``grad`` (``∂L/∂e``, ``[B, h]``) through ``bottom`` at ``x``; SGD."""
    bottom.zero_grad(set_to_none=True)
    bottom(x).backward(grad)
    with torch.no_grad():
        for p in bottom.parameters():
            p -= lr * p.grad


def predict(top: nn.Module, embeddings: Sequence[torch.Tensor], labels: torch.Tensor,
            join: str) -> tuple[float, float]:
    """``(mean cross-entropy, accuracy)`` of the top model on the joined embeddings of a test batch."""
    with torch.no_grad():
        logits = top(join_embeddings(embeddings, join))
        return float(nn.functional.cross_entropy(logits, labels)), float((logits.argmax(1) == labels).float().mean())


def split_positions(n: int, seed: int, test_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """The label party's seeded split of the ``n`` aligned rows: ``(train, test)`` positions (test sorted)."""
    perm = np.random.default_rng([int(seed), 45, 1]).permutation(n)
    n_test = max(1, round(float(test_fraction) * n))
    return perm[n_test:], np.sort(perm[:n_test])


def batch_positions(train: np.ndarray, batch: int, iteration: int, seed: int) -> np.ndarray:
    """Mini-batch ``iteration``: seeded passes over ``train`` (a fresh order each pass), ``batch`` rows, sorted."""
    per_epoch = max(1, len(train) // batch)
    epoch, k = divmod(iteration, per_epoch)
    order = train[np.random.default_rng([int(seed), 45, 2, epoch]).permutation(len(train))]
    return np.sort(order[k * batch:(k + 1) * batch]) if len(train) >= batch else np.sort(order)


def model_flops(model: nn.Module, batch: int) -> float:
    """FLOPs of a forward and backward pass of an MLP on ``batch`` rows: ``6·batch·(weights)``."""
    return 6.0 * batch * sum(p.numel() for p in model.parameters() if p.dim() == 2)
