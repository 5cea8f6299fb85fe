"""Many clients on one machine (issue 47): what start-up and an idle client cost.

partition.png above ``MAX_BAR_CLIENTS`` clients is flwr-datasets' heatmap over one bincount; the
partitions are read through the partitioners' index tables (equal to one ``load_partition`` each);
nodes share one task record; and in-process nodes that are not training keep no live model.
"""

from __future__ import annotations

import numpy as np
import pytest
from tests.conftest import read_metrics


def test_label_counts_equal_a_bincount():
    """One bincount over all clients gives each client's ``np.bincount`` of its labels, empty clients included."""
    from fl_app.data.partition_plot import label_counts

    rng = np.random.default_rng(0)
    labels = rng.integers(0, 7, 500)
    parts = np.array_split(rng.permutation(500), 40) + [np.array([], dtype=np.int64)]
    counts = label_counts(labels, parts, 9)
    assert counts.shape == (41, 9)
    for p, row in zip(parts, counts):
        assert np.array_equal(row, np.bincount(labels[p], minlength=9))
    with pytest.raises(ValueError):
        label_counts(labels, [np.array([0])], 3)  # a label of 3 or more


def test_plot_at_many_clients_is_a_heatmap(tmp_path, monkeypatch):
    """Above MAX_BAR_CLIENTS the PNG is written by flwr-datasets' heatmap over the bincount, with no
    ``select`` per client; at or below it, the stacked bars."""
    import flwr_datasets.visualization.heatmap_plot as hp

    from fl_app.data import partition_plot as pp

    seen = []
    real = hp._plot_heatmap
    monkeypatch.setattr(hp, "_plot_heatmap", lambda frame, *a: seen.append(frame.to_numpy()) or real(frame, *a))
    selects = []
    real_load = pp.IndexPartitioner.load_partition
    monkeypatch.setattr(pp.IndexPartitioner, "load_partition", lambda self, i: selects.append(i) or real_load(self, i))
    rng = np.random.default_rng(1)
    labels = rng.integers(0, 10, 3000)
    n = pp.MAX_BAR_CLIENTS + 1
    parts = np.array_split(rng.permutation(3000), n)
    pp.plot_partitions(labels, parts, 10, tmp_path / "many.png", "many")
    assert (tmp_path / "many.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert len(seen) == 1 and not selects
    assert np.array_equal(seen[0], pp.label_counts(labels, parts, 10))
    pp.plot_partitions(labels, parts[:5], 10, tmp_path / "few.png")
    assert len(seen) == 1 and len(selects) >= 5  # bars: flwr-datasets' compute_counts over the partitioner
    assert (tmp_path / "few.png").stat().st_size > 0


@pytest.mark.parametrize("scheme, n, alpha, shards, extra", [
    ("iid", 37, 0.0, 0, ()), ("square", 7, 0.0, 0, ()), ("dirichlet", 23, 0.5, 0, ()), ("shard", 41, 0.0, 2, ()),
    ("pathological", 17, 0.0, 0, (3, "random")), ("inner-dirichlet", 19, 0.5, 0, None)])
def test_partitions_from_the_index_table_equal_load_partition(scheme, n, alpha, shards, extra, monkeypatch):
    """Every partition read in one pass through the partitioner's table equals its ``load_partition``
    (shard: the table indexes the label-sorted dataset)."""
    from fl_app.data import partition as part

    labels = np.random.default_rng(2).integers(0, 10, 3001)
    extra = part._inner_dirichlet_sizes(3001, n, None) if extra is None else extra
    fast = part._partition_compute(labels, n, scheme, alpha, shards, 3, 1, extra)
    monkeypatch.setattr(part, "_read_partitions", lambda *a: None)
    slow = part._partition_compute(labels, n, scheme, alpha, shards, 3, 1, extra)
    assert len(fast) == len(slow) == n
    assert all(a.dtype == b.dtype == np.int64 and np.array_equal(a, b) for a, b in zip(fast, slow))


def _contexts(monkeypatch) -> list:
    """The InProcessGrid of the next in-process run, appended once built."""
    import simulation.engine as engine

    grids = []
    real = engine.InProcessGrid.__init__

    def init(self, *a, **k):
        real(self, *a, **k)
        grids.append(self)

    monkeypatch.setattr(engine.InProcessGrid, "__init__", init)
    return grids


def test_live_caches_are_kept_for_the_most_recently_used_nodes(monkeypatch):
    """Beyond MAX_NODES nodes the least recently used lose their caches; a message (a registering call)
    makes its node the most recent; a dropped node's next message starts without a cache."""
    from flwr.app import RecordDict

    from fl_app.client import live
    monkeypatch.setattr(live, "MAX_NODES", 3)
    monkeypatch.setattr(live, "_LIVE", {})
    states = [RecordDict() for _ in range(5)]
    assert all(live.live_cache(s) is None for s in states[:3])  # first sight: registered, no cache yet
    first = live.live_cache(states[0])  # node 0 most recently used
    assert first is not None
    live.live_cache(states[3])  # drops node 1, the least recently used
    assert live.live_cache(states[1], register=False) is None
    assert live.live_cache(states[0], register=False) is first
    live.live_cache(states[4])  # drops node 2
    assert live.live_cache(states[2], register=False) is None and len(live._LIVE) == 3
    assert live.live_cache(states[1]) is None  # a first message again


@pytest.mark.slow  # two in-process runs of 12 clients (about 40 s on a loaded 2-core machine)
def test_idle_nodes_keep_no_model_and_share_the_task_record(tmp_path, monkeypatch):
    """12 clients, 3 per round, 3 rounds, with live caches for at most 3 nodes: after the run no more
    than 3 nodes hold a live model, all nodes share one task record, and the numbers equal a run
    whose every trained node kept its cache."""
    from fl_app.client import live
    from fl_app import protocol as P
    from simulation.cli import main
    from tests.conftest import cli_args

    cfg = {"strategy": "splitfed-v1", "model": "lenet5", "dataset": "mnist-5k", "num-clients": 12,
           "concurrency": 3, "partition": "iid", "global-iterations": 3, "local-iterations": 1, "batch-size": 8,
           "seed": 3, "momentum": 0.5, "eval-samples": 64}
    rows = {}
    for cap in (3, 10_000):
        monkeypatch.setattr(live, "MAX_NODES", cap)
        live._LIVE.clear()
        grids = _contexts(monkeypatch)
        assert main(cli_args({**cfg, "output-dir": tmp_path / str(cap)}, "-q")) == 0
        states = [c.state for c in grids[-1].contexts.values()]
        caches = [live.live_cache(s, register=False) for s in states]
        holding = [c for c in caches if c is not None and any(m is not None for m in c.models.values())]
        assert len(holding) <= cap and (cap > 3 or len(holding) >= 1)
        if cap > 3:
            assert len(holding) > 3  # the clients of every round kept theirs
        assert len({id(s[P.TASK]) for s in states}) == 1
        rows[cap] = read_metrics(tmp_path / str(cap) / "metrics.csv")
    for col in ("test_accuracy", "test_loss", "virtual_time_s"):
        assert [r[col] for r in rows[3]] == [r[col] for r in rows[10_000]], col
