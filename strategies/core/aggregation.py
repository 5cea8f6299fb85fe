"""Model averaging and the FL update rules, as pure functions on state dicts.

:func:`weighted_average` is the default of every strategy's aggregation hook,
:meth:`ModelAggregation.aggregate_models` (a base of
:class:`~strategies.core.base.SFLStrategy`; its docstring lists what goes
through it and what does not); :func:`average_uploads` orders uploads for it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence

import torch

from fl_app.learning.averaging import weighted_average
from fl_app.run.options import Option

State = Mapping[str, torch.Tensor]

#: The option of every strategy that averages client models.
AGGREGATION_OPTION = Option("aggregation", "data-size",
                            "client-model averaging weights: |D_k| (eq. 10) or uniform (GAS reference code)",
                            ("data-size", "uniform"), source="GAS eq. 10")
#: η_g, the server's step along the clients' aggregated update: FedBuff's buffered FL and MU-SplitFed's
#: aggregation, declared once for both.
SERVER_LR_OPTION = Option("server-lr", 1.0, "global learning rate η_g: the server's step along the clients' "
                          "aggregated update", above=0, source="FedBuff Algorithm 1; MU-SplitFed eq. 7")


#: ``(models, weights) -> model``: :func:`weighted_average` or a strategy's aggregation hook.
Combine = Callable[[Sequence[State], Sequence[float]], Mapping[str, torch.Tensor]]


def average_uploads(uploads: Mapping[int, State] | Iterable[tuple[int, State]],
                    weight: Callable[[int], float], combine: Combine = weighted_average) -> dict[str, torch.Tensor]:
    """Weighted average of client uploads: ``Σ_k w(k)·state_k / Σ_k w(k)`` (GAS eq. 10).

    Args:
        uploads: ``pid -> state`` (averaged in ascending pid order) or
            ``(pid, state)`` pairs (in the given order, e.g. a buffer's
            arrival order; float sums depend on the order).
        weight: the weight of a client, e.g. ``|D_k|``
            (:meth:`~strategies.core.base.SFLStrategy.aggregation_weight`).
        combine: what makes one model of the ordered states and their
            weights: :func:`weighted_average` (the mean above), or a
            strategy's hook (:meth:`ModelAggregation.aggregate_models`).

    Raises:
        ValueError: no uploads, or a non-positive total weight (from :func:`weighted_average`).
    """
    pairs = sorted(uploads.items()) if isinstance(uploads, Mapping) else list(uploads)
    return dict(combine([s for _, s in pairs], [weight(p) for p, _ in pairs]))


class ModelAggregation:
    """The model-aggregation hook of every strategy (a base of :class:`~strategies.core.base.SFLStrategy`).

    Override :meth:`aggregate_models` alone to change how a strategy combines
    its models, e.g. a coordinate-wise trimmed mean or median for robustness
    (Yin et al. 2018): every model average of the strategy goes through it.
    """

    #: ``pid -> weight`` of a client's model (provided by :class:`~strategies.core.base.SFLStrategy`).
    aggregation_weight: Callable[[int], float]

    def aggregate_models(self, models: Sequence[State], weights: Sequence[float]) -> dict[str, torch.Tensor]:
        """Hook: combine ``K`` models into one (sflower's counterpart of Flower's ``aggregate_train``).

        Every model average of a strategy calls it, once per averaged quantity:

        * the client-side models of a synchronous round (SplitFed-V1/V2,
          MiniBatch-SFL, vanilla SL, S²FL, MU-SplitFed), FedAvg's full models
          and GAS's full model buffer (``Q_c`` models in arrival order; eq. 10);
        * server-side copies: SplitFed-V1's and MU-SplitFed's per-client copies
          (weights as the clients'), S²FL's per-group copies after each
          server step (weights 1);
        * RingSFL's blended models of the ring members (eq. 6, weights 1: the
          ``a_j = D_j/ΣD`` weighting is already in the clients' gradients);
        * MU-SplitFed's eq. 7 ``w + η_g·(agg − w)`` steps towards the result.

        Not through it, by design: FedBuff's and CA²FL's server steps
        (:mod:`strategies.algorithms.fl`) combine client *updates* ``Δ_k``, not
        models, and not as a normalised mean: FedBuff's ``(1/K) Σ s(τ_k) Δ_k``
        lets the staleness discount shrink the step (a normalised mean would
        undo it), and CA²FL calibrates with all ``N`` cached updates; their
        one-method hook is ``BufferedFL.apply_buffer(state, buffer)``. Gradient
        and loss means inside an algorithm (EPSL's last-layer gradients,
        GAPSL's leader gradient, RingSFL's on-client accumulation, GAS's
        activation statistics) are not model averages; the PSL family never
        averages its client-side models.

        Args:
            models: ``K >= 1`` state dicts (parameter name -> tensor) with the
                same keys, shapes and dtypes, on one device (the CPU or the
                strategy's :attr:`~strategies.core.base.SFLStrategy.device`), in a fixed order: ascending
                partition id (group index for S²FL, ring position for RingSFL)
                or a buffer's arrival order (GAS). Not to be modified.
            weights: ``K`` non-negative weights in the same order: ``|D_k|``
                (the client's training examples) with ``aggregation=data-size``,
                1 with ``aggregation=uniform``, and 1 for copies that carry no
                data size (S²FL's groups, RingSFL).

        Returns:
            A new state dict with the keys, shapes and dtypes of ``models[0]``.
            The default is :func:`weighted_average`: ``Σ_k w_k·x_k / Σ_k w_k``
            per floating-point entry, accumulated in float64 in the given
            order and cast back (FedAvg's ``Σ_k (n_k/n)·w_k``, McMahan et al.
            2017, Algorithm 1; GAS eq. 10; SplitFed, Thapa et al. 2022); integer
            entries (BatchNorm's ``num_batches_tracked``) are ``models[0]``'s.
            An override may ignore the weights; it should handle ``K = 1``
            (vanilla SL averages one model at a time).

        Raises:
            ValueError: (the default) no models, a weight count that differs
                from the model count, or a non-positive total weight.
        """
        return weighted_average(models, weights)

    def aggregate_uploads(self, uploads: Mapping[int, State] | Iterable[tuple[int, State]],
                          weight: Callable[[int], float] | None = None) -> dict[str, torch.Tensor]:
        """:meth:`aggregate_models` of ``pid -> state`` uploads (ascending pid) or ``(pid, state)`` pairs (in
        their order), weighted by ``weight(pid)`` (default :attr:`aggregation_weight`); see :func:`average_uploads`."""
        return average_uploads(uploads, weight or self.aggregation_weight, self.aggregate_models)


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
