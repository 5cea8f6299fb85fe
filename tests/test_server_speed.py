"""``server-speed``: the server's compute on the virtual clock (docs/explanation/design.md §6, "Server compute").

The virtual times below are computed by hand from LeNet-5's block FLOPs (cut after block 3):

* client side (conv1, relu1, pool1): 235,200 forward FLOPs per sample;
* server side (the other 9 blocks): 597,840 forward FLOPs per sample.

``heterogeneity=none``: every client at 5e9 FLOP/s, free communication, no stragglers.
"""

from __future__ import annotations

import math

import pandas as pd
import pytest

from fl_app.run.errors import ConfigError
from simulation.cli import main
from simulation.timing.durations import DeviceTiming, ZeroTiming
from simulation.timing.profiles import DeviceProfile
from strategies.algorithms.gas.generation import generation_flops
from tests.conftest import cli_args, make_cfg

CLIENT_FWD = 235_200.0  # FLOPs per sample, LeNet-5 blocks [0, 3)
SERVER_FWD = 597_840.0  # FLOPs per sample, LeNet-5 blocks [3, 12)
B, P, K = 4, 1, 2  # batch, perturbation pairs, clients (all in every round)

TINY_ZO = {"dataset": "mnist-5k", "model": "lenet5", "cut-layer": 3, "num-clients": K, "concurrency": K,
           "partition": "iid", "global-iterations": 2, "local-iterations": 1, "batch-size": B, "lr": 0.002,
           "momentum": 0.0, "weight-decay": 0.0, "perturbations": P, "heterogeneity": "none", "seed": 0,
           "eval-samples": 50}

#: One client's round with E = 1: a ZO forward (2P + 1 client forwards of B samples) at 5e9 FLOP/s; the
#: zo_update that returns the model computes nothing (its piggybacked request is the weights) and
#: communication is free.
CLIENT_ROUND_S = (2 * P + 1) * B * CLIENT_FWD / 5e9  # 5.6448e-4 s
#: MU-SplitFed at τ = 2: per client, τ ZO steps of 2P + 1 server forwards, then the 2P forwards of its
#: loss differences: 2 * (2 * (2·1 + 1) + 2·1) = 16 batch forwards of B samples in a round.
MU_TAU2_SERVER_FLOPS = K * (2 * (2 * P + 1) + 2 * P) * B * SERVER_FWD  # 38,261,760 FLOPs
#: ZO-SplitFed (τ = 1): 2 * ((2·1 + 1) + 2·1) = 10 batch forwards.
ZO_SPLITFED_SERVER_FLOPS = K * ((2 * P + 1) + 2 * P) * B * SERVER_FWD  # 23,913,600 FLOPs


def _times(tmp_path, name: str, **keys) -> list[float]:
    """The run's ``virtual_time_s`` per metric row (the CSV rounds to 1e-6 s), the last one replaced by
    ``summary.json``'s unrounded value."""
    out = tmp_path / name
    args = {**TINY_ZO, **{k.replace("_", "-"): v for k, v in keys.items()}, "output-dir": out}
    assert main(cli_args(args, "-q")) == 0
    times = pd.read_csv(out / "metrics.csv")["virtual_time_s"].tolist()
    last = pd.read_json(out / "summary.json", typ="series")["virtual_time_s"]
    assert times[-1] == pytest.approx(last, abs=1e-6)
    return [*times[:-1], float(last)]


def _close(got: list[float], want: list[float]) -> None:
    """Equal to the CSV's 1e-6 s rounding, the last (unrounded) one to 1e-12 relative."""
    assert got[:-1] == pytest.approx(want[:-1], abs=1e-6)
    assert got[-1] == pytest.approx(want[-1], rel=1e-12)


def test_server_speed_defaults_to_free():
    assert make_cfg().server_speed == 0
    assert make_cfg(server_speed="1e11").server_speed == 1e11


@pytest.mark.parametrize("value", ["-5", "-1e9", "fast", "nan", "inf", ""])
def test_bad_server_speed_is_refused_in_one_line(value, tmp_path, capsys):
    with pytest.raises(ConfigError, match="server-speed") as err:
        make_cfg(server_speed=value)
    assert "\n" not in str(err.value)
    code = main(cli_args({"server-speed": value, "output-dir": tmp_path / "run"}))
    lines = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and len(lines) == 1 and "server-speed" in lines[0]
    assert not (tmp_path / "run").exists()


def test_device_timing_charges_server_flops():
    profiles = [DeviceProfile(partition_id=0, flops_per_s=5e9)]
    assert DeviceTiming(profiles, 0).server_seconds(1e12) == 0.0  # default: free
    timing = DeviceTiming(profiles, 0, server_flops_per_s=2e9)
    assert timing.server_seconds(3e9) == 1.5
    assert timing.server_seconds(0.0) == 0.0
    assert timing.duration(0, 5e9) == 1.0  # client time is unchanged
    with pytest.raises(ValueError):
        timing.server_seconds(-1.0)
    with pytest.raises(ConfigError, match="server-speed"):
        DeviceTiming(profiles, 0, server_flops_per_s=0.0)
    assert ZeroTiming().server_seconds(1e12) == 0.0  # the wall clock: server work takes its real time


def test_generation_flops():
    assert generation_flops(10, "full", 3, 2) == 2 * 10 * 10 * 5
    assert generation_flops(10, "diagonal", 3, 2) == 4 * 10 * 3 + 3 * 10 * 2
    assert generation_flops(10, "full", 0, 0) == 0.0


def test_default_keeps_todays_virtual_times(tmp_path):
    """No key and ``server-speed=0`` give today's times: rounds of client time alone."""
    default = _times(tmp_path, "default", strategy="mu-splitfed", server_steps=2)
    assert default == _times(tmp_path, "zero", strategy="mu-splitfed", server_steps=2, server_speed="0")
    _close(default, [0.0, CLIENT_ROUND_S, 2 * CLIENT_ROUND_S])


def test_mu_splitfed_and_zo_splitfed_server_time_by_hand(tmp_path):
    """At a finite speed each round adds its server FLOPs / speed: τ = 2 costs 16/10 of τ = 1's."""
    speed = MU_TAU2_SERVER_FLOPS  # FLOP/s: exactly 1 s of server time per MU-SplitFed round
    mu = _times(tmp_path, "mu", strategy="mu-splitfed", server_steps=2, server_speed=speed)
    _close(mu, [0.0, CLIENT_ROUND_S + 1.0, 2 * (CLIENT_ROUND_S + 1.0)])
    zo = _times(tmp_path, "zo", strategy="splitfed-v1", client_optimizer="zo", server_optimizer="zo",
                server_speed=speed)
    per = ZO_SPLITFED_SERVER_FLOPS / speed  # 0.625 s
    assert per == 0.625
    _close(zo, [0.0, CLIENT_ROUND_S + per, 2 * (CLIENT_ROUND_S + per)])
    summary = pd.read_json(tmp_path / "mu" / "summary.json", typ="series")
    assert summary["server_virtual_s"] == pytest.approx(2.0, rel=1e-12)


def test_first_order_sync_round_charges_forward_and_backward(tmp_path):
    """SplitFed-V1, first order, E = 1: the server's forward and backward of each client's batch."""
    from fl_app.models import build_model, profile_blocks

    prof = profile_blocks(build_model("lenet5", (1, 28, 28), 10, 0), (1, 28, 28))
    server = sum(b.forward_flops + b.backward_flops for b in prof[3:]) * B * K
    free = _times(tmp_path, "free", strategy="splitfed-v1")
    charged = _times(tmp_path, "charged", strategy="splitfed-v1", server_speed=server)  # 1 s per round
    _close([c - f for c, f in zip(charged, free)], [0.0, 1.0, 2.0])


def test_gas_charges_its_server(tmp_path):
    """GAS: the activation gradients, the server steps and the generation move the clock; the default does not."""
    keys = {"strategy": "gas", "global-iterations": 1, "local-iterations": 2}
    free = _times(tmp_path, "free", **keys)
    assert free == _times(tmp_path, "zero", **keys, server_speed="0")
    charged = _times(tmp_path, "charged", **keys, server_speed=1e9)
    assert charged[-1] > free[-1]
    summary = pd.read_json(tmp_path / "charged" / "summary.json", typ="series")
    assert summary["server_virtual_s"] > 0
    assert "server_virtual_s" not in pd.read_json(tmp_path / "free" / "summary.json", typ="series")
