"""Queued, tagged requests and the straggler tools of the event loop:
per-node FIFO queues, ``gather(first=k)``, ``gather(deadline=t)``, ``cancel``,
with virtual times computed by hand.

The timing model here charges ``flops`` seconds (one FLOP per second), so
each request's duration is its ``flops`` field.
"""

from __future__ import annotations

import pytest
from flwr.app import RecordDict

from strategies.core.clock import Timing
from tests.conftest import make_cfg
from tests.test_runtime import ScriptedGrid, node_of


class FlopSeconds(Timing):
    """A request takes ``flops`` seconds on every client (``draw`` ignored)."""

    def duration(self, partition_id, flops, bits_up=0.0, bits_down=0.0, draw=0):
        return float(flops)


def req(seconds, tag=None):
    from strategies.core.dispatcher import Request

    return Request("train.forward", RecordDict(), flops=seconds, tag=tag)


def all_at_once(unreleased, pulls):
    return unreleased


def reverse_one_per_pull(unreleased, pulls):
    return unreleased[-1:]


@pytest.fixture
def strategy(server_identity):
    """An SFLStrategy on a scripted grid of 4 nodes; ``strategy(release)``."""
    from fl_app.learning.task import load_task
    from simulation.timing.clocks import VirtualClock
    from strategies.core.base import ClientInfo, SFLStrategy
    from strategies.core.dispatcher import Dispatcher

    def build(release=all_at_once, n=4):
        cfg = make_cfg(num_clients=n, concurrency=n)
        s = SFLStrategy(cfg, load_task(cfg), clock=VirtualClock(), timing=FlopSeconds(), progress=False)
        nodes = node_of(n)
        s.clients = {p: ClientInfo(p, nodes[p], 10, None) for p in range(n)}
        grid = ScriptedGrid(release)
        s.dispatcher = Dispatcher(grid, s.clock, nodes, poll_interval=0.0)
        return s, grid

    return build


def test_queue_is_fifo_per_node_with_one_message_on_the_wire(strategy):
    s, grid = strategy(reverse_one_per_pull)
    d = s.dispatcher
    a = s.send(0, req(1.0, "a"))
    b = s.send(0, req(2.0, "b"))  # queued behind a: starts at 1.0, due 3.0
    c = s.send(1, req(0.5, "c"))
    assert (a.due, b.due, c.due) == (1.0, 3.0, 0.5)
    assert b.start == 1.0 and b.sent_at == 0.0
    assert len(grid.pushed) == 2 and b.message_id is None  # b waits for a's reply
    assert d.busy(0) and d.in_flight == 2 and d.outstanding == 3
    got = []
    while d.outstanding:
        r = s.receive()
        got.append((r.tag, r.pid, s.clock.now()))
    assert got == [("c", 1, 0.5), ("a", 0, 1.0), ("b", 0, 3.0)]
    assert len(grid.pushed) == 3


def test_gather_first_k_keeps_the_rest(strategy):
    s, _ = strategy(reverse_one_per_pull)
    # durations 3, 1, 2, 4 s: the first two in virtual completion order are p1 (1 s) and p2 (2 s)
    replies = s.gather_replies([(p, req(t, p)) for p, t in enumerate([3.0, 1.0, 2.0, 4.0])], first=2)
    assert [r.pid for r in replies] == [1, 2] and [r.tag for r in replies] == [1, 2]
    assert s.clock.now() == 2.0
    assert s.dispatcher.outstanding == 2
    later = [s.receive() for _ in range(2)]
    assert [(r.pid, r.due) for r in later] == [(0, 3.0), (3, 4.0)]
    assert s.clock.now() == 4.0


def test_gather_first_k_cancels_the_rest(strategy):
    s, grid = strategy(all_at_once)
    replies = s.gather_replies([(p, req(t, p)) for p, t in enumerate([3.0, 1.0, 2.0, 4.0])], first=2, rest="cancel")
    assert [r.pid for r in replies] == [1, 2] and s.clock.now() == 2.0
    assert s.dispatcher.outstanding == 0 and not s.dispatcher.busy(0)
    # p0 is free at once in virtual time: a new 1 s request is due at 2 + 1 = 3 s, and its
    # reply (not the cancelled one's) comes back
    new = s.send(0, req(1.0, "new"))
    assert new.due == 3.0
    r = s.receive()
    assert r.tag == "new" and r.pid == 0 and s.clock.now() == 3.0
    assert r.content.config_records["info"]["mid"] == new.message_id
    assert s.dispatcher.outstanding == 0


def test_gather_deadline_cuts_stragglers(strategy):
    s, _ = strategy(reverse_one_per_pull)
    s.clock.advance_to(10.0)
    # due at 13, 11, 12, 14; the deadline 12.5 keeps p1 and p2, and the round ends at 12.5
    replies = s.gather_replies([(p, req(t, p)) for p, t in enumerate([3.0, 1.0, 2.0, 4.0])],
                               deadline=12.5, rest="cancel")
    assert [r.pid for r in replies] == [1, 2]
    assert s.clock.now() == 12.5
    assert s.dispatcher.outstanding == 0
    # with every reply due before the deadline, the clock stops at the last one
    replies = s.gather_replies([(p, req(t, p)) for p, t in enumerate([1.0, 2.0])], deadline=20.0)
    assert [r.pid for r in replies] == [0, 1] and s.clock.now() == 14.5


def test_gather_deadline_keep_then_stray_replies(strategy):
    s, _ = strategy(all_at_once)
    replies = s.gather_replies([(0, req(5.0, "slow")), (1, req(1.0, "fast"))], deadline=2.0)
    assert [r.tag for r in replies] == ["fast"] and s.clock.now() == 2.0
    # the next gather receives the kept straggler on the way: it lands in stray_replies
    replies = s.gather_replies([(1, req(4.0, "next"))])
    assert [r.tag for r in replies] == ["next"] and s.clock.now() == 6.0
    assert [(r.tag, r.due) for r in s.stray_replies] == [("slow", 5.0)]


def test_cancel_drops_queued_and_in_flight(strategy):
    s, grid = strategy(all_at_once)
    s.send(0, req(1.0, "a"))
    s.send(0, req(1.0, "b"))
    s.send(1, req(2.0, "c"))
    assert s.cancel(0) == 2
    assert len(grid.pushed) == 2  # "b" was never delivered
    r = s.receive()
    assert r.tag == "c" and s.clock.now() == 2.0
    assert s.dispatcher.outstanding == 0
    with pytest.raises(ValueError, match="rest"):
        s.gather_replies([], rest="drop")


def test_expected_duration_is_the_mean_and_draws_nothing(server_identity):
    """With exponential stragglers a request's expected duration is its nominal compute
    time (the mean of Exp(1) is 1), and asking does not consume a straggler draw."""
    from fl_app.learning.task import load_task
    from simulation.timing.clocks import VirtualClock
    from simulation.timing.devices import DEFAULT_FLOPS_PER_S, draw_profiles
    from simulation.timing.durations import DeviceTiming
    from strategies.core.base import ClientInfo, SFLStrategy
    from strategies.core.dispatcher import Dispatcher

    cfg = make_cfg(num_clients=2, concurrency=2, heterogeneity="exponential")
    timing = DeviceTiming(draw_profiles("exponential", 2, cfg.seed), cfg.seed)
    s = SFLStrategy(cfg, load_task(cfg), clock=VirtualClock(), timing=timing, progress=False)
    nodes = node_of(2)
    s.clients = {p: ClientInfo(p, nodes[p], 10, None) for p in range(2)}
    s.dispatcher = Dispatcher(ScriptedGrid(all_at_once), s.clock, nodes, poll_interval=0.0)
    work = req(2.5e9)
    assert s.expected_duration(1, work) == pytest.approx(0.5)  # 2.5e9 FLOPs at 5e9 FLOP/s
    assert DEFAULT_FLOPS_PER_S == 5e9
    sent = s.send(1, work)
    assert sent.due == pytest.approx(0.5 * timing.straggler_factor(1, 0))  # draw 0 is still the first


def test_sync_strategy_measures_server_compute(tmp_path):
    from simulation.server_app import plan_run
    from simulation.engine import run_inprocess

    cfg = make_cfg(strategy="minibatch-sfl", num_clients=2, concurrency=2, local_iterations=3,
                   output_dir=str(tmp_path / "run"))
    summary = run_inprocess(plan_run(cfg), progress=False)
    assert summary["server_compute_s"] > 0.0
    assert summary["server_compute_s"] < summary["wall_time_s"]
