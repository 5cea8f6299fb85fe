"""Model averaging and the FL update rules, as pure functions on state dicts."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from fl_app.config import Option

State = Mapping[str, torch.Tensor]

#: The option of every strategy that averages client models.
AGGREGATION_OPTION = Option("aggregation", "data-size",
                            "client-model averaging weights: |D_k| (eq. 10) or uniform (GAS reference code)",
                            ("data-size", "uniform"))


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


def average_uploads(uploads: Mapping[int, State] | Iterable[tuple[int, State]],
                    weight: Callable[[int], float]) -> dict[str, torch.Tensor]:
    """Weighted average of client uploads: ``Σ_k w(k)·state_k / Σ_k w(k)`` (GAS eq. 10).

    Args:
        uploads: ``pid -> state`` (averaged in ascending pid order) or
            ``(pid, state)`` pairs (in the given order, e.g. a buffer's
            arrival order; float sums depend on the order).
        weight: the weight of a client, e.g. ``|D_k|``
            (:meth:`~strategies.core.base.SFLStrategy.aggregation_weight`).

    Raises:
        ValueError: no uploads, or a non-positive total weight.
    """
    pairs = sorted(uploads.items()) if isinstance(uploads, Mapping) else list(uploads)
    return weighted_average([s for _, s in pairs], [weight(p) for p, _ in pairs])


def state_delta(new: State, old: State) -> dict[str, torch.Tensor]:
    """``new - old`` for every floating-point entry (a client's update)."""
    return {k: new[k] - old[k] for k in old if torch.is_floating_point(old[k])}


def apply_update(state: State, update: State, lr: float) -> dict[str, torch.Tensor]:
    """``state + lr * update`` on the keys of ``update``; other keys unchanged."""
    return {k: (v + lr * update[k] if k in update else v.clone()) for k, v in state.items()}


def staleness_weight(staleness: int, kind: str = "none") -> float:
    """FedBuff's staleness discount ``s(τ)``: 1, or ``1/sqrt(1+τ)`` for ``"polynomial"``."""
    if kind == "none":
        return 1.0
    if kind == "polynomial":
        return 1.0 / (1.0 + staleness) ** 0.5
    raise ValueError(f"unknown staleness weighting '{kind}'")


def fedbuff_step(state: State, deltas: Sequence[State], weights: Sequence[float], server_lr: float) -> dict[str, torch.Tensor]:
    """FedBuff (Nguyen et al. 2022): ``w + η_g · (1/K) Σ_k s_k Δ_k`` over the K buffered updates."""
    k = len(deltas)
    mean = {key: sum(float(w) * d[key] for d, w in zip(deltas, weights)) / k for key in deltas[0]}
    return apply_update(state, mean, server_lr)


def ca2fl_step(state: State, cache: Mapping[int, State], buffered: Sequence[tuple[int, State]],
               num_clients: int, server_lr: float) -> tuple[dict[str, torch.Tensor], dict[int, State]]:
    """CA²FL's cached update calibration (Wang et al. 2023).

    With ``h_i`` the latest cached update of client i (0 if none) at the start
    of the round and ``S`` the buffered updates::

        v = (1/N) Σ_{i=1..N} h_i + (1/|S|) Σ_{(i, Δ_i) ∈ S} (Δ_i − h_i)
        w ← w + η_g · v,   then h_i ← Δ_i for every buffered i (the latest wins).

    Returns:
        ``(new state, new cache)``; the input cache is not modified.
    """
    keys = list(buffered[0][1])
    mean_cache = {k: sum((h[k] for h in cache.values()), torch.zeros_like(buffered[0][1][k])) / num_clients
                  for k in keys}
    calib = {k: torch.zeros_like(buffered[0][1][k]) for k in keys}
    for pid, delta in buffered:
        for k in keys:
            calib[k] += delta[k] - (cache[pid][k] if pid in cache else 0.0)
    v = {k: mean_cache[k] + calib[k] / len(buffered) for k in keys}
    new_cache = dict(cache)
    for pid, delta in buffered:
        new_cache[pid] = delta
    return apply_update(state, v, server_lr), new_cache
