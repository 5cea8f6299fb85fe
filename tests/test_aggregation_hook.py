"""The aggregation hook (:meth:`strategies.core.aggregation.ModelAggregation.aggregate_models`).

1. The default is the sample-weighted mean, ``Σ_k w_k·x_k / Σ_k w_k``, checked
   against hand-computed numbers, and it is :func:`weighted_average` bit for
   bit (the arithmetic every shipped number was produced with).
2. A subclass that overrides only the hook (a coordinate-wise median) is
   called for every model average of every averaging strategy, and its
   result is what the strategy keeps, on tiny in-process runs (LeNet-5,
   3 clients, 1-2 global iterations). FedBuff and CA²FL combine updates in
   ``apply_buffer``, not through the hook: they never call it, and say so.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import pytest
import torch

from strategies.core.aggregation import ModelAggregation, weighted_average
from tests.conftest import make_cfg

pytestmark = pytest.mark.usefixtures("one_torch_thread")


# =============================================================================
# 1. The default: the sample-weighted mean
# =============================================================================


def test_default_is_the_hand_computed_weighted_mean():
    a = {"w": torch.tensor([1.0, 2.0]), "b": torch.tensor([[0.0, 4.0]]), "n": torch.tensor(5)}
    b = {"w": torch.tensor([5.0, 6.0]), "b": torch.tensor([[4.0, 0.0]]), "n": torch.tensor(9)}
    c = {"w": torch.tensor([3.0, -2.0]), "b": torch.tensor([[8.0, 8.0]]), "n": torch.tensor(1)}
    out = ModelAggregation().aggregate_models([a, b, c], [2.0, 1.0, 1.0])
    # (2a + b + c) / 4
    assert out["w"].tolist() == [(2 * 1 + 5 + 3) / 4, (2 * 2 + 6 - 2) / 4]  # [2.5, 2.0]
    assert out["b"].tolist() == [[(0 + 4 + 8) / 4, (8 + 0 + 8) / 4]]  # [[3.0, 4.0]]
    assert out["w"].dtype == torch.float32 and out["b"].shape == (1, 2)
    assert out["n"].dtype == torch.int64 and int(out["n"]) == 5  # integer entries: the first model's
    assert a["w"].tolist() == [1.0, 2.0]  # inputs untouched
    with pytest.raises(ValueError):
        ModelAggregation().aggregate_models([a, b], [0.0, 0.0])


def test_default_is_weighted_average_bit_for_bit():
    g = torch.Generator().manual_seed(0)
    models = [{"w": torch.randn(7, 5, generator=g), "h": torch.randn(3, generator=g, dtype=torch.float64)}
              for _ in range(4)]
    weights = [713.0, 662.0, 1001.0, 1.0]
    got, ref = ModelAggregation().aggregate_models(models, weights), weighted_average(models, weights)
    assert all(torch.equal(got[k], ref[k]) and got[k].dtype == ref[k].dtype for k in ref)


def test_aggregate_uploads_orders_and_weights_for_the_hook():
    """A mapping is combined in ascending pid order, pairs in their order; weights from ``aggregation_weight``."""
    seen = []

    class Probe(ModelAggregation):
        def aggregation_weight(self, pid):
            return 10.0 * pid

        def aggregate_models(self, models, weights):
            seen.append(([float(m["w"]) for m in models], list(weights)))
            return super().aggregate_models(models, weights)

    up = {2: {"w": torch.tensor(2.0)}, 1: {"w": torch.tensor(1.0)}}
    assert float(Probe().aggregate_uploads(up)["w"]) == pytest.approx((10 * 1 + 20 * 2) / 30)
    Probe().aggregate_uploads([(2, up[2]), (1, up[1])], lambda pid: 1.0)
    assert seen == [([1.0, 2.0], [10.0, 20.0]), ([2.0, 1.0], [1.0, 1.0])]


# =============================================================================
# 2. An override of the hook alone, on every averaging strategy
# =============================================================================


def median_of(models: Sequence[Mapping[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Coordinate-wise median of the float entries (the lower middle value for even K); others from models[0]."""
    return {k: torch.stack([m[k] for m in models]).median(dim=0).values if torch.is_floating_point(v) else v.clone()
            for k, v in models[0].items()}


def with_median_hook(cls: type) -> type:
    """``cls`` with only :meth:`aggregate_models` overridden: a median that records each call."""

    def aggregate_models(self, models, weights):
        out = median_of(models)
        self.__dict__.setdefault("hook_calls", []).append(
            (frozenset(models[0]), list(weights), out, weighted_average(models, weights)))
        return out

    return type(f"Median{cls.__name__}", (cls,), {"aggregate_models": aggregate_models})


def run_strategy(cls: type, **overrides):
    """A tiny in-process run of ``cls`` (LeNet-5 cut 3, 3 clients, all concurrent, E = 2, B = 8); the strategy."""
    from fl_app.client_app import app
    from fl_app.learning.task import load_task
    from simulation.engine import InProcessGrid
    from simulation.timing.clocks import VirtualClock
    from simulation.timing.durations import ZeroTiming

    values = dict(strategy=cls.name, model="lenet5", cut_layer=3, num_clients=3, concurrency=3,
                  global_iterations=1, local_iterations=2, batch_size=8, eval_every=0)
    cfg = make_cfg(**{**values, **overrides})
    s = cls(cfg, load_task(cfg), clock=VirtualClock(), timing=ZeroTiming(), progress=False)
    s.start(InProcessGrid(app, cfg.num_clients, seed=cfg.seed))
    assert s.status == "completed"
    return s


def parts(s) -> dict[str, dict[str, torch.Tensor]]:
    """The strategy's models that an aggregate may land in, by name."""
    names = ("client_model", "server_model") if hasattr(s, "client_model") else ("model",)
    return {n: getattr(s, n).state_dict() for n in names}


#: strategy -> (the models it averages through the hook, the number of models per call, extra settings)
AVERAGING = {
    "splitfed-v1": ({"client_model", "server_model"}, 3, {"global_iterations": 2}),
    "splitfed-v2": ({"client_model"}, 3, {}),
    "minibatch-sfl": ({"client_model"}, 3, {}),
    "vanilla-sl": ({"client_model"}, 1, {}),
    "s2fl": ({"client_model", "server_model"}, None, {}),  # server side: one copy per group
    "mu-splitfed": ({"client_model", "server_model"}, 3, {}),
    "gas": ({"client_model"}, 3, {"generate": False}),
    "fedavg": ({"model"}, 3, {}),
    "ringsfl": ({"model"}, 3, {}),
}


@pytest.mark.parametrize("name", list(AVERAGING))
def test_an_override_of_the_hook_alone_is_every_average(name, server_identity):
    """Every average of the strategy calls the override, and the strategy keeps what it returns."""
    from strategies.core.registry import get_strategy

    averaged, k, overrides = AVERAGING[name]
    s = run_strategy(with_median_hook(get_strategy(name)), **overrides)
    calls = s.__dict__.get("hook_calls", [])
    assert calls, f"{name} never called aggregate_models"
    models = parts(s)
    keysets = {n: frozenset(state) for n, state in models.items()}
    hit = {n for keys, *_ in calls for n, ks in keysets.items() if keys == ks}
    assert hit == averaged and all(keys in keysets.values() for keys, *_ in calls)
    assert k is None or all(len(w) == k for _, w, _, _ in calls)
    for n in averaged:  # the last aggregate of each part is that part's final state
        _, _, out, _ = [c for c in calls if c[0] == keysets[n]][-1]
        assert all(torch.equal(out[key], models[n][key]) for key in out), f"{name}: {n} is not the hook's result"
    if k != 1:  # the median changed what was combined (with K = 1 both are that model)
        assert any(not torch.equal(out[key], mean[key]) for _, _, out, mean in calls for key in out)


def test_weights_follow_the_aggregation_key(server_identity):
    """SplitFed-V1's calls carry |D_k| (``aggregation=data-size``), client models and server copies alike, in
    ascending pid order; with ``aggregation=uniform`` the hook gets weights 1."""
    from strategies.algorithms.splitfed import SplitFedV1

    s = run_strategy(with_median_hook(SplitFedV1))
    sizes = [float(s.clients[p].num_examples) for p in sorted(s.clients)]
    assert len(set(sizes)) > 1 and len(s.hook_calls) == 2
    assert all(w == sizes for _, w, _, _ in s.hook_calls)
    s.cfg = s.cfg.replace(aggregation="uniform")
    s.aggregate_uploads({p: s.client_model.state_dict() for p in s.clients})
    assert s.hook_calls[-1][1] == [1.0, 1.0, 1.0]


def test_the_override_changes_the_trained_model(server_identity):
    """The user's case: SplitFed-V1 with only the hook overridden trains to a different model than SplitFed-V1."""
    from strategies.algorithms.splitfed import SplitFedV1

    base, median = run_strategy(SplitFedV1), run_strategy(with_median_hook(SplitFedV1))
    a, b = base.model.state_dict(), median.model.state_dict()
    assert a.keys() == b.keys() and any(not torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("name", ["fedbuff", "ca2fl"])
def test_buffered_fl_does_not_call_the_hook_and_says_so(name, server_identity, caplog):
    """FedBuff and CA²FL combine updates in ``apply_buffer``; an override of the hook warns that it is unused."""
    from strategies.core.registry import get_strategy

    with caplog.at_level("WARNING", logger="sflower"):
        s = run_strategy(with_median_hook(get_strategy(name)))
    assert "hook_calls" not in s.__dict__
    assert any("aggregate_models is overridden but never called" in r.getMessage() for r in caplog.records)
