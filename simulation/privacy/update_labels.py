"""Label counts from the uploaded tail updates alone (the iDLG family), as a measurement.

The gradient of the mean cross-entropy w.r.t. the last layer's bias is
``(1/B) Σ_i (p_i − e_{y_i})`` (``p_i`` the softmax, ``e_y`` the one-hot
label): its negative entries are the batch's labels (Zhao, Mopuri and Bilen,
"iDLG: Improved Deep Leakage from Gradients", arXiv:2001.02610, 2020, §3 for
one sample; for batches, the label-count estimates of Wainakh et al.,
"User-Level Label Leakage from Gradients in Federated Learning", PETS 2022,
"LLG"). A server that holds the tail a client started a round from and the
one it uploaded at the end (U-shaped runs: every strategy that aggregates the
tails) sees the sum of ``T`` such steps in the bias' update:
``Δb = −lr · Σ_t v_t``, ``v_t`` the SGD direction (momentum ``m``: the step
``s`` of ``T`` enters ``Σ_t v_t`` with weight ``(1 − m^{T−s+1})/(1 − m)``;
weight decay adds ``wd·b``). :func:`label_counts` inverts it for the number
of examples of each label in the round, assuming the tail's mean prediction
``Σ_i p_i`` is uniform (``N/K`` per class: the attacker's prior without the
activations) and every step's gradient equal in the momentum weighting.

The score (:func:`bag_accuracy`) is the fraction of the round's labels named
right as a multiset: ``Σ_c min(n̂_c, n_c) / N``. It never names which example
has which label: the attack recovers the round's label histogram.
"""

from __future__ import annotations

import numpy as np
import torch


def last_bias_key(state: dict[str, torch.Tensor], num_classes: int) -> str | None:
    """The name of the tail's output bias: the last 1-D tensor of ``num_classes`` entries (None if none)."""
    keys = [k for k, v in state.items() if v.dim() == 1 and v.shape[0] == num_classes and k.endswith("bias")]
    return keys[-1] if keys else None


def label_counts(start_bias: torch.Tensor, end_bias: torch.Tensor, *, lr: float, batch_size: int, steps: int,
                 momentum: float = 0.0, weight_decay: float = 0.0) -> np.ndarray:
    """Estimated label counts ``n̂`` int ``[K]`` of a round of ``steps`` SGD steps on batches of ``batch_size``.

    ``Σ_s ∇_b L_s ≈ −Δb / (lr · w̄) − T·wd·b₀`` with ``w̄`` the mean momentum weight (module docstring);
    ``n = Σ_i p_i − B Σ_s ∇_b L_s`` with ``Σ_i p_i = N/K``; rounded to non-negative integers that sum to
    ``N = steps × batch_size`` (largest remainders).

    Raises:
        ValueError: ``lr``, ``batch_size`` or ``steps`` not positive, or ``momentum`` not in ``[0, 1)``.
    """
    if lr <= 0 or batch_size <= 0 or steps <= 0 or not 0 <= momentum < 1:
        raise ValueError("label_counts needs lr, batch_size, steps > 0 and 0 <= momentum < 1")
    k = start_bias.numel()
    s = np.arange(1, steps + 1)
    weight = float(np.mean((1 - momentum ** (steps - s + 1)) / (1 - momentum))) if momentum else 1.0
    delta = (end_bias - start_bias).double().numpy()
    grad_sum = -delta / (lr * weight) - steps * weight_decay * start_bias.double().numpy()
    n = steps * batch_size
    est = np.clip(n / k - batch_size * grad_sum, 0.0, None)
    est = est * (n / est.sum()) if est.sum() > 0 else np.full(k, n / k)
    counts = np.floor(est).astype(np.int64)
    for c in np.argsort(-(est - counts))[: n - int(counts.sum())]:
        counts[c] += 1
    return counts


def bag_accuracy(counts: np.ndarray, labels: np.ndarray) -> float:
    """``Σ_c min(n̂_c, n_c) / N``: the fraction of ``labels`` (int ``[N]``) that the estimated counts name."""
    true = np.bincount(labels, minlength=len(counts))[: len(counts)]
    return float(np.minimum(counts, true).sum() / max(len(labels), 1))
