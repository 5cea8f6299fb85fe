"""Defences on the activations (NoPeek, clipped noise) and the model-inversion measurement (sflower attack).

* ``distance_correlation`` equals the ``dcor`` package's on random data (1e-9);
* clipping bounds every sample's norm; the noise is a function of its seed only;
* the client's backward objective has the gradient of the joint loss ``L(release(f(x))) + α·dCor(x, f(x))``;
* bad input: negative α, σ, C; a defence a strategy cannot use; noise without clipping;
  ``privacy-record`` without ``output-dir``: one line, exit 2, before anything runs;
* the attack works: undefended LeNet-5 at cut 1 on Fashion-MNIST is inverted above a PSNR at which garments
  are recognisable, and NoPeek and noise each lower it (small runs).
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from fl_app.privacy.activations import ActivationDefence, clip_rows, distance_correlation
from simulation.cli import main
from tests.conftest import cli_args


@pytest.mark.slow  # dcor's numba functions compile on first use (79 s)
@pytest.mark.parametrize("shape", [((20, 5), (20, 3)), ((16, 1, 6, 6), (16, 4, 3, 3)), ((7, 2), (7, 2))])
def test_distance_correlation_matches_dcor(shape):
    dcor = pytest.importorskip("dcor")
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(shape[0], generator=gen, dtype=torch.float64)
    z = torch.randn(shape[1], generator=gen, dtype=torch.float64)
    z = z + 0.5 * x.flatten(1)[:, :1].reshape(-1, *([1] * (z.dim() - 1)))  # some dependence
    ref = dcor.distance_correlation(x.flatten(1).numpy(), z.flatten(1).numpy())
    assert float(distance_correlation(x, z)) == pytest.approx(float(ref), abs=1e-9)
    assert float(distance_correlation(x, x)) == pytest.approx(1.0, abs=1e-9)


def test_distance_correlation_gradient_is_finite_with_duplicate_rows():
    x = torch.tensor([[1.0, 2.0], [1.0, 2.0], [0.0, 1.0], [3.0, -1.0]])
    z = torch.randn(4, 3, generator=torch.Generator().manual_seed(0), requires_grad=True)
    distance_correlation(x, z).backward()
    assert torch.isfinite(z.grad).all()


def test_clip_and_noise():
    acts = torch.randn(8, 3, 4, 4, generator=torch.Generator().manual_seed(1)) * 5
    clipped = clip_rows(acts, 2.0)
    assert clipped.flatten(1).norm(dim=1).max() <= 2.0 + 1e-5
    small = acts[:1] / acts[:1].norm() * 0.5  # a sample inside the bound is unchanged
    assert torch.equal(clip_rows(small, 2.0), small)
    d = ActivationDefence(clip=2.0, sigma=0.5)
    a, b, c = d.release(acts, 11), d.release(acts, 11), d.release(acts, 12)
    assert torch.equal(a, b) and not torch.equal(a, c)
    noise = a - clipped
    assert float(noise.std()) == pytest.approx(1.0, rel=0.15)  # σ·C = 1


def test_backward_objective_is_the_joint_loss_gradient():
    """<g, release(f(x))> + α dCor(x, f(x)) has the gradient of L(release(f(x))) + α dCor when g = ∂L/∂sent."""
    gen = torch.Generator().manual_seed(0)
    f = torch.nn.Linear(6, 4)
    head = torch.nn.Linear(4, 3)
    x, y = torch.randn(10, 6, generator=gen), torch.randint(0, 3, (10,), generator=gen)
    d = ActivationDefence(nopeek_alpha=0.7, clip=1.5, sigma=0.3)
    # the server's side: gradient w.r.t. what it received
    sent = d.release(f(x), 5).detach().requires_grad_(True)
    torch.nn.functional.cross_entropy(head(sent), y).backward()
    f.zero_grad()
    d.objective(x, f(x), sent.grad, 5).backward()
    got = [p.grad.clone() for p in f.parameters()]
    f.zero_grad()
    acts = f(x)
    joint = torch.nn.functional.cross_entropy(head(d.release(acts, 5)), y) + 0.7 * distance_correlation(x, acts)
    joint.backward()
    for g, p in zip(got, f.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-6)


@pytest.mark.parametrize("keys, message", [
    ({"nopeek-alpha": -1}, "nopeek-alpha must be >= 0"),
    ({"act-noise": -0.5}, "act-noise must be >= 0"),
    ({"act-clip": -2}, "act-clip must be >= 0"),
    ({"act-noise": 1.0}, "act-noise needs act-clip"),
    ({"nopeek-alpha": 1.0, "strategy": "fedavg"}, "send no activations"),
    ({"act-clip": 1.0, "strategy": "fedbuff"}, "send no activations"),
    ({"nopeek-alpha": 1.0, "strategy": "mu-splitfed"}, "zeroth-order"),
    ({"act-clip": 1.0, "act-noise": 1.0, "strategy": "splitfed-v1", "client-optimizer": "zo"}, "zeroth-order"),
    ({"privacy-record": "true"}, "needs output-dir"),
    ({"aux-holdout": 4000}, "leaves no training example"),
])
def test_bad_input_is_one_line_exit_2(keys, message, capsys, tmp_path):
    values = {"strategy": "splitfed-v1", "dataset": "mnist-5k", "model": "lenet5", "cut-layer": 1,
              "num-clients": 2, "concurrency": 2, "global-iterations": 1, "local-iterations": 1, **keys}
    if "privacy-record" not in keys:
        values["output-dir"] = tmp_path / "run"
    assert main(cli_args(values)) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


def test_attack_without_record_is_one_line_exit_2(capsys, tmp_path):
    assert main(["attack", str(tmp_path)]) == 2
    assert len(capsys.readouterr().err.strip().splitlines()) == 1
    assert main(["attack", str(tmp_path), "aux=nope"]) == 2


def test_holdout_is_in_no_partition_and_off_changes_nothing(tiny_cfg):
    from fl_app.learning.task import load_task

    base = load_task(tiny_cfg())
    held = load_task(tiny_cfg(aux_holdout=500))
    assert base.holdout is None and len(held.holdout) == 500
    used = np.concatenate(held.partitions)
    assert not set(used.tolist()) & set(held.holdout.tolist())
    assert len(used) + 500 == sum(len(p) for p in base.partitions)


#: The attack test's run: LeNet-5 cut after conv1 on Fashion-MNIST, 4 iid clients, 2 rounds of 5 steps.
SMALL = {"strategy": "splitfed-v1", "model": "lenet5", "cut-layer": 1, "dataset": "fashion-mnist",
         "num-clients": 4, "concurrency": 4, "partition": "iid", "global-iterations": 2, "local-iterations": 5,
         "aux-holdout": 1000, "privacy-record": "true", "seed": 0}


@pytest.fixture(scope="module")
def attacked(fmnist_dir, tmp_path_factory, one_torch_thread):
    """The inversion of three small runs: no defence, NoPeek α=1000 (no step clipping: the dCor gradient of a
    conv layer is small, ~0.015), noise σ=0.03 at C=50 (activation norms are ~100 here)."""
    out = {}
    for name, extra in (("none", {}), ("nopeek", {"nopeek-alpha": 1000.0, "clip-norm": 0.0}),
                        ("noise", {"act-clip": 50.0, "act-noise": 0.03})):
        run_dir = tmp_path_factory.mktemp(name) / "run"
        values = {**SMALL, **extra, "data-dir": fmnist_dir, "output-dir": run_dir}
        assert main(cli_args(values)) == 0
        assert main(["attack", str(run_dir), "epochs=8"]) == 2  # the run dir's data-dir is not read ...
        assert main(["attack", str(run_dir), "epochs=8", f"data-dir={fmnist_dir}"]) == 0  # ... the user's is
        out[name] = json.loads((run_dir / "privacy" / "inversion.json").read_text())
        assert (run_dir / "privacy" / "inversion.png").stat().st_size > 0
    return out


def test_inversion_recovers_garments_without_defence(attacked):
    res = attacked["none"]
    assert res["samples"] == 4 * 32 and res["unmatched_clients"] == []
    assert res["client_model"] == "uploaded"
    # measured 26.2 dB, SSIM 0.80: garments are recognisable in the grid (docs/results/privacy.md); the
    # mean-image floor is 10.8 dB
    assert res["psnr"] > 22.0 and res["ssim"] > 0.6
    assert res["psnr"] > res["psnr_floor"] + 10.0


def test_defences_lower_the_inversion(attacked):
    none = attacked["none"]
    # measured: NoPeek 22.9 dB (-3.3), noise ~17 dB
    for name in ("nopeek", "noise"):
        assert attacked[name]["psnr"] < none["psnr"] - 2.0, name
        assert attacked[name]["ssim"] < none["ssim"], name


def test_report_adds_the_inversion_columns_and_plots(tmp_path):
    """Attacked runs: PSNR and SSIM columns (mean ± 95 % half-width), privacy.png and cut-layer.png; attacked
    U-shaped runs: the label AUC columns and label-leakage.png."""
    import pandas as pd

    from simulation.outputs.privacy_report import plot_cut_layer, plot_label_leakage, plot_privacy
    from simulation.outputs.report import _label, summarize

    nan = float("nan")
    table = pd.DataFrame({
        "strategy": ["gas"] * 4, "cut-layer": [1, 1, 3, 3], "status": ["completed"] * 4,
        "final_accuracy": [0.6, 0.7, 0.6, 0.5], "best_accuracy": [0.6, 0.7, 0.6, 0.5],
        "time_to_target_s": [nan] * 4, "iterations_to_target": [nan] * 4,
        "inversion_psnr": [30.0, 32.0, 20.0, 20.0], "inversion_ssim": [0.9, 0.9, 0.5, 0.7],
        "inversion_mse": [0.001] * 4,
    })
    rows = summarize(table, ["cut-layer"]).set_index("cut-layer")
    # (30, 32): mean 31, sd 1.414, sem 1, t(0.975, 1 df) = 12.706
    assert rows.loc[1, "inversion PSNR (dB)"] == "31.00 ± 12.71"
    assert rows.loc[3, "inversion SSIM"] == "0.600 ± 1.271"  # sd 0.1414, sem 0.1
    assert "inversion PSNR (dB)" not in summarize(table.drop(columns=["inversion_psnr"]), ["cut-layer"]).columns
    assert plot_privacy(tmp_path, table, ["cut-layer"], _label).stat().st_size > 0
    assert plot_cut_layer(tmp_path, table, ["strategy", "cut-layer"]).stat().st_size > 0
    assert plot_cut_layer(tmp_path, table, ["strategy"]) is None
    # no U-shaped run: no label columns, no label plot; with them: both AUCs, and label-leakage.png
    assert "label AUC, direction" not in rows.columns and plot_label_leakage(tmp_path, table, [], _label) is None
    table["label_norm_auc"], table["label_direction_auc"] = [0.5, 0.5, 0.5, 0.5], [0.9, 1.0, nan, nan]
    rows = summarize(table, ["cut-layer"]).set_index("cut-layer")
    assert rows.loc[1, "label AUC, direction"] == "0.950 ± 0.635"  # sd 0.0707, sem 0.05
    assert rows.loc[3, "label AUC, direction"] == "–" and rows.loc[1, "label AUC, norm"] == "0.500 ± 0.000"
    assert plot_label_leakage(tmp_path, table, ["cut-layer"], _label).name == "label-leakage.png"


def test_noise_is_seeded_per_node_and_forward(tmp_path, one_torch_thread):
    """The same seed gives the same metrics with noise on (no global RNG); the noise does change them."""
    from tests.conftest import read_metrics

    values = {"strategy": "splitfed-v1", "dataset": "mnist-5k", "model": "lenet5", "cut-layer": 3,
              "num-clients": 2, "concurrency": 2, "global-iterations": 1, "local-iterations": 3, "batch-size": 8}
    rows = {}
    for name, extra in (("a", {"act-clip": 20.0, "act-noise": 0.05, "nopeek-alpha": 1.0}),
                        ("b", {"act-clip": 20.0, "act-noise": 0.05, "nopeek-alpha": 1.0}), ("off", {})):
        assert main(cli_args({**values, **extra, "output-dir": tmp_path / name}, "-q")) == 0
        rows[name] = [(r["test_accuracy"], r["test_loss"]) for r in read_metrics(tmp_path / name / "metrics.csv")]
    assert rows["a"] == rows["b"]
    assert rows["a"][-1] != rows["off"][-1]
