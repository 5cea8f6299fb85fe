"""The ``device`` key (fl_app.run.device): spelling, resolution, node overrides, and GPU runs where a GPU exists."""

from __future__ import annotations

import pytest
import torch

from fl_app.run.config import ConfigError, RunConfig
from fl_app.run.device import check_device_name, model_device, resolve_device, to_device
from simulation.server_app import plan_run
from simulation.engine import run_inprocess
from strategies.core.base import RunFailedError
from tests.conftest import make_cfg

HAS_CUDA = torch.cuda.is_available()
#: this module's runs: conftest's TINY with 3 clients, 2 global iterations, each evaluated on 200 images
SMALL = dict(num_clients=3, global_iterations=2, eval_every=1, eval_samples=200, heterogeneity="none")


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
        plan_run(make_cfg(**SMALL, device="cuda", output_dir=str(tmp_path)))


def test_to_device_keeps_the_tensor_object_on_its_own_device():
    t = torch.ones(3)
    assert to_device(t, torch.device("cpu")) is t
    assert model_device(torch.nn.Linear(2, 2)) == torch.device("cpu")
    assert model_device(torch.nn.ReLU()) == torch.device("cpu")


def _run(tmp_path, name: str, node_configs=None, **keys):
    cfg = make_cfg(**{**SMALL, **keys}, output_dir=str(tmp_path / name))
    return run_inprocess(plan_run(cfg), progress=False, node_configs=node_configs)


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
    from fl_app.run.device import deterministic_gpu

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
