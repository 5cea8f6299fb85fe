"""Loading a dataset by name: local files first, then the Hugging Face hub.

:func:`load_dataset` validates its arguments and dispatches between the sources
in :mod:`fl_app.data.files` and :mod:`fl_app.data.hub`; results are cached per
``(name, resolved data_dir)``. When neither source has the data,
:class:`~fl_app.run.errors.ConfigError` says where to put the files.
"""

from __future__ import annotations

import functools
import os
from pathlib import Path

from fl_app.data import files, hub
from fl_app.data.dataset import DATASETS, ImageDataset
from fl_app.data.text import TEXT_DATASETS, TextDataset, load_text_dataset
from fl_app.run.errors import ConfigError

__all__ = ["load_dataset"]


def load_dataset(name: str, data_dir: str | os.PathLike[str] | None = None) -> ImageDataset | TextDataset:
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
            directory": only the Hugging Face hub is tried. ``sst2``,
            ``text-csv``: :func:`fl_app.data.text.load_text_dataset` (a
            ``data_dir`` is required; the ``llm`` extra too).

    Returns:
        An :class:`ImageDataset` (uint8 images ``[N, C, H, W]``, int64 labels).
        The same object is returned for repeated calls with the same arguments;
        treat it as read-only.

    Raises:
        ConfigError: unknown name; ``data_dir`` given but not an existing
            directory; corrupt files; files absent and the hub unreachable.
    """
    if name in TEXT_DATASETS:
        return _load_text(name, data_dir)
    if name not in DATASETS:
        raise ConfigError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS + TEXT_DATASETS)}")
    if name == "mnist-5k":
        return _load_cached(name, None)
    if data_dir is None or str(data_dir) == "":
        return _load_cached(name, None)
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise ConfigError(f"data-dir '{data_dir}' does not exist")
    return _load_cached(name, str(path.resolve()))


def _load_text(name: str, data_dir: str | os.PathLike[str] | None) -> TextDataset:
    """A text dataset from ``data_dir`` (required), cached per resolved directory."""
    if data_dir is None or str(data_dir) == "":
        raise ConfigError(f"dataset {name!r} needs data-dir=DIR (the directory with its files)")
    path = Path(data_dir).expanduser()
    if not path.is_dir():
        raise ConfigError(f"data-dir '{data_dir}' does not exist")
    return _load_text_cached(name, str(path.resolve()))


@functools.lru_cache(maxsize=4)
def _load_text_cached(name: str, data_dir: str) -> TextDataset:
    return load_text_dataset(name, Path(data_dir))


@functools.lru_cache(maxsize=8)
def _load_cached(name: str, data_dir: str | None) -> ImageDataset:
    # Sources are looked up through their modules (files.X, hub.X), so that a
    # monkeypatch of e.g. fl_app.data.hub._load_from_hub takes effect here.
    if name == "mnist-5k":
        return files._load_mnist5k()
    local = None
    if data_dir is not None:
        local = files._load_local(name, Path(data_dir))
    if local is not None:
        return local
    from_hub = hub._load_from_hub(name)
    if from_hub is not None:
        return from_hub
    expected = files._expected_files(name)
    where = data_dir if data_dir is not None else "(no data-dir given)"
    raise ConfigError(
        f"dataset {name!r}: no files in '{where}' (expected {', '.join(expected)}) and the "
        f"Hugging Face hub could not be used; pass data-dir=DIR"
    )
