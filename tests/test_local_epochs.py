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

    from fl_app.task import load_task
    from simulation.clock import VirtualClock
    from strategies.base import ClientInfo
    from strategies.clock import ZeroTiming
    from strategies.fl import FedAvg
    from tests.conftest import make_cfg
    from fl_app import protocol as P

    cfg = make_cfg(strategy="fedavg", local_epochs=3, batch_size=64)
    s = FedAvg(cfg, load_task(cfg), clock=VirtualClock(), timing=ZeroTiming(), progress=False)
    s.initialize()
    s.clients = {0: ClientInfo(0, 10, 1000, [100] * 10), 1: ClientInfo(1, 11, 130, [13] * 10)}
    for pid, want in ((0, 3 * 15), (1, 3 * 2)):
        req = s.fit_request(P.state_record(s.model.state_dict()), pid)
        assert P.FitConfig.from_record(P.config_of(req.content, P.CONFIG)).local_iterations == want


def test_bad_local_epochs(tmp_path, capsys):
    assert main(cli_args({**RUN, "local-epochs": -1, "output-dir": tmp_path / "bad"})) == 2
    assert "local-epochs must be >= 0" in capsys.readouterr().err
