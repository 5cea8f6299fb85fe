"""Label inference by clustering the returned gradient rows, and how many known labels name the clusters.

The gradient rows a U-shaped client's tail returns
(:mod:`simulation.privacy.label_leakage`) fall into one group per label:
without the tail's weights, a server can still cluster them into ``K``
groups (k-means, or spectral clustering on a nearest-neighbour graph;
scikit-learn) on the rows scaled to unit norm (their directions; the norms
shrink as training converges). Two scores:

* :func:`matched_accuracy`: the clusters named by the best one-to-one
  assignment to labels (the Hungarian method, ``scipy.optimize.linear_sum_assignment``
  on the confusion matrix): the attack's ceiling, the accuracy of an attacker
  who can name every cluster;
* :func:`known_label_accuracy`: an attacker who knows the labels of ``m``
  rows (drawn at random) names each cluster by the majority of its known
  rows, and a cluster with none by the most frequent known label: the
  accuracy as a function of ``m`` (averaged over draws); :func:`one_per_cluster_accuracy`: one known
  row in each cluster.
"""

from __future__ import annotations

import numpy as np


def unit_rows(grads: np.ndarray) -> np.ndarray:
    """The rows of ``grads`` ``[N, d]`` scaled to unit L2 norm (a zero row stays zero), float64."""
    g = grads.reshape(grads.shape[0], -1).astype(np.float64)
    norms = np.linalg.norm(g, axis=1, keepdims=True)
    return np.divide(g, norms, out=np.zeros_like(g), where=norms > 0)


def cluster_rows(grads: np.ndarray, k: int, method: str = "kmeans", seed: int = 0) -> np.ndarray:
    """Cluster ids int ``[N]`` in ``[0, k)`` of the unit rows of ``grads`` ``[N, d]``.

    Args:
        method: ``"kmeans"`` (``KMeans(k, n_init=10)``) or ``"spectral"`` (``SpectralClustering`` on a
            10-nearest-neighbour graph).
        seed: the clustering's random state.

    Raises:
        ValueError: an unknown ``method``, or fewer rows than ``k``.
    """
    from sklearn.cluster import KMeans, SpectralClustering

    x = unit_rows(grads)
    if len(x) < k:
        raise ValueError(f"clustering {len(x)} rows into {k} clusters")
    if method == "kmeans":
        return KMeans(k, n_init=10, random_state=seed).fit_predict(x)
    if method == "spectral":
        return SpectralClustering(k, affinity="nearest_neighbors", n_neighbors=min(10, len(x) - 1),
                                  random_state=seed, assign_labels="cluster_qr").fit_predict(x)
    raise ValueError(f"unknown clustering method {method!r}; choose kmeans or spectral")


def matched_accuracy(clusters: np.ndarray, labels: np.ndarray) -> float:
    """The accuracy of naming the clusters by the best one-to-one assignment to labels (Hungarian method)."""
    from scipy.optimize import linear_sum_assignment

    k = int(max(clusters.max(), labels.max())) + 1
    confusion = np.zeros((k, k), dtype=np.int64)
    np.add.at(confusion, (clusters, labels), 1)
    rows, cols = linear_sum_assignment(-confusion)
    return float(confusion[rows, cols].sum() / len(labels))


def name_clusters(clusters: np.ndarray, known: np.ndarray, known_labels: np.ndarray, k: int) -> np.ndarray:
    """Labels ``[N]`` of every row: each cluster named by the majority label of its ``known`` rows (indices),
    a cluster without one by the most frequent of ``known_labels``."""
    fallback = int(np.bincount(known_labels).argmax())
    names = np.full(int(clusters.max()) + 1, fallback, dtype=np.int64)
    for c in np.unique(clusters[known]):
        names[c] = int(np.bincount(known_labels[clusters[known] == c]).argmax())
    return names[clusters]


def known_label_accuracy(clusters: np.ndarray, labels: np.ndarray, m: int, draws: int = 20,
                         seed: int = 0) -> float:
    """The mean accuracy, over ``draws`` random sets of ``m`` known rows, of :func:`name_clusters`
    (scored on all rows, the known ones included)."""
    rng = np.random.default_rng(seed)
    k = int(labels.max()) + 1
    accs = []
    for _ in range(draws):
        known = rng.choice(len(labels), size=min(m, len(labels)), replace=False)
        accs.append(float((name_clusters(clusters, known, labels[known], k) == labels).mean()))
    return float(np.mean(accs))


def one_per_cluster_accuracy(clusters: np.ndarray, labels: np.ndarray, draws: int = 20, seed: int = 0) -> float:
    """The mean accuracy, over ``draws``, of naming each cluster by the label of one random row of it (an
    attacker who learns one labelled row per cluster: ``k`` labels in all)."""
    rng = np.random.default_rng(seed)
    ids = np.unique(clusters)
    accs = []
    for _ in range(draws):
        known = np.array([rng.choice(np.flatnonzero(clusters == c)) for c in ids])
        accs.append(float((name_clusters(clusters, known, labels[known], len(ids)) == labels).mean()))
    return float(np.mean(accs))
