"""GAS Fig. 2's gradient dissimilarity: the server gradient on a buffer against one on a fixed balanced sample."""

from __future__ import annotations

import numpy as np
import torch
from torch import nn

STREAM_REFERENCE = 17


def reference_batch(data, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A fixed sample of the training set (up to 100 per label, seeded) for Fig. 2's full gradient."""
    labels = data.y_train.numpy()
    rng = np.random.default_rng([seed, STREAM_REFERENCE])
    idx = np.concatenate([rng.permutation(np.flatnonzero(labels == c))[:100] for c in range(data.num_classes)])
    return data.train_batch(idx)


def server_gradient(server: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    """Flattened gradient of the mean cross-entropy w.r.t. the server-side parameters."""
    params = [p for p in server.parameters()]
    loss = nn.functional.cross_entropy(server(x.detach()), y)
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, params)])


def gradient_dissimilarity(server: nn.Module, client: nn.Module, x: torch.Tensor, y: torch.Tensor,
                           rx: torch.Tensor, ry: torch.Tensor) -> float:
    """GAS Fig. 2: ``‖∇F_s(x, y) − ∇F_s(reference)‖²``; the reference gradient is taken on the activations of
    the reference sample ``(rx, ry)`` through the current client-side model."""
    with torch.no_grad():
        ra = client(rx)
    diff = server_gradient(server, x, y) - server_gradient(server, ra, ry)
    return float(diff.pow(2).sum())
