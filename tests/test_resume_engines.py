"""Checkpoints and resume on every engine: the clients' state through ``query.checkpoint``/``query.restore``.

* the protocol actions and the dispatcher's drain, on the in-process grid;
* ``node-loss=rollback``: a node lost mid-run (its state gone) sends the run back to its last checkpoint, and
  the metrics equal an uninterrupted run's;
* the Ray engine: a real ``sflower run engine=ray`` subprocess SIGKILLed after checkpoint 3 of 6 resumes
  (``engine=ray resume=RUN_DIR``) with the metrics of an uninterrupted in-process run.

The deployed chaos test (SuperNodes and the ServerApp killed, restarted and resumed) is in ``test_deploy.py``.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from flwr.app import ConfigRecord, Message, RecordDict

from fl_app import protocol as P
from fl_app.client_app import app as client_app
from fl_app.run.config import RunConfig
from simulation import cli
from simulation.engine import InProcessGrid, run_inprocess
from simulation.server_app import plan_run
from strategies.core import checkpoint as ckpt
from strategies.core import client_states
from simulation.timing.clocks import VirtualClock
from strategies.core.dispatcher import Dispatcher, Request
from strategies.core.errors import RunFailedError
from tests.test_checkpoint import (BASE, _columns, _reference, _same_metrics, for_strategy,
                                   reference_in_its_own_process, run_cli)

REPO = Path(__file__).resolve().parents[1]


def _handshaken_grid(num_nodes: int = 2, run_dir: Path | None = None) -> tuple[InProcessGrid, dict[int, int]]:
    """An in-process grid whose nodes had the handshake (run directory ``run_dir``: where the nodes keep their
    checkpoint keys); ``{partition id: node id}``."""
    grid = InProcessGrid(client_app, num_nodes, seed=3)
    out = {"output-dir": str(run_dir)} if run_dir is not None else {}
    task = ConfigRecord(RunConfig.from_mapping({**BASE, "num-clients": num_nodes, "concurrency": 1, **out}).as_dict())
    node_of = {}
    for nid in grid.get_node_ids():
        (reply,) = grid.send_and_receive([Message(P.requests.query_info(task), nid, P.QUERY_INFO)])
        node_of[int(reply.content[P.INFO][P.INFO_PARTITION_ID])] = nid
    return grid, node_of


def test_checkpoint_and_restore_actions_carry_the_whole_node_state(server_identity, tmp_path):
    """``query.checkpoint`` returns every record of a node's state, sealed (opened with the node's key: the
    same records); ``query.restore`` replaces the whole state (records the node had and the restored state
    lacks are gone); a state that is not sealed is refused in one line and the node's state is kept."""
    from fl_app.client.sealing import SEALED, node_key, unseal

    grid, node_of = _handshaken_grid(run_dir=tmp_path)
    states = client_states.fetch(grid, node_of, timeout=30)
    assert set(states) == {0, 1}
    for pid, nid in node_of.items():
        assert list(states[pid].keys()) == [SEALED]
        opened = unseal(states[pid], node_key(tmp_path / "nodes" / f"node-{pid}" / "checkpoint.key"), pid)
        assert set(opened.keys()) == set(grid.contexts[nid].state.keys()) and P.TASK in opened
    grid.contexts[node_of[0]].state["stray"] = ConfigRecord({"x": 1})
    grid.contexts[node_of[1]].state["stray"] = ConfigRecord({"x": 2})
    client_states.push(grid, node_of, {0: states[0], 1: states[1]}, timeout=30)
    assert "stray" not in grid.contexts[node_of[0]].state and P.TASK in grid.contexts[node_of[0]].state
    grid.contexts[node_of[0]].state["stray"] = ConfigRecord({"x": 1})
    with pytest.raises(RunFailedError, match=r"^query.restore failed on client 0: .*not sealed[^\n]*$"):
        client_states.push(grid, node_of, {0: RecordDict({"only": ConfigRecord({"y": 3})})}, timeout=30)
    assert "stray" in grid.contexts[node_of[0]].state


def test_a_failed_node_fails_the_fetch_in_one_line(server_identity, tmp_path):
    grid, node_of = _handshaken_grid(run_dir=tmp_path)

    def app(msg, ctx):
        if msg.metadata.message_type == P.QUERY_CHECKPOINT and ctx.node_id == node_of[1]:
            raise OSError("disk full\non two lines")
        return client_app(msg, ctx)

    grid.client_app = app
    assert set(client_states.fetch(grid, {0: node_of[0]}, timeout=30)) == {0}
    with pytest.raises(RunFailedError, match=r"^query.checkpoint failed on client 1: on two lines$"):
        client_states.fetch(grid, node_of, timeout=30)


def test_drain_holds_delivery_until_release(server_identity, tmp_path):
    """While drained, queued requests are not delivered; the replies on the wire are pulled and wait in order;
    :meth:`release` delivers the queue."""
    grid, node_of = _handshaken_grid(1, run_dir=tmp_path)
    pushed: list[str] = []
    push = grid.push_messages
    grid.push_messages = lambda msgs: [pushed.append(m.metadata.message_type) or i for m in msgs for i in push([m])]
    disp = Dispatcher(grid, VirtualClock(), node_of)
    for _ in range(3):
        disp.send(0, Request(P.QUERY_CHECKPOINT, RecordDict()), duration=1.0)
    assert len(pushed) == 1  # one at a time per node
    assert disp.drain(timeout=10) and not disp._wire and len(disp._arrived) == 1
    assert len(pushed) == 1  # held: nothing new went out
    disp.release()
    assert len(pushed) == 2
    for due in (1.0, 2.0, 3.0):
        pending, reply = disp.next_reply()
        assert pending.due == due and not reply.has_error()


def test_when_nodes_are_back_retries_only_a_lost_node(monkeypatch):
    monkeypatch.setattr(client_states, "RETRY_S", 0.01)
    tries = []

    def step():
        tries.append(1)
        if len(tries) < 3:
            raise RunFailedError("handshake failed on node 7: Error: Node Unavailable")
        return "ok"

    assert client_states.when_nodes_are_back(step, timeout=5) == "ok" and len(tries) == 3

    def broken():
        tries.append(1)
        raise RunFailedError("malformed handshake from node 7")

    tries.clear()
    with pytest.raises(RunFailedError, match="malformed"):
        client_states.when_nodes_are_back(broken, timeout=5)
    assert len(tries) == 1


class _LosesNode:
    """The real ClientApp, except that partition ``pid``'s node is lost once, on its ``at``-th training message:
    its state is wiped (a restarted SuperNode's fresh context) and the message fails as a lost node's does."""

    def __init__(self, pid: int, at: int) -> None:
        self.pid, self.at, self.count, self.lost = pid, at, 0, False

    def __call__(self, msg: Message, ctx):
        if msg.metadata.message_type.startswith("train.") and int(ctx.node_config["partition-id"]) == self.pid:
            self.count += 1
            if self.count == self.at and not self.lost:
                self.lost = True
                ctx.state = RecordDict()
                raise RuntimeError("node unavailable: the stream broke (simulated)")
        return client_app(msg, ctx)


@pytest.mark.slow  # a rolled-back run and a reference run
@pytest.mark.parametrize("strategy", ["gas", "splitfed-v1"])
def test_a_lost_node_rolls_the_run_back_to_its_checkpoint(tmp_path, strategy):
    """node-loss=rollback: the run goes back to its last checkpoint, restores every client's state (the lost
    node's included) and ends with the metrics of a run that lost nothing."""
    cfg = {**for_strategy(strategy)}
    out = tmp_path / "rolled"
    plan = plan_run(RunConfig.from_mapping({**cfg, "checkpoint-every": 1, "node-loss": "rollback",
                                            "output-dir": str(out)}))
    app = _LosesNode(pid=2, at=7)
    summary = run_inprocess(plan, progress=False, client_app=app)
    assert app.lost and summary["rollbacks"] == 1 and summary["failed_clients"] == []
    _same_metrics(out / "metrics.csv", _reference(tmp_path, cfg))


def test_a_lost_node_is_excluded_by_default_and_rollback_needs_checkpoints(tmp_path, capsys):
    plan = plan_run(RunConfig.from_mapping({**for_strategy("splitfed-v1"), "output-dir": str(tmp_path / "x")}))
    summary = run_inprocess(plan, progress=False, client_app=_LosesNode(pid=1, at=2))
    assert summary["failed_clients"] == [1] and summary["rollbacks"] == 0
    assert cli.main(["run", "node-loss=rollback"]) == 2
    err = capsys.readouterr().err
    assert "node-loss=rollback needs checkpoint-every" in err and err.count("\n") == 1


@pytest.mark.e2e  # two sflower run engine=ray processes (Ray instances), one of them SIGKILLed
@pytest.mark.parametrize("strategy", ["gas", "ringsfl"])
def test_ray_run_sigkilled_after_a_checkpoint_resumes_identically(tmp_path, strategy):
    """SIGKILL a Ray run (its process group: the driver and Ray's workers) once checkpoint 3 of 6 is on disk;
    ``engine=ray resume=RUN_DIR`` finishes it with the metrics of an uninterrupted in-process run."""
    cfg = {**for_strategy(strategy)}
    run_dir = tmp_path / "killed"
    proc = run_cli("engine=ray", *[f"{k}={v}" for k, v in cfg.items()], "checkpoint-every=1",
                    f"output-dir={run_dir}")
    deadline = time.monotonic() + 600
    while time.monotonic() < deadline and proc.poll() is None:
        try:
            if ckpt.read_meta(run_dir / ckpt.CHECKPOINT_FILE)["global_iteration"] >= 3:
                break
        except ckpt.CheckpointError:
            pass
        time.sleep(0.05)
    assert proc.poll() is None, proc.stderr.read().decode()[-2000:]
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert not (run_dir / "summary.json").exists()
    resumed = run_cli("engine=ray", f"resume={run_dir}")
    assert resumed.wait(timeout=600) == 0, resumed.stderr.read().decode()[-2000:]
    _same_metrics(run_dir / "metrics.csv", reference_in_its_own_process(tmp_path, cfg))
    assert len(_columns(run_dir / "metrics.csv")["global_iteration"]) == 7
