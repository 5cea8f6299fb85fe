"""The optimizers a training message can name (``optimizer=sgd|adamw``) and their state,
which must survive between a node's messages (docs/explanation/design.md §4: no live objects survive)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from fl_app.models import build_model
from fl_app.learning.training import load_optimizer, make_sgd, optimizer_record


def _steps(model, opt, xs, ys, save_between=False, kind="sgd"):
    for x, y in zip(xs, ys):
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if save_between:  # what a node does: state to a record, a fresh optimizer from it
            record = optimizer_record(model, opt)
            opt = make_sgd(model, 1e-3, 0.9, 0.01, kind=kind)
            load_optimizer(model, opt, record)
    return model


@pytest.mark.parametrize("kind", ["sgd", "adamw"])
def test_optimizer_state_survives_a_record_round_trip(kind):
    """Three steps with the state saved and reloaded between them equal three steps of one optimizer."""
    gen = torch.Generator().manual_seed(0)
    xs = [torch.randn(4, 1, 28, 28, generator=gen) for _ in range(3)]
    ys = [torch.randint(0, 10, (4,), generator=gen) for _ in range(3)]
    a, b = build_model("lenet5", (1, 28, 28), 10, seed=1), build_model("lenet5", (1, 28, 28), 10, seed=1)
    _steps(a, make_sgd(a, 1e-3, 0.9, 0.01, kind=kind), xs, ys)
    _steps(b, make_sgd(b, 1e-3, 0.9, 0.01, kind=kind), xs, ys, save_between=True, kind=kind)
    for (k, va), vb in zip(a.state_dict().items(), b.state_dict().values()):
        assert torch.equal(va, vb), k


def test_adamw_is_adamw_and_unknown_kinds_are_refused():
    model = build_model("lenet5", (1, 28, 28), 10)
    opt = make_sgd(model, 3e-4, 0.9, 0.05, lr_scale=[2.0] * len(model), kind="adamw")
    assert isinstance(opt, torch.optim.AdamW)
    assert {g["lr"] for g in opt.param_groups} == {6e-4} and opt.param_groups[0]["weight_decay"] == 0.05
    with pytest.raises(ValueError, match="unknown optimizer 'adam'"):
        make_sgd(model, 0.1, 0.0, 0.0, kind="adam")


def test_bad_optimizer_key_is_a_config_error():
    from fl_app.run.config import RunConfig
    from fl_app.run.errors import ConfigError

    assert RunConfig.from_mapping({"optimizer": "adamw"}).optimizer == "adamw"
    with pytest.raises(ConfigError, match="optimizer must be one of sgd, adamw"):
        RunConfig.from_mapping({"optimizer": "adam"})
