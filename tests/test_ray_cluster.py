"""The Ray engine on a two-node Ray cluster started on this machine (issue 12, item 7).

A head node and a second node, one CPU each, as ``ray start --head
--num-cpus=1`` and ``ray start --address=HEAD --num-cpus=1`` would start
them; here through Ray's own ``ray.cluster_utils.Cluster``, which starts the
same processes and stops exactly those it started (``ray stop`` would stop
every Ray process on the machine). The run joins it with ``address`` (the
CLI's ``ray-address``), places clients on both nodes, and computes what the
in-process engine computes. About a minute on 2 cores.
"""

from __future__ import annotations

import json

import pytest

from tests.conftest import make_cfg, read_metrics


@pytest.fixture
def two_node_cluster():
    """A Ray head and one more node, 1 CPU each; yields the head's ``HOST:PORT``."""
    cluster_utils = pytest.importorskip("ray.cluster_utils")
    cluster = cluster_utils.Cluster(initialize_head=True, head_node_args={"num_cpus": 1, "include_dashboard": False})
    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes(timeout=120)
        yield cluster.address
    finally:
        import ray

        if ray.is_initialized():
            ray.shutdown()
        cluster.shutdown()


@pytest.mark.e2e  # a two-node Ray cluster
def test_run_on_a_two_node_cluster(two_node_cluster, tmp_path):
    from simulation.server_app import plan_run
    from simulation.engine import run_inprocess
    from simulation.ray_engine import run_ray

    base = {"strategy": "gas", "num_clients": 4, "concurrency": 4, "global_iterations": 1, "local_iterations": 3,
            "batch_size": 8, "seed": 2}
    s_cluster = run_ray(plan_run(make_cfg(**base, output_dir=str(tmp_path / "cluster"))), progress=False,
                        address=two_node_cluster)
    s_local = run_inprocess(plan_run(make_cfg(**base, output_dir=str(tmp_path / "local"))), progress=False)

    # both nodes ran clients' messages, each in its own actor process
    placement = json.loads((tmp_path / "cluster" / "placement.json").read_text())
    assert s_cluster["ray"]["address"] == two_node_cluster and s_cluster["ray"]["nodes"] == 2
    assert [n["cpus"] for n in placement["nodes"]] == [1.0, 1.0]
    assert sorted(n["head"] for n in placement["nodes"]) == [False, True]
    assert all(n["messages"] > 0 and len(n["processes"]) == 1 for n in placement["nodes"]), placement["nodes"]
    assert placement["nodes"][0]["processes"] != placement["nodes"][1]["processes"]
    assert sum(n["messages"] for n in placement["nodes"]) == placement["messages"] >= s_cluster["exchanges"]
    assert sorted(placement["clients"], key=int) == ["0", "1", "2", "3"]

    # and the results are the single-machine run's, bit for bit
    assert s_cluster["status"] == "completed" and s_cluster["failed_clients"] == []
    rows_cluster = read_metrics(tmp_path / "cluster" / "metrics.csv")
    rows_local = read_metrics(tmp_path / "local" / "metrics.csv")
    for col in ("global_iteration", "server_updates", "virtual_time_s", "bytes_up", "bytes_down", "exchanges",
                "test_accuracy", "test_loss"):
        assert [r[col] for r in rows_cluster] == [r[col] for r in rows_local], col
    assert s_cluster["final_accuracy"] == s_local["final_accuracy"]
    assert float(rows_local[1]["test_loss"]) != float(rows_local[0]["test_loss"])  # training happened
