"""Tests for strategies/algorithms/gas/generation.py and strategies/algorithms/gas/gaussian_factors.py: GAS per-label Gaussians (eqs. 11-12)."""

import math

import numpy as np
import pytest
import torch

from fl_app.run.errors import ConfigError
from strategies.algorithms.gas.generation import (
    EXPONENTIAL_RATE,
    WEIGHTINGS,
    LabelGaussians,
    progress_weight,
)

REG = 1e-5


def _stream(num_updates, num_classes, dim, seed=0, batch=9, skip=None):
    """Random flushes; ``skip(n)`` gives labels left out of flush n."""
    g = torch.Generator().manual_seed(seed)
    scale = torch.arange(1, dim + 1, dtype=torch.float32)
    out = []
    for n in range(1, num_updates + 1):
        labels = torch.randint(0, num_classes, (batch,), generator=g)
        if skip is not None:
            for y in skip(n):
                labels[labels == y] = (y + 1) % num_classes
        acts = torch.randn(batch, dim, generator=g) * scale + 0.3 * n + labels[:, None]
        out.append((acts, labels))
    return out


def _direct(stream, label, weights):
    """Weighted mean and population covariance over all activations of ``label``."""
    xs, ws = [], []
    for (acts, labels), w in zip(stream, weights):
        m = (labels == label).numpy()
        xs.append(acts.numpy().astype(np.float64)[m])
        ws.append(np.full(m.sum(), w))
    x, w = np.concatenate(xs), np.concatenate(ws)
    mu = np.average(x, axis=0, weights=w)
    cov = np.cov(x.T, aweights=w, bias=True).reshape(x.shape[1], x.shape[1])
    # bias=True divides by the total weight, the paper's S_N: check it explicitly.
    d = x - mu
    assert np.allclose(cov, (w[:, None] * d).T @ d / w.sum())
    return mu, cov


# ---------------------------------------------------------------- weights
def test_progress_weight_values():
    assert [progress_weight(n) for n in (1, 2, 7)] == [1.0, 2.0, 7.0]
    assert progress_weight(3, "linear") == 3.0
    assert progress_weight(3, "polynomial") == pytest.approx(9.0)
    assert progress_weight(1, "polynomial") == pytest.approx(1.0)
    assert progress_weight(4, "exponential") == pytest.approx(math.exp(0.4))
    assert EXPONENTIAL_RATE == 0.1
    # increasing, as the paper requires
    for kind in WEIGHTINGS:
        ws = [progress_weight(n, kind) for n in range(1, 20)]
        assert all(a < b for a, b in zip(ws, ws[1:]))
    assert progress_weight(100_000, "exponential") == math.inf


def test_progress_weight_rejects_bad_input():
    with pytest.raises(ConfigError):
        progress_weight(1, "cubic")
    with pytest.raises(ValueError):
        progress_weight(0)
    with pytest.raises(ValueError):
        progress_weight(1.5)


def test_constructor_rejects_bad_names():
    with pytest.raises(ConfigError):
        LabelGaussians(3, 4, covariance="banded")
    with pytest.raises(ConfigError):
        LabelGaussians(3, 4, weighting="quadratic")
    with pytest.raises(ConfigError):
        LabelGaussians(3, 4, regulariser=-1.0)
    with pytest.raises(ConfigError):
        LabelGaussians(0, 4)
    with pytest.raises(ConfigError):
        LabelGaussians(3, 0)
    assert issubclass(ConfigError, ValueError)


# ----------------------------------------------------------- eqs. 11 - 12
@pytest.mark.parametrize("factor_dtype,tol", [(torch.float64, 1e-12), (torch.float32, 1e-6)])
def test_hand_worked_1d_two_updates(factor_dtype, tol):
    lg = LabelGaussians(1, 1, covariance="full", factor_dtype=factor_dtype)
    lg.update(torch.tensor([[0.0], [2.0]]), torch.tensor([0, 0]))  # s(1) = 1 each
    assert lg.mean(0).item() == pytest.approx(1.0)
    assert lg.covariance(0, regularised=False).item() == pytest.approx(1.0)  # ((0-1)^2+(2-1)^2)/2
    lg.update(torch.tensor([[4.0]]), torch.tensor([0]))  # s(2) = 2
    # S = 1 + 1 + 2 = 4;  mu = (0 + 2 + 2*4) / 4 = 2.5
    assert lg.mean(0).item() == pytest.approx(2.5, abs=1e-12)
    # Sigma = (1*(0-2.5)^2 + 1*(2-2.5)^2 + 2*(4-2.5)^2) / 4 = (6.25 + 0.25 + 4.5) / 4 = 2.75
    assert lg.covariance(0, regularised=False).item() == pytest.approx(2.75, abs=tol)
    assert lg.covariance(0).item() == pytest.approx(2.75 + REG, abs=tol)
    assert lg.total_weight(0) == pytest.approx(4.0)

    diag = LabelGaussians(1, 1, covariance="diagonal")
    diag.update(torch.tensor([[0.0], [2.0]]), torch.tensor([0, 0]))
    diag.update(torch.tensor([[4.0]]), torch.tensor([0]))
    assert diag.mean(0).item() == pytest.approx(2.5, abs=1e-12)
    assert diag.covariance(0).item() == pytest.approx(2.75 + REG, abs=1e-12)


@pytest.mark.parametrize("covariance", ["full", "diagonal"])
def test_per_activation_progress_hand_worked(covariance):
    """Per-row progress (GAS: "each activation has a different training progress"), s(n) = n."""
    lg = LabelGaussians(1, 1, covariance=covariance, factor_dtype=torch.float64)
    # weights 1, 3: mu = (1*0 + 3*4) / 4 = 3; Sigma = (1*9 + 3*1) / 4 = 3
    lg.update(torch.tensor([[0.0], [4.0]]), torch.tensor([0, 0]), progress=torch.tensor([1, 3]))
    assert lg.mean(0).item() == pytest.approx(3.0, abs=1e-12)
    assert lg.covariance(0, regularised=False).item() == pytest.approx(3.0, abs=1e-12)
    assert lg.num_updates == 3
    # then weight 4 on 8: S = 8, mu = (12 + 32) / 8 = 5.5;
    # Sigma = (1*5.5^2 + 3*1.5^2 + 4*2.5^2) / 8 = (30.25 + 6.75 + 25) / 8 = 7.75
    lg.update(torch.tensor([[8.0]]), torch.tensor([0]), progress=torch.tensor([4]))
    assert lg.mean(0).item() == pytest.approx(5.5, abs=1e-12)
    assert lg.covariance(0, regularised=False).item() == pytest.approx(7.75, abs=1e-12)
    assert lg.total_weight(0) == pytest.approx(8.0)


def test_per_activation_progress_equals_one_at_a_time():
    """A flush with mixed progress equals folding its activations one by one (3-d, two labels)."""
    g = torch.Generator().manual_seed(5)
    acts = torch.randn(12, 3, generator=g) * torch.tensor([1.0, 2.0, 3.0])
    labels = torch.tensor([0, 1] * 6)
    progress = torch.tensor([1, 2, 2, 5, 3, 3, 7, 1, 4, 4, 6, 2])
    batch = LabelGaussians(2, 3, max_pending=2, factor_dtype=torch.float64)
    batch.update(acts[:5], labels[:5], progress=progress[:5])
    batch.update(acts[5:], labels[5:], progress=progress[5:])
    single = LabelGaussians(2, 3, max_pending=2, factor_dtype=torch.float64)
    for i in range(12):
        single.update(acts[i:i + 1], labels[i:i + 1], progress=progress[i:i + 1])
    for label in range(2):
        torch.testing.assert_close(batch.mean(label), single.mean(label), rtol=0, atol=1e-12)
        torch.testing.assert_close(batch.covariance(label), single.covariance(label), rtol=0, atol=1e-10)
        w = progress[labels == label].double()
        x = acts[labels == label].double()
        mu = (w[:, None] * x).sum(0) / w.sum()
        sig = ((w[:, None] * (x - mu)).T @ (x - mu)) / w.sum()
        torch.testing.assert_close(batch.mean(label), mu, rtol=0, atol=1e-12)
        torch.testing.assert_close(batch.covariance(label, regularised=False), sig, rtol=0, atol=1e-10)


def test_per_activation_progress_rejects_bad_values():
    lg = LabelGaussians(2, 1)
    with pytest.raises(ValueError, match=">= 1"):
        lg.update(torch.zeros(2, 1), torch.tensor([0, 1]), progress=torch.tensor([0, 1]))
    with pytest.raises(ValueError, match="integer tensor of 2"):
        lg.update(torch.zeros(2, 1), torch.tensor([0, 1]), progress=torch.tensor([1]))


@pytest.mark.parametrize("factor_dtype,tol", [(torch.float64, 1e-10), (torch.float32, 1e-6)])
def test_matches_paper_recursion_one_activation_at_a_time(factor_dtype, tol):
    """Eqs. 11-12 applied literally, activation by activation (float32 storage: to its rounding)."""
    stream = _stream(5, 2, 3, seed=3)
    lg = LabelGaussians(2, 3, max_pending=2, factor_dtype=factor_dtype)
    for acts, labels in stream:
        lg.update(acts, labels)
    for label in range(2):
        S, mu, sig = 0.0, np.zeros(3), np.zeros((3, 3))
        for n, (acts, labels) in enumerate(stream, start=1):
            for a in acts.numpy().astype(np.float64)[(labels == label).numpy()]:
                s = float(n)
                mu_new = S / (S + s) * mu + s / (S + s) * a  # (11)
                sig = (S * (sig + np.outer(mu_new - mu, mu_new - mu))
                       + s * np.outer(mu_new - a, mu_new - a)) / (S + s)  # (12)
                mu, S = mu_new, S + s
        np.testing.assert_allclose(lg.mean(label).numpy(), mu, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(lg.covariance(label, regularised=False).numpy(), sig,
                                   rtol=tol, atol=tol * np.abs(sig).max())


@pytest.mark.parametrize("weighting", WEIGHTINGS)
@pytest.mark.parametrize("covariance,factor_dtype,tol", [
    ("full", torch.float64, 1e-11), ("full", torch.float32, 1e-6),
    ("diagonal", torch.float64, 1e-11),  # diagonal statistics are float64 whatever factor_dtype says
])
def test_weighted_mean_and_covariance_over_all_updates(covariance, weighting, factor_dtype, tol):
    dim, classes = 4, 3
    # label 2 is left out of flushes 2-4, label 0 out of flush 5
    stream = _stream(7, classes, dim, seed=1,
                     skip=lambda n: [2] if 2 <= n <= 4 else ([0] if n == 5 else []))
    lg = LabelGaussians(classes, dim, covariance=covariance, weighting=weighting, factor_dtype=factor_dtype)
    for acts, labels in stream:
        lg.update(acts.reshape(-1, 1, 2, 2), labels)  # [N, ...] is flattened
    assert lg.num_updates == 7
    weights = [progress_weight(n, weighting) for n in range(1, 8)]
    for label in range(classes):
        mu, cov = _direct(stream, label, weights)
        np.testing.assert_allclose(lg.mean(label).numpy(), mu, rtol=1e-12, atol=1e-12)
        got = lg.covariance(label).numpy()
        want = cov + REG * np.eye(dim) if covariance == "full" else np.diag(cov) + REG
        np.testing.assert_allclose(got, want, rtol=tol, atol=tol * np.abs(want).max())
        raw = lg.covariance(label, regularised=False).numpy()
        np.testing.assert_allclose(raw, cov if covariance == "full" else np.diag(cov),
                                   rtol=tol, atol=tol * np.abs(want).max())
        assert lg.count(label) == sum(int((lab == label).sum()) for _, lab in stream)


def test_single_activation_flushes():
    lg = LabelGaussians(1, 2, factor_dtype=torch.float64)
    lg.update(torch.tensor([[1.0, 2.0]]), torch.tensor([0]))  # s(1) = 1
    torch.testing.assert_close(lg.covariance(0), REG * torch.eye(2, dtype=torch.float64))
    F, iso = lg.sampling_factor(0)
    assert F.shape == (2, 0) and iso == REG
    x = lg.sample(0, 3, torch.Generator().manual_seed(0))
    assert torch.allclose(x, torch.tensor([1.0, 2.0]).expand(3, 2), atol=0.02)
    lg.update(torch.tensor([[3.0, 0.0]]), torch.tensor([0]))  # s(2) = 2
    # S = 3, mu = (1*[1,2] + 2*[3,0]) / 3 = [7/3, 2/3]
    torch.testing.assert_close(lg.mean(0), torch.tensor([7 / 3, 2 / 3], dtype=torch.float64))
    # Sigma = (1/3)(2/3) * d d^T with d = [1,2] - [3,0] = [-2, 2]
    d = torch.tensor([-2.0, 2.0], dtype=torch.float64)
    torch.testing.assert_close(lg.covariance(0, regularised=False), (2 / 9) * torch.outer(d, d))


def test_diagonal_equals_diagonal_of_full():
    stream = _stream(6, 2, 5, seed=2)
    full = LabelGaussians(2, 5, covariance="full", max_pending=3, factor_dtype=torch.float64)
    diag = LabelGaussians(2, 5, covariance="diagonal")
    for acts, labels in stream:
        full.update(acts, labels)
        diag.update(acts, labels)
    for label in range(2):
        torch.testing.assert_close(diag.mean(label), full.mean(label), rtol=1e-13, atol=1e-13)
        torch.testing.assert_close(diag.covariance(label), torch.diagonal(full.covariance(label)),
                                   rtol=1e-11, atol=1e-11)


def test_exponential_weights_do_not_overflow():
    stream = _stream(3, 1, 3, seed=4)
    lg = LabelGaussians(1, 3, weighting="exponential", factor_dtype=torch.float64)
    progress = [9_000, 9_001, 9_005]  # exp(0.1 * 9000) overflows a float64
    for (acts, labels), n in zip(stream, progress):
        lg.update(acts, labels, progress=n)
    assert lg.num_updates == 9_005
    rel = [math.exp(EXPONENTIAL_RATE * (n - progress[-1])) for n in progress]
    mu, cov = _direct(stream, 0, rel)
    np.testing.assert_allclose(lg.mean(0).numpy(), mu, rtol=1e-12)
    np.testing.assert_allclose(lg.covariance(0, regularised=False).numpy(), cov, rtol=1e-10,
                               atol=1e-10)


def test_empty_flush_only_advances_the_counter():
    lg = LabelGaussians(2, 3)
    lg.update(torch.empty(0, 3), torch.empty(0, dtype=torch.int64))
    assert lg.num_updates == 1 and not lg.has_stats(0)
    lg.update(torch.ones(2, 3), torch.tensor([1, 1]))
    assert lg.num_updates == 2 and lg.total_weight(1) == pytest.approx(4.0)  # 2 * s(2)


def test_update_rejects_bad_shapes_and_labels():
    lg = LabelGaussians(2, 3)
    with pytest.raises(ValueError):
        lg.update(torch.ones(2, 4), torch.tensor([0, 1]))
    with pytest.raises(ValueError):
        lg.update(torch.ones(2, 3), torch.tensor([0, 2]))
    with pytest.raises(ValueError):
        lg.update(torch.ones(2, 3), torch.tensor([0]))


def _each_state(lg, stream, weights, labels):
    """After each update of ``stream``: ``(i, label, state, eq. 12 target + rI)`` for every seen label."""
    dim = stream[0][0].shape[1]
    for i, (acts, y) in enumerate(stream):
        lg.update(acts, y)
        for label in labels:
            if lg.has_stats(label):
                _, cov = _direct(stream[: i + 1], label, weights)
                yield i, label, lg._states[label], cov + REG * np.eye(dim)


# ------------------------------------------------------ factored sampling
@pytest.mark.parametrize("factor_dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 3e-6)])
@pytest.mark.parametrize("bounds", [None, [0, 1, 3]])
def test_factor_matches_covariance_through_compressions(factor_dtype, rtol, bounds):
    dim = 3
    stream = _stream(12, 2, dim, seed=5, batch=5)
    lg = LabelGaussians(2, dim, max_pending=2, factor_dtype=factor_dtype)
    if bounds is not None:  # exercise the blocked triangular products on a tiny D
        lg._bounds = bounds
    weights = [float(n) for n in range(1, 13)]
    seen_states = set()
    for _, label, st, target in _each_state(lg, stream, weights, range(2)):
        seen_states.add((st.L is not None, st.j > 0))
        F, iso = lg.sampling_factor(label)
        np.testing.assert_allclose((F @ F.T).numpy() + iso * np.eye(dim), target,
                                   rtol=rtol, atol=rtol * np.abs(target).max())
        # covariance() is float64, accurate to the storage dtype's rounding
        np.testing.assert_allclose(lg.covariance(label).numpy(), target,
                                   rtol=rtol, atol=rtol * np.abs(target).max())
        assert 0.0 <= iso <= REG
    assert lg.num_compressions >= 4
    assert (True, True) in seen_states  # compressed factor plus pending columns


def test_compression_fallback_for_singular_statistics():
    # All activations identical -> Sigma = 0; with r = 0 Cholesky fails, eigh fallback.
    lg = LabelGaussians(1, 3, regulariser=0.0, max_pending=1)
    for _ in range(3):
        lg.update(torch.ones(4, 3), torch.zeros(4, dtype=torch.int64))
    assert lg.num_compressions >= 1
    x = lg.sample(0, 5, torch.Generator().manual_seed(0))
    torch.testing.assert_close(x, torch.ones(5, 3))


def _empirical_check(lg, label, n=200_000, seed=0):
    x = lg.sample(label, n, torch.Generator().manual_seed(seed)).double()
    assert x.dtype == torch.float64 and x.shape == (n, lg.dim)
    mean, cov = lg.mean(label), lg.covariance(label)
    if cov.dim() == 1:
        cov = torch.diag(cov)
    sd = torch.sqrt(torch.diagonal(cov))
    # mean: standard error sd / sqrt(n); allow ~6 standard errors
    assert torch.all((x.mean(0) - mean).abs() < 6 * sd / math.sqrt(n))
    # covariance: compare correlations-scaled entries; SE of each ~ 1/sqrt(n)
    emp = torch.cov(x.T, correction=0)
    scaled = (emp - cov) / torch.outer(sd, sd)
    assert scaled.abs().max() < 6 * math.sqrt(2.0 / n)


@pytest.mark.parametrize("covariance", ["full", "diagonal"])
def test_sample_statistics(covariance):
    dim = 3
    stream = _stream(9, 2, dim, seed=6, batch=6)
    lg = LabelGaussians(2, dim, covariance=covariance, max_pending=4)
    lg._bounds = [0, 2, 3]  # blocked triangular sampling path
    for acts, labels in stream:
        lg.update(acts, labels)
    if covariance == "full":
        st = lg._states[0]
        assert st.L is not None and st.j > 0 and 0 < st.c < 1  # all three terms in play
    for label in range(2):
        _empirical_check(lg, label, seed=label)
    out = lg.sample(0, 4, torch.Generator().manual_seed(0))
    assert out.dtype == torch.float32 and out.shape == (4, dim)


def test_sample_with_correlated_covariance_before_compression():
    # Strong correlation, rank-deficient data (points on a line): only K and r I.
    t = torch.tensor([[-1.0], [0.0], [1.0]])
    acts = torch.cat([t, 2 * t, -t], dim=1)
    lg = LabelGaussians(1, 3, max_pending=100)
    lg.update(acts, torch.zeros(3, dtype=torch.int64))  # 3 columns <= D: no compression
    assert lg._states[0].L is None
    x = lg.sample(0, 100_000, torch.Generator().manual_seed(1)).double()
    emp = torch.corrcoef(x.T)
    assert emp[0, 1] > 0.999 and emp[0, 2] < -0.999


# ----------------------------------------------------------- generation
def _ready(classes=4, dim=3, covariance="full"):
    lg = LabelGaussians(classes, dim, covariance=covariance)
    lg.update(torch.randn(2 * classes, dim, generator=torch.Generator().manual_seed(0)),
              torch.arange(2 * classes) % classes)
    return lg


def test_ready_only_when_every_label_has_stats():
    lg = LabelGaussians(3, 2)
    assert not lg.ready()
    lg.update(torch.randn(4, 2), torch.tensor([0, 0, 2, 2]))
    assert not lg.ready() and lg.has_stats(0) and not lg.has_stats(1) and lg.has_stats(2)
    with pytest.raises(RuntimeError):
        lg.generate(torch.tensor([0]), 4, torch.Generator())
    with pytest.raises(RuntimeError):
        lg.sample(1, 3, torch.Generator())
    with pytest.raises(RuntimeError):
        lg.mean(1)
    lg.update(torch.randn(1, 2), torch.tensor([1]))
    assert lg.ready()


@pytest.mark.parametrize("covariance", ["full", "diagonal"])
def test_generate_tops_up_each_label(covariance):
    lg = _ready(covariance=covariance)
    present = torch.tensor([2, 0, 0, 2, 0, 2, 2, 2, 0, 0, 2, 3])  # 0:5, 1:0, 2:6, 3:1
    acts, labels = lg.generate(present, 5, torch.Generator().manual_seed(0))
    # label 0 has 5 >= 5 -> 0; label 1 absent -> 5; label 2 has 6 -> 0; label 3 -> 4
    assert labels.tolist() == [1] * 5 + [3] * 4
    assert labels.dtype == torch.int64
    assert acts.shape == (9, 3) and acts.dtype == torch.float32
    # nothing needed -> empty outputs of the right shape
    acts, labels = lg.generate(present, 1, torch.Generator())
    assert labels.tolist() == [1] and acts.shape == (1, 3)
    acts, labels = lg.generate(present, 0, torch.Generator())
    assert acts.shape == (0, 3) and labels.shape == (0,)
    # an empty buffer gets per_label of every label, in label order
    acts, labels = lg.generate(torch.empty(0, dtype=torch.int64), 2, torch.Generator())
    assert labels.tolist() == [0, 0, 1, 1, 2, 2, 3, 3]


def test_generation_is_deterministic_per_seed():
    lg = _ready()
    present = torch.tensor([0, 1])
    a1, l1 = lg.generate(present, 3, torch.Generator().manual_seed(7))
    a2, l2 = lg.generate(present, 3, torch.Generator().manual_seed(7))
    a3, _ = lg.generate(present, 3, torch.Generator().manual_seed(8))
    assert torch.equal(a1, a2) and torch.equal(l1, l2)
    assert not torch.equal(a1, a3)
    s1 = lg.sample(2, 4, torch.Generator().manual_seed(1))
    s2 = lg.sample(2, 4, torch.Generator().manual_seed(1))
    assert torch.equal(s1, s2)


# ------------------------------------------------------ memory-saving storage
@pytest.mark.parametrize("factor_dtype,rtol", [(torch.float64, 1e-10), (torch.float32, 2e-6)])
def test_compact_storage_matches_straightforward_statistics_and_samples(factor_dtype, rtol):
    """The stored form (factor slabs + one copy of the pending columns, no G) gives
    eq. 12's covariance, and sample() is exactly mean + F e + sqrt(iso) e' with the
    dense factor F of that covariance (the straightforward sampler), draw for draw."""
    dim, classes = 6, 3
    stream = _stream(14, classes, dim, seed=8, batch=7, skip=lambda n: [2])  # label 2 never seen
    lg = LabelGaussians(classes, dim, max_pending=4, factor_dtype=factor_dtype)
    lg._bounds = [0, 2, 4, 6]  # three row slabs on a tiny D
    weights = [float(n) for n in range(1, 15)]
    checked = set()
    for i, label, st, target in _each_state(lg, stream, weights, range(2)):
        np.testing.assert_allclose(lg.covariance(label).numpy(), target,
                                   rtol=rtol, atol=rtol * np.abs(target).max())
        F, iso = lg.sampling_factor(label)
        np.testing.assert_allclose((F @ F.T).numpy() + iso * np.eye(dim), target,
                                   rtol=rtol, atol=rtol * np.abs(target).max())
        # draw for draw: the same normals through the dense factor
        n = 5
        x = lg.sample(label, n, torch.Generator().manual_seed(i))
        eps = torch.randn((n, F.shape[1] + dim), generator=torch.Generator().manual_seed(i),
                          dtype=factor_dtype).double()
        want = lg.mean(label) + eps[:, : F.shape[1]] @ F.T + math.sqrt(iso) * eps[:, F.shape[1]:]
        torch.testing.assert_close(x.double(), want, rtol=1e-5, atol=1e-5 * float(want.abs().max()))
        checked.add((st.L is not None, st.j > 0))
        if st.L is not None:  # the stored factor: row slabs, the storage dtype, no dense D x D
            assert [t.shape for t in st.L] == [(2, 2), (2, 4), (2, 6)]
            assert all(t.dtype == factor_dtype for t in st.L)
            assert st.K is None or st.K.dtype == factor_dtype
    assert (True, True) in checked and (False, True) in checked and lg.num_compressions >= 3
    # storage grows only with the labels seen: label 2 holds nothing
    assert not lg.has_stats(2) and lg._states[2].K is None and lg._states[2].L is None
    size = torch.finfo(factor_dtype).bits // 8
    per_label_bound = size * (24 + (4 + 2 * 8) * dim) + 8 * (dim + 4 + 2 * 8)  # slabs + K + mean + scales
    assert lg.memory_bytes() <= 2 * per_label_bound


def test_float32_storage_is_half_of_float64_and_far_below_the_dense_form():
    dim = 64
    stream = _stream(40, 2, dim, seed=9, batch=8)
    sizes = {}
    for dt in (torch.float32, torch.float64):
        lg = LabelGaussians(2, dim, max_pending=16, factor_dtype=dt)
        for acts, labels in stream:
            lg.update(acts, labels)
        assert lg.num_compressions >= 2
        sizes[dt] = lg.memory_bytes()
    assert sizes[torch.float32] < 0.6 * sizes[torch.float64]
    # the previous layout held, per label, G (float64) and L (float32) densely: 12 * D * D bytes
    assert sizes[torch.float32] < 2 * 12 * dim * dim / 2
