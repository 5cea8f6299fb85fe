"""GAS (docs/explanation/design.md §7): the logit-adjusted loss (eq. 6) and the activation
gradient by hand, the activation and model buffers driven event by event on a
strategy object with a stubbed transport, and two short in-process runs
(reproducibility, virtual-time order).
"""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch
from torch import nn

from fl_app import protocol as P
from strategies.algorithms.gas.strategy import logit_adjusted_loss
from strategies.core.server_step import activation_gradient as shared_activation_gradient


def activation_gradient(model, x, y, prior):
    """GAS's ``G_k``: the shared activation gradient under eq. 6's loss (plain cross-entropy with no prior)."""
    loss_fn = None if prior is None else (lambda logits, labels: logit_adjusted_loss(logits, labels, prior))
    return shared_activation_gradient(model, x, y, loss_fn)
from tests.conftest import read_metrics


pytestmark = pytest.mark.usefixtures("one_torch_thread")


# =============================================================================
# 5. Eq. 6 and the activation gradient
# =============================================================================

LOGITS = [[1.0, 2.0, 0.5], [0.0, -1.0, 3.0]]
LABELS = [0, 2]


def _hand_eq6(logits, labels, prior):
    """-log( exp(s_y + log p_y) / Σ_y' exp(s_y' + log p_y') ), p -> p + 1e-12, batch mean."""
    total = 0.0
    for s, y in zip(logits, labels):
        num = math.exp(s[y] + math.log(prior[y] + 1e-12))
        den = sum(math.exp(s_j + math.log(p_j + 1e-12)) for s_j, p_j in zip(s, prior))
        total += -math.log(num / den)
    return total / len(labels)


def test_logit_adjusted_loss_by_hand():
    logits, labels = torch.tensor(LOGITS), torch.tensor(LABELS)
    prior = [0.5, 0.3, 0.2]
    # written out: sample 1: -log(0.5 e^1 / (0.5 e^1 + 0.3 e^2 + 0.2 e^0.5))
    #              sample 2: -log(0.2 e^3 / (0.5 e^0 + 0.3 e^-1 + 0.2 e^3))
    l1 = -math.log(0.5 * math.e / (0.5 * math.e + 0.3 * math.exp(2) + 0.2 * math.exp(0.5)))
    l2 = -math.log(0.2 * math.exp(3) / (0.5 + 0.3 * math.exp(-1) + 0.2 * math.exp(3)))
    assert (l1 + l2) / 2 == pytest.approx(_hand_eq6(LOGITS, LABELS, prior), rel=1e-9)
    # by hand: 1.35914 / (1.35914 + 2.21672 + 0.32974) = 0.34800 -> 1.05555;
    #          4.01711 / (0.5 + 0.11036 + 4.01711) = 0.86810 -> 0.14145; mean 0.59850
    assert (l1 + l2) / 2 == pytest.approx(0.59850, abs=1e-4)
    got = logit_adjusted_loss(logits, labels, torch.tensor(prior))
    assert got.shape == ()
    assert float(got) == pytest.approx((l1 + l2) / 2, rel=1e-5)
    # the adjustment matters: plain CE differs
    assert float(nn.functional.cross_entropy(logits, labels)) != pytest.approx((l1 + l2) / 2, rel=1e-3)


def test_logit_adjusted_loss_zero_prior_uses_epsilon():
    """A label the client never holds gets log(1e-12), not -inf: the loss stays finite."""
    prior = [0.75, 0.25, 0.0]
    got = logit_adjusted_loss(torch.tensor(LOGITS), torch.tensor(LABELS), torch.tensor(prior))
    expected = _hand_eq6(LOGITS, LABELS, prior)  # sample 2 has y = 2 with P = 0: about 27.6/2 + ...
    assert math.isfinite(float(got))
    assert float(got) == pytest.approx(expected, rel=1e-5)
    assert expected > 10


def _linear_model():
    m = nn.Linear(4, 3)
    with torch.no_grad():
        m.weight.copy_(torch.tensor([[0.5, -1.0, 0.25, 2.0], [1.5, 0.0, -0.5, 1.0], [-1.0, 0.75, 1.0, 0.0]]))
        m.bias.copy_(torch.tensor([0.1, -0.2, 0.3]))
    return m


ACTS = [[1.0, 0.5, -1.0, 0.2], [0.0, 2.0, 1.0, -0.5]]


def _hand_gradient(model, acts, labels, prior):
    """Autograd (float64) of eq. 6 written with exp/log, not with cross_entropy."""
    W = model.weight.detach().double()
    b = model.bias.detach().double()
    x = torch.tensor(acts, dtype=torch.float64, requires_grad=True)
    s = x @ W.T + b
    if prior is not None:
        s = s + torch.log(torch.tensor(prior, dtype=torch.float64) + 1e-12)
    y = torch.tensor(labels)
    loss = (-torch.log(torch.exp(s[torch.arange(len(labels)), y]) / torch.exp(s).sum(1))).mean()
    (g,) = torch.autograd.grad(loss, x)
    # closed form as a cross-check: (softmax(s) - onehot(y)) W / B
    onehot = torch.nn.functional.one_hot(y, 3).double()
    closed = (torch.softmax(s.detach(), 1) - onehot) @ W / len(labels)
    assert torch.allclose(g, closed, atol=1e-12)
    return g.float()


def test_activation_gradient_equals_hand_formula():
    model = _linear_model()
    x, y = torch.tensor(ACTS), torch.tensor(LABELS)
    prior = [0.5, 0.3, 0.2]
    got = activation_gradient(model, x, y, torch.tensor(prior))
    assert got.shape == x.shape and not got.requires_grad
    assert torch.allclose(got, _hand_gradient(model, ACTS, LABELS, prior), atol=1e-6)

    plain = activation_gradient(model, x, y, None)
    assert torch.allclose(plain, _hand_gradient(model, ACTS, LABELS, None), atol=1e-6)
    assert not torch.allclose(got, plain, atol=1e-3)  # a skewed prior changes the gradient

    # a uniform prior shifts every logit by the same constant: same gradient as plain CE
    uniform = activation_gradient(model, x, y, torch.full((3,), 1 / 3))
    assert torch.allclose(uniform, plain, atol=1e-6)


def test_activation_gradient_keeps_shape_of_multi_dim_activations():
    model = nn.Sequential(nn.Flatten(), _linear_model())
    x = torch.tensor(ACTS).reshape(2, 1, 2, 2)
    got = activation_gradient(model, x, torch.tensor(LABELS), torch.tensor([0.5, 0.3, 0.2]))
    assert got.shape == (2, 1, 2, 2)
    assert torch.allclose(got.reshape(2, 4), _hand_gradient(model[1], ACTS, LABELS, [0.5, 0.3, 0.2]), atol=1e-6)


# =============================================================================
# 6. The activation gradient leaves the server model alone
# =============================================================================


def test_activation_gradient_leaves_server_model_untouched():
    from fl_app.learning.task import load_task
    from tests.conftest import make_cfg

    task = load_task(make_cfg())
    _, server = task.split()
    before = {k: v.clone() for k, v in server.state_dict().items()}
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(4, *task.profiles[task.cut_layer - 1].output_shape, generator=gen)
    y = torch.tensor([0, 3, 3, 9])
    prior = torch.full((10,), 0.1)
    g = activation_gradient(server, x, y, prior)
    assert g.shape == x.shape and float(g.abs().sum()) > 0
    assert all(p.grad is None for p in server.parameters())
    for k, v in server.state_dict().items():
        assert torch.equal(v, before[k]), k
    # existing .grad buffers are not accumulated into either
    for p in server.parameters():
        p.grad = torch.ones_like(p)
    activation_gradient(server, x, y, None)
    assert all(torch.equal(p.grad, torch.ones_like(p)) for p in server.parameters())
    assert not x.requires_grad and x.grad is None


# =============================================================================
# 7-8. Buffers, driven event by event
# =============================================================================

HIST = {0: np.array([50, 10, 10, 10, 5, 5, 5, 3, 1, 1], dtype=np.int64),  # 100 examples
        1: np.array([30] * 10, dtype=np.int64)}                          # 300 examples


def make_gas(**overrides):
    """A GAS strategy on mnist-5k with two hand-made clients (|D| = 100 and 300) and a
    stubbed transport: returns ``(strategy, sent)`` with ``sent`` the list of
    ``(pid, Request)`` it tried to send."""
    from fl_app.run.config import RunConfig
    from simulation.server_app import plan_run
    from simulation.timing.clocks import VirtualClock
    from simulation.timing.durations import ZeroTiming
    from strategies.core.base import ClientInfo

    values = {"strategy": "gas", "dataset": "mnist-5k", "model": "alexnet", "cut-layer": 2,
              "num-clients": 2, "concurrency": 2, "partition": "iid", "heterogeneity": "none",
              "batch-size": 4, "local-iterations": 10, "global-iterations": 50, "eval-every": 0, "seed": 0}
    values.update({k.replace("_", "-"): v for k, v in overrides.items()})
    plan = plan_run(RunConfig.from_mapping(values))
    s = plan.strategy_cls(plan.cfg, plan.task, clock=VirtualClock(), timing=ZeroTiming(), recorder=None,
                          progress=False)
    s.clients = {0: ClientInfo(0, 1000, 100, HIST[0]), 1: ClientInfo(1, 1001, 300, HIST[1])}
    s.initialize()
    sent = []
    s.send = lambda pid, request: sent.append((pid, request))
    return s, sent


def batch(labels, seed):
    gen = torch.Generator().manual_seed(seed)
    y = torch.tensor(labels, dtype=torch.int64)
    return torch.randn(len(labels), 64, 7, 7, generator=gen), y


def server_state(s):
    return {k: v.clone() for k, v in s.server_model.state_dict().items()}


def same_state(a, b):
    return all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture
def capture_server_steps(monkeypatch):
    """Record the (x, y) of every GAS server step, then run the real step."""
    import strategies.algorithms.gas.strategy as gas

    calls = []
    real = gas.server_step

    def spy(model, opt, x, y, clip_norm, *args, **kwargs):
        calls.append((x.detach().clone(), y.clone()))
        return real(model, opt, x, y, clip_norm, *args, **kwargs)

    monkeypatch.setattr(gas, "server_step", spy)
    return calls


def test_activation_buffer_flushes_at_qs_times_b(capture_server_steps):
    """Q_s = 3, B = 4: the server steps when 12 activations have arrived, counted in
    activations, not in batches."""
    s, _ = make_gas(buffer_activations=3, generate=False)
    assert s.q_s == 3
    s.progress_of = {0: 0, 1: 0}
    start = server_state(s)
    # six half batches of 2: no step until the sixth (12 activations)
    for i in range(5):
        s.on_activations(i % 2, *batch([i, i + 1], seed=i))
        assert s.server_updates == 0 and not capture_server_steps
        assert same_state(server_state(s), start), f"server model changed after {2 * (i + 1)} activations"
    s.on_activations(1, *batch([7, 8], seed=5))
    assert s.server_updates == 1 and len(capture_server_steps) == 1
    assert capture_server_steps[0][0].shape[0] == 12
    after_first = server_state(s)
    assert not same_state(after_first, start)
    assert s.activation_buffer == []
    # then full batches of 4: the third one flushes again
    for i in range(2):
        s.on_activations(0, *batch([1, 2, 3, 4], seed=10 + i))
        assert s.server_updates == 1
        assert same_state(server_state(s), after_first)
    s.on_activations(0, *batch([1, 2, 3, 4], seed=12))
    assert s.server_updates == 2 and len(capture_server_steps) == 2


def _progress_seen(s):
    """Wrap the strategy's Gaussians: the per-activation progress tensor of every update, as lists."""
    seen = []
    real = s.gaussians.update

    def spy(x, y, progress=None):
        seen.append(None if progress is None else progress.tolist())
        return real(x, y, progress=progress)

    s.gaussians.update = spy
    return seen


def test_progress_uploads_counts_as_the_authors_code():
    """progress=uploads: GAS_main.py's weight_count. Clients start at total_weight_count (1), count
    their uploads; a global iteration adds the flushes so far (2, then 3) to the total."""
    s, _ = make_gas(progress="uploads", buffer_activations=2, buffer_models=2)
    seen = _progress_seen(s)
    s.launch(0), s.launch(1)
    s.on_activations(0, *batch([0, 1, 2, 3], seed=1))  # n = 1 (client 0 then counts 2)
    s.on_activations(1, *batch([4, 5, 6, 7], seed=2))  # n = 1: flush 1
    s.on_activations(0, *batch([0, 1, 2, 3], seed=3))  # n = 2
    s.on_activations(0, *batch([4, 5, 6, 7], seed=4))  # n = 3: flush 2
    assert seen == [[1] * 8, [2] * 4 + [3] * 4]
    s.on_upload(0, _filled(s, 1.0), 100)
    s.on_upload(1, _filled(s, 1.0), 300)  # global iteration 1: total = 1 + 2 flushes = 3
    assert s.training_progress.upload_total == 3
    s.launch(0)  # starts from 3; client 1 keeps counting from 2
    s.on_activations(0, *batch([0, 1, 2, 3], seed=5))
    s.on_activations(1, *batch([4, 5, 6, 7], seed=6))
    assert seen[2] == [3] * 4 + [2] * 4
    s.on_upload(0, _filled(s, 1.0), 100)
    s.on_upload(1, _filled(s, 1.0), 300)
    assert s.training_progress.upload_total == 3 + 3


def test_progress_iterations_is_the_papers_tE_plus_e():
    """progress=iterations: n = tE + e, t the global iteration the client's model comes from, E = 10."""
    s, _ = make_gas(progress="iterations", buffer_activations=2, buffer_models=2)
    seen = _progress_seen(s)
    s.launch(0), s.launch(1)
    s.on_activations(0, *batch([0, 1, 2, 3], seed=1))
    s.on_activations(0, *batch([4, 5, 6, 7], seed=2))
    assert seen == [[1] * 4 + [2] * 4]
    s.on_upload(0, _filled(s, 1.0), 100)
    s.on_upload(1, _filled(s, 1.0), 300)
    s.launch(0)  # from the model of global iteration 1
    s.on_activations(0, *batch([0, 1, 2, 3], seed=3))  # 1 * 10 + 1
    s.on_activations(1, *batch([4, 5, 6, 7], seed=4))  # 0 * 10 + 1
    assert seen[1] == [11] * 4 + [1] * 4


def test_progress_flushes_is_the_default():
    s, _ = make_gas(buffer_activations=1)
    seen = _progress_seen(s)
    s.launch(0)
    s.on_activations(0, *batch([0, 1, 2, 3], seed=1))
    assert seen == [None] and s.gaussians.num_updates == 1


def test_qs_defaults_to_concurrency():
    s, _ = make_gas(buffer_activations=0, buffer_models=0, num_clients=2, concurrency=2)
    assert (s.q_s, s.q_c) == (2, 2)


def test_generate_false_steps_on_exactly_the_buffer(capture_server_steps):
    s, _ = make_gas(buffer_activations=3, generate=False)
    assert s.gaussians is None
    s.progress_of = {0: 0}
    batches = [batch([0, 1, 2, 3], 1), batch([4, 5, 6, 7], 2), batch([8, 9, 0, 1], 3)]
    for x, y in batches:
        s.on_activations(0, x, y)
    (x, y), = capture_server_steps
    assert torch.equal(x, torch.cat([b[0] for b in batches]))
    assert torch.equal(y, torch.cat([b[1] for b in batches]))
    assert s.generated_total == 0


def test_generation_waits_until_every_label_has_statistics(capture_server_steps):
    s, _ = make_gas(buffer_activations=2, generate=True)
    s.progress_of = {0: 0}
    s.on_activations(0, *batch([0, 1, 2, 3], 1))
    s.on_activations(0, *batch([3, 2, 1, 0], 2))  # labels 4..9 never seen
    (x, y), = capture_server_steps
    assert x.shape[0] == 8 and y.tolist() == [0, 1, 2, 3, 3, 2, 1, 0]
    assert s.generated_total == 0


def test_generation_tops_up_every_label_to_b(capture_server_steps):
    """Q_s = 3, B = 4. The first flush holds every label (0 and 1 twice, the rest
    once), so it already gets a top-up: 2 + 2 + 8*3 = 28 generated activations,
    each label ending with exactly B = 4. The second flush holds only label 5
    (12 of them): every other label gets B = 4 generated ones, 36 in all."""
    s, _ = make_gas(buffer_activations=3, generate=True)
    s.progress_of = {0: 0, 1: 0}
    batches = [batch([0, 1, 2, 3], 1), batch([4, 5, 6, 7], 2), batch([8, 9, 0, 1], 3)]
    for i, (x, y) in enumerate(batches):
        s.on_activations(i % 2, x, y)
    assert s.server_updates == 1
    x, y = capture_server_steps[0]
    assert x.shape == (40, 64, 7, 7) and y.shape == (40,)
    assert torch.equal(x[:12], torch.cat([b[0] for b in batches]))  # the buffer itself comes first
    assert torch.equal(y[:12], torch.cat([b[1] for b in batches]))
    assert torch.bincount(y, minlength=10).tolist() == [4] * 10
    assert y[12:].tolist() == [0, 0, 1, 1] + [lab for lab in range(2, 10) for _ in range(3)]
    assert torch.isfinite(x[12:]).all() and float(x[12:].abs().sum()) > 0
    assert s.generated_total == 28

    batches = [batch([5] * 4, 10 + i) for i in range(3)]
    for x, y in batches:
        s.on_activations(1, x, y)
    assert s.server_updates == 2
    x, y = capture_server_steps[1]
    counts = torch.bincount(y, minlength=10).tolist()
    assert counts == [4, 4, 4, 4, 4, 12, 4, 4, 4, 4]
    assert x.shape[0] == 48 and torch.equal(x[:12], torch.cat([b[0] for b in batches]))
    assert s.generated_total == 28 + 36
    assert s.extra_metrics()["generated_activations"] == 64.0


def _request_next(request):
    assert request.action == P.TRAIN_BACKWARD
    return P.BackwardConfig.from_record(request.content.config_records[P.CONFIG]).next


def _request_grad(request):
    return P.record_tensor(request.content.array_records[P.GRADIENT], "g")


def test_backward_requests_and_gradients(capture_server_steps):
    """E = 3: each client's first two backward requests ask for the next forward,
    the third for the weights, counted per client. Every G_k comes from the server
    model as it was when the batch arrived, with client k's own label prior."""
    s, sent = make_gas(local_iterations=3, buffer_activations=2, generate=False)
    s.launch(0)
    s.launch(1)
    assert [pid for pid, _ in sent] == [0, 1]
    for pid, request in sent:
        assert request.action == P.TRAIN_FORWARD and P.WEIGHTS in request.content.array_records
    sent.clear()

    priors = {p: torch.tensor(h / h.sum(), dtype=torch.float32) for p, h in HIST.items()}
    order = [0, 1, 0, 0, 1, 1]
    expected_next = {0: ["forward", "forward", "weights"], 1: ["forward", "forward", "weights"]}
    got_next = {0: [], 1: []}
    for i, pid in enumerate(order):
        x, y = batch([i % 10, (i + 3) % 10, 0, 1], seed=20 + i)
        frozen = copy.deepcopy(s.server_model)
        expected_grad = activation_gradient(frozen, x, y, priors[pid])
        updates = s.server_updates
        s.on_activations(pid, x, y)
        assert s.server_updates == updates + (1 if i % 2 == 1 else 0)  # Q_s*B = 8: every second batch
        got_pid, request = sent[-1]
        assert got_pid == pid
        got_next[pid].append(_request_next(request))
        g = _request_grad(request)
        assert torch.allclose(g, expected_grad, atol=1e-7), f"batch {i}: G_k is not from the current model"
        if i == 1:  # with logit adjustment the two clients' priors differ, so would G_k
            assert not torch.allclose(g, activation_gradient(frozen, x, y, priors[0]), atol=1e-6)
    assert got_next == expected_next
    assert s.server_updates == 3


def test_logit_adjust_off_uses_plain_cross_entropy():
    s, sent = make_gas(local_iterations=3, buffer_activations=5, logit_adjust=False)
    assert s.label_prior(0) is None
    s.progress_of = {0: 0}
    x, y = batch([0, 1, 2, 3], 3)
    expected = activation_gradient(copy.deepcopy(s.server_model), x, y, None)
    s.on_activations(0, x, y)
    assert torch.allclose(_request_grad(sent[-1][1]), expected, atol=1e-7)


def _filled(s, value):
    return {k: torch.full_like(v, value) for k, v in s.client_model.state_dict().items()}


def _assert_client_model_is(s, value):
    for k, v in s.client_model.state_dict().items():
        assert torch.allclose(v, torch.full_like(v, value), atol=1e-6), (k, float(v.flatten()[0]))


def test_model_buffer_averages_by_data_size_at_qc():
    """Q_c = 2: client A (|D| = 100) all ones, client B (|D| = 300) all threes:
    (100*1 + 300*3) / 400 = 2.5, at the second upload and not before."""
    s, _ = make_gas(buffer_models=2)
    assert s.q_c == 2
    start = {k: v.clone() for k, v in s.client_model.state_dict().items()}
    server_before = server_state(s)
    s.on_upload(0, _filled(s, 1.0), 100)
    assert s.global_iteration == 0
    assert same_state(s.client_model.state_dict(), start)
    s.on_upload(1, _filled(s, 3.0), 300)
    assert s.global_iteration == 1
    _assert_client_model_is(s, 2.5)
    # the full model sees the new client side; the server side is untouched
    full = s.global_model().state_dict()
    assert any(torch.allclose(v, torch.full_like(v, 2.5)) for v in full.values())
    assert same_state(server_state(s), server_before)
    # the buffer was emptied: the next pair alone makes the next average
    s.on_upload(1, _filled(s, 0.0), 300)
    assert s.global_iteration == 1
    _assert_client_model_is(s, 2.5)
    s.on_upload(0, _filled(s, 4.0), 100)
    assert s.global_iteration == 2
    _assert_client_model_is(s, (300 * 0.0 + 100 * 4.0) / 400)  # 1.0


def test_model_buffer_uniform_aggregation():
    s, _ = make_gas(buffer_models=2, aggregation="uniform")
    s.on_upload(0, _filled(s, 1.0), 100)
    s.on_upload(1, _filled(s, 3.0), 300)
    assert s.global_iteration == 1
    _assert_client_model_is(s, 2.0)


def test_model_buffer_qc_three():
    s, _ = make_gas(buffer_models=3, num_clients=2, concurrency=2)
    for pid, v in [(0, 1.0), (1, 3.0)]:
        s.on_upload(pid, _filled(s, v), 0)
        assert s.global_iteration == 0
    s.on_upload(0, _filled(s, 5.0), 100)
    assert s.global_iteration == 1
    _assert_client_model_is(s, (100 * 1 + 300 * 3 + 100 * 5) / 500)  # 3.0


# =============================================================================
# 9-10. Short runs: reproducibility and virtual-time order
# =============================================================================

RUN = {"strategy": "gas", "dataset": "mnist-5k", "model": "alexnet", "cut-layer": 2, "num-clients": 4,
       "concurrency": 2, "partition": "iid", "heterogeneity": "gas", "global-iterations": 2,
       "local-iterations": 2, "batch-size": 8, "seed": 3}


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    from fl_app.run.config import RunConfig
    from simulation.server_app import plan_run
    from simulation.engine import run_inprocess

    out = []
    for i in range(2):
        d = tmp_path_factory.mktemp(f"gas{i}")
        summary = run_inprocess(plan_run(RunConfig.from_mapping({**RUN, "output-dir": str(d)})), progress=False)
        out.append((summary, read_metrics(d / "metrics.csv")))
    return out


def test_gas_run_is_reproducible(two_runs):
    (s1, rows1), (s2, rows2) = two_runs
    assert s1["status"] == s2["status"] == "completed"
    assert len(rows1) == len(rows2) == 3
    for col in ("global_iteration", "test_accuracy", "test_loss", "virtual_time_s", "server_updates",
                "bytes_up", "bytes_down", "generated_activations"):
        assert [r[col] for r in rows1] == [r[col] for r in rows2], col
    assert s1["virtual_time_s"] == s2["virtual_time_s"]
    # and the run did something: the server stepped and the accuracy moved
    assert int(rows1[-1]["server_updates"]) >= 2
    assert rows1[-1]["test_accuracy"] != rows1[0]["test_accuracy"]


def test_gas_virtual_time_is_ordered(two_runs):
    _, rows = two_runs[0]
    times = [float(r["virtual_time_s"]) for r in rows]
    assert [int(r["global_iteration"]) for r in rows] == [0, 1, 2]
    assert times[0] == 0.0
    assert all(t > 0 for t in times[1:])
    assert times == sorted(times)
    updates = [int(r["server_updates"]) for r in rows]
    assert updates == sorted(updates)


def test_server_step_without_input_grad_is_bit_identical():
    """GAS steps with input_grad=False: same parameters, bit for bit, as the full step."""
    from strategies.core.server_step import server_step

    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(4, 8, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2), nn.Flatten(),
                          nn.Linear(8 * 3 * 3, 5))
    twin = copy.deepcopy(model)
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.9, weight_decay=5e-4) for m in (model, twin)]
    g = torch.Generator().manual_seed(1)
    for _ in range(3):
        x, y = torch.randn(16, 4, 6, 6, generator=g), torch.randint(0, 5, (16,), generator=g)
        grad, loss = server_step(model, opts[0], x, y, 10.0)
        none, loss2 = server_step(twin, opts[1], x, y, 10.0, input_grad=False)
        assert grad.shape == x.shape and none is None and torch.equal(loss, loss2)
    for a, b in zip(model.parameters(), twin.parameters()):
        assert torch.equal(a, b)


# =============================================================================
# client-momentum=shared: one momentum buffer the server holds for all clients
# =============================================================================


def test_shared_momentum_travels_and_folds():
    """The buffer goes out with every gradient (and is charged both ways); a reply folds
    ``m <- β·m + (m_k − β·m_sent)``: without overlap m becomes the client's buffer exactly,
    with overlap the other client's contribution is kept."""
    s, sent = make_gas(client_momentum="shared", momentum=0.5)
    own, _ = make_gas()
    assert own.shared_momentum is None
    x, y = batch([0, 1, 2, 3], 1)
    s.progress_of = {0: 0, 1: 0}
    s.on_activations(0, x, y)
    (pid, req), = sent
    assert pid == 0 and len(req.content[P.OPTIMIZER]) == 0  # nothing yet
    own.progress_of = {0: 0}
    own.send = lambda pid, r: sent.append((pid, r))
    own.on_activations(0, x, y)
    assert req.bits_up == sent[1][1].bits_up + s.costs.param_bits(0, s.cut)

    a = {"w": torch.tensor([1.0, 2.0])}
    shared = s.shared_momentum
    shared.fold(0, P.state_record(a))  # sent {} : m = m_0
    assert torch.equal(shared.buffer["w"], a["w"])
    # two clients sent the same m; client 0 returns first, then client 1
    shared.sent = {0: dict(shared.buffer), 1: dict(shared.buffer)}
    m0 = {"w": 0.5 * a["w"] + torch.tensor([10.0, 0.0])}  # d_0 = (10, 0)
    m1 = {"w": 0.5 * a["w"] + torch.tensor([0.0, 4.0])}  # d_1 = (0, 4)
    shared.fold(0, P.state_record(m0))
    assert torch.equal(shared.buffer["w"], m0["w"])  # no overlap yet: exactly the client's buffer
    shared.fold(1, P.state_record(m1))
    assert torch.allclose(shared.buffer["w"], 0.5 * m0["w"] + torch.tensor([0.0, 4.0]))
    assert shared.sent == {}


def test_shared_momentum_needs_sgd_clients(tmp_path, capsys):
    from simulation.cli import main
    from tests.conftest import cli_args

    for bad in ({"client-optimizer": "zo"}, {"optimizer": "adamw"}):
        rc = main(cli_args({"strategy": "gas", "client-momentum": "shared", **bad, "output-dir": tmp_path / "x"}))
        assert rc == 2
        assert "client-momentum=shared needs SGD clients" in capsys.readouterr().err
