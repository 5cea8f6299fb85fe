"""``local-epochs=N``: each client's local work is N passes over its own partition, ⌊|D_k|/B⌋ steps a pass."""

from __future__ import annotations

import json

import pytest

from simulation.cli import main
from tests.conftest import cli_args

pytestmark = pytest.mark.usefixtures("one_torch_thread")

RUN = {"dataset": "mnist-5k", "model": "lenet5", "cut-layer": 3, "num-clients": 3, "concurrency": 3,
       "partition": "dirichlet", "alpha": 1.0, "min-partition-size": 64, "batch-size": 64, "local-epochs": 1,
       "local-iterations": 2, "global-iterations": 1, "heterogeneity": "none", "eval-samples": 200, "seed": 4}


def _run(tmp_path, name, **keys):
    out = tmp_path / name
    assert main(cli_args({**RUN, **keys, "output-dir": out}, "-q")) == 0
    return json.loads((out / "summary.json").read_text())


def _steps(summary, epochs=1, batch=64):
    sizes = [int(n) for _, n in sorted(summary["client_examples"].items())]
    assert len(set(sizes)) == len(sizes), sizes  # unequal partitions: the case where counts differ
    return [epochs * (n // batch) for n in sizes]


def test_sync_rounds_count_each_clients_own_epochs(tmp_path):
    """SplitFed-V1 steps each client's server copy once per exchange: Σ_k ⌊|D_k|/B⌋ server updates;
    MiniBatch-SFL steps once per exchange while any client trains: the longest client's count."""
    v1 = _run(tmp_path, "v1", strategy="splitfed-v1")
    steps = _steps(v1)
    assert v1["server_updates"] == sum(steps)
    two = _run(tmp_path, "v1-2", strategy="splitfed-v1", **{"local-epochs": 2})
    assert two["server_updates"] == 2 * sum(steps)
    fixed = _run(tmp_path, "v1-fixed", strategy="splitfed-v1", **{"local-epochs": 0})
    assert fixed["server_updates"] == 3 * 2  # local-iterations when local-epochs is 0


def test_async_and_fl_honour_local_epochs(tmp_path):
    """GAS: every client round is its own ⌊|D_k|/B⌋ iterations; FedAvg's train.fit runs as many."""
    import pandas as pd

    # one client at a time, Q_c = 1: a global iteration is exactly one client's local round
    gas = _run(tmp_path, "gas", strategy="gas", concurrency=1, **{"generate": "false", "buffer-models": 1,
                                                                  "global-iterations": 5})
    steps = _steps(gas)
    rounds = pd.read_csv(tmp_path / "gas" / "metrics.csv")["client_iterations"].diff().dropna().astype(int)
    assert len(rounds) == 5 and set(rounds) <= set(steps) and len(set(rounds)) > 1, (list(rounds), steps)

    from fl_app.learning.task import load_task
    from simulation.timing.clocks import VirtualClock
    from strategies.core.base import ClientInfo
    from simulation.timing.durations import ZeroTiming
    from strategies.algorithms.fl import FedAvg
    from tests.conftest import make_cfg
    from fl_app import protocol as P

    cfg = make_cfg(strategy="fedavg", local_epochs=3, batch_size=64)
    s = FedAvg(cfg, load_task(cfg), clock=VirtualClock(), timing=ZeroTiming(), progress=False)
    s.initialize()
    s.clients = {0: ClientInfo(0, 10, 1000, [100] * 10), 1: ClientInfo(1, 11, 130, [13] * 10)}
    for pid, want in ((0, 3 * 15), (1, 3 * 2)):
        req = s.fit_request(P.state_record(s.model.state_dict()), pid)
        assert P.FitConfig.from_record(P.config_of(req.content, P.CONFIG)).local_iterations == want


def test_vanilla_sl_batch_order_round_is_one_clients_epochs(tmp_path):
    """RingSFL §6: a round of vanilla SL is ``local_epoch_num × batch_num`` steps, batch_num being one
    client's batches per epoch (the most over the cohort with unequal partitions), not the cohort's sum."""
    sl = _run(tmp_path, "sl", strategy="vanilla-sl", **{"sl-order": "batch", "local-epochs": 2})
    steps = _steps(sl, epochs=2)
    assert sl["server_updates"] == max(steps) < sum(steps)


def test_bad_local_epochs(tmp_path, capsys):
    assert main(cli_args({**RUN, "local-epochs": -1, "output-dir": tmp_path / "bad"})) == 2
    assert "local-epochs must be >= 0" in capsys.readouterr().err


@pytest.mark.parametrize("strategy", ["ringsfl", "minibatch-sfl"])
def test_equal_partitions_epochs_are_that_many_iterations(tmp_path, strategy):
    """preset=ringsfl-reference on mnist-5k: 5 contiguous chunks of 800, B = 64, 2 local epochs: exactly
    local-iterations=24, bit for bit."""
    import pandas as pd

    keys = {"strategy": strategy, "preset": "ringsfl-reference", "global-iterations": 1, "eval-samples": 500}
    if strategy == "ringsfl":
        keys["ring-lengths"] = "8:1:1:1:1"
    else:
        keys["preset-any-strategy"] = True  # the preset is RingSFL's; MiniBatch-SFL takes the keys it reads
    for name, extra in (("epochs", {}), ("iterations", {"local-epochs": 0, "local-iterations": 24})):
        assert main(cli_args({**keys, **extra, "output-dir": tmp_path / name}, "-q")) == 0
    a, b = (pd.read_csv(tmp_path / n / "metrics.csv").drop(columns=["wall_time_s"]) for n in ("epochs", "iterations"))
    assert a.equals(b)
    one = json.loads((tmp_path / "epochs" / "summary.json").read_text())
    assert one["client_examples"] == {str(k): 800 for k in range(5)}


def test_ringsfl_reference_preset_and_its_data():
    """The RingSFL authors' choices: their LeNet, PyTorch's init, plain SGD at 0.02, B = 64, pixels in
    [-1, 1], 2 local epochs, 5 clients holding contiguous chunks in file order."""
    import torch

    from fl_app.run.config import RunConfig
    from fl_app.learning.task import load_task

    cfg = RunConfig.from_mapping({"preset": "ringsfl-reference"})
    assert (cfg.model, cfg.init, cfg.lr, cfg.momentum, cfg.batch_size, cfg.local_epochs, cfg.num_clients) == \
        ("lenet5-ringsfl", "torch-default", 0.02, 0.0, 64, 2, 5)
    task = load_task(cfg)
    n = task.data.y_train.shape[0]
    assert [p.tolist() for p in task.partitions] == [list(range(i * n // 5, (i + 1) * n // 5)) for i in range(5)]
    x, _ = task.data.train_batch(task.partitions[0][:8])
    raw = task.data.x_train[task.partitions[0][:8]].to(torch.float32) / 255
    assert torch.allclose(x, (raw - 0.5) / 0.5, atol=1e-6) and float(x.min()) == -1.0
    plain = load_task(RunConfig.from_mapping({}))
    assert plain.data.mean == (0.1307,)  # the default keeps the dataset's own statistics
