"""Saved models: the trained model of a run as safetensors, and its evaluation (``sflower evaluate``).

At the end of a completed run the run directory gets:

* ``model.safetensors``: the full block model, client and server parts joined
  (the strategy's ``global_model()``, the model the final metric row
  evaluated), as a ``state_dict`` (``blocks.<name>.<param>`` keys, float32,
  buffers included), written with :func:`safetensors.torch.save_model`;
* ``model.json``: what is needed to rebuild and evaluate it: model name, cut
  layer, dataset, input shape ``[C, H, W]``, number of classes, pixel
  normalisation, and where it comes from (strategy, seed, global iteration,
  its test accuracy and loss);
* for strategies that evaluate a model per client (the PSL family,
  ``evaluation_models()``): ``model-clients.safetensors``, each client's
  client-side model (blocks ``[0, cut)``) under the keys ``"<pid>:<key>"``;
  the final metric is the mean over these clients of ``client_k ∘ server``.

With ``save-best=true`` the best-accuracy model so far is kept the same way
under ``model-best.*`` (written whenever a metric row beats the best before
it). :func:`evaluate_saved_model` rebuilds a saved model and evaluates it on a
test set; on the run's own test set it returns the run's metric exactly (same
weights, same batches, same arithmetic; torch's thread count must be the
run's, as for any rerun).
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fl_app.run.config import given_or_default
from fl_app.run.errors import ConfigError
from fl_app.run.untrusted import read_json
from fl_app.models import BlockModel
from simulation.outputs.records import RunListener

__all__ = ["MODEL_FILE", "BEST_MODEL_FILE", "SavedModel", "ModelSaver", "save_model", "load_saved_model",
           "evaluate_saved_model", "resolve_model_path"]

#: The final model of a run, in its run directory.
MODEL_FILE = "model.safetensors"
#: The best-accuracy model (``save-best=true``).
BEST_MODEL_FILE = "model-best.safetensors"
#: Version of the ``model.json`` layout.
FORMAT = "sflower.saved-model/1"


def _sidecar(path: Path) -> Path:
    """``model.safetensors`` -> ``model.json``."""
    return path.with_suffix(".json")


def _clients_file(path: Path) -> Path:
    """``model.safetensors`` -> ``model-clients.safetensors``."""
    return path.with_name(path.stem + "-clients.safetensors")


def save_model(path: str | Path, model: BlockModel, meta: Mapping[str, Any],
               client_models: Mapping[int, BlockModel] | None = None) -> None:
    """Write ``model`` to ``path`` (safetensors), ``meta`` beside it, and the per-client client-side models.

    Args:
        path: the ``.safetensors`` file; ``<stem>.json`` and, with
            ``client_models``, ``<stem>-clients.safetensors`` go beside it.
        model: the full block model (any device; written from the CPU).
        meta: the JSON description (:meth:`ModelSaver.describe`); must hold
            ``cut-layer``.
        client_models: ``pid -> full model`` of a strategy with per-client
            models; blocks ``[0, cut-layer)`` of each are written.
    """
    from safetensors.torch import save_file, save_model as st_save_model

    path = Path(path)
    meta = dict(meta)
    meta["client-models"] = None
    meta["clients"] = []
    if client_models:
        cut = int(meta["cut-layer"])
        tensors = {f"{pid}:{k}": v.detach().cpu().contiguous()
                   for pid, m in client_models.items() for k, v in m.segment(0, cut).state_dict().items()}
        save_file(tensors, str(_clients_file(path)), metadata={"format": "pt"})
        meta["client-models"] = _clients_file(path).name
        meta["clients"] = [int(p) for p in client_models]
    st_save_model(model, str(path), metadata={"format": "pt"})
    _sidecar(path).write_text(json.dumps(meta, indent=2) + "\n")


@dataclass
class SavedModel:
    """A model read back by :func:`load_saved_model`.

    Attributes:
        meta: the ``model.json`` content.
        model: the full block model (CPU, eval mode).
        client_models: ``pid -> full model`` (the full model with client
            ``pid``'s client-side blocks), in the saved order; empty when the
            run had one global model.
    """

    meta: dict[str, Any]
    model: BlockModel
    client_models: dict[int, BlockModel]


def resolve_model_path(target: str | Path) -> Path:
    """A run directory (-> its ``model.safetensors``) or a ``.safetensors`` file.

    Raises:
        ConfigError: no such directory or file, or no saved model in the directory.
    """
    path = Path(target)
    if path.is_dir():
        path = path / MODEL_FILE
        if not path.is_file():
            raise ConfigError(f"{target}: no {MODEL_FILE} (a run writes it when it completes)")
    elif not path.is_file():
        raise ConfigError(f"{target}: no such run directory or model file")
    if not _sidecar(path).is_file():
        raise ConfigError(f"{path}: its description {_sidecar(path).name} is missing")
    return path


def load_saved_model(target: str | Path) -> SavedModel:
    """Rebuild a saved model (a run directory or a ``.safetensors`` file written by :func:`save_model`).

    Raises:
        ConfigError: missing or unreadable files, another format, or weights
            that do not fit the described model.
    """
    import copy

    from safetensors import SafetensorError
    from safetensors.torch import load_file, load_model

    from fl_app.models import build_model

    path = resolve_model_path(target)
    meta = read_json(_sidecar(path))  # untrusted: bounded size and depth, one-line errors
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ConfigError(f"{_sidecar(path)}: not an sflower model description ({FORMAT})")
    missing = [k for k in ("model", "input-shape", "num-classes", "cut-layer", "dataset") if k not in meta]
    if missing:
        raise ConfigError(f"{_sidecar(path)}: {', '.join(missing)} missing")
    try:
        shape, classes = tuple(int(n) for n in meta["input-shape"]), int(meta["num-classes"])
        if len(shape) != 3 or not all(0 < n <= 4096 for n in shape) or not 0 < classes <= 100_000:
            raise ValueError("input-shape or num-classes out of range")
        model = build_model(str(meta["model"]), shape, classes)
    except (TypeError, ValueError, OverflowError, RuntimeError) as err:
        raise ConfigError(f"{_sidecar(path)}: describes no buildable model ({type(err).__name__})") from None
    try:
        load_model(model, str(path), strict=True)
        clients = {}
        if meta.get("client-models"):
            tensors = load_file(str(path.with_name(meta["client-models"])))
            for pid in list(meta["clients"]):
                m = copy.deepcopy(model)
                m.segment(0, int(meta["cut-layer"])).load_state_dict(
                    {k.split(":", 1)[1]: v for k, v in tensors.items() if k.split(":", 1)[0] == str(pid)})
                clients[int(pid)] = m
    except (OSError, RuntimeError, ValueError, KeyError, TypeError, SafetensorError) as err:  # bad file, wrong weights
        raise ConfigError(f"{path}: cannot load into {meta['model']}: {str(err).strip().splitlines()[0]}") from None
    model.eval()
    return SavedModel(meta, model, clients)


def evaluate_saved_model(target: str | Path, dataset: str | None = None, data_dir: str | None = None,
                         device: str = "auto") -> dict[str, Any]:
    """Evaluate a saved model on a test set: the run's (default) or another of the same shape and classes.

    Args:
        target: a run directory or a ``.safetensors`` file.
        dataset: the dataset whose test set is used (default: the run's).
        data_dir: its files (default: none: embedded or from the hub). A
            ``data-dir`` that ``model.json`` records is never read: the
            user names it (:mod:`fl_app.run.untrusted`).
        device: where to evaluate (``auto``, ``cpu``, ``cuda[:N]``).

    Returns:
        ``{"test_accuracy", "test_loss", "test_examples", "dataset", "meta"}``,
        plus ``client_accuracy_mean/min/max`` for per-client models (then
        accuracy and loss are the means over clients, as in the run).

    Raises:
        ConfigError: unreadable model, unknown dataset or missing data, a
            ``model.json`` naming a ``data-dir`` the user did not give, or a
            dataset whose image shape or class count differs from the model's.
    """
    from fl_app.data import load_dataset
    from fl_app.run.device import resolve_device
    from fl_app.learning.task import normalised
    from fl_app.learning.training import evaluate_model

    saved = load_saved_model(target)
    meta = saved.meta
    name = dataset or str(meta["dataset"])
    recorded = str(meta.get("data-dir") or "")
    if data_dir is None and recorded and name == meta["dataset"]:  # a run directory is untrusted input
        raise ConfigError(f"{_sidecar(resolve_model_path(target))} names data-dir={recorded[:200]!r}; sflower reads no "
                          "directory a run directory names: pass data-dir=... yourself")
    data = normalised(load_dataset(name, data_dir or None), str(given_or_default(meta, "normalize")))
    if list(data.input_shape) != list(meta["input-shape"]) or data.num_classes != int(meta["num-classes"]):
        raise ConfigError(f"{name} has {data.num_classes} classes of shape {list(data.input_shape)}; the model takes "
                          f"{meta['num-classes']} classes of shape {meta['input-shape']}")
    dev = resolve_device(device)
    models: Sequence[BlockModel] = list(saved.client_models.values()) or [saved.model]
    # the arithmetic of SFLStrategy.evaluate_global: float64 means over the models
    results = np.array([evaluate_model(m.to(dev), data.test_batches())[:2] for m in models], dtype=np.float64)
    out: dict[str, Any] = {"test_loss": float(results[:, 0].mean()), "test_accuracy": float(results[:, 1].mean()),
                           "test_examples": int(data.y_test.numel()), "dataset": name, "meta": meta}
    if saved.client_models:
        out.update(client_accuracy_mean=float(results[:, 1].mean()), client_accuracy_min=float(results[:, 1].min()),
                   client_accuracy_max=float(results[:, 1].max()))
    return out


class ModelSaver(RunListener):
    """Saves a run's models from its metric rows (a :class:`simulation.outputs.records.RunRecorder` listener).

    * :meth:`on_finish` of a completed run writes :data:`MODEL_FILE`;
    * with ``save_best``, :meth:`on_row` writes :data:`BEST_MODEL_FILE`
      whenever a row's ``test_accuracy`` beats every row before it.

    Call :meth:`bind` with the strategy before the run starts; the models
    come from its ``global_model()`` and ``evaluation_models()``.

    Args:
        out_dir: the run directory.
        meta: the run's part of ``model.json`` (:meth:`describe`).
        save_best: keep the best model too (``save-best``).
    """

    def __init__(self, out_dir: str | Path, meta: Mapping[str, Any], save_best: bool = False) -> None:
        self.out_dir = Path(out_dir)
        self.meta = dict(meta)
        self.save_best = save_best
        self.best = -math.inf
        self.strategy: Any = None
        self._last_row: Mapping[str, Any] = {}

    @staticmethod
    def describe(cfg: Any, task: Any) -> dict[str, Any]:
        """The run's part of ``model.json`` from its ``RunConfig`` and ``Task``."""
        return {"format": FORMAT, "model": cfg.model, "init": cfg.init, "cut-layer": int(cfg.cut_layer),
                "dataset": cfg.dataset, "data-dir": cfg.data_dir, "normalize": cfg.normalize,
                "input-shape": list(task.data.input_shape), "num-classes": int(task.data.num_classes),
                "mean": list(task.data.mean), "std": list(task.data.std), "strategy": cfg.strategy,
                "seed": int(cfg.seed)}

    def bind(self, strategy: Any) -> None:
        """The strategy whose models are saved."""
        self.strategy = strategy

    def on_row(self, row: Mapping[str, Any]) -> None:
        """Keep the row; with ``save-best``, save the model when the row's accuracy is a new best."""
        self._last_row = row
        acc = float(row["test_accuracy"])
        if self.save_best and acc > self.best:
            self.best = acc
            self.save(self.out_dir / BEST_MODEL_FILE, row, which="best")

    def on_resume(self, rows: Sequence[Mapping[str, Any]]) -> None:
        """A resumed run: the best so far is the best of the checkpoint's rows (its file is already written)."""
        finite = [float(r["test_accuracy"]) for r in rows if math.isfinite(float(r["test_accuracy"]))]
        self.best = max(finite, default=-math.inf)
        self._last_row = rows[-1] if rows else {}

    def on_finish(self, summary: Mapping[str, Any]) -> None:
        """A completed run: save the final model (the one its last row evaluated)."""
        if summary.get("status") == "completed" and self.strategy is not None and self._last_row:
            self.save(self.out_dir / MODEL_FILE, self._last_row, which="final")

    def save(self, path: Path, row: Mapping[str, Any], which: str) -> None:
        """Write the strategy's current models to ``path`` with ``row``'s figures in ``model.json``."""
        strategy = self.strategy
        meta = {**self.meta, "which": which, "cut-layer": int(getattr(strategy, "cut", self.meta["cut-layer"])),
                "global-iteration": int(row["global_iteration"]), "test-accuracy": float(row["test_accuracy"]),
                "test-loss": float(row["test_loss"]), "virtual-time-s": float(row["virtual_time_s"])}
        with torch.no_grad():
            save_model(path, strategy.global_model(), meta, strategy.evaluation_models())
