"""The ``device`` key (fl_app.device): spelling, resolution, node overrides, and GPU runs where a GPU exists."""

from __future__ import annotations

import pytest
import torch

from fl_app.config import ConfigError, RunConfig
from fl_app.device import check_device_name, model_device, resolve_device, to_device
from fl_app.models import fixed_rng
from fl_app.server_app import plan_run
from simulation.engine import run_inprocess
from strategies.base import RunFailedError

HAS_CUDA = torch.cuda.is_available()
TINY = dict(dataset="mnist-5k", num_clients=3, concurrency=2, partition="iid", global_iterations=2,
            local_iterations=2, eval_every=1, eval_samples=200, heterogeneity="none")


@pytest.mark.parametrize("name", ["gpu", "cuda:x", "cpu:0", "", "CUDA"])
def test_bad_device_names_are_one_line_config_errors(name):
    with pytest.raises(ConfigError, match="device must be auto, cpu, cuda or cuda:N"):
        RunConfig.from_mapping({"device": name})


@pytest.mark.parametrize("name", ["auto", "cpu", "cuda", "cuda:1"])
def test_good_device_names_pass_the_spelling_check(name):
    check_device_name(name)  # the device need not exist on this machine


@pytest.mark.skipif(HAS_CUDA, reason="checks the behaviour without a GPU")
def test_without_a_gpu_auto_is_cpu_and_cuda_is_refused_at_plan_time(tmp_path):
    assert resolve_device("auto") == torch.device("cpu")
    with pytest.raises(ConfigError, match="torch sees no GPU"):
        plan_run(RunConfig.from_mapping({**_keys(TINY), "device": "cuda", "output-dir": str(tmp_path)}))


def test_to_device_keeps_the_tensor_object_on_its_own_device():
    t = torch.ones(3)
    assert to_device(t, torch.device("cpu")) is t
    assert model_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert model_device(torch.nn.ReLU()) == torch.device("cpu")


def test_fixed_rng_with_a_cpu_device_draws_what_it_draws_without():
    with fixed_rng(7):
        a = torch.rand(4)
    with fixed_rng(7, torch.device("cpu")):
        b = torch.rand(4)
    assert torch.equal(a, b)


def _keys(d: dict) -> dict:
    return {k.replace("_", "-"): v for k, v in d.items()}


def _run(tmp_path, name: str, node_configs=None, **keys):
    cfg = RunConfig.from_mapping({**_keys(TINY), **_keys(keys), "output-dir": str(tmp_path / name)})
    return run_inprocess(plan_run(cfg), progress=False, node_configs=node_configs)


def test_device_cpu_gives_the_numbers_of_auto_on_this_machine(tmp_path):
    if HAS_CUDA:
        pytest.skip("auto is cuda here")
    a = _run(tmp_path, "auto", strategy="splitfed-v1")
    b = _run(tmp_path, "cpu", strategy="splitfed-v1", device="cpu")
    assert a["final_accuracy"] == b["final_accuracy"]
    assert (tmp_path / "auto" / "metrics.csv").read_text().count("\n") >= 3


@pytest.mark.skipif(HAS_CUDA, reason="checks a node that asks for a GPU it does not have")
def test_a_node_config_device_the_node_lacks_is_named_at_the_handshake(tmp_path):
    # node 1 asks for a GPU in its node_config: the handshake says which node and why, in one line
    nodes = [{"partition-id": i, "num-partitions": 3} for i in range(3)]
    nodes[1]["device"] = "cuda"
    with pytest.raises(RunFailedError, match=r"handshake failed on node \d+: ConfigError: device=cuda but torch sees no GPU"):
        _run(tmp_path, "node", nodes, strategy="splitfed-v1")
    nodes[1]["device"] = "cpu"  # an explicit CPU node trains as the others
    assert _run(tmp_path, "cpu-node", nodes, strategy="splitfed-v1")["status"] == "completed"


@pytest.mark.skipif(not HAS_CUDA, reason="needs a GPU")
@pytest.mark.parametrize("strategy", ["gas", "splitfed-v1", "fedavg", "mu-splitfed"])
def test_gpu_runs_repeat_from_their_seed_and_learn_like_the_cpu(tmp_path, strategy):
    a = _run(tmp_path, "a", strategy=strategy, device="cuda")
    b = _run(tmp_path, "b", strategy=strategy, device="cuda")
    cpu = _run(tmp_path, "cpu", strategy=strategy, device="cpu")
    assert a["final_accuracy"] == b["final_accuracy"]
    assert abs(a["final_accuracy"] - cpu["final_accuracy"]) < 0.05


def test_deterministic_gpu_settings_keep_a_users_cublas_choice(monkeypatch):
    from fl_app.device import deterministic_gpu

    monkeypatch.setattr(torch.backends.cudnn, "deterministic", False)
    monkeypatch.setattr(torch.backends.cudnn, "benchmark", True)
    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    deterministic_gpu()
    assert torch.backends.cudnn.deterministic and not torch.backends.cudnn.benchmark
    import os

    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":4096:8"
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":16:8")
    deterministic_gpu()
    assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == ":16:8"
