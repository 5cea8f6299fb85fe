"""Saved models: every completed run writes model.safetensors (+ model.json, per-client models for the PSL
family, model-best.* with save-best=true), and ``sflower evaluate`` reproduces the run's accuracy exactly."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
import torch

from fl_app.models import build_model
from simulation.cli import main
from tests.conftest import cli_args

SHORT = {"model": "lenet5", "num-clients": 3, "concurrency": 2, "partition": "shard", "global-iterations": 2,
         "local-iterations": 3, "batch-size": 8, "seed": 1}


def evaluated(capsys, *args: str) -> float:
    """``sflower evaluate ARGS``'s test accuracy (printed at full precision)."""
    capsys.readouterr()
    assert main(["evaluate", *args]) == 0
    line = capsys.readouterr().out
    return float(re.search(r"test_accuracy (\S+)", line).group(1))


@pytest.mark.parametrize("strategy", ["gas", "psl", "fedavg"])
def test_sflower_evaluate_reproduces_the_runs_final_and_best_accuracy(tmp_path, capsys, one_torch_thread, strategy):
    out = tmp_path / strategy
    assert main(cli_args({**SHORT, "strategy": strategy, "save-best": "true", "output-dir": str(out)}, "-q")) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert evaluated(capsys, str(out)) == summary["final_accuracy"]
    assert evaluated(capsys, str(out / "model-best.safetensors")) == summary["best_accuracy"]
    meta = json.loads((out / "model.json").read_text())
    assert meta["model"] == "lenet5" and meta["cut-layer"] == 2 and meta["dataset"] == "mnist-5k"
    assert meta["input-shape"] == [1, 28, 28] and meta["num-classes"] == 10
    assert meta["which"] == "final" and meta["global-iteration"] == 2
    assert meta["test-accuracy"] == summary["final_accuracy"]
    if strategy == "psl":  # per-client client-side models, evaluated as client_k o server
        assert meta["clients"] == [0, 1, 2] and (out / "model-clients.safetensors").is_file()
    else:
        assert meta["clients"] == [] and not (out / "model-clients.safetensors").exists()
    assert (out / "partition.png").is_file()


def test_model_safetensors_is_the_full_block_model(tmp_path, capsys, one_torch_thread):
    from safetensors.torch import load_file

    out = tmp_path / "run"
    assert main(cli_args({**SHORT, "strategy": "splitfed-v1", "output-dir": str(out)}, "-q")) == 0
    tensors = load_file(str(out / "model.safetensors"))
    template = build_model("lenet5", (1, 28, 28), 10).state_dict()
    assert set(tensors) == set(template)  # client and server blocks joined, same keys as the model
    assert all(tensors[k].shape == template[k].shape and tensors[k].dtype == template[k].dtype for k in template)
    assert any(not torch.equal(tensors[k], template[k]) for k in template)  # trained, not the initial weights
    assert not (out / "model-best.safetensors").exists()  # save-best is off by default
    capsys.readouterr()
    assert main(["evaluate", str(out), "dataset=imagenet"]) == 2
    err = capsys.readouterr().err.strip()
    assert "imagenet" in err and "\n" not in err, err


def test_evaluate_on_another_dataset_of_the_same_shape(tmp_path, capsys, one_torch_thread, shared_data):
    mnist = shared_data / "mnist"
    if not (mnist / "t10k-images-idx3-ubyte.gz").is_file():
        pytest.skip(f"{mnist} has no MNIST IDX files")
    out = tmp_path / "run"
    assert main(cli_args({**SHORT, "strategy": "splitfed-v1", "output-dir": str(out)}, "-q")) == 0
    capsys.readouterr()
    assert main(["evaluate", str(out), "dataset=mnist", f"data-dir={mnist}"]) == 0
    assert "on mnist's 10000 test images" in capsys.readouterr().out


@pytest.mark.parametrize("args, fragment", [
    (["/nonexistent/run"], "no such run directory"),
    (["{empty}"], "no model.safetensors"),
    (["{run}"], "cannot load into lenet5"),
    (["{run}", "foo=1"], "evaluate takes dataset, data-dir, device"),
    (["{run}", "device=tpu"], "device must be auto, cpu, cuda or cuda:N; got 'tpu'"),  # its Option's check
])
def test_evaluate_bad_input_is_one_line_exit_2(tmp_path, capsys, args, fragment):
    (tmp_path / "empty").mkdir()
    run = tmp_path / "run"
    run.mkdir()
    (run / "model.safetensors").write_bytes(b"")
    (run / "model.json").write_text(json.dumps({"format": "sflower.saved-model/1", "model": "lenet5", "cut-layer": 2,
                                                "dataset": "mnist-5k", "input-shape": [1, 28, 28],
                                                "num-classes": 10}))
    args = [a.format(empty=tmp_path / "empty", run=run) for a in args]
    capsys.readouterr()
    code = main(["evaluate", *args])
    err = capsys.readouterr().err.strip()
    assert code == 2 and fragment in err and "\n" not in err, err


def test_diverged_run_writes_no_final_model(tmp_path, one_torch_thread):
    out = tmp_path / "run"
    code = main(cli_args({**SHORT, "strategy": "splitfed-v1", "lr": 1e6, "clip-norm": 0, "output-dir": str(out)},
                         "-q"))
    summary = json.loads((out / "summary.json").read_text())
    if code == 0:
        pytest.skip("the run did not diverge")
    assert summary["status"].startswith("diverged")
    assert not Path(out / "model.safetensors").exists()
