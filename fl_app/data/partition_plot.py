"""``partition.png``: how the labels are spread over the clients.

One stacked bar per client (its label histogram, one colour per class), the
client's size written on top, drawn by flwr-datasets'
``flwr_datasets.visualization.plot_label_distributions``. The plot reads the
partitions the run trains on (index arrays from
:func:`fl_app.data.partition_indices`, whatever the scheme) through
:class:`IndexPartitioner`, a Flower Datasets ``Partitioner`` over fixed
indices. Drawing touches no random generator, so writing it changes no
number of a run.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np
from flwr_datasets.partitioner import Partitioner

__all__ = ["IndexPartitioner", "plot_partitions"]

#: Above this many clients the sizes are not written on the bars (they would overlap).
MAX_LABELLED_BARS = 40


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


def plot_partitions(labels: np.ndarray, partitions: Sequence[np.ndarray], num_classes: int,
                    path: str | os.PathLike[str], title: str = "") -> None:
    """Write the per-client label histograms as stacked bars to ``path`` (PNG).

    Args:
        labels: ``[N]`` integer labels of the training set, in ``[0, num_classes)``.
        partitions: one index array into ``labels`` per client.
        num_classes: classes of the dataset (every class gets a colour, even
            one no client holds).
        path: the PNG file to write (its directory must exist).
        title: the plot's title.
    """
    import datasets as hf
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from flwr_datasets.visualization import plot_label_distributions

    features = hf.Features({"label": hf.ClassLabel(num_classes=int(num_classes))})
    partitioner = IndexPartitioner(partitions)
    # the Arrow format: flwr-datasets reads whole label columns, which Arrow hands over without a row loop
    partitioner.dataset = hf.Dataset.from_dict({"label": np.asarray(labels, dtype=np.int64)},
                                               features=features).with_format("arrow")
    n = len(partitions)
    cmap = "tab10" if num_classes <= 10 else "tab20" if num_classes <= 20 else None  # None: Flower's own
    fig, ax, counts = plot_label_distributions(
        partitioner, label_name="label", plot_type="bar", size_unit="absolute", legend=True,
        legend_title="label", verbose_labels=False, figsize=(max(6.0, 0.35 * n + 3.0), 4.5), cmap=cmap,
        title=title or "Per-client label distribution")
    sizes = counts.sum(axis=1)
    if n <= MAX_LABELLED_BARS:
        ax.bar_label(ax.containers[-1], labels=[str(int(s)) for s in sizes], fontsize=7, padding=2)
    ax.set_ylim(0, 1.1 * max(1, int(sizes.max())))
    ax.set_xlabel("client (partition id)")
    ax.set_ylabel("examples")
    fig.savefig(path, dpi=90, bbox_inches="tight")
    plt.close(fig)
