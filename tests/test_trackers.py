"""Experiment trackers (``tracker=...``): what a short run leaves for a user to open, read back with each
tracker's own reader; missing extras and unknown names fail before anything runs. Offline throughout."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from simulation.cli import main
from tests.conftest import cli_args

REPO = Path(__file__).resolve().parents[1]

#: A short run: 2 clients, 2 global iterations (3 metric rows: iterations 0, 1, 2).
SHORT = {"strategy": "splitfed-v1", "model": "lenet5", "num-clients": 2, "concurrency": 2, "partition": "iid",
         "heterogeneity": "gas", "global-iterations": 2, "local-iterations": 2, "batch-size": 8}


def short_run(out: Path, tracker: str, **extra) -> tuple[pd.DataFrame, dict]:
    code = main(cli_args({**SHORT, **extra, "tracker": tracker, "output-dir": str(out)}, "-q"))
    assert code == 0
    return pd.read_csv(out / "metrics.csv"), json.loads((out / "summary.json").read_text())


def test_tensorboard_event_file_holds_the_accuracy_series(tmp_path, one_torch_thread):
    pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed (pip install 'sflower[tensorboard]')")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    metrics, summary = short_run(tmp_path / "run", "tensorboard")
    ea = EventAccumulator(str(tmp_path / "run" / "tensorboard"))
    ea.Reload()
    acc = ea.Scalars("test_accuracy")
    assert [e.step for e in acc] == metrics.global_iteration.tolist() == [0, 1, 2]
    assert [e.value for e in acc] == pytest.approx(metrics.test_accuracy.tolist(), abs=1e-7)  # float32 on disk
    # the second axis: each event's time is the virtual time
    assert [e.wall_time for e in acc] == pytest.approx(metrics.virtual_time_s.tolist())
    assert {"test_loss", "virtual_time_s", "wall_time_s", "bytes_up"} <= set(ea.Tags()["scalars"])
    assert {"config/text_summary", "summary/text_summary"} <= set(ea.Tags()["tensors"])
    config_text = ea.Tensors("config/text_summary")[0].tensor_proto.string_val[0].decode()
    assert '"strategy": "splitfed-v1"' in config_text
    assert summary["status"] == "completed"


def test_mlflow_search_runs_finds_the_run_with_metrics_and_params(tmp_path, one_torch_thread):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed (pip install 'sflower[mlflow]')")
    import mlflow
    from mlflow import MlflowClient

    out = tmp_path / "run"
    metrics, summary = short_run(out, "mlflow")
    uri = f"sqlite:///{(out / 'mlflow.db').resolve()}"
    mlflow.set_tracking_uri(uri)
    try:
        runs = mlflow.search_runs(experiment_names=["sflower"])
    finally:
        mlflow.set_tracking_uri(None)
    assert len(runs) == 1
    run = runs.iloc[0]
    assert run["tags.mlflow.runName"] == "run" and run["status"] == "FINISHED"
    assert run["params.strategy"] == "splitfed-v1" and run["params.lr"] == "0.01" and run["params.tracker"] == "mlflow"
    assert run["metrics.test_accuracy"] == summary["final_accuracy"]
    assert run["metrics.final_accuracy"] == summary["final_accuracy"]
    history = MlflowClient(tracking_uri=uri).get_metric_history(run["run_id"], "test_accuracy")
    assert [(m.step, m.value) for m in sorted(history, key=lambda m: m.step)] == list(
        zip(metrics.global_iteration, metrics.test_accuracy))
    assert str(run["artifact_uri"]).startswith((out / "mlartifacts").resolve().as_uri())  # inside the run directory


def wandb_records(run_dir: Path) -> list[dict]:
    """The records of the run's offline ``.wandb`` log, read by W&B's own reader (``wandb leet inspect``)."""
    files = list((run_dir / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(files) == 1, files
    wandb_cli = Path(sys.executable).parent / "wandb"
    out = subprocess.run([str(wandb_cli), "leet", "inspect", "--json", str(files[0])], capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]


def test_wandb_offline_run_holds_the_history(tmp_path, one_torch_thread):
    pytest.importorskip("wandb", reason="the wandb extra is not installed (pip install 'sflower[wandb]')")
    out = tmp_path / "run"
    metrics, summary = short_run(out, "wandb")
    records = wandb_records(out)
    history = [r["history"]["item"] for r in records if "history" in r]
    assert [h["global_iteration"] for h in history] == [0, 1, 2]
    assert [h["test_accuracy"] for h in history] == metrics.test_accuracy.tolist()
    assert [h["virtual_time_s"] for h in history] == metrics.virtual_time_s.tolist()
    run = next(r["run"] for r in records if "run" in r)
    assert run["display_name"] == "run" and run["project"] == "sflower"
    config = run["config"]["update"]
    assert config["strategy"] == "splitfed-v1" and config["global-iterations"] == 2
    summaries = {}
    for r in records:
        summaries.update(r.get("summary", {}).get("update", {}))
    assert summaries["final_accuracy"] == summary["final_accuracy"] and summaries["status"] == "completed"


def test_sweep_tracks_each_run_under_its_variant_and_seed(tmp_path, one_torch_thread):
    pytest.importorskip("mlflow", reason="the mlflow extra is not installed (pip install 'sflower[mlflow]')")
    import mlflow

    sweep = tmp_path / "tiny.toml"
    base = {**SHORT, "global-iterations": 1, "tracker": "mlflow,tensorboard"}
    sweep.write_text("[base]\n" + "".join(f"{k} = {json.dumps(v)}\n" for k, v in base.items())
                     + '[variants]\nsync = {strategy = "splitfed-v1"}\nfl = {strategy = "fedavg"}\n'
                     + '[grid]\nvariant = ["sync", "fl"]\nseed = [0]\n')
    out = tmp_path / "sweep"
    assert main(["sweep", str(sweep), f"output-dir={out}", "-q"]) == 0
    mlflow.set_tracking_uri(f"sqlite:///{(out / 'mlflow.db').resolve()}")
    try:
        runs = mlflow.search_runs(experiment_names=["sweep"]).set_index("tags.mlflow.runName")
    finally:
        mlflow.set_tracking_uri(None)
    assert set(runs.index) == {"variant=sync,seed=0", "variant=fl,seed=0"}
    assert runs.loc["variant=fl,seed=0", "tags.variant"] == "fl" and runs.loc["variant=fl,seed=0", "tags.seed"] == "0"
    assert runs.loc["variant=fl,seed=0", "params.strategy"] == "fedavg"
    assert all((out / name / "tensorboard").is_dir() for name in runs.index)


def test_missing_extra_is_one_line_naming_the_install_command_before_anything_runs(tmp_path, capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    out = tmp_path / "run"
    code = main(cli_args({**SHORT, "tracker": "tensorboard,wandb", "output-dir": str(out)}, "-q"))
    err = capsys.readouterr().err.strip()
    assert code == 2 and "\n" not in err and "pip install 'sflower[wandb]'" in err, err
    assert not out.exists()


@pytest.mark.parametrize("value, fragment", [("tensorbored", "unknown tracker 'tensorbored'"),
                                             ("none,mlflow", "'none' cannot be combined")])
def test_bad_tracker_value_exits_2(tmp_path, capsys, value, fragment):
    code = main(cli_args({**SHORT, "tracker": value, "output-dir": str(tmp_path / "run")}, "-q"))
    err = capsys.readouterr().err.strip()
    assert code == 2 and fragment in err and "\n" not in err, err


def test_tracker_packages_are_imported_only_when_asked_for():
    """Planning a run checks that the packages exist without importing them; tracker=none imports none."""
    code = ("import sys\n"
            "from fl_app.run.config import RunConfig\n"
            "from simulation.server_app import plan_run\n"
            "from simulation.outputs.trackers import check_trackers\n"
            "from simulation.cli import main\n"
            "check_trackers('tensorboard,mlflow,wandb')\n"
            "plan_run(RunConfig.from_mapping({'tracker': 'none'}))\n"
            "print(sorted(m for m in ('tensorboard', 'mlflow', 'wandb', 'torch.utils.tensorboard') if m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def test_every_tracker_name_has_a_class_and_an_extra():
    from simulation.outputs.trackers import EXTRAS, TRACKER_CLASSES, TRACKERS

    assert tuple(TRACKER_CLASSES) == TRACKERS == tuple(EXTRAS)
    with open(REPO / "pyproject.toml", "rb") as fh:
        import tomllib

        extras = tomllib.load(fh)["project"]["optional-dependencies"]
    assert set(TRACKERS) <= set(extras)
    dev_self = extras["dev"][-1]  # CI installs dev, so it runs these tests
    assert dev_self.startswith("sflower[") and set(TRACKERS) <= set(dev_self[len("sflower["):-1].split(","))
