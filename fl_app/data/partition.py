"""Partitioning the training set among clients (docs/explanation/design.md §8).

Uses the flwr-datasets partitioners over a label column; results depend only on
the arguments and are cached.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
import warnings

import numpy as np

from fl_app.run.errors import ConfigError

# flwr-datasets reads FLWR_TELEMETRY_ENABLED when it is first imported (below, lazily), and its plotting
# helper (partition.png) then posts a usage event. sflower makes no network call unless asked: off by default.
os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")

__all__ = ["PARTITIONS", "CLASS_ASSIGNMENT_MODES", "partition_indices", "label_sorted_partition",
           "parse_partition_sizes"]

PARTITIONS: tuple[str, ...] = ("iid", "dirichlet", "shard", "label-sorted", "contiguous", "pathological",
                               "inner-dirichlet", "linear", "square", "exponential")

#: ``class-assignment-mode`` values of ``pathological`` (flwr-datasets' ``PathologicalPartitioner``).
CLASS_ASSIGNMENT_MODES: tuple[str, ...] = ("first-deterministic", "deterministic", "random")

#: The size-skewed schemes: flwr-datasets partitioner and the law of client ``k``'s share, ``f(k + 1)``.
SIZE_SKEW: dict[str, tuple[str, str]] = {
    "linear": ("LinearPartitioner", "k + 1"),
    "square": ("SquarePartitioner", "(k + 1)^2"),
    "exponential": ("ExponentialPartitioner", "e^(k + 1)"),
}


def partition_indices(
    labels: np.ndarray,
    num_partitions: int,
    scheme: str,
    *,
    alpha: float = 0.5,
    shards: int = 2,
    seed: int = 0,
    min_partition_size: int = 1,
    num_classes_per_partition: int = 2,
    class_assignment_mode: str = "first-deterministic",
    partition_sizes: tuple[int, ...] | None = None,
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
    * ``label-sorted``: the rows stably sorted by label and cut into
      ``num_partitions`` contiguous chunks of near-equal size (``np.array_split``:
      sizes differ by at most one, no row left out); no randomness, no
      flwr-datasets. The non-IID split of the RingSFL authors' code (5
      clients: about 2 classes each).
    * ``contiguous``: the rows in file order cut into ``num_partitions``
      contiguous chunks of near-equal size (``np.array_split``); no
      randomness. The RingSFL authors' IID split (MNIST's file order is not
      sorted by label).
    * ``pathological``: ``PathologicalPartitioner(num_classes_per_partition=...,
      class_assignment_mode=..., shuffle=True, seed=seed)`` (Li et al. 2022,
      "Federated Learning on Non-IID Data Silos"): each client holds exactly
      ``num_classes_per_partition`` classes; each class is split evenly among
      the clients that hold it. ``first-deterministic`` (the paper's, default):
      client ``k``'s first class is ``k mod C``, the others random;
      ``deterministic``: classes ``k, k+1, ...`` (mod C); ``random``: all
      random. A class that no client draws is left out (only possible with
      fewer clients than classes, or with ``random``).
    * ``inner-dirichlet``: ``InnerDirichletPartitioner(partition_sizes, alpha=alpha,
      shuffle=True, seed=seed)`` (Acar et al. 2021, "FedDyn"): the client sizes
      are given (``partition_sizes``; None: ``N`` split as evenly as possible),
      and each client's labels follow its own Dirichlet(alpha) prior, drawn
      example by example until its size is reached.
    * ``linear``, ``square``, ``exponential``: the rows permuted with
      ``seed``, then ``LinearPartitioner`` / ``SquarePartitioner`` /
      ``ExponentialPartitioner``: client ``k`` (from 0) gets
      ``floor(N · f(k+1) / Σ_j f(j+1))`` rows with ``f(x) = x``, ``x²`` or
      ``eˣ``, and the last client also the rows that rounding left over
      (:data:`SIZE_SKEW`); labels are IID within the sizes.

    Args:
        labels: ``[N]`` integer labels of the training set.
        num_partitions: number of clients, ``1 <= num_partitions <= N``.
        scheme: one of :data:`PARTITIONS`.
        alpha: Dirichlet concentration, ``> 0`` (``dirichlet`` only).
        shards: shards per client, ``>= 1`` (``shard`` only).
        seed: partition seed; the result depends only on the arguments.
        min_partition_size: ``dirichlet``: resample until every client has
            at least this many rows.
        num_classes_per_partition: ``pathological``: classes per client,
            ``1 <= k <=`` the number of classes.
        class_assignment_mode: ``pathological``: one of :data:`CLASS_ASSIGNMENT_MODES`.
        partition_sizes: ``inner-dirichlet``: one size ``>= 1`` per client,
            summing to at most ``N`` (rows beyond the sum are left out);
            None: as even as possible, summing to ``N``.

    Returns:
        ``num_partitions`` int64 arrays of row indices into the training set,
        pairwise disjoint and each non-empty (a fresh copy on every call).

    Raises:
        ConfigError: unknown scheme, bad argument (non-integer labels,
            ``num_partitions`` outside ``[1, N]``, ``alpha <= 0``, ``shards < 1``,
            non-integer seed), an impossible configuration (``num_partitions *
            shards > N``; Dirichlet sampling that leaves a partition empty after
            11 tries), or an empty partition; ``pathological`` with more
            classes per client than classes, or a class drawn by more clients
            than it has rows; ``inner-dirichlet`` sizes of the wrong count or
            sum, or a Dirichlet prior that runs out of classes; a size skew
            that leaves its smallest client empty.
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
    elif scheme == "inner-dirichlet":
        alpha = float(alpha)
        if not (alpha > 0 and math.isfinite(alpha)):
            raise ConfigError(f"inner-dirichlet alpha must be a positive number, got {alpha}")
        shards = 0
    else:
        alpha, shards = 0.0, 0
    extra: tuple = ()
    if scheme == "pathological":
        extra = _pathological_args(labels, num_partitions, num_classes_per_partition, class_assignment_mode)
    elif scheme == "inner-dirichlet":
        extra = _inner_dirichlet_sizes(n, num_partitions, partition_sizes)
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ConfigError(f"partition seed must be an integer, got {seed!r}")
    labels = labels.astype(np.int64, copy=False)
    if scheme == "label-sorted":
        return label_sorted_partition(labels, num_partitions)
    if scheme == "contiguous":
        return [chunk.copy() for chunk in np.array_split(np.arange(n, dtype=np.int64), num_partitions)]
    key = hashlib.sha1(np.ascontiguousarray(labels).tobytes()).hexdigest()
    min_size = max(1, int(min_partition_size)) if scheme == "dirichlet" else 1
    cached = _partition_lru(key, n, num_partitions, scheme, alpha, shards, int(seed), min_size, extra,
                            _Unhashed(labels))
    return [p.copy() for p in cached]


def parse_partition_sizes(text: str) -> tuple[int, ...] | None:
    """The ``partition-sizes`` key: ``"1000:500:2500"`` -> ``(1000, 500, 2500)``; ``""`` -> None.

    Raises:
        ConfigError: an item that is not a positive integer.
    """
    text = str(text).strip()
    if not text:
        return None
    sizes = []
    for item in text.split(":"):
        try:
            size = int(item.strip())
        except ValueError:
            size = 0
        if size < 1:
            raise ConfigError(f"partition-sizes={text!r}: each size must be a positive integer, got {item!r}")
        sizes.append(size)
    return tuple(sizes)


def _pathological_args(labels: np.ndarray, num_partitions: int, k: int, mode: str) -> tuple[int, str]:
    """Checked ``(num_classes_per_partition, class_assignment_mode)``."""
    classes = int(np.unique(labels).size)
    if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or not 1 <= k <= classes:
        raise ConfigError(f"num-classes-per-partition must be an integer in 1..{classes} "
                          f"(the dataset's classes), got {k!r}")
    if mode not in CLASS_ASSIGNMENT_MODES:
        raise ConfigError(f"class-assignment-mode must be one of {', '.join(CLASS_ASSIGNMENT_MODES)}, got {mode!r}")
    return int(k), str(mode)


def _inner_dirichlet_sizes(n: int, num_partitions: int, sizes: tuple[int, ...] | None) -> tuple[int, ...]:
    """Checked client sizes of ``inner-dirichlet`` (None: ``n`` split as evenly as possible)."""
    if sizes is None:
        return tuple(int(len(c)) for c in np.array_split(np.arange(n), num_partitions))
    sizes = tuple(int(s) for s in sizes)
    if len(sizes) != num_partitions:
        raise ConfigError(f"partition-sizes gives {len(sizes)} sizes for {num_partitions} clients (num-clients)")
    if min(sizes) < 1:
        raise ConfigError(f"partition-sizes must be positive, got {min(sizes)}")
    if sum(sizes) > n:
        raise ConfigError(f"partition-sizes sum to {sum(sizes)}, more than the {n} training examples")
    return sizes


def label_sorted_partition(labels: np.ndarray, num_partitions: int) -> list[np.ndarray]:
    """The training set sorted by label (stable) and cut into ``num_partitions`` contiguous chunks.

    The RingSFL authors' non-IID split (docs/explanation/design.md §7): with MNIST's
    60,000 images and 5 clients, chunks of 12,000 holding about 2 classes
    each. Chunk sizes differ by at most one (``np.array_split``).

    Args:
        labels: ``[N]`` integer labels.
        num_partitions: ``1 <= num_partitions <= N``.

    Returns:
        ``num_partitions`` int64 arrays of row indices, ascending within each
        label; their concatenation is the stable label sort of ``range(N)``.
    """
    order = np.argsort(np.asarray(labels), kind="stable").astype(np.int64)
    return [chunk.copy() for chunk in np.array_split(order, num_partitions)]


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
    extra: tuple,
    labels_box: _Unhashed,
) -> tuple[np.ndarray, ...]:
    labels = labels_box.value
    labels_box.value = None  # the cache keeps the box as part of its key; do not keep the labels
    parts = _partition_compute(labels, num_partitions, scheme, alpha, shards, seed, min_size, extra)
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
    extra: tuple = (),
) -> list[np.ndarray]:
    import datasets as hf
    from flwr_datasets import partitioner as fp

    n = labels.size
    idx = np.arange(n, dtype=np.int64)
    if scheme == "iid" or scheme in SIZE_SKEW:
        # IidPartitioner and the size partitioners take contiguous chunks without shuffling: permute first.
        perm = np.random.default_rng(seed).permutation(n)
        idx, labels = idx[perm], labels[perm]
        cls = fp.IidPartitioner if scheme == "iid" else getattr(fp, SIZE_SKEW[scheme][0])
        partitioner = cls(num_partitions=num_partitions)
    elif scheme == "pathological":
        k, mode = extra
        partitioner = fp.PathologicalPartitioner(num_partitions=num_partitions, partition_by="label",
                                                 num_classes_per_partition=k, class_assignment_mode=mode,
                                                 shuffle=True, seed=seed)
    elif scheme == "inner-dirichlet":
        partitioner = fp.InnerDirichletPartitioner(partition_sizes=list(extra), partition_by="label", alpha=alpha,
                                                   shuffle=True, seed=seed)
    elif scheme == "dirichlet":
        partitioner = fp.DirichletPartitioner(num_partitions=num_partitions, partition_by="label", alpha=alpha,
                                              min_partition_size=min_size, self_balancing=False, shuffle=True,
                                              seed=seed)
    else:
        partitioner = fp.ShardPartitioner(num_partitions=num_partitions, partition_by="label",
                                          num_shards_per_partition=shards, shuffle=True, seed=seed)
    # Arrow format: the partitioners read whole columns; a pyarrow column converts
    # to numpy at once, where the default format's Column iterates row by row.
    ds = hf.Dataset.from_dict({"label": labels, "idx": idx}).with_format("arrow")
    partitioner.dataset = ds
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DirichletPartitioner warns on each resample
            first = np.asarray(partitioner.load_partition(0)["idx"].to_numpy(), dtype=np.int64)
            out = _read_partitions(partitioner, idx, n, num_partitions, scheme)
            if out is None:  # no index table to read: one load_partition per client
                out = [first] + [np.asarray(partitioner.load_partition(i)["idx"].to_numpy(), dtype=np.int64)
                                 for i in range(1, num_partitions)]
    except (ValueError, ZeroDivisionError, TypeError) as err:
        raise ConfigError(_partition_error_message(scheme, num_partitions, alpha, shards, n, err)) from None
    if not np.array_equal(out[0], first):
        raise AssertionError("partition 0 read from the partitioner's index table differs from load_partition(0)")
    for i, p in enumerate(out):
        if p.size == 0:
            hint = {"dirichlet": "raise alpha", "shard": "use fewer shards",
                    "pathological": "lower num-classes-per-partition"}.get(scheme, "use another partition")
            raise ConfigError(f"partition {i} is empty; lower num-clients or {hint}")
    return out


def _read_partitions(partitioner, idx: np.ndarray, n: int, num_partitions: int,  # noqa: ANN001
                     scheme: str) -> list[np.ndarray] | None:
    """Every partition's ``idx`` rows without one ``datasets.select`` per partition (None: not possible).

    ``load_partition(i)`` of flwr-datasets' partitioners is ``dataset.select(table[i])`` over the
    table they compute on the first call (``_partition_id_to_indices``, rows of their own
    ``dataset``, which ``ShardPartitioner`` sorts), or, for ``IidPartitioner``,
    ``dataset.shard(num_partitions, i, contiguous=True)``: the contiguous chunks of
    ``np.array_split``. Reading ``idx`` through the same table gives the same arrays in
    O(N) total, where a ``select`` per partition costs milliseconds each (seconds at 10,000
    clients). :func:`_partition_compute` checks partition 0 against ``load_partition(0)``.
    """
    if scheme == "iid":
        return [chunk.copy() for chunk in np.array_split(idx, num_partitions)]
    table = getattr(partitioner, "_partition_id_to_indices", None)
    if not isinstance(table, dict) or len(table) != num_partitions:
        return None
    # the partitioner's own dataset: ShardPartitioner sorts it by label, and its table indexes the sorted rows
    column = np.asarray(partitioner.dataset["idx"].to_numpy(), dtype=np.int64)
    return [column[np.asarray(table[i], dtype=np.int64)] for i in range(num_partitions)]


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
    if scheme in SIZE_SKEW:
        return (
            f"{scheme} partition of {n} samples into {num_partitions} clients leaves client 0 empty "
            f"(client k gets a share ~ {SIZE_SKEW[scheme][1]}); lower num-clients"
        )
    if scheme == "pathological":
        return (
            f"pathological partition into {num_partitions} clients is impossible: a class is drawn by more "
            f"clients than it has examples; lower num-clients or num-classes-per-partition"
        )
    if scheme == "inner-dirichlet":
        return (
            f"inner-dirichlet partition with alpha={alpha} ran out of classes for a client's prior; "
            f"raise alpha or change partition-sizes"
        )
    first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
    return f"{scheme} partition into {num_partitions} clients failed: {first}"
