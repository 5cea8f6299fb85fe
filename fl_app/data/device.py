"""Device-local data: the training files a SuperNode holds on its own disk.

In deployment a node is started with ``--node-config "data-dir=/path/on/device"``
and trains on **every training example** in that directory, in the format the
run's dataset is read from anywhere else (see :func:`fl_app.data.load_dataset`),
except that the test files are optional (the server evaluates on its own test
set):

* ``mnist-5k``, ``mnist``, ``fashion-mnist``: ``train-images-idx3-ubyte`` and
  ``train-labels-idx1-ubyte`` (``.gz`` or not), in the directory or in
  ``DIR/<dataset>``; optionally the two ``t10k-*`` files. (``mnist-5k`` has no
  files of its own elsewhere; on a device it is read from IDX files like MNIST.)
* ``cifar10``: ``data_batch_1`` ... ``data_batch_5`` (python pickles), in the
  directory or in ``DIR/cifar-10-batches-py``; optionally ``test_batch``.
* ``cifar100``: ``train``, in the directory or in ``DIR/cifar-100-python``;
  optionally ``test``.
* ``sst2``, ``text-csv`` (the ``llm`` extra): the training file and the test
  file, as :func:`fl_app.data.text.load_text_dataset` reads them anywhere
  (``train.tsv`` and ``dev.tsv``; ``train.csv`` and ``test.csv``). The test
  file is not optional here: the labels are numbered over both files.
  :func:`fl_app.data.text.write_text_partition` writes them.

:func:`write_training_files` writes a set of examples in exactly that format
(what ``sflower partition`` uses to give each partition its own directory), so
that :func:`load_device_dataset` reads them back unchanged, in the same order.
Both use the parsers of :mod:`fl_app.data.files`.
"""

from __future__ import annotations

import gzip
import os
import pickle
from pathlib import Path

import numpy as np

from fl_app.data import files
from fl_app.data.dataset import DATASETS, ImageDataset, _make
from fl_app.data.text import TEXT_DATASETS, TextDataset, load_text_dataset
from fl_app.run.errors import ConfigError

__all__ = ["IDX_DATASETS", "INPUT_SHAPES", "load_device_dataset", "write_training_files"]

#: Datasets stored as IDX files on a device.
IDX_DATASETS: tuple[str, ...] = ("mnist-5k", "mnist", "fashion-mnist")
#: Image shape ``(C, H, W)`` each dataset's model is built for.
INPUT_SHAPES: dict[str, tuple[int, int, int]] = {
    "mnist-5k": (1, 28, 28), "mnist": (1, 28, 28), "fashion-mnist": (1, 28, 28),
    "cifar10": (3, 32, 32), "cifar100": (3, 32, 32),
}
_CIFAR_SUBDIRS = {"cifar10": "cifar-10-batches-py", "cifar100": "cifar-100-python"}
_CIFAR_TRAIN = {"cifar10": files._CIFAR10_FILES[:5], "cifar100": ("train",)}
_CIFAR_TEST = {"cifar10": "test_batch", "cifar100": "test"}
_CIFAR_LABEL_KEY = {"cifar10": b"labels", "cifar100": b"fine_labels"}


def _expected(name: str) -> str:
    if name in IDX_DATASETS:
        return "train-images-idx3-ubyte.gz, train-labels-idx1-ubyte.gz"
    return ", ".join(_CIFAR_TRAIN[name])


def load_device_dataset(name: str, data_dir: str | os.PathLike[str]) -> ImageDataset | TextDataset:
    """Read the training examples a device holds (not cached: see :func:`fl_app.learning.task.load_device_task`).

    Args:
        name: the run's dataset, one of :data:`~fl_app.data.DATASETS`; it
            selects the file format and the normalisation constants.
        data_dir: the device's directory (see the module docstring for the
            files it must hold). ``~`` is expanded.

    Returns:
        An :class:`ImageDataset` whose training split is every example in the
        files, in file order (uint8 ``[N, C, H, W]``, int64 labels ``[N]``);
        its test split is the optional test files, or empty (``[0, C, H, W]``).

    Raises:
        ConfigError (one line): unknown dataset, ``data_dir`` empty or not a
            directory, no training files of the dataset's format in it, corrupt
            files, images of another shape than the dataset's, labels out of
            range, or no training example at all.
    """
    if name not in DATASETS + TEXT_DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS + TEXT_DATASETS)}")
    if data_dir is None or str(data_dir).strip() == "":
        raise ConfigError("node data-dir is empty; start the SuperNode with --node-config 'data-dir=DIR'")
    path = Path(str(data_dir)).expanduser()
    if not path.is_dir():
        raise ConfigError(f"node data-dir '{data_dir}' does not exist or is not a directory")
    if name in TEXT_DATASETS:  # its own files, tokenised and cached as anywhere else (not cached in memory here)
        try:
            return load_text_dataset(name, path)
        except ConfigError as err:
            raise ConfigError(f"node data-dir '{data_dir}': {err}") from None
    if name in IDX_DATASETS:
        found = _load_idx_train(name, path)
    else:
        found = _load_cifar_train(name, path)
    if found is None:
        listing = sorted(p.name for p in path.iterdir())[:5]
        what = f"it holds {', '.join(listing)}{', ...' if len(listing) == 5 else ''}" if listing else "it is empty"
        raise ConfigError(f"node data-dir '{data_dir}' has no {name} training files "
                          f"(expected {_expected(name)}); {what}")
    ds = found
    if ds.input_shape != INPUT_SHAPES[name]:
        shape = "x".join(map(str, ds.input_shape))
        want = "x".join(map(str, INPUT_SHAPES[name]))
        raise ConfigError(f"node data-dir '{data_dir}': images are {shape}, dataset {name!r} needs {want}")
    if ds.x_train.shape[0] == 0:
        raise ConfigError(f"node data-dir '{data_dir}' holds no training examples")
    return ds


def _load_idx_train(name: str, path: Path) -> ImageDataset | None:
    """The IDX training files (and test files if present) under ``path`` or ``path/name``; None if absent."""
    train_stems, test_stems = files._IDX_FILES[:2], files._IDX_FILES[2:]
    for d in (path, path / name):
        train = _find(d, train_stems)
        if train is None:
            continue
        x = files.read_idx(train[0], 2051)
        y = files.read_idx(train[1], 2049)
        test = _find(d, test_stems)
        if test is not None:
            xt, yt = files.read_idx(test[0], 2051), files.read_idx(test[1], 2049)
        else:
            xt, yt = np.zeros((0, *x.shape[1:]), np.uint8), np.zeros(0, np.uint8)
        for xs, ys, split in ((x, y, "train"), (xt, yt, "test")):
            if xs.ndim != 3 or ys.ndim != 1 or xs.shape[0] != ys.shape[0]:
                raise ConfigError(f"node data-dir '{d}': {split} images {xs.shape} and labels {ys.shape} do not match")
        return _make(name, x[:, None], y, xt[:, None], yt)
    return None


_find = files.find_files


def _load_cifar_train(name: str, path: Path) -> ImageDataset | None:
    """The CIFAR training pickles (and the test pickle if present); None if absent."""
    key = _CIFAR_LABEL_KEY[name]
    for d in (path, path / _CIFAR_SUBDIRS[name]):
        if not all((d / f).is_file() for f in _CIFAR_TRAIN[name]):
            continue
        parts = [files._read_cifar_file(d / f, key) for f in _CIFAR_TRAIN[name]]
        x = np.concatenate([p[0] for p in parts])
        y = np.concatenate([p[1] for p in parts])
        test = d / _CIFAR_TEST[name]
        if test.is_file():
            xt, yt = files._read_cifar_file(test, key)
        else:
            xt, yt = np.zeros((0, 3, 32, 32), np.uint8), np.zeros(0, np.int64)
        return _make(name, x, y, xt, yt)
    return None


def write_training_files(name: str, x: np.ndarray, y: np.ndarray, out_dir: str | os.PathLike[str]) -> list[Path]:
    """Write training examples in the device format of dataset ``name`` (see the module docstring).

    ``mnist-5k``/``mnist``/``fashion-mnist``: ``train-images-idx3-ubyte.gz`` and
    ``train-labels-idx1-ubyte.gz``. ``cifar10``: ``data_batch_1`` ...
    ``data_batch_5`` (the examples cut into 5 near-equal consecutive chunks).
    ``cifar100``: ``train``. Files already there are overwritten; no test file
    is written. :func:`load_device_dataset` reads back exactly ``x`` and ``y``.

    Args:
        name: one of :data:`~fl_app.data.DATASETS`.
        x: uint8 ``[N, C, H, W]`` images (``C == 1`` for the IDX datasets,
            ``[N, 3, 32, 32]`` for CIFAR).
        y: ``[N]`` integer labels (``< 256`` for IDX files).
        out_dir: the directory (created with its parents if missing).

    Returns:
        The paths written.

    Raises:
        ConfigError: unknown dataset, or arrays of the wrong shape or dtype.
    """
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")
    x, y = np.asarray(x), np.asarray(y)
    if x.dtype != np.uint8 or x.ndim != 4 or tuple(x.shape[1:]) != INPUT_SHAPES[name] or y.shape != (x.shape[0],):
        raise ConfigError(f"cannot write {name}: images {x.shape} {x.dtype} and labels {y.shape} "
                          f"(need uint8 [N, {', '.join(map(str, INPUT_SHAPES[name]))}] and [N])")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if name in IDX_DATASETS:
        if y.size and (y.min() < 0 or y.max() > 255):
            raise ConfigError(f"cannot write {name}: labels outside 0..255 do not fit an IDX file")
        written = [out / "train-images-idx3-ubyte.gz", out / "train-labels-idx1-ubyte.gz"]
        _write_idx(written[0], x[:, 0], 2051)
        _write_idx(written[1], y.astype(np.uint8), 2049)
        return written
    written = []
    chunks = np.array_split(np.arange(x.shape[0]), len(_CIFAR_TRAIN[name]))
    for fname, idx in zip(_CIFAR_TRAIN[name], chunks):
        target = out / fname
        record = {b"data": np.ascontiguousarray(x[idx].reshape(len(idx), 3 * 32 * 32)),
                  _CIFAR_LABEL_KEY[name]: [int(v) for v in y[idx]]}
        with open(target, "wb") as fh:
            pickle.dump(record, fh, protocol=4)
        written.append(target)
    return written


def _write_idx(path: Path, arr: np.ndarray, magic: int) -> None:
    """One gzip-compressed IDX file: magic, big-endian dimensions, uint8 data."""
    header = magic.to_bytes(4, "big") + b"".join(int(s).to_bytes(4, "big") for s in arr.shape)
    # mtime=0: the same examples always give the same bytes
    with gzip.GzipFile(path, "wb", mtime=0) as fh:
        fh.write(header + np.ascontiguousarray(arr, dtype=np.uint8).tobytes())
