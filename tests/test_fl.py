"""FL baselines (docs/explanation/design.md §7, "Asynchronous FL baselines"): the pure
update rules of :mod:`strategies.core.aggregation` against hand-worked numbers,
the strategies' wiring of those rules, and two short in-process runs
(FedBuff's buffer size, FedAvg actually learning on mnist-5k).
"""

from __future__ import annotations

import math

import pytest
import torch

from strategies.core.aggregation import (ca2fl_step, fedbuff_step, staleness_weight, state_delta,
                                    weighted_average)
from tests.conftest import make_cfg, read_metrics


pytestmark = pytest.mark.usefixtures("one_torch_thread")


def t(*values):
    return torch.tensor(values, dtype=torch.float32)


def assert_close(got, expected, atol=1e-6):
    expected = torch.as_tensor(expected, dtype=got.dtype)
    assert torch.allclose(got, expected, atol=atol, rtol=0), f"{got.tolist()} != {expected.tolist()}"


# =============================================================================
# 1. weighted_average
# =============================================================================


def test_weighted_average_by_hand():
    a = {"w": t(1.0, 2.0), "b": torch.tensor([[0.0, 4.0]]), "n": torch.tensor(5)}
    b = {"w": t(5.0, 6.0), "b": torch.tensor([[4.0, 0.0]]), "n": torch.tensor(9)}
    out = weighted_average([a, b], [1, 3])
    # (1*a + 3*b) / 4
    assert_close(out["w"], [(1 * 1 + 3 * 5) / 4, (1 * 2 + 3 * 6) / 4])  # [4, 5]
    assert_close(out["b"], [[(0 + 3 * 4) / 4, (4 + 0) / 4]])  # [[3, 1]]
    assert out["w"].dtype == torch.float32 and out["b"].shape == (1, 2)
    # integer entries are taken from the first state, not averaged
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 5
    # weights are normalised: 10 and 30 give the same as 1 and 3
    assert_close(weighted_average([a, b], [10, 30])["w"], [4.0, 5.0])
    # the inputs are untouched
    assert a["w"].tolist() == [1.0, 2.0] and b["w"].tolist() == [5.0, 6.0]


def test_weighted_average_rejects_bad_input():
    a = {"w": t(1.0)}
    with pytest.raises(ValueError):
        weighted_average([], [])
    with pytest.raises(ValueError):
        weighted_average([a, a], [1.0])
    with pytest.raises(ValueError):
        weighted_average([a, a], [0.0, 0.0])


# =============================================================================
# 2. FedBuff
# =============================================================================


def test_staleness_weight_values():
    assert staleness_weight(0) == 1.0 and staleness_weight(7, "none") == 1.0
    assert staleness_weight(0, "polynomial") == 1.0
    assert staleness_weight(3, "polynomial") == pytest.approx(0.5)
    assert staleness_weight(8, "polynomial") == pytest.approx(1 / 3)
    with pytest.raises(ValueError):
        staleness_weight(1, "exponential")


def test_fedbuff_step_by_hand():
    state = {"w": t(1.0, 2.0), "n": torch.tensor(7)}
    d1, d2 = {"w": t(2.0, 0.0)}, {"w": t(0.0, 4.0)}
    # w + 0.5 * ((2,0) + (0,4)) / 2 = (1,2) + 0.5*(1,2) = (1.5, 3.0)
    out = fedbuff_step(state, [d1, d2], [1.0, 1.0], 0.5)
    assert_close(out["w"], [1.5, 3.0])
    assert int(out["n"]) == 7
    assert state["w"].tolist() == [1.0, 2.0]  # not modified in place
    # polynomial staleness, tau = (0, 3): s = (1, 1/sqrt(4) = 1/2)
    # mean = ((2,0)*1 + (0,4)*0.5) / 2 = (1, 1); w + 0.5*(1,1) = (1.5, 2.5)
    w = [staleness_weight(0, "polynomial"), staleness_weight(3, "polynomial")]
    assert_close(fedbuff_step(state, [d1, d2], w, 0.5)["w"], [1.5, 2.5])
    # the mean is over K, not over the sum of the weights: one update weighted 1/2 moves half as far
    assert_close(fedbuff_step(state, [d2], [0.5], 1.0)["w"], [1.0, 4.0])


def test_fedbuff_strategy_applies_config():
    """FedBuff.apply_buffer wires server-lr and staleness (the buffer's third item, tau)."""
    from strategies.algorithms.fl import FedBuff

    s = FedBuff.__new__(FedBuff)
    s.cfg = make_cfg(strategy="fedbuff", staleness="polynomial", server_lr=0.5)
    state = {"w": t(1.0, 2.0)}
    out = s.apply_buffer(state, [(0, {"w": t(2.0, 0.0)}, 0), (1, {"w": t(0.0, 4.0)}, 3)])
    assert_close(out["w"], [1.5, 2.5])
    s.cfg = make_cfg(strategy="fedbuff", staleness="none", server_lr=0.5)
    out = s.apply_buffer(state, [(0, {"w": t(2.0, 0.0)}, 0), (1, {"w": t(0.0, 4.0)}, 3)])
    assert_close(out["w"], [1.5, 3.0])


def test_state_delta_skips_integer_entries():
    new = {"w": t(3.0, 1.0), "n": torch.tensor(4)}
    old = {"w": t(1.0, 2.0), "n": torch.tensor(2)}
    d = state_delta(new, old)
    assert set(d) == {"w"}
    assert_close(d["w"], [2.0, -1.0])


# =============================================================================
# 3. CA²FL
# =============================================================================


def _snapshot(cache):
    return {p: {k: v.clone() for k, v in h.items()} for p, h in cache.items()}


def _assert_cache(cache, expected):
    assert set(cache) == set(expected)
    for p, h in expected.items():
        assert_close(cache[p]["w"], h)


def test_ca2fl_step_by_hand():
    """v = (1/N) Σ_i h_i + (1/|S|) Σ_{(i,Δ_i)∈S} (Δ_i − h_i), w ← w + η_g v, h_i ← Δ_i.

    N = 3 clients (client 2 stays silent until round 3), η_g = 0.5.
    """
    N, lr = 3, 0.5
    w0 = {"w": t(1.0, 2.0), "n": torch.tensor(7)}

    # Round 1: empty cache, so v = (1/|S|) Σ Δ_i = ((2,0) + (0,4)) / 2 = (1, 2).
    # w1 = (1,2) + 0.5*(1,2) = (1.5, 3.0); cache {0: (2,0), 1: (0,4)}
    cache0 = {}
    w1, cache1 = ca2fl_step(w0, cache0, [(0, {"w": t(2.0, 0.0)}), (1, {"w": t(0.0, 4.0)})], N, lr)
    assert_close(w1["w"], [1.5, 3.0])
    assert int(w1["n"]) == 7
    assert cache0 == {}
    _assert_cache(cache1, {0: [2.0, 0.0], 1: [0.0, 4.0]})

    # Round 2: client 0 twice in one buffer, (4,2) then (2,2); both are calibrated
    # with h_0 = (2,0) from the start of the round, and the latest one is cached.
    #   (1/N) Σ h_i = ((2,0) + (0,4)) / 3          = (2/3, 4/3)
    #   Σ (Δ − h_0) = ((4,2)-(2,0)) + ((2,2)-(2,0)) = (2,2) + (0,2) = (2,4); / |S| = 2 -> (1, 2)
    #   v = (5/3, 10/3); w2 = (1.5, 3) + 0.5 v = (1.5 + 5/6, 3 + 5/3)
    before = _snapshot(cache1)
    w2, cache2 = ca2fl_step(w1, cache1, [(0, {"w": t(4.0, 2.0)}), (0, {"w": t(2.0, 2.0)})], N, lr)
    assert_close(w2["w"], [1.5 + 5 / 6, 3.0 + 5 / 3], atol=1e-5)
    _assert_cache(cache2, {0: [2.0, 2.0], 1: [0.0, 4.0]})
    _assert_cache(cache1, {p: h["w"].tolist() for p, h in before.items()})  # input cache not mutated
    assert cache2 is not cache1

    # Round 3: |S| = 3, a first-time client (h_2 = 0).
    #   (1/N) Σ h_i = ((2,2) + (0,4)) / 3 = (2/3, 2)
    #   Σ (Δ − h) = ((1,1)-(0,4)) + ((3,0)-0) + ((0,0)-(2,2)) = (1,-3) + (3,0) + (-2,-2) = (2,-5); /3
    #   v = (2/3 + 2/3, 2 - 5/3) = (4/3, 1/3); w3 = w2 + 0.5 v = (3.0, 29/6)
    before = _snapshot(cache2)
    w3, cache3 = ca2fl_step(w2, cache2, [(1, {"w": t(1.0, 1.0)}), (2, {"w": t(3.0, 0.0)}),
                                         (0, {"w": t(0.0, 0.0)})], N, lr)
    assert_close(w3["w"], [3.0, 29 / 6], atol=1e-5)
    _assert_cache(cache3, {0: [0.0, 0.0], 1: [1.0, 1.0], 2: [3.0, 0.0]})
    _assert_cache(cache2, {p: h["w"].tolist() for p, h in before.items()})
    assert w2["w"].tolist() == pytest.approx([1.5 + 5 / 6, 3.0 + 5 / 3])  # state not modified in place


def test_ca2fl_strategy_keeps_its_cache():
    """CA2FL.apply_buffer threads its cache through rounds with N = num-clients."""
    from strategies.algorithms.fl import CA2FL

    s = CA2FL.__new__(CA2FL)
    s.cfg = make_cfg(strategy="ca2fl", num_clients=3, concurrency=2, server_lr=0.5)
    s.cache = {}
    w1 = s.apply_buffer({"w": t(1.0, 2.0)}, [(0, {"w": t(2.0, 0.0)}, 0), (1, {"w": t(0.0, 4.0)}, 0)])
    assert_close(w1["w"], [1.5, 3.0])
    w2 = s.apply_buffer(w1, [(0, {"w": t(4.0, 2.0)}, 1), (0, {"w": t(2.0, 2.0)}, 0)])
    assert_close(w2["w"], [1.5 + 5 / 6, 3.0 + 5 / 3], atol=1e-5)
    _assert_cache(s.cache, {0: [2.0, 2.0], 1: [0.0, 4.0]})


# =============================================================================
# 4. End-to-end runs
# =============================================================================


def test_fedbuff_flushes_after_exactly_k_uploads(tmp_path, monkeypatch):
    """K = fl-buffer = 3 with C = 2 concurrent clients: every flush sees 3 updates."""
    from simulation.server_app import plan_run
    from simulation.engine import run_inprocess
    from strategies.algorithms.fl import FedBuff

    flushes, replies = [], []
    orig_apply, orig_reply = FedBuff.apply_buffer, FedBuff.on_reply

    def apply_buffer(self, state, buffer):
        flushes.append([(pid, tau) for pid, _, tau in buffer])
        return orig_apply(self, state, buffer)

    def on_reply(self, reply):
        replies.append(reply.pid)
        return orig_reply(self, reply)

    monkeypatch.setattr(FedBuff, "apply_buffer", apply_buffer)
    monkeypatch.setattr(FedBuff, "on_reply", on_reply)
    out = tmp_path / "fedbuff"
    cfg = make_cfg(strategy="fedbuff", num_clients=4, concurrency=2, fl_buffer=3, global_iterations=2,
                   local_iterations=1, batch_size=8, heterogeneity="gas", output_dir=str(out))
    summary = run_inprocess(plan_run(cfg), progress=False)

    assert summary["status"] == "completed"
    assert summary["server_updates"] == 2 == summary["global_iterations"]
    assert len(replies) == 6  # 2 flushes x K = 3 uploads, no more
    assert [len(f) for f in flushes] == [3, 3]
    assert [tau for _, tau in flushes[0]] == [0, 0, 0]  # everything of flush 1 started from version 0
    # flush 1 left one version-0 client and one version-1 client in flight: at most one
    # update of flush 2 is one version stale, the others are fresh
    taus = sorted(tau for _, tau in flushes[1])
    assert taus[:2] == [0, 0] and taus[2] in (0, 1), taus
    rows = read_metrics(out / "metrics.csv")
    assert [int(r["global_iteration"]) for r in rows] == [0, 1, 2]
    assert [int(r["server_updates"]) for r in rows] == [0, 1, 2]
    times = [float(r["virtual_time_s"]) for r in rows]
    assert times[0] == 0.0 and 0 < times[1] <= times[2]


@pytest.mark.slow  # a learning run on MNIST (86 s under load)
def test_fedavg_learns_on_mnist(tmp_path):
    """Two rounds of 15 local iterations reach ~0.8 (measured 0.77-0.82 over seeds 0-2);
    an untrained model is at ~0.1."""
    from simulation.server_app import plan_run
    from simulation.engine import run_inprocess

    out = tmp_path / "fedavg"
    cfg = make_cfg(strategy="fedavg", num_clients=2, concurrency=2, global_iterations=2, local_iterations=15,
                   batch_size=32, eval_every=0, heterogeneity="gas", output_dir=str(out))
    summary = run_inprocess(plan_run(cfg), progress=False)
    rows = read_metrics(out / "metrics.csv")
    assert [int(r["global_iteration"]) for r in rows] == [0, 2]
    assert [int(r["server_updates"]) for r in rows] == [0, 2]
    first, last = float(rows[0]["test_accuracy"]), float(rows[-1]["test_accuracy"])
    assert first < 0.2
    assert last > 0.5, f"FedAvg reached only {last}"
    assert summary["final_accuracy"] == pytest.approx(last, abs=1e-6)
    assert math.isfinite(float(rows[-1]["test_loss"])) and float(rows[-1]["test_loss"]) < float(rows[0]["test_loss"])
    assert float(rows[-1]["virtual_time_s"]) > 0
