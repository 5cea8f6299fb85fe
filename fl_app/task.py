"""The learning task of a run: dataset, partitions and splittable model.

Both sides build the same :class:`Task` from the run configuration: the
ServerApp to evaluate and to time work, each ClientApp to train on its
partition. Building it is cached per process, because a ClientApp is
called once per message.
"""

from __future__ import annotations

import copy
import functools
from dataclasses import dataclass

import numpy as np
import torch

from fl_app.config import RunConfig
from fl_app.data import ImageDataset, label_histogram, load_dataset, partition_indices
from fl_app.errors import ConfigError
from fl_app.models import BlockModel, BlockProfile, build_model, profile_blocks, split_model

#: Keys of the run configuration that define the task (data, partition, model).
TASK_KEYS = (
    "dataset", "data-dir", "partition", "alpha", "shards", "min-partition-size", "num-clients",
    "model", "cut-layer", "seed", "init",
)


@dataclass(frozen=True, eq=False)
class Task:
    """Dataset, partitions and model of one run.

    Attributes:
        data: the dataset (training and test split, uint8 in memory).
        partitions: ``num-clients`` int64 index arrays into the training set.
        model_name: a name from :data:`fl_app.models.MODELS`.
        cut_layer: the default cut; the client-side model is blocks
            ``[0, cut_layer)``.
        seed: the seed the initial model is built from.
        partition_scheme: the ``partition`` key (``iid``, ``dirichlet``, ...).
        init: the weight initialisation (``default``, ``ringsfl`` or ``torch-default``, see
            :func:`fl_app.models.build_model`); part of :data:`TASK_KEYS`,
            so the server and every client build the same initial model.
    """

    data: ImageDataset
    partitions: tuple[np.ndarray, ...]
    model_name: str
    cut_layer: int
    seed: int
    partition_scheme: str = "iid"
    init: str = "default"

    @functools.cached_property
    def _template(self) -> BlockModel:
        return build_model(self.model_name, self.data.input_shape, self.data.num_classes, self.seed, init=self.init)

    def build_model(self) -> BlockModel:
        """A fresh full model with the run's seeded initial weights (a copy of a cached template)."""
        return copy.deepcopy(self._template)

    def build_segment(self, start: int, end: int) -> BlockModel:
        """A fresh copy of blocks ``[start, end)`` only (cheap: the other blocks are not copied)."""
        return copy.deepcopy(self._template.segment(start, end))

    def split(self, cut: int | None = None) -> tuple[BlockModel, BlockModel]:
        """A fresh model split at ``cut`` (default: the run's cut layer)."""
        return split_model(self.build_model(), self.cut_layer if cut is None else cut)

    @functools.cached_property
    def profiles(self) -> list[BlockProfile]:
        """Per-block FLOPs per sample, parameter bytes and output shapes."""
        return profile_blocks(self.build_model(), self.data.input_shape)

    def num_examples(self, partition_id: int) -> int:
        """Training examples held by a partition."""
        return int(len(self.partitions[partition_id]))

    def histogram(self, partition_id: int) -> np.ndarray:
        """int64 ``[num_classes]`` label counts of a partition."""
        labels = self.data.y_train.numpy()[self.partitions[partition_id]]
        return label_histogram(labels, self.data.num_classes)


def load_task(cfg: RunConfig) -> Task:
    """Build (or fetch from the per-process cache) the task of ``cfg``.

    Raises:
        ConfigError: unknown dataset or model, missing data, impossible
            partition, cut layer out of range.
    """
    key = tuple((k, cfg.get(k)) for k in TASK_KEYS)
    return _load_task(key)


@functools.lru_cache(maxsize=4)
def _load_task(key: tuple[tuple[str, object], ...]) -> Task:
    values = dict(key)
    data = load_dataset(str(values["dataset"]), str(values["data-dir"]) or None)
    parts = partition_indices(
        data.y_train.numpy(),
        int(values["num-clients"]),
        str(values["partition"]),
        alpha=float(values["alpha"]),
        shards=int(values["shards"]),
        seed=int(values["seed"]),
        min_partition_size=int(values["min-partition-size"]),
    )
    task = Task(
        data=data,
        partitions=tuple(parts),
        model_name=str(values["model"]),
        cut_layer=int(values["cut-layer"]),
        seed=int(values["seed"]),
        partition_scheme=str(values["partition"]),
        init=str(values["init"]),
    )
    task.split()  # validates model name and cut layer
    return task


def check_batch_size(task: Task, batch_size: int) -> None:
    """Refuse a batch size larger than the smallest partition.

    Raises:
        ConfigError: naming the smallest partition and its size.
    """
    sizes = [len(p) for p in task.partitions]
    smallest = int(np.argmin(sizes))
    if batch_size > sizes[smallest]:
        raise ConfigError(
            f"batch-size={batch_size} is larger than partition {smallest} "
            f"({sizes[smallest]} examples); lower batch-size or num-clients"
            + (", or raise min-partition-size" if task.partition_scheme == "dirichlet" else "")
        )


def seeded_generator(*seed_parts: int) -> torch.Generator:
    """A CPU ``torch.Generator`` seeded from integers (order-sensitive)."""
    seq = np.random.SeedSequence([int(s) for s in seed_parts])
    return torch.Generator().manual_seed(int(seq.generate_state(1, np.uint64)[0] >> 1))
