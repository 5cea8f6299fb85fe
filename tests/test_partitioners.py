"""The flwr-datasets partitioners added by issue 24 (pathological, inner-dirichlet, linear/square/exponential
size skew): the properties each one promises, on mnist-5k's 4,000 training labels, and partition.png."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from fl_app.data import load_dataset, partition_indices
from fl_app.data.partition import SIZE_SKEW, parse_partition_sizes
from fl_app.run.errors import ConfigError
from simulation.cli import main


@pytest.fixture(scope="module")
def labels() -> np.ndarray:
    return load_dataset("mnist-5k").y_train.numpy()


def assert_disjoint_cover(parts: list[np.ndarray], rows: np.ndarray) -> None:
    """The parts are pairwise disjoint and together exactly ``rows``."""
    joined = np.concatenate(parts)
    assert joined.size == np.unique(joined).size, "a row is in two partitions"
    assert np.array_equal(np.sort(joined), np.sort(rows))


# ---------------------------------------------------------------------- pathological
@pytest.mark.parametrize("k", [1, 2, 3])
def test_pathological_gives_each_client_exactly_k_classes(labels, k):
    parts = partition_indices(labels, 12, "pathological", num_classes_per_partition=k, seed=3)
    held = [set(np.unique(labels[p]).tolist()) for p in parts]
    assert [len(h) for h in held] == [k] * 12
    # first-deterministic (the paper's): client i's first class is i mod 10, so all 10 classes are used
    assert all(i % 10 in h for i, h in enumerate(held))
    assert_disjoint_cover(parts, np.arange(labels.size))


def test_pathological_splits_each_class_evenly_among_its_holders(labels):
    parts = partition_indices(labels, 10, "pathological", num_classes_per_partition=2, seed=0)
    for c in range(10):
        shares = [int((labels[p] == c).sum()) for p in parts if (labels[p] == c).any()]
        assert sum(shares) == int((labels == c).sum())
        assert max(shares) - min(shares) <= 1, (c, shares)  # np.array_split of the class's rows


def test_pathological_deterministic_assignment_is_consecutive_classes(labels):
    parts = partition_indices(labels, 10, "pathological", num_classes_per_partition=3,
                              class_assignment_mode="deterministic")
    for i, p in enumerate(parts):
        assert set(np.unique(labels[p]).tolist()) == {i % 10, (i + 1) % 10, (i + 2) % 10}


def test_pathological_with_fewer_clients_than_classes_leaves_unused_classes_out(labels):
    parts = partition_indices(labels, 3, "pathological", num_classes_per_partition=2, seed=1)
    used = set().union(*(set(np.unique(labels[p]).tolist()) for p in parts))
    assert all(len(np.unique(labels[p])) == 2 for p in parts)
    assert_disjoint_cover(parts, np.flatnonzero(np.isin(labels, sorted(used))))


# ---------------------------------------------------------------------- inner-dirichlet
def test_inner_dirichlet_client_sizes_are_the_given_ones(labels):
    sizes = (1000, 500, 250, 2250)
    parts = partition_indices(labels, 4, "inner-dirichlet", alpha=0.5, partition_sizes=sizes, seed=2)
    assert [len(p) for p in parts] == list(sizes)
    assert_disjoint_cover(parts, np.arange(labels.size))


def test_inner_dirichlet_default_sizes_are_equal_and_labels_skewed(labels):
    parts = partition_indices(labels, 8, "inner-dirichlet", alpha=0.1, seed=0)
    assert [len(p) for p in parts] == [500] * 8
    assert_disjoint_cover(parts, np.arange(labels.size))
    # alpha=0.1: each client is dominated by few classes (an IID client's top class is ~12 % here)
    top_share = [np.bincount(labels[p], minlength=10).max() / len(p) for p in parts]
    assert np.mean(top_share) > 0.25, top_share


def test_inner_dirichlet_sizes_smaller_than_the_set_leave_the_rest_out(labels):
    parts = partition_indices(labels, 2, "inner-dirichlet", alpha=1.0, partition_sizes=(100, 300), seed=0)
    assert [len(p) for p in parts] == [100, 300]
    joined = np.concatenate(parts)
    assert joined.size == np.unique(joined).size


@pytest.mark.parametrize("sizes, fragment", [((100, 100), "2 sizes for 3 clients"),
                                             ((3000, 1000, 1), "more than the 4000")])
def test_inner_dirichlet_bad_sizes_are_refused(labels, sizes, fragment):
    with pytest.raises(ConfigError, match=fragment):
        partition_indices(labels, 3, "inner-dirichlet", alpha=0.5, partition_sizes=sizes)


def test_partition_sizes_key_parses_colon_separated_positive_integers():
    assert parse_partition_sizes("") is None
    assert parse_partition_sizes("10:20: 30") == (10, 20, 30)
    for bad in ("10:x", "10::20", "0:5", "-1:3"):
        with pytest.raises(ConfigError, match="partition-sizes"):
            parse_partition_sizes(bad)


# ---------------------------------------------------------------------- size skew
LAWS = {"linear": lambda x: x, "square": lambda x: x ** 2, "exponential": math.exp}


@pytest.mark.parametrize("scheme", sorted(SIZE_SKEW))
def test_size_skew_follows_its_law(labels, scheme):
    m, n = 6, labels.size
    parts = partition_indices(labels, m, scheme, seed=4)
    sizes = [len(p) for p in parts]
    f = [LAWS[scheme](k + 1) for k in range(m)]
    expected = [int(n * fk / sum(f)) for fk in f[:-1]]
    assert sizes[:-1] == expected  # floor(N f(k+1) / sum f)
    assert sizes[-1] == n - sum(expected)  # the last client takes what rounding left
    assert all(a < b for a, b in zip(sizes, sizes[1:]))
    assert_disjoint_cover(parts, np.arange(n))
    # labels are shuffled before cutting (not file order): the largest client sees every class
    assert len(np.unique(labels[parts[-1]])) == 10


def test_size_skew_depends_on_the_seed_only(labels):
    a = partition_indices(labels, 5, "linear", seed=1)
    b = partition_indices(labels, 5, "linear", seed=1)
    c = partition_indices(labels, 5, "linear", seed=2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert not np.array_equal(a[0], c[0])


def test_exponential_with_too_many_clients_is_refused_in_one_line(labels):
    with pytest.raises(ConfigError, match="exponential partition .* leaves client 0 empty") as err:
        partition_indices(labels, 12, "exponential")
    assert "\n" not in str(err.value)


# ---------------------------------------------------------------------- command line and partition.png
@pytest.mark.parametrize("pairs, fragment", [
    (["partition=pathological", "num-classes-per-partition=11"], "num-classes-per-partition"),
    (["partition=pathological", "num-classes-per-partition=0"], "num-classes-per-partition"),
    (["partition=pathological", "class-assignment-mode=sorted"], "class-assignment-mode"),
    (["partition=inner-dirichlet", "partition-sizes=10:x"], "partition-sizes"),
    (["partition=inner-dirichlet", "num-clients=2", "concurrency=2", "partition-sizes=5000:1"], "partition-sizes"),
    (["partition=exponential", "num-clients=12", "concurrency=2"], "exponential"),
])
def test_bad_partition_parameters_exit_2_with_one_line(tmp_path, capsys, pairs, fragment):
    out = tmp_path / "run"
    code = main(["run", *pairs, f"output-dir={out}", "-q"])
    err = capsys.readouterr().err.strip()
    assert code == 2 and fragment in err and "\n" not in err, err
    assert not out.exists()


def test_sflower_partition_writes_the_new_schemes_and_partition_png(tmp_path, capsys):
    out = tmp_path / "parts"
    code = main(["partition", "dataset=mnist-5k", "num-clients=4", "partition=pathological",
                 "num-classes-per-partition=3", "class-assignment-mode=deterministic", f"out={out}"])
    assert code == 0, capsys.readouterr().err
    assert (out / "partition.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    metas = [json.loads((out / f"partition-{k}" / "partition.json").read_text()) for k in range(4)]
    assert all(m["partition"] == "pathological" and m["num-classes-per-partition"] == 3
               and m["class-assignment-mode"] == "deterministic" for m in metas)
    assert [sum(1 for c in m["label-histogram"] if c) for m in metas] == [3, 3, 3, 3]
    assert sum(m["num-examples"] for m in metas) < 4000  # 4 clients x 3 consecutive classes leave 4 classes out


def test_device_local_nodes_of_a_new_scheme_train_like_the_simulation(tmp_path):
    """``sflower partition`` of an inner-dirichlet split, one node per directory: the metrics equal the
    simulation's bit for bit (the node trains on its own files, the scheme's keys travel in partition.json)."""
    from simulation.server_app import plan_run
    from simulation.engine import run_inprocess
    from tests.conftest import make_cfg, read_metrics

    part = {"dataset": "mnist-5k", "num-clients": 3, "partition": "inner-dirichlet", "alpha": 0.3,
            "partition-sizes": "1000:600:2400", "seed": 2}
    out = tmp_path / "parts"
    assert main(["partition", *[f"{k}={v}" for k, v in part.items()], f"out={out}"]) == 0
    assert json.loads((out / "partition-1" / "partition.json").read_text())["num-examples"] == 600
    run = {**part, "strategy": "splitfed-v1", "model": "lenet5", "concurrency": 3, "global-iterations": 1,
           "local-iterations": 2, "batch-size": 8}
    run_inprocess(plan_run(make_cfg(**run, output_dir=str(tmp_path / "sim"))), progress=False)
    configs = [{"data-dir": str(out / f"partition-{k}"), "partition-id": k} for k in range(3)]
    summary = run_inprocess(plan_run(make_cfg(**run, output_dir=str(tmp_path / "dev"))), progress=False,
                            node_configs=configs)
    assert summary["client_examples"] == {"0": 1000, "1": 600, "2": 2400}
    keys = ["global_iteration", "virtual_time_s", "test_accuracy", "test_loss"]
    a, b = (read_metrics(tmp_path / name / "metrics.csv") for name in ("sim", "dev"))
    assert [[r[k] for k in keys] for r in a] == [[r[k] for k in keys] for r in b]


def test_partition_seed_sets_the_partition_alone(tmp_path, capsys):
    """``partition-seed`` seeds the assignment of the data to clients and nothing else: runs with different
    seeds and one partition-seed share their partitions and differ in the rest (here: the initial
    weights); -1 means ``seed``; below -1 is refused in one line."""
    import torch

    from fl_app.run.config import RunConfig
    from fl_app.learning.task import load_task
    from tests.conftest import cli_args

    def task(**keys):
        return load_task(RunConfig.from_mapping({"partition": "shard", "shards": 2, **keys}))

    a, b = task(seed=1, **{"partition-seed": 5}), task(seed=2, **{"partition-seed": 5})
    assert all(np.array_equal(p, q) for p, q in zip(a.partitions, b.partitions))
    assert not torch.equal(next(a.build_model().parameters()), next(b.build_model().parameters()))
    own = task(seed=5)
    assert all(np.array_equal(p, q) for p, q in zip(own.partitions, a.partitions))
    follows = task(seed=1, **{"partition-seed": -1})
    assert not all(np.array_equal(p, q) for p, q in zip(follows.partitions, a.partitions))
    assert all(np.array_equal(p, q) for p, q in zip(follows.partitions, task(seed=1).partitions))
    assert main(cli_args({"partition-seed": -2, "output-dir": tmp_path / "x"})) == 2
    assert "partition-seed must be >= 0, or -1" in capsys.readouterr().err
