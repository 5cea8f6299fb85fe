"""The weighted mean of model states, shared by the server's aggregation (:mod:`strategies.core.aggregation`)
and the clients' own aggregation of hidden client-side models (:mod:`fl_app.client.hidden`).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch

State = Mapping[str, torch.Tensor]


def weighted_average(states: Sequence[State], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """``sum_k w_k * state_k / sum_k w_k`` key by key (GAS eq. 10 with w_k = |D_k|).

    Non-float entries (integer buffers) are taken from the first state.

    Raises:
        ValueError: no states, mismatched lengths, or non-positive total weight.
    """
    if not states or len(states) != len(weights):
        raise ValueError("weighted_average needs as many weights as states (at least one)")
    total = float(sum(weights))
    if total <= 0:
        raise ValueError("weighted_average needs a positive total weight")
    out: dict[str, torch.Tensor] = {}
    for key, first in states[0].items():
        if not torch.is_floating_point(first):
            out[key] = first.clone()
            continue
        acc = torch.zeros_like(first, dtype=torch.float64)
        for state, w in zip(states, weights):
            acc += state[key].to(torch.float64) * (float(w) / total)
        out[key] = acc.to(first.dtype)
    return out
