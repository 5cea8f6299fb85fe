"""Evaluation: test loss and accuracy of the global model, or their means over per-client models.

:func:`evaluate_models` is what :meth:`strategies.core.base.SFLStrategy.evaluate_global`
computes; it receives the models and the test data, not the strategy.
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import numpy as np
import torch

from fl_app.run.device import model_device
from fl_app.models import BlockModel
from fl_app.learning.training import evaluate_model

Batches = Iterable[tuple[torch.Tensor, torch.Tensor]]


def take(batches: Batches, limit: int) -> Batches:
    """The first ``limit`` examples of a stream of ``(x, y)`` batches."""
    left = limit
    for x, y in batches:
        if left <= 0:
            return
        yield x[:left], y[:left]
        left -= int(y.shape[0])


def evaluate_models(model: BlockModel | None, models: Mapping[Any, BlockModel] | None, device: torch.device,
                    test_batches: Callable[[], Batches], limit: int = 0) -> tuple[float, float, dict[str, float]]:
    """Test loss and accuracy of ``model``, or, when ``models`` is given, their means over those models.

    Args:
        model: the one global model (used when ``models`` is None).
        models: per-client full models (``client_k ∘ server``), or None.
        device: where to evaluate (a model elsewhere is copied there).
        test_batches: a fresh stream of the test set's ``(x, y)`` batches.
        limit: evaluate only the first ``limit`` test examples (0: all).

    Returns:
        ``(loss, accuracy, extra columns)``; with per-client models the extra
        columns hold ``client_accuracy_mean/min/max``.
    """

    def evaluate(m: BlockModel) -> tuple[float, float]:
        if model_device(m) != device:  # e.g. an FL model, aggregated on the CPU
            m = copy.deepcopy(m).to(device)
        batches = test_batches()
        loss, acc, _ = evaluate_model(m, take(batches, limit) if limit else batches)
        return loss, acc

    if models is None:
        return (*evaluate(model), {})
    results = np.array([evaluate(m) for m in models.values()], dtype=np.float64)
    accs = results[:, 1]
    extra = {"client_accuracy_mean": float(accs.mean()), "client_accuracy_min": float(accs.min()),
             "client_accuracy_max": float(accs.max())}
    return float(results[:, 0].mean()), float(accs.mean()), extra
