"""The learning task of a run: dataset, partitions and splittable model.

Both sides build the same :class:`Task` from the run configuration: the
ServerApp to evaluate and to time work, each ClientApp to train on its
partition. Building it is cached per process, because a ClientApp is
called once per message.

A node with device-local data (``--node-config data-dir=DIR``) builds its
task with :func:`load_device_task` instead: the same model, but the data
is the examples in its own directory and its one partition is all of them.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fl_app.run.config import RunConfig
from fl_app.data import (ImageDataset, label_histogram, load_dataset, load_device_dataset, parse_partition_sizes,
                         partition_indices)
from fl_app.run.errors import ConfigError
from fl_app.models import BlockModel, BlockProfile, build_model, profile_blocks, split_model

#: Keys of the run configuration that define the task (data, partition, model).
TASK_KEYS = (
    "dataset", "data-dir", "partition", "alpha", "shards", "min-partition-size", "num-classes-per-partition",
    "class-assignment-mode", "partition-sizes", "num-clients", "model", "cut-layer", "seed", "init", "init-seed",
    "partition-seed", "normalize", "aux-holdout", "lora-rank", "lora-alpha", "lora-targets",
    "text-padding",
)


@dataclass(frozen=True, eq=False)
class Task:
    """Dataset, partitions and model of one run.

    Attributes:
        data: the dataset (training and test split, uint8 in memory).
        partitions: ``num-clients`` int64 index arrays into the training set
            (a device task: :class:`DevicePartition`, the device's examples
            under any partition id).
        model_name: a name from :data:`fl_app.models.MODELS`.
        cut_layer: the default cut; the client-side model is blocks
            ``[0, cut_layer)``.
        seed: the run's seed (data order, augmentation, dropout, ZO directions;
            the initial model too unless ``init_seed`` is set).
        partition_scheme: the ``partition`` key (``iid``, ``dirichlet``, ...).
        init: the weight initialisation (``default``, ``ringsfl`` or ``torch-default``, see
            :func:`fl_app.models.build_model`); part of :data:`TASK_KEYS`,
            so the server and every client build the same initial model.
        init_seed: the seed the initial model is built from; ``-1`` (default): ``seed``.
        holdout: int64 indices into the training set that no partition contains (``aux-holdout``: the
            auxiliary data of ``sflower attack``); None when nothing is held out.
        lora: a pretrained model's LoRA keywords (:func:`lora_options`), ``()`` for the other models.
    """

    data: ImageDataset
    partitions: Sequence[np.ndarray]
    model_name: str
    cut_layer: int
    seed: int
    partition_scheme: str = "iid"
    init: str = "default"
    init_seed: int = -1
    holdout: np.ndarray | None = None
    lora: tuple[tuple[str, object], ...] = ()

    @functools.cached_property
    def _template(self) -> BlockModel:
        seed = self.seed if self.init_seed < 0 else self.init_seed
        return build_model(self.model_name, self.data.input_shape, self.data.num_classes, seed, init=self.init,
                           **dict(self.lora))

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
    preloaded = _PRELOADED.get(key)
    return preloaded if preloaded is not None else _load_task(key)


#: Tasks an engine handed to this process, by task key (see :func:`preload_task`).
_PRELOADED: dict[tuple[tuple[str, object], ...], Task] = {}


def preload_task(cfg: RunConfig, task: Task) -> None:
    """Make :func:`load_task` return ``task`` for ``cfg``'s task in this process.

    For engines whose clients run in other processes (the Ray actors of
    :func:`simulation.ray_engine.run_ray`): the driver loads the dataset and
    partitions once and hands them over, instead of every actor reading and
    partitioning the dataset again. ``task`` must hold what :func:`load_task`
    builds for ``cfg`` (the driver's data and partitions, unchanged); its
    model template is built from the seed on first use. At most 4 are kept.
    """
    key = tuple((k, cfg.get(k)) for k in TASK_KEYS)
    if len(_PRELOADED) >= 4 and key not in _PRELOADED:
        _PRELOADED.clear()
    _PRELOADED[key] = task


@functools.lru_cache(maxsize=4)
def _load_task(key: tuple[tuple[str, object], ...]) -> Task:
    values = dict(key)
    data = normalised(load_dataset(str(values["dataset"]), str(values["data-dir"]) or None), str(values["normalize"]),
                      str(values["text-padding"]))
    seed = int(values["seed"]) if int(values["partition-seed"]) < 0 else int(values["partition-seed"])
    pool, holdout = held_out(len(data.y_train), int(values["aux-holdout"]), seed)
    parts = partition_indices(
        data.y_train.numpy() if pool is None else data.y_train.numpy()[pool],
        int(values["num-clients"]),
        str(values["partition"]),
        alpha=float(values["alpha"]),
        shards=int(values["shards"]),
        seed=seed,
        min_partition_size=int(values["min-partition-size"]),
        num_classes_per_partition=int(values["num-classes-per-partition"]),
        class_assignment_mode=str(values["class-assignment-mode"]),
        partition_sizes=parse_partition_sizes(str(values["partition-sizes"])),
    )
    if pool is not None:  # indices into the pool -> into the training set
        parts = [pool[np.asarray(p, dtype=np.int64)] for p in parts]
    task = Task(
        data=data,
        partitions=tuple(parts),
        model_name=str(values["model"]),
        cut_layer=int(values["cut-layer"]),
        seed=int(values["seed"]),
        partition_scheme=str(values["partition"]),
        init=str(values["init"]),
        init_seed=int(values["init-seed"]),
        holdout=holdout,
        lora=lora_options(values),
    )
    task.split()  # validates model name and cut layer
    return task


def lora_options(values: dict[str, object]) -> tuple[tuple[str, object], ...]:
    """The LoRA keywords of :func:`fl_app.models.build_model` from the run config's task values
    (``lora-rank``, ``lora-alpha``, ``lora-targets``); ``()`` unless ``model`` is ``minilm-l6``."""
    if values["model"] != "minilm-l6":
        return ()
    return (("lora_rank", int(values["lora-rank"])), ("lora_alpha", float(values["lora-alpha"])),
            ("lora_targets", str(values["lora-targets"])))


def held_out(n: int, count: int, seed: int) -> tuple[np.ndarray | None, np.ndarray | None]:
    """``(pool, holdout)``: ``holdout`` is ``count`` of the ``n`` training indices drawn without replacement
    (the head of a ``numpy.random.default_rng((seed, 35))`` permutation), ``pool`` the others, which the
    partitions are built from; both sorted int64. ``count`` 0: ``(None, None)`` (every index is partitioned,
    as before).

    Raises:
        ConfigError: ``count`` leaves fewer than one training example.
    """
    if count <= 0:
        return None, None
    if count >= n:
        raise ConfigError(f"aux-holdout={count} leaves no training example (the dataset has {n})")
    perm = np.random.default_rng((int(seed), 35)).permutation(n)
    return np.sort(perm[count:]).astype(np.int64), np.sort(perm[:count]).astype(np.int64)


def normalised(data: ImageDataset, scheme: str, padding: str = "batch") -> ImageDataset:
    """``data`` with the pixel normalisation of ``normalize`` (a text dataset: with ``text-padding``).

    ``dataset``: the dataset's own mean and standard deviation (unchanged).
    ``half``: ``(x − 0.5) / 0.5`` per channel, i.e. pixels in ``[−1, 1]``,
    as the RingSFL authors' loaders (``Normalize((0.5,), (0.5,))``).
    """
    if getattr(data, "padding", padding) != padding:  # a text dataset (fl_app.data.text)
        data = dataclasses.replace(data, padding=padding)
    if scheme == "half":
        c = len(data.mean)
        return dataclasses.replace(data, mean=(0.5,) * c, std=(0.5,) * c)
    return data


class DevicePartition(Sequence):
    """The one partition of a device task: all ``n`` training examples, under any partition id.

    A node with device-local data indexes ``task.partitions[partition_id]``
    with its own id (as the training code does in simulation); every id gives
    ``arange(n)``, so that the id only seeds the node's randomness. Its length
    is 1 and it iterates over that one array.
    """

    def __init__(self, n: int) -> None:
        self._all = np.arange(int(n), dtype=np.int64)
        self._all.setflags(write=False)

    def __getitem__(self, partition_id: int) -> np.ndarray:  # type: ignore[override]
        return self._all

    def __len__(self) -> int:
        return 1

    def __iter__(self) -> Iterator[np.ndarray]:
        yield self._all


def load_device_task(cfg: RunConfig, data_dir: str) -> Task:
    """The task of a node that holds its own data in ``data_dir`` (cached per process).

    The model (``model``, ``cut-layer``, ``seed``, ``init``) is the run's; the
    data is every training example in ``data_dir``, read as the run's
    ``dataset`` (see :func:`fl_app.data.load_device_dataset`); the run's
    ``data-dir`` and partition keys are not used. ``task.partitions[k]`` is
    all the examples for any ``k`` (:class:`DevicePartition`).

    Raises:
        ConfigError: missing or empty directory, files of another format,
            corrupt files, wrong image shape (one line each); unknown model or
            cut layer out of range.
    """
    key = tuple((k, cfg.get(k)) for k in TASK_KEYS)
    return _load_device_task(key, str(data_dir))


@functools.lru_cache(maxsize=4)
def _load_device_task(key: tuple[tuple[str, object], ...], data_dir: str) -> Task:
    values = dict(key)
    data = normalised(load_device_dataset(str(values["dataset"]), data_dir), str(values["normalize"]),
                      str(values["text-padding"]))
    task = Task(
        data=data,
        partitions=DevicePartition(data.x_train.shape[0]),
        model_name=str(values["model"]),
        cut_layer=int(values["cut-layer"]),
        seed=int(values["seed"]),
        partition_scheme="device",
        init=str(values["init"]),
        init_seed=int(values["init-seed"]),
        lora=lora_options(values),
    )
    task.split()  # validates model name and cut layer
    return task


#: Run-config keys that define a run's partitions (what ``sflower partition`` takes, besides ``out``).
PARTITION_KEYS = ("dataset", "data-dir", "num-clients", "partition", "alpha", "shards", "seed", "min-partition-size",
                  "num-classes-per-partition", "class-assignment-mode", "partition-sizes")

#: The keys each partition scheme reads besides ``num-clients`` and ``seed`` (in ``partition.json``).
SCHEME_KEYS: dict[str, tuple[str, ...]] = {
    "dirichlet": ("alpha", "min-partition-size"),
    "shard": ("shards",),
    "pathological": ("num-classes-per-partition", "class-assignment-mode"),
    "inner-dirichlet": ("alpha", "partition-sizes"),
}


def write_partition_dirs(cfg: RunConfig, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write each partition of the run's training set to ``out_dir/partition-K`` (``sflower partition``).

    The partitions are the simulation's (:func:`load_task`'s, from the
    :data:`PARTITION_KEYS` of ``cfg``), each written in the device format of
    the dataset (:func:`fl_app.data.write_training_files`; a text dataset's
    sentences with :func:`fl_app.data.text.write_text_partition`), in partition
    order, so that a node started with ``data-dir=out_dir/partition-K`` and
    ``partition-id=K`` trains exactly like simulated client ``K``. Each
    directory also gets ``partition.json`` (dataset, partition id and scheme
    with its keys, size, label histogram), for people: nodes do not read it;
    ``out_dir/partition.png`` shows the split
    (:func:`fl_app.data.partition_plot.plot_partitions`).

    Returns:
        The ``num-clients`` directories, ``partition-0`` first.

    Raises:
        ConfigError: the configuration (dataset, data, partition) is bad, or
            ``out_dir`` exists and is not a directory.
    """
    import json

    from fl_app.data import write_training_files
    from fl_app.data.text import TEXT_DATASETS, write_text_partition

    out = Path(out_dir).expanduser()
    if out.exists() and not out.is_dir():
        raise ConfigError(f"out '{out_dir}' exists and is not a directory")
    task = load_task(cfg)
    scheme = {k: cfg.get(k) for k in SCHEME_KEYS.get(cfg.partition, ())}
    x, y = task.data.x_train.numpy(), task.data.y_train.numpy()
    dirs = []
    text = task.data.name in TEXT_DATASETS
    for k, part in enumerate(task.partitions):
        d = out / f"partition-{k}"
        if text:  # the partition's sentences as they are in the source file, and the test file
            write_text_partition(task.data.name, Path(cfg.data_dir).expanduser(), part, d)
        else:
            write_training_files(task.data.name, x[part], y[part], d)
        meta = {"dataset": task.data.name, "partition-id": k, "num-partitions": len(task.partitions),
                "partition": cfg.partition, "seed": cfg.seed, **scheme, "num-examples": int(len(part)),
                "label-histogram": task.histogram(k).tolist()}
        (d / "partition.json").write_text(json.dumps(meta) + "\n")
        dirs.append(d)
    write_partition_plot(task, out / "partition.png")
    return dirs


def partition_config(pairs: dict[str, object]) -> RunConfig:
    """The run configuration of ``sflower partition``'s keys (:data:`PARTITION_KEYS`): ``concurrency`` 1 and,
    for a text dataset, ``model=minilm-l6`` (the task holds a model, and the image models take no text).

    Raises:
        ConfigError: a bad key or value.
    """
    from fl_app.data.text import TEXT_DATASETS

    cfg = RunConfig.from_mapping({**pairs, "concurrency": 1})
    return RunConfig.from_mapping({**pairs, "concurrency": 1, "model": "minilm-l6"}) if cfg.dataset in TEXT_DATASETS else cfg


def write_partition_plot(task: Task, path: str | os.PathLike[str]) -> None:
    """``partition.png`` of ``task``: its partitions' label histograms, as stacked bars (client sizes on top) up
    to 100 clients, as a client × label heatmap of the counts above (:data:`~fl_app.data.partition_plot.MAX_BAR_CLIENTS`).

    See :func:`fl_app.data.partition_plot.plot_partitions`.
    """
    from fl_app.data.partition_plot import plot_partitions

    plot_partitions(task.data.y_train.numpy(), task.partitions, task.data.num_classes, path,
                    title=f"{task.data.name}: partition={task.partition_scheme}, {len(task.partitions)} clients")


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
