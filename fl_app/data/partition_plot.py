"""``partition.png``: how the labels are spread over the clients.

Up to :data:`MAX_BAR_CLIENTS` clients: one stacked bar per client (its label
histogram, one colour per class), the client's size written on top when there
are at most :data:`MAX_LABELLED_BARS`, drawn by flwr-datasets'
``flwr_datasets.visualization.plot_label_distributions`` over
:class:`IndexPartitioner`, a Flower Datasets ``Partitioner`` over fixed indices.

Above :data:`MAX_BAR_CLIENTS` clients (a bar each would be thousands of
matplotlib patches and a figure hundreds of inches wide): flwr-datasets'
heatmap of the same counts, one column per client (partition id, in order) and
one row per class, the colour the number of that class's examples the client
holds, in a figure of fixed size; the title adds the client sizes' minimum,
median and maximum. At thousands of clients a screen pixel covers several
columns, so the heatmap shows how the classes are spread over the population
(uniform colour: IID; streaks: label skew) rather than any single client. The
counts come from one ``np.bincount`` over all clients (:func:`label_counts`),
not one ``datasets.select`` per client.

The plot reads the partitions the run trains on (index arrays from
:func:`fl_app.data.partition_indices`, whatever the scheme). Drawing touches
no random generator, so writing it changes no number of a run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from flwr_datasets.partitioner import Partitioner

__all__ = ["IndexPartitioner", "label_counts", "plot_partitions", "MAX_BAR_CLIENTS"]

#: Above this many clients the sizes are not written on the bars (they would overlap).
MAX_LABELLED_BARS = 40
#: Above this many clients the plot is a heatmap (one column per client) instead of stacked bars.
MAX_BAR_CLIENTS = 100


class IndexPartitioner(Partitioner):
    """A Flower Datasets ``Partitioner`` whose partitions are given index arrays.

    Lets flwr-datasets' metrics and plots (``compute_counts``,
    ``plot_label_distributions``) read any split, including the ones no
    flwr-datasets partitioner makes (``label-sorted``, ``contiguous``).

    Args:
        partitions: one int64 array of row indices per partition.
    """

    def __init__(self, partitions: Sequence[np.ndarray]) -> None:
        super().__init__()
        self._parts = [np.asarray(p, dtype=np.int64) for p in partitions]

    def load_partition(self, partition_id: int):  # noqa: ANN201 - datasets.Dataset
        """Rows ``partitions[partition_id]`` of the assigned dataset."""
        return self.dataset.select(self._parts[partition_id])

    @property
    def num_partitions(self) -> int:
        """The number of partitions."""
        return len(self._parts)


def label_counts(labels: np.ndarray, partitions: Sequence[np.ndarray], num_classes: int) -> np.ndarray:
    """Per-client label counts in one pass.

    Args:
        labels: ``[N]`` integer labels, in ``[0, num_classes)``.
        partitions: ``P`` index arrays into ``labels``.
        num_classes: ``C``.

    Returns:
        ``[P, C]`` int64: entry ``[p, c]`` is how many of partition ``p``'s rows have label ``c``
        (equal to ``np.bincount(labels[partitions[p]], minlength=C)``).

    Raises:
        ValueError: a label outside ``[0, num_classes)``.
    """
    labels = np.asarray(labels, dtype=np.int64)
    c = int(num_classes)
    sizes = np.fromiter((len(p) for p in partitions), dtype=np.int64, count=len(partitions))
    if sizes.sum() == 0:
        return np.zeros((len(partitions), c), dtype=np.int64)
    rows = labels[np.concatenate([np.asarray(p, dtype=np.int64) for p in partitions])]
    if rows.min() < 0 or rows.max() >= c:
        raise ValueError(f"labels must lie in [0, {c}), got {int(rows.min())}..{int(rows.max())}")
    owner = np.repeat(np.arange(len(partitions), dtype=np.int64), sizes)
    return np.bincount(owner * c + rows, minlength=len(partitions) * c).reshape(len(partitions), c)


def plot_partitions(labels: np.ndarray, partitions: Sequence[np.ndarray], num_classes: int,
                    path: str | os.PathLike[str], title: str = "") -> None:
    """Write the per-client label histograms to ``path`` (PNG).

    Stacked bars up to :data:`MAX_BAR_CLIENTS` clients, a heatmap (client × class counts) above;
    see the module's docstring for what each shows.

    Args:
        labels: ``[N]`` integer labels of the training set, in ``[0, num_classes)``.
        partitions: one index array into ``labels`` per client.
        num_classes: classes of the dataset (every class gets a colour, even
            one no client holds).
        path: the PNG file to write (its directory must exist).
        title: the plot's title.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = len(partitions)
    title = title or "Per-client label distribution"
    if n > MAX_BAR_CLIENTS:
        fig, ax = _heatmap(labels, partitions, num_classes, title)
    else:
        fig, ax, counts = _bars(labels, partitions, num_classes, title)
        sizes = counts.sum(axis=1)
        if n <= MAX_LABELLED_BARS:
            ax.bar_label(ax.containers[-1], labels=[str(int(s)) for s in sizes], fontsize=7, padding=2)
        ax.set_ylim(0, 1.1 * max(1, int(sizes.max())))
        ax.set_ylabel("examples")
    ax.set_xlabel("client (partition id)")
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)


def _bars(labels, partitions, num_classes, title):  # noqa: ANN001, ANN202
    """flwr-datasets' stacked bars, one per client: ``(figure, axes, counts DataFrame)``."""
    import datasets as hf
    from flwr_datasets.visualization import plot_label_distributions

    features = hf.Features({"label": hf.ClassLabel(num_classes=int(num_classes))})
    partitioner = IndexPartitioner(partitions)
    # the Arrow format: flwr-datasets reads whole label columns, which Arrow hands over without a row loop
    partitioner.dataset = hf.Dataset.from_dict({"label": np.asarray(labels, dtype=np.int64)},
                                               features=features).with_format("arrow")
    n = len(partitions)
    cmap = "tab10" if num_classes <= 10 else "tab20" if num_classes <= 20 else None  # None: Flower's own
    return plot_label_distributions(
        partitioner, label_name="label", plot_type="bar", size_unit="absolute", legend=True,
        legend_title="label", verbose_labels=False, figsize=(max(6.0, 0.35 * n + 3.0), 4.5), cmap=cmap,
        title=title)


def _heatmap(labels, partitions, num_classes, title):  # noqa: ANN001, ANN202
    """flwr-datasets' label-distribution heatmap over counts from :func:`label_counts`: ``(figure, axes)``.

    ``plot_label_distributions(plot_type="heatmap")`` would count through one ``select`` per client
    (minutes at 10,000); its drawing routine is called here with the same DataFrame
    ``compute_counts`` returns (index "Partition ID", one column per class).
    """
    import pandas as pd
    from flwr_datasets.visualization.heatmap_plot import _plot_heatmap  # flwr-datasets is pinned (==0.6.1)

    counts = label_counts(labels, partitions, num_classes)
    frame = pd.DataFrame(counts, columns=list(range(int(num_classes))))
    frame.index.name = "Partition ID"
    sizes = counts.sum(axis=1)
    full = (f"{title}\nclient sizes: min {int(sizes.min())}, median {float(np.median(sizes)):g}, "
            f"max {int(sizes.max())} examples")
    ax = _plot_heatmap(frame, None, (14.0, max(3.0, 0.3 * num_classes + 1.5)), full, None, "x", "absolute",
                       True, "examples of the label",
                       {"rasterized": True, "xticklabels": max(1, len(partitions) // 20)}, None)
    ax.set_ylabel("label")
    return ax.figure, ax
