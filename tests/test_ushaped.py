"""The label-private (U-shaped) split, ``cut-layers=c1,c2`` (strategies/core/ushaped.py).

* One client of ``vanilla-sl`` in U-shaped form trains, round after round,
  exactly the weights that training the whole model in one process on the same
  batches gives (same SGD: lr, momentum, weight decay; the client's momentum
  restarts with each round's start weights, as the protocol resets it).
* No reply a client sends in a U-shaped run (every strategy that has the form)
  carries a ``labels`` record, a label histogram or an integer array equal to
  the labels of its current batch; the same check finds the labels in a
  prefix run; the clients' own audit (``privacy-record``) agrees reply for
  reply.
* Every leg is charged: the requests' compute and transfer figures against
  :class:`~fl_app.learning.costs.BlockCosts` by hand.
* Bad input is one line and exit 2; every strategy without a U-shaped form
  refuses it saying why.
* U-shaped splitfed-v1 learns mnist-5k about as well as the prefix split on the
  same budget; over the session transport it gives the in-process metrics.
* Label inference reads the labels off the returned gradients, in-process and
  from a run's record (``sflower attack``); max-norm and iso noise lower it.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message
from torch import nn

from fl_app import protocol as P
from fl_app.client.state import slot_key
from fl_app.client_app import app as real_app
from fl_app.run.config import RunConfig
from fl_app.run.errors import ConfigError
from fl_app.learning.task import load_task
from fl_app.learning.training import next_batch
from simulation import cli
from simulation.engine import run_inprocess
from simulation.server_app import plan_run
from strategies.algorithms.splitfed import VanillaSL
from strategies.core.exchange import Exchange
from strategies.core.registry import get_strategy, strategy_names
from strategies.core.ushaped import surrogate_loss
from tests.conftest import read_metrics
from tests.test_session import certs  # noqa: F401  (the TLS files fixture)

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: mnist-5k, LeNet-5 (12 blocks) cut at 2 and 9: head [0, 2), middle [2, 9) on the server, tail [9, 12).
BASE = {
    "dataset": "mnist-5k", "model": "lenet5", "cut-layers": "2,9", "num-clients": 3, "concurrency": 2,
    "partition": "iid", "local-iterations": 2, "batch-size": 8, "global-iterations": 2, "eval-samples": 200,
    "seed": 1,
}
#: The strategies with a U-shaped form.
SUPPORTED = ("splitfed-v1", "splitfed-v2", "minibatch-sfl", "vanilla-sl", "psl")


def _run(tmp_path: Path, client_app=None, **overrides) -> tuple[dict, Path]:
    cfg = RunConfig.from_mapping({**BASE, "output-dir": str(tmp_path), **overrides})
    return run_inprocess(plan_run(cfg), progress=False, client_app=client_app), tmp_path


# --- 1. U-shaped vanilla SL equals one-process training ----------------------------------------------------
@pytest.mark.parametrize("local, rounds", [(1, 4), (3, 2)])
def test_vanilla_sl_ushaped_equals_whole_model_training(tmp_path, monkeypatch, local, rounds):
    """One client, U-shaped vanilla SL: after every round the global model equals the whole model trained in
    one process on the same batches with the same SGD (momentum 0.9, weight decay 5e-4, no clipping), the
    client parts' momentum restarting each round. Tolerance: 1e-6 absolute (float32; observed: identical)."""
    seen = []
    monkeypatch.setattr(VanillaSL, "end_round", lambda self, cohort: seen.append(
        {k: v.clone() for k, v in self.model.state_dict().items()}))
    cfg = {"strategy": "vanilla-sl", "num-clients": 1, "concurrency": 1, "local-iterations": local,
           "global-iterations": rounds, "clip-norm": 0.0, "lr": 0.05, "momentum": 0.9, "weight-decay": 5e-4}
    _run(tmp_path, **cfg)
    assert len(seen) == rounds

    task = load_task(RunConfig.from_mapping({**BASE, **cfg}))
    model = task.build_model()
    names = list(model.blocks)
    middle = [p for name in names[2:9] for p in model.blocks[name].parameters()]
    ends = [p for name in names[:2] + names[9:] for p in model.blocks[name].parameters()]
    sgd = dict(lr=0.05, momentum=0.9, weight_decay=5e-4)
    server_opt = torch.optim.SGD(middle, **sgd)
    sampler = ConfigRecord()
    for r in range(rounds):
        client_opt = torch.optim.SGD(ends, **sgd)  # the round's start weights reset the client's momentum
        for _ in range(local):
            _, _, x, y = next_batch(task, 0, sampler, 8)
            client_opt.zero_grad()
            server_opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            client_opt.step()
            server_opt.step()
        for key, value in model.state_dict().items():
            torch.testing.assert_close(seen[r][key], value, atol=1e-6, rtol=0, msg=f"round {r}, {key}")


def test_surrogate_loss_gives_the_clients_gradient_and_value():
    """surrogate_loss: value = the client's loss; d/d(outputs) = the gradient it returned, exactly."""
    z = torch.randn(4, 3, requires_grad=True)
    g = torch.randn(4, 3)
    loss = surrogate_loss(z * 2.0, g, 1.25)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(1.25)
    assert torch.equal(z.grad, 2.0 * g)


# --- 2. No reply carries the labels ----------------------------------------------------------------------
class LabelWatch:
    """A ClientApp wrapper that inspects every real reply: its record keys (and the handshake's label
    histogram), and every integer array in it against the labels of the node's current own batch (read from
    its state by the batch's indices)."""

    def __init__(self, labels_of) -> None:
        self.labels_of = labels_of
        self.replies = 0
        self.label_keys: list[str] = []
        self.label_arrays: list[str] = []

    def __call__(self, msg: Message, context: Context) -> Message:
        reply = real_app(msg, context)
        if reply.has_error():
            return reply
        self.replies += 1
        info = reply.content.get(P.INFO)
        if msg.metadata.message_type == "query.info" and P.INFO_LABEL_HISTOGRAM in info:
            self.label_keys.append("query.info")
        batch = context.state.get(slot_key(P.OWN_SLOT, "batch"))
        labels = self.labels_of(list(batch["indices"])) if isinstance(batch, ConfigRecord) else None
        for key, record in reply.content.items():
            if key == P.LABELS:
                self.label_keys.append(msg.metadata.message_type)
            if isinstance(record, ArrayRecord) and labels is not None:
                for name in record.keys():
                    arr = P.record_tensor(record, name).numpy()
                    if arr.dtype.kind in "iu" and arr.shape == labels.shape and np.array_equal(arr, labels):
                        self.label_arrays.append(f"{msg.metadata.message_type}:{key}/{name}")
        return reply


def _watch(cfg: dict) -> LabelWatch:
    y = load_task(RunConfig.from_mapping({**BASE, **cfg})).data.y_train.numpy()
    return LabelWatch(lambda idx: y[np.asarray(idx, dtype=np.int64)])


def _audits(out: Path) -> dict:
    """The clients' label audits of a privacy-record run (fl_app.client.audit), summed over the clients."""
    from fl_app.client.audit import read_audit

    total = {"replies": 0, "label_records": [], "label_arrays": []}
    for path in sorted((out / "privacy" / "evaluator").glob("audit-*.jsonl")):
        audit = read_audit(path)
        total["replies"] += audit["replies"]
        total["label_records"] += audit["label_records"]
        total["label_arrays"] += audit["label_arrays"]
    return total


@pytest.mark.parametrize("strategy", SUPPORTED)
def test_no_reply_carries_labels(tmp_path, strategy):
    """In a U-shaped run no client reply has a labels record or an integer array equal to its batch's labels;
    the clients' own audit (privacy-record) checked the same replies and found none either."""
    cfg = {"strategy": strategy, "privacy-record": True}
    watch = _watch(cfg)
    summary, out = _run(tmp_path, client_app=watch, **cfg)
    assert summary["status"] == "completed"
    assert watch.replies >= 8
    assert watch.label_keys == [] and watch.label_arrays == []
    assert _audits(out) == {"replies": watch.replies, "label_records": [], "label_arrays": []}


def test_the_label_check_finds_labels_in_a_prefix_run(tmp_path):
    """The same check on a prefix split (the server holds the labels by construction) finds them, and so does
    the clients' audit, reply for reply."""
    cfg = {"strategy": "splitfed-v1", "cut-layers": "", "cut-layer": 2, "privacy-record": True}
    watch = _watch(cfg)
    _, out = _run(tmp_path, client_app=watch, **cfg)
    assert "train.forward" in watch.label_keys and "query.info" in watch.label_keys and watch.label_arrays
    audit = _audits(out)
    assert audit["replies"] == watch.replies
    assert sorted(audit["label_records"]) == sorted(watch.label_keys)
    assert sorted(audit["label_arrays"]) == sorted(watch.label_arrays)


# --- 3. Every leg is charged -----------------------------------------------------------------------------
def test_every_leg_is_timed_and_metered(tmp_path, monkeypatch):
    """One client, one round of 2 iterations of U-shaped vanilla SL: the requests are, in order, the head's
    forward (up: activations at c1, no labels), the tail's forward with the loss (down: the middle's output
    and the tail's weights; up: the gradient at c2), the head's backward (down: the gradient at c1; up: the
    next activations), the tail's again, the head's backward returning its weights, the tail's upload."""
    sent = []
    real_send = Exchange.send
    monkeypatch.setattr(Exchange, "send", lambda self, pid, req: sent.append(req) or real_send(self, pid, req))
    _run(tmp_path, strategy="vanilla-sl", **{"num-clients": 1, "concurrency": 1, "global-iterations": 1})
    task = load_task(RunConfig.from_mapping(BASE))
    from fl_app.learning.costs import BlockCosts

    c = BlockCosts(task.profiles)
    train = [r for r in sent if r.action.startswith("train.")]
    assert [r.action for r in train] == ["train.forward", "train.forward", "train.backward", "train.forward",
                                         "train.backward", "train.step"]
    head, tail, back, tail2, last, upload = train
    assert head.bits_up == c.activation_bits(2, 8, labels=False)
    assert head.flops == c.flops(0, 2, 8)
    assert tail.bits_up == tail2.bits_up == c.activation_bits(9, 8, labels=False)
    assert tail.flops == c.flops(9, 12, 8, backward=True)
    tail_weights = 8 * sum(a.nbytes for a in _arrays(tail.content, P.WEIGHTS))
    assert tail_weights > 0 and not _arrays(tail2.content, P.WEIGHTS)  # the tail's weights go once per round
    assert tail.download_bits >= tail_weights + c.activation_bits(9, 8, labels=False)
    assert back.bits_up == c.activation_bits(2, 8, labels=False)
    assert back.flops == c.flops(0, 2, 8, forward=False, backward=True) + c.flops(0, 2, 8)
    assert last.bits_up == c.param_bits(0, 2) and upload.bits_up == c.param_bits(9, 12)


def _arrays(content, key):
    record = content.get(key)
    return [] if record is None else [P.record_tensor(record, n).numpy() for n in record.keys()]


# --- 4. Bad input -----------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["cut-layers=5,3"], "need 1 <= c1 < c2"),
    (["cut-layers=0,3"], "need 1 <= c1 < c2"),
    (["cut-layers=2,12"], "out of range for lenet5 (12 blocks)"),
    (["cut-layers=2"], "two cut layers"),
    (["cut-layers=2,5", "cut-layer=3"], "contradicts"),
    (["cut-layers=2,5", "client-optimizer=zo", "server-optimizer=zo"], "first-order"),
])
def test_bad_cut_layers_are_one_line_exit_2(tmp_path, capsys, args, message):
    """Impossible cut pairs: ``sflower run`` exits 2 with one line."""
    base = [f"{k}={v}" for k, v in BASE.items() if k != "cut-layers"]
    assert cli.main(["run", "-q", "strategy=splitfed-v1", *base, f"output-dir={tmp_path}", *args]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


BUILTIN = [s for s in strategy_names() if get_strategy(s).__module__.startswith("strategies.")]


def test_the_supported_strategies_declare_it():
    """Among sflower's own strategies exactly SUPPORTED declare a U-shaped form."""
    assert sorted(s for s in BUILTIN if get_strategy(s).ushaped_refusal == "") == sorted(SUPPORTED)


@pytest.mark.parametrize("strategy", [s for s in BUILTIN if s not in SUPPORTED])
def test_strategies_without_a_ushaped_form_refuse_it(tmp_path, strategy):
    """Every other strategy of sflower's refuses cut-layers with its own reason (not the generic one)."""
    with pytest.raises(ConfigError, match=f"cut-layers does not apply to {strategy}: ") as err:
        plan_run(RunConfig.from_mapping({**BASE, "strategy": strategy, "output-dir": str(tmp_path)}))
    assert "declares no label-private form" not in str(err.value)
    assert get_strategy(strategy).ushaped_refusal


def test_cut_layer_equal_to_c1_is_accepted_and_the_key_off_keeps_the_prefix_split():
    """cut-layer = c1 with cut-layers is no contradiction; without cut-layers nothing changes."""
    assert RunConfig.from_mapping({**BASE, "cut-layer": 2}).cut_layer == 2
    assert RunConfig.from_mapping({**BASE, "cut-layers": "3,9"}).cut_layer == 3
    cfg = RunConfig.from_mapping({**BASE, "cut-layers": "", "cut-layer": 4})
    assert cfg.cut_layer == 4 and cfg.get("cut-layers") == ""


# --- 5. Learning, and the session transport ---------------------------------------------------------------
LEARN = {"num-clients": 4, "concurrency": 4, "local-iterations": 5, "batch-size": 16, "global-iterations": 20,
         "eval-samples": 500, "lr": 0.05}


@pytest.mark.slow  # two whole learning runs (34 s)
def test_ushaped_splitfed_v1_learns_like_the_prefix_split(tmp_path):
    """mnist-5k, LeNet-5, 4 IID clients, 20 rounds of 5 iterations of 16 images: U-shaped splitfed-v1 (cuts 2, 9)
    reaches accuracy >= 0.8 and within 0.1 of the prefix split at cut 2 on the same budget (measured, seed 1:
    0.898 against 0.904; seed 2: 0.903 against 0.875)."""
    u, _ = _run(tmp_path / "u", strategy="splitfed-v1", **LEARN)
    prefix, _ = _run(tmp_path / "p", strategy="splitfed-v1", **{**LEARN, "cut-layers": "", "cut-layer": 2})
    assert u["final_accuracy"] >= 0.8
    assert u["final_accuracy"] >= prefix["final_accuracy"] - 0.1


@pytest.mark.parametrize("strategy", ["vanilla-sl", "splitfed-v1"])
def test_ushaped_over_sessions(strategy, certs, tmp_path):
    """Over the session transport (TLS on localhost; the nodes' ClientApp served by serve_session): a
    U-shaped run writes the metrics of the same run over in-process Flower messages (so vanilla SL keeps its
    equality with one-process training), and no reply a node hands to its session carries the labels."""
    from fl_app.session.client import OPEN_ACTION, serve_session
    from tests.conftest import make_cfg
    from tests.test_session import RUN, run_over_sessions

    keys = dict(strategy=strategy, clock="virtual", cut_layers="2,6", **RUN)  # alexnet: 8 blocks
    tls = dict(transport="session", session_address="localhost:0", session_timeout=20.0,
               session_certificate=str(certs["cert"]), session_key=str(certs["key"]), session_ca=str(certs["ca"]))
    cfg = make_cfg(output_dir=str(tmp_path / "session"), **keys, **tls)
    y = load_task(cfg).data.y_train.numpy()
    watch = LabelWatch(lambda idx: y[np.asarray(idx, dtype=np.int64)])
    run = run_over_sessions(cfg, lambda msg, ctx: serve_session(msg, ctx, watch)
                            if msg.metadata.message_type == OPEN_ACTION else watch(msg, ctx))
    run_inprocess(plan_run(make_cfg(output_dir=str(tmp_path / "flower"), transport="flower", **keys)), progress=False)
    ours, theirs = read_metrics(run.out / "metrics.csv"), read_metrics(tmp_path / "flower" / "metrics.csv")
    for row in ours + theirs:
        del row["wall_time_s"]
    assert ours == theirs and len(ours) == 3
    assert json.loads((run.out / "config.json").read_text())["transport"] == "session"
    assert run.requests > 0 and watch.replies >= run.requests
    assert watch.label_keys == [] and watch.label_arrays == []


# --- 6. Label inference from the returned gradients, and the max-norm defence -----------------------------
def test_leakage_auc_on_hand_made_gradients():
    """Rows of class c along e_c (norm 1 + c): direction scoring reads every label (AUC 1); norm scoring ranks
    class 2 (the largest norms) first, class 0 last: per-class AUCs 0, 0.5, 1 -> the best bet, class 2: 1 (the
    mean, 0.5, would call a perfect separation chance)."""
    from simulation.privacy.label_leakage import leakage_auc

    labels = np.array([0, 1, 2] * 4)
    grads = np.zeros((12, 3))
    grads[np.arange(12), labels] = 1.0 + labels
    auc = leakage_auc(grads, labels)
    assert auc.direction == 1.0 and auc.norm == pytest.approx(1.0) and auc.samples == 12
    # norms that carry no label (all 1): every per-class AUC 0.5
    grads[np.arange(12), labels] = 1.0
    assert leakage_auc(grads, labels).norm == pytest.approx(0.5)
    # two classes, class 1's norms the larger in 3 of 4 pairs: AUC 0.75 either way round (max(AUC, 1 - AUC))
    two = np.array([0, 0, 1, 1])
    for flip in (1.0, -1.0):
        rows = np.array([[1.0], [3.0], [2.0], [4.0]]) if flip > 0 else np.array([[4.0], [2.0], [3.0], [1.0]])
        assert leakage_auc(rows, two).norm == pytest.approx(0.75)


def measure(cfg: RunConfig):
    """Run ``cfg`` (U-shaped) in-process and score every gradient its clients returned (norm and direction
    scoring, :class:`simulation.privacy.label_leakage.TailGradients` around the ClientApp)."""
    from fl_app.client_app import app
    from fl_app.learning.task import load_task
    from simulation.privacy.label_leakage import TailGradients

    y = load_task(cfg).data.y_train.numpy()
    recorder = TailGradients(app, lambda idx: y[idx])
    run_inprocess(plan_run(cfg), progress=False, client_app=recorder)
    return recorder.auc()


LEAK = {"strategy": "splitfed-v1", "num-clients": 4, "concurrency": 4, "local-iterations": 5, "batch-size": 16,
        "global-iterations": 4, "lr": 0.05}


@pytest.mark.parametrize("cuts, undefended, defended", [("2,11", 0.99, 0.97), ("2,9", 0.85, None)])
def test_label_inference_reads_the_labels_and_max_norm_blurs_them(tmp_path, cuts, undefended, defended):
    """The gradients U-shaped clients return at c2 give away their labels to direction scoring (measured on
    mnist-5k, seed 1: AUC 1.0 with the tail = the last block, cuts 2,11; 0.931 with 3 blocks, cuts 2,9);
    max-norm noise lowers it (0.931 at cuts 2,11, 0.905 at 2,9), not to chance."""
    cfg = {**BASE, **LEAK, "cut-layers": cuts, "output-dir": str(tmp_path)}
    auc = measure(RunConfig.from_mapping(cfg))
    assert auc.direction >= undefended and auc.samples == 4 * 4 * 5 * 16
    if defended is not None:
        noisy = measure(RunConfig.from_mapping({**cfg, "label-defence": "max-norm"}))
        assert 0.6 <= noisy.direction <= defended


def test_max_norm_noise_equalises_the_expected_norms():
    """Rows of norms 1, 2, 4 in d = 20000: after max-norm noise every squared norm is 16 within 3 %;
    the largest row is unchanged; the same seed gives the same noise."""
    from fl_app.privacy.label_defence import defence_generator, max_norm_noise

    d = 20000
    grad = torch.zeros(3, d)
    grad[0, 0], grad[1, 1], grad[2, 2] = 1.0, 2.0, 4.0
    out = max_norm_noise(grad, defence_generator(0, 1, 2))
    assert torch.equal(out[2], grad[2])
    assert torch.allclose((out ** 2).sum(dim=1), torch.full((3,), 16.0), rtol=0.03)
    assert torch.equal(out, max_norm_noise(grad, defence_generator(0, 1, 2)))
    assert not torch.equal(out, max_norm_noise(grad, defence_generator(0, 1, 3)))


def test_label_defence_needs_a_ushaped_split(tmp_path, capsys):
    """label-defence=max-norm on a prefix split: one line, exit 2."""
    base = [f"{k}={v}" for k, v in BASE.items() if k != "cut-layers"]
    assert cli.main(["run", "-q", "strategy=splitfed-v1", *base, f"output-dir={tmp_path}",
                     "label-defence=max-norm"]) == 2
    err = capsys.readouterr().err.strip()
    assert "needs a U-shaped split" in err and len(err.splitlines()) == 1


def test_iso_noise_is_t_times_the_largest_norm():
    """Rows of norms 1, 2, 4 in d = 20000, t = 0.5: each row gets N(0, (0.5·4)²/d) per coordinate, drawn from
    the generator in row order (the same draws by hand), so every squared norm grows by 4 within 3 %."""
    from fl_app.privacy.label_defence import defence_generator, iso_noise, perturb

    d = 20000
    grad = torch.zeros(3, d)
    grad[0, 0], grad[1, 1], grad[2, 2] = 1.0, 2.0, 4.0
    out = iso_noise(grad, 0.5, defence_generator(0, 1, 2))
    by_hand = grad + torch.randn((3, d), generator=defence_generator(0, 1, 2)) * (0.5 * 4.0 / d ** 0.5)
    assert torch.allclose(out, by_hand, atol=1e-7)
    assert torch.allclose((out ** 2).sum(dim=1), torch.tensor([1.0, 4.0, 16.0]) + 4.0, rtol=0.03)
    assert torch.equal(perturb(grad, "iso", 0.5, defence_generator(0, 1, 2)), out)
    assert perturb(grad, "none", 0.5, defence_generator(0, 1, 2)) is grad


@pytest.mark.parametrize("keys, message", [
    (["label-noise=1.0"], "goes with label-defence=iso"),
    (["label-defence=iso"], "iso needs label-noise > 0"),
    (["label-defence=iso", "label-noise=-1"], "label-noise"),
])
def test_label_noise_goes_with_iso(tmp_path, capsys, keys, message):
    """label-noise without iso, iso without label-noise, a negative t: one line, exit 2."""
    base = [f"{k}={v}" for k, v in BASE.items()]
    assert cli.main(["run", "-q", "strategy=splitfed-v1", *base, f"output-dir={tmp_path}", *keys]) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


@pytest.mark.slow  # a recorded run and sflower attack on it (55 s)
def test_the_attack_reads_the_labels_off_what_the_server_recorded(tmp_path, capsys):
    """A U-shaped run with privacy-record: sflower attack's label inference on the server's record scores the
    same rows as the client-side measurement of the same run (every tail reply as sent: the same norm AUC;
    direction scoring's reference example is the first recorded, which the orders of the two records differ on);
    direction scoring reads the labels (>= 0.85), iso noise at t = 4 brings it near chance (<= 0.65); a record
    that is not what a client sent is left out, and with none left the attack is one ConfigError."""
    from fl_app.run.errors import ConfigError
    from simulation.privacy.label_leakage import attack_run
    from simulation.privacy.attack import run_attack

    cfg = {**BASE, **LEAK, "privacy-record": True, "aux-holdout": 200}
    summary, out = _run(tmp_path / "plain", **cfg)
    assert summary["status"] == "completed"
    res = run_attack(out, epochs=1)["labels"]
    direct = measure(RunConfig.from_mapping({**BASE, **cfg, "output-dir": str(tmp_path / "direct")}))
    assert res["samples"] == direct.samples == 4 * 4 * 5 * 16 and res["clients"] == [0, 1, 2, 3]
    assert res["norm_auc"] == pytest.approx(direct.norm, abs=1e-12)  # order-free; direction's reference is not
    assert res["direction_auc"] >= 0.85 and direct.direction >= 0.85
    assert json.loads((out / "privacy" / "labels.json").read_text())["direction_auc"] == res["direction_auc"]
    _, noisy = _run(tmp_path / "iso", **cfg, **{"label-defence": "iso", "label-noise": 4.0})
    capsys.readouterr()
    assert cli.main(["attack", str(noisy), "epochs=1"]) == 0  # the command prints both attacks' lines
    printed = capsys.readouterr().out
    assert "label inference on 1280 tail gradients (label-defence=iso)" in printed and "PSNR" in printed
    assert "worst case over all attacks: labels" in printed and "gradient-matching tracked" in printed
    assert json.loads((noisy / "privacy" / "labels.json").read_text())["direction_auc"] <= 0.65
    received = dict(np.load(out / "privacy" / "received.npz"))
    received["g-1"] = received["g-1"] + 1.0
    np.savez(out / "privacy" / "received.npz", **received)
    assert attack_run(out)["unmatched_clients"] == [1]
    for name in [n for n in received if n.startswith("g-")]:
        received[name] = received[name][1:]
    np.savez(out / "privacy" / "received.npz", **received)
    with pytest.raises(ConfigError, match="matches a client's record"):
        attack_run(out)


def test_the_clients_records_are_appended_and_a_cut_short_end_is_left_out(tmp_path):
    """The tail record and the audit are appended one reply at a time (never read back on the node); reading
    them gives every whole reply in order, and leaves out a last one cut short (a client killed mid-write)."""
    from fl_app.client.audit import read_audit
    from fl_app.privacy.activations import append_tail_truth, read_tail_truth, tail_truth_path

    grads = [torch.arange(6.0).reshape(2, 3), torch.ones(2, 1, 3)]
    labels = [torch.tensor([4, 7]), torch.tensor([1, 2])]
    for g, y in zip(grads, labels):
        append_tail_truth(str(tmp_path), 3, g, y)
    g, y = read_tail_truth(tail_truth_path(tmp_path, 3))
    assert g.dtype == np.float32 and g.shape == (4, 3) and y.tolist() == [4, 7, 1, 2]
    assert np.array_equal(g[:2], grads[0].numpy()) and np.array_equal(g[2:], np.ones((2, 3)))
    path = tail_truth_path(tmp_path, 3)
    path.write_bytes(path.read_bytes()[:-5])  # the second pair's labels cut short
    g, y = read_tail_truth(path)
    assert g.shape == (2, 3) and y.tolist() == [4, 7]
    audit = tmp_path / "audit-0.jsonl"
    audit.write_text('{"reply": "train.forward", "label_record": true, "label_arrays": ["labels/y"]}\n'
                     '{"reply": "train.backward", "label_record": false, "label_arrays": []}\n{"reply": "tr')
    assert read_audit(audit) == {"replies": 2, "label_records": ["train.forward"],
                                 "label_arrays": ["train.forward:labels/y"], "index_arrays": []}
