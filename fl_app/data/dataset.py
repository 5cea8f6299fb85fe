"""The in-memory dataset container and its per-dataset constants.

Images stay ``uint8`` in memory (``[N, C, H, W]``); batches are converted to
normalised ``float32`` on demand by :meth:`ImageDataset.train_batch` and
:meth:`ImageDataset.test_batches`. Training batches of the CIFAR datasets get a
random crop plus horizontal flip drawn from a caller-supplied generator.

Also here: :data:`DATASETS` (the known dataset names), the normalisation
statistics, :func:`_make` (arrays -> :class:`ImageDataset`, shared by the file
and hub loaders) and :func:`label_histogram`.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch

from fl_app.run.errors import ConfigError

__all__ = ["DATASETS", "ImageDataset", "label_histogram"]

DATASETS: tuple[str, ...] = ("mnist-5k", "mnist", "fashion-mnist", "cifar10", "cifar100")

_MNIST_MEAN, _MNIST_STD = (0.1307,), (0.3081,)
_FMNIST_MEAN, _FMNIST_STD = (0.286,), (0.3205,)
_CIFAR10_MEAN, _CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)
_CIFAR100_MEAN, _CIFAR100_STD = (0.5071, 0.4865, 0.4409), (0.2673, 0.2564, 0.2762)

_CROP_PAD = 4  # random-crop padding for CIFAR augmentation


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
        scale = self.__dict__.get("_scale")  # (mean, std) as [1, C, 1, 1] tensors, built once
        if scale is None:
            c = x.shape[1]
            scale = (torch.tensor(self.mean, dtype=torch.float32).view(1, c, 1, 1),
                     torch.tensor(self.std, dtype=torch.float32).view(1, c, 1, 1))
            object.__setattr__(self, "_scale", scale)
        mean, std = scale
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
        idx = index_tensor(indices)
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


def index_tensor(indices: np.ndarray | torch.Tensor) -> torch.Tensor:
    """``indices`` (any shape, a tensor or array-like of ints) as a flat int64 tensor ``[B]``, for row selection."""
    if isinstance(indices, torch.Tensor):
        return indices.to(torch.long).reshape(-1)
    return torch.from_numpy(np.array(indices, dtype=np.int64).reshape(-1))


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
