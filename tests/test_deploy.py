"""End-to-end loopback deployment (issue 12): a SuperLink and 3 SuperNodes with their own data
directories, TLS and SuperNode authentication on, GAS and splitfed-v1 with a tiny budget, and a
SuperNode whose key is not registered (refused; the run goes on with the others).

Each test starts real Flower processes (``sflower deploy``, :mod:`simulation.deploy`) and takes
about a minute on two cores; they are skipped only when Flower's binaries (or openssl/ssh-keygen,
needed for the certificates and keys) are missing.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from fl_app.run.config import RunConfig
from fl_app.run.errors import ConfigError
from simulation.deploy.options import parse_deploy_args
from simulation.deploy.processes import flower_binaries_missing
from tests.conftest import read_metrics

MISSING = flower_binaries_missing() + [t for t in ("openssl", "ssh-keygen") if shutil.which(t) is None]
needs_flower = pytest.mark.skipif(bool(MISSING), reason=f"deployment needs {', '.join(MISSING)} (not installed)")

TINY = {"global-iterations": "1", "local-iterations": "1", "concurrency": "3", "timeout": "400",
        "node-timeout": "300"}


def _deploy(tmp_path: Path, **pairs: str) -> tuple[dict, Path]:
    from simulation.deploy.run import deploy

    options = parse_deploy_args({**TINY, **pairs, "run-dir": str(tmp_path / "run")})
    summary = deploy(options, quiet=True)
    return summary, Path(summary["deploy"]["run_dir"])


def _no_process_left(run_dir: Path) -> list[str]:
    """Command lines of live processes that mention the run directory (none may survive)."""
    left = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            except OSError:
                continue
            if str(run_dir) in cmd:
                left.append(cmd)
    return left


def _check_outputs(summary: dict, run_dir: Path, clients: int) -> list[dict]:
    out = run_dir / "out"
    assert summary["status"] == "completed"
    rows = read_metrics(out / "metrics.csv")
    assert [int(r["global_iteration"]) for r in rows] == [0, 1]
    assert int(rows[-1]["exchanges"]) > 0 and int(rows[-1]["bytes_up"]) > 0
    assert 0.0 <= float(rows[-1]["test_accuracy"]) <= 1.0
    # each node trained on its own directory: the handshake sizes are those of the files written for it
    for k in range(clients):
        meta = json.loads((run_dir / "data" / f"partition-{k}" / "partition.json").read_text())
        assert summary["client_examples"][str(k)] == meta["num-examples"]
    # nothing private in config.json: no key, no certificate, no node's data path
    text = (out / "config.json").read_text()
    for secret in (str(run_dir / "data"), str(run_dir / "keys"), str(run_dir / "certs"), "/partition-",
                   "PRIVATE KEY", "BEGIN"):
        assert secret not in text
    assert (run_dir / "logs" / "superlink.log").stat().st_size > 0
    assert not _no_process_left(run_dir)
    # the requests went over sessions (the default in a deployment), and the endpoint's port is closed
    assert json.loads(text)["transport"] == "session"
    assert _session_port_closed(run_dir)
    # every node's session handler returned at the close and replied, so Flower stored its context.state
    for k in range(clients):
        assert "Sending: query.session" in (run_dir / "logs" / f"node-{k}.log").read_text(), k
    return rows


def _session_port_closed(run_dir: Path) -> bool:
    """Whether the session endpoint the ServerApp logged ("session endpoint on HOST:PORT") refuses connections."""
    import re
    import socket

    found = re.search(r"session endpoint on ([\w.\-]+):(\d+)", (run_dir / "logs" / "flwr-run.log").read_text())
    assert found, "the ServerApp did not log its session endpoint"
    try:
        socket.create_connection((found.group(1), int(found.group(2))), timeout=2).close()
    except OSError:
        return True
    return False


@pytest.mark.e2e
@needs_flower
def test_splitfed_v1_three_supernodes_tls_auth(tmp_path: Path) -> None:
    summary, run_dir = _deploy(tmp_path, nodes="3", strategy="splitfed-v1", tls="true", auth="true")
    _check_outputs(summary, run_dir, 3)
    assert summary["failure_reasons"] == {}
    assert sorted(summary["client_examples"]) == ["0", "1", "2"]
    assert "--enable-supernode-auth" in (run_dir / "logs" / "superlink.log").read_text()


@pytest.mark.e2e
@needs_flower
def test_gas_with_an_unauthorised_supernode(tmp_path: Path) -> None:
    summary, run_dir = _deploy(tmp_path, nodes="3", intruders="1", strategy="gas",
                               **{"join-timeout": "20"})  # room for 3 SuperNodes to join on a loaded machine
    _check_outputs(summary, run_dir, 3)
    # node 3's key was never registered: Flower refused it, and the run went on with nodes 0-2
    assert summary["deploy"]["refused_nodes"].get("3", 0) != 0
    assert "Failed to activate SuperNode" in (run_dir / "logs" / "node-3-unauthorised.log").read_text()
    assert sorted(summary["client_examples"]) == ["0", "1", "2"]
    assert summary["failure_reasons"] == {"3": "query.info: no node joined"}


@pytest.mark.e2e
@needs_flower
def test_a_node_killed_mid_session_is_excluded_and_the_run_finishes(tmp_path: Path) -> None:
    """SIGKILL of a SuperNode (and its ClientApp) mid-session: the client is excluded as unavailable (so it may be
    re-admitted), and the others finish the run.

    Which side notices first is a race on a loaded machine: the session's stream breaking, or SuperLink's
    heartbeat error on the node's opening message. Both reasons say "node unavailable". The kill is timed from
    the first trained row (global iteration 10), when every session is open. Timed from row 0 it could land
    while the node was still starting its ClientApp; the asynchronous run could then end before SuperLink's
    heartbeat lapsed, and the failure went unnoticed (CI, 2026-11-26)."""
    summary, run_dir = _deploy(tmp_path, nodes="3", strategy="gas", **{
        "global-iterations": "60", "eval-every": "10", "kill-node": "1", "kill-after": "2"})
    assert summary["status"] == "completed" and summary["deploy"]["killed_node"] == 1
    reason = summary["failure_reasons"]["1"]
    assert "node unavailable" in reason.lower(), reason
    assert "stream" in reason or "heartbeat" in reason, reason  # the stream broke, or SuperLink's heartbeat lapsed
    assert summary["failed_clients"] == [1]
    rows = read_metrics(run_dir / "out" / "metrics.csv")
    assert int(rows[-1]["global_iteration"]) == 60
    assert _session_port_closed(run_dir) and not _no_process_left(run_dir)


def test_the_kill_clock_starts_at_the_first_trained_row(tmp_path: Path) -> None:
    from simulation.deploy.run import _trained_rows
    path = tmp_path / "metrics.csv"
    assert _trained_rows(path) == 0
    path.write_text("global_iteration,test_accuracy\n0,0.1\n")
    assert _trained_rows(path) == 0  # the initial model's evaluation: sessions may not be open yet
    path.write_text("global_iteration,test_accuracy\n0,0.1\n10,0.5\n20,0.6\n")
    assert _trained_rows(path) == 2


def test_deploy_arguments() -> None:
    opts = parse_deploy_args({"nodes": "2", "strategy": "gas"})
    assert opts.cfg.num_clients == 2 and opts.cfg.clock == "wall" and opts.opts["tls"] and opts.opts["auth"]
    opts = parse_deploy_args({"nodes": "3", "intruders": "1"})
    assert (opts.cfg.num_clients, opts.cfg.min_clients) == (4, 3)
    for bad in ({"nodes": "0"}, {"auth": "true", "tls": "false"}, {"intruders": "1", "auth": "false", "tls": "false"},
                {"bogus": "1"}, {"output-dir": "x"}, {"nodes": "3", "num-clients": "2"}, {"kill-node": "5"},
                {"isolation": "thread"}, {"timeout": "0"}, {"tls": "maybe"}):
        with pytest.raises(ConfigError):
            parse_deploy_args(bad)


def test_min_clients_checks() -> None:
    with pytest.raises(ConfigError):
        RunConfig.from_mapping({"num-clients": 3, "min-clients": 4})
    with pytest.raises(ConfigError):
        RunConfig.from_mapping({"join-timeout": -1})


def _run_with_dead_node(clock: str, monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """GAS on an in-process grid where client 2's first train.forward gets a ClientApp error
    (excluded for good), then client 1's first train.backward the SuperLink's "Node Unavailable"
    error reply (its SuperNode died; the node itself stays connected, as a SuperNode restarted with
    the same key does). Returns the summary and the number of ``query.info`` messages each
    client's node got."""
    from flwr.app import Error, Message

    from fl_app.client_app import app
    from simulation.server_app import plan_run, run_server
    from simulation.engine import InProcessGrid, _task_identity
    from strategies.core.base import SFLStrategy

    monkeypatch.setattr(SFLStrategy, "readmit_every_s", 0.0)
    reason = "Error: Node Unavailable — The destination node failed to report a heartbeat within 2 × its interval."

    failures = {(2, "train.forward"): "ClientAppException: boom", (1, "train.backward"): reason}
    handshakes = {0: 0, 1: 0, 2: 0}

    class DeadOnce(InProcessGrid):
        def push_messages(self, messages):
            messages = list(messages)
            ids = list(super().push_messages(messages))
            for msg, mid in zip(messages, ids):
                pid = int(self.contexts[msg.metadata.dst_node_id].node_config["partition-id"])
                if msg.metadata.message_type == "query.info":
                    handshakes[pid] += 1
                if (pid, msg.metadata.message_type) in failures:
                    fail = failures.pop((pid, msg.metadata.message_type))
                    self._replies[mid] = Message(Error(code=5, reason=fail), reply_to=msg)
            return ids

    cfg = RunConfig.from_mapping({"strategy": "gas", "num-clients": 3, "concurrency": 3, "global-iterations": 3,
                                  "local-iterations": 1, "clock": clock, "eval-every": 3,
                                  "output-dir": str(tmp_path)})
    grid = DeadOnce(app, 3, cfg.seed)
    with _task_identity(grid.run.run_id):
        return run_server(grid, plan_run(cfg), progress=False), handshakes


@pytest.mark.slow  # a whole GAS run (AlexNet) on the wall clock that waits for a dead node to be re-admitted
def test_dead_supernode_is_readmitted_after_a_fresh_handshake(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    summary, handshakes = _run_with_dead_node("wall", monkeypatch, tmp_path)
    assert summary["status"] == "completed" and summary["failed_clients"] == [2]
    assert summary["failure_reasons"]["1"].startswith("train.backward: Error: Node Unavailable")
    assert summary["failure_reasons"]["1"].endswith("re-admitted after a fresh handshake")
    # only the dead node was asked again: not the live client's, not that of a client excluded for good
    assert handshakes == {0: 1, 1: 2, 2: 1}


@pytest.mark.slow  # a whole GAS run (AlexNet) with a dead node
def test_no_readmission_on_the_virtual_clock(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    summary, handshakes = _run_with_dead_node("virtual", monkeypatch, tmp_path)
    assert summary["status"] == "completed" and summary["failed_clients"] == [1, 2]
    assert "re-admitted" not in summary["failure_reasons"]["1"]
    assert handshakes == {0: 1, 1: 1, 2: 1}


def test_fast_refuses_a_flower_it_cannot_patch(tmp_path: Path) -> None:
    """``fast=true`` checks Flower's SuperNode module first: today's passes; one that no longer sleeps through
    a module-level ``time`` (another release) is refused in one line instead of silently running slow."""
    import importlib.util
    import subprocess
    import sys

    import flwr.supernode.start_client_internal as sci

    from simulation.deploy.supernode import UnpatchableFlower, check_patchable

    check_patchable(sci)
    for i, source in enumerate(("import time\ndef loop():\n    pass\n",                  # no time.sleep(
                                "from time import sleep\ndef loop():\n    sleep(3)\n")):  # no module-level time
        path = tmp_path / f"changed_{i}.py"
        path.write_text(source)
        spec = importlib.util.spec_from_file_location(path.stem, path)
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        with pytest.raises(UnpatchableFlower, match="no longer sleeps"):
            check_patchable(module)
    # the launcher turns the refusal into one line on stderr and exit code 2
    code = ("import simulation.deploy.supernode as s, runpy, sys\n"
            "def refuse(_, fast): raise s.UnpatchableFlower(f'fast={fast}: no longer sleeps')\n"
            "s.supernode_main = refuse\nsys.argv = ['x', 'supernode-fast']\n"
            "runpy.run_module('simulation.deploy', run_name='__main__')\n")
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert proc.returncode == 2 and proc.stderr.strip() == "sflower: fast=True: no longer sleeps", proc.stderr


def test_the_process_watch_walks_proc_once_per_poll(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """``Processes.refresh`` reads the process table once for all the processes it watches (a walk per process
    took a quarter of a core with 20 SuperNodes) and still finds each one's descendants."""
    import sys

    from simulation.deploy import processes as P

    procs = P.Processes()
    code = ("import subprocess, sys, time\n"
            "subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(30)'])\ntime.sleep(30)\n")
    started = [procs.start(f"p{i}", [sys.executable, "-c", code], tmp_path / f"p{i}.log", dict(os.environ))
               for i in range(3)]
    walks = []
    real = P._children_map
    monkeypatch.setattr(P, "_children_map", lambda: walks.append(1) or real())
    refreshes = 0
    try:
        while refreshes < 100 and not all(p.known for p in started):
            procs.refresh()
            refreshes += 1
            time.sleep(0.05)
        assert all(len(p.known) == 1 for p in started)  # each one's child, found
        assert len(walks) == refreshes  # one walk per refresh, not one per process
    finally:
        procs.stop_all(grace=1.0)
    assert not any(p.alive() for p in started)


def test_a_clientapp_may_start_later_than_flowers_30_s_but_a_running_one_keeps_its_heartbeat_window(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The launcher's start window (``widen_start_window``) on Flower's own SuperNode state: a claimed task's
    token outlives Flower's 30 s by the extra seconds only (Flower alone: expired at 31 s, the livelock of
    20 SuperNodes on 2 cores); once activated, a task that stops its heartbeats expires as in Flower."""
    from datetime import timedelta

    from flwr.supercore.corestate import in_memory_corestate as core
    from flwr.supercore.object_store import ObjectStoreFactory
    from flwr.supernode.nodestate.in_memory_nodestate import InMemoryNodeState

    from simulation.deploy.supernode import widen_start_window

    class Widened(InMemoryNodeState):
        """Flower's state, with only this class's claim wrapped (Flower's own class is untouched)."""

    assert widen_start_window(Widened, 100.0) and widen_start_window(Widened, 100.0)  # wrapped once
    start = core.now()
    clock = {"t": start}
    monkeypatch.setattr(core, "now", lambda: clock["t"])

    def claimed(cls: type) -> tuple[object, int, str]:
        state = cls(ObjectStoreFactory().store())
        task_id = state.create_task("clientapp", run_id=1)
        token = state.claim_task(task_id)
        assert token is not None
        return state, task_id, token

    flower, _, flower_token = claimed(InMemoryNodeState)
    ours, task_id, token = claimed(Widened)
    clock["t"] = start + timedelta(seconds=31)
    assert flower.get_task_by_token(flower_token) is None  # Flower's window: gone
    assert ours.get_task_by_token(token) is not None
    clock["t"] = start + timedelta(seconds=129)
    assert ours.activate_task(task_id) and ours.get_task_by_token(token) is not None
    clock["t"] += timedelta(seconds=(core.HEARTBEAT_PATIENCE * core.HEARTBEAT_DEFAULT_INTERVAL) + 1)
    assert ours.get_task_by_token(token) is None  # running, no heartbeat: Flower's window, not ours
    assert widen_start_window(object, 1.0) is False  # no claim_task: left alone


@pytest.mark.e2e
@needs_flower
def test_chaos_serverapp_and_a_supernode_killed_then_resumed_equals_in_process(tmp_path: Path) -> None:
    """The chaos test, short (issue 37): a deployed GAS run on the virtual clock over TLS sessions with node
    authentication; one SuperNode SIGKILLed at a random point (restarted until the SuperLink lets it in:
    ``node-loss=rollback`` sends the run back to its last checkpoint) and the ServerApp SIGKILLed once and
    resumed with ``resume=RUN_DIR/out`` against the same SuperLink and SuperNodes. The final metrics.csv
    equals the uninterrupted in-process run's in every column but wall_time_s. The longer one, for four
    strategies: ``bash docs/results/chaos/run.sh``."""
    from simulation.engine import run_inprocess
    from simulation.server_app import plan_run
    from tests.test_checkpoint import BASE, _same_metrics

    keys = {**{k: str(v) for k, v in BASE.items()}, "strategy": "gas", "global-iterations": "30",
            "clock": "virtual"}
    summary, run_dir = _deploy(tmp_path, nodes="3", transport="session", **keys, **{
        "checkpoint-every": "1", "node-loss": "rollback", "chaos": "1", "chaos-seed": "3", "restart-after": "2",
        "kill-server-after": "6", "timeout": "900"})
    events = summary["deploy"]
    assert events["server_kills"] == 1 and events["node_kills"] == 1, events
    assert summary["status"] == "completed" and summary["failed_clients"] == []
    reference = tmp_path / "inprocess"
    run_inprocess(plan_run(RunConfig.from_mapping({**keys, "output-dir": str(reference)})), progress=False)
    _same_metrics(run_dir / "out" / "metrics.csv", reference / "metrics.csv")
    assert not _no_process_left(run_dir)


def test_chaos_options_need_checkpoints() -> None:
    for pairs in ({"chaos": "1"}, {"kill-server-after": "3"}):
        with pytest.raises(ConfigError, match="need checkpoint-every"):
            parse_deploy_args(pairs)
    with pytest.raises(ConfigError, match=">= 0"):
        parse_deploy_args({"chaos": "-1", "checkpoint-every": "1"})
    assert parse_deploy_args({"chaos": "2", "checkpoint-every": "1"}).opts["chaos"] == 2
    with pytest.raises(ConfigError, match="^isolation must be one of subprocess, process; got 'thread'$"):
        parse_deploy_args({"isolation": "thread"})  # declared as an Option: the run-config keys' messages


def test_a_refused_supernode_is_started_again_until_it_is_let_in(tmp_path: Path, monkeypatch) -> None:
    """Chaos kills a node, starts it again after ``restart-after``; while the SuperLink refuses its key (its killed
    predecessor still counts as online) it is stopped and started again, until it logs its SuperNode ID. Fake
    SuperNodes: processes that print what Flower's would."""
    import sys
    import time

    from simulation.deploy import faults as F
    from simulation.deploy.cluster import NodeSpec
    from simulation.deploy.options import DEPLOY_DEFAULTS
    from simulation.deploy.processes import Processes

    monkeypatch.setattr(F, "REJOIN_RETRY_S", 0.2)
    said = iter([F.JOINED + " 1\n", F.REFUSED + "\n", F.REFUSED + "\n", F.JOINED + " 7\n"])

    class FakeDeployment:
        processes, starts = Processes(), 0

        def start_node(self, spec: NodeSpec, num_partitions: int):
            self.starts += 1
            code = f"import sys, time; sys.stdout.write({next(said)!r}); sys.stdout.flush(); time.sleep(60)"
            spec.proc = self.processes.start("node-0", [sys.executable, "-c", code], tmp_path / "node-0.log", {})
            return spec.proc

    dep, spec = FakeDeployment(), NodeSpec(0, tmp_path, None, 0)
    dep.start_node(spec, 1)
    (tmp_path / "checkpoint.sfl").write_text("")
    faults = F.Faults({**DEPLOY_DEFAULTS, "chaos": 1, "restart-after": 0.5}, dep, [spec], 1, lambda: None,
                      tmp_path / "checkpoint.sfl", lambda line: None)
    try:
        start = time.monotonic()
        while (dep.starts < 4 or faults.rejoining or faults.down) and time.monotonic() - start < 30:
            faults.step(None, start)  # type: ignore[arg-type]
            time.sleep(0.05)
    finally:
        dep.processes.stop_all(grace=1)
    assert dep.starts == 4 and not faults.rejoining and not faults.down
    assert [e["event"] for e in faults.record()["events"]] == ["killed SuperNode (SIGKILL)", "restarted SuperNode"]


@pytest.mark.e2e
@needs_flower
def test_ushaped_deployed_equals_in_process_and_no_reply_carries_labels(tmp_path: Path) -> None:
    """Issue 35: a label-private (U-shaped) run deployed on 3 SuperNodes (their own data directories) over TLS
    sessions on the virtual clock gives the in-process run's metrics, and every node's own label audit
    (``privacy-record``: :mod:`fl_app.client.audit`, written on the node) checked each reply it sent and found
    neither a labels record nor an array equal to the labels of a batch it holds; the server recorded every
    tail gradient the nodes sent."""
    import numpy as np

    from simulation.engine import run_inprocess
    from simulation.server_app import plan_run
    from tests.test_checkpoint import _same_metrics, for_strategy

    keys = {**{k: str(v) for k, v in for_strategy("splitfed-v1").items()}, "cut-layers": "2,9",
            "global-iterations": "3", "clock": "virtual", "privacy-record": "true"}
    summary, run_dir = _deploy(tmp_path, nodes="3", transport="session", **keys)
    assert summary["status"] == "completed" and summary["failed_clients"] == []
    out = run_dir / "out"
    from fl_app.client.audit import audit_path, read_audit

    audits = [read_audit(audit_path(out, k)) for k in range(3)]
    assert sum(a["replies"] for a in audits) >= 3 * 2 * 2  # 3 rounds of 2 clients, 2 iterations: >= 4 legs up
    assert all(a["label_records"] == [] and a["label_arrays"] == [] for a in audits), audits
    received = np.load(out / "privacy" / "received.npz")
    assert not [n for n in received.files if n.startswith("y-")] and [n for n in received.files if n.startswith("g-")]
    reference = tmp_path / "inprocess"
    run_inprocess(plan_run(RunConfig.from_mapping({**keys, "output-dir": str(reference)})), progress=False)
    _same_metrics(out / "metrics.csv", reference / "metrics.csv")
    assert not _no_process_left(run_dir)
