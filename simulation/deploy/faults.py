"""The faults ``sflower deploy`` injects into a running deployment, and the restarts that follow them.

* ``kill-node=K kill-after=S [restart-after=R]``: SIGKILL SuperNode ``K``
  ``S`` seconds after the first metric row of a trained model; start it
  again ``R`` seconds later (0: never).
* ``chaos=N chaos-seed=X``: ``N`` SIGKILLs of SuperNodes drawn at random
  (seeded by ``chaos-seed``), each a random 1 to 4 seconds after the
  previous node is back, each node started again ``restart-after`` seconds
  later (at least 1 s); only once the run has a checkpoint, so that a run
  with ``node-loss=rollback`` has one to go back to.

A killed SuperNode's key stays taken until the SuperLink sees its heartbeat
lapse (up to 2 × 30 s in Flower 1.41 and 1.42); until then a restarted SuperNode is
refused (it logs :data:`REFUSED`), so it is stopped and started again every
:data:`REJOIN_RETRY_S` seconds until it is let in (it logs :data:`JOINED`).
* ``kill-server-after=S``: SIGKILL the ServerApp (and its ``flwr run``)
  once, ``S`` seconds after the first trained row and once a checkpoint is
  on disk, and start ``flwr run`` again at once with ``resume=RUN_DIR/out``,
  against the same SuperLink and SuperNodes.

:class:`Faults` holds the schedule; the deploy loop calls :meth:`Faults.step`
while it waits for ``summary.json``.
"""

from __future__ import annotations

import random
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from simulation.deploy.cluster import Deployment, NodeSpec
from simulation.deploy.processes import Proc


#: Seconds between two starts of a killed SuperNode that the SuperLink did not let rejoin yet.
REJOIN_RETRY_S = 2.0
#: What a SuperNode logs once the SuperLink has activated it (Flower 1.41, 1.42): it is back.
JOINED = "SuperNode ID:"
#: What a SuperNode logs when the SuperLink refuses to activate it (Flower 1.41, 1.42: exit code 305, API error 2004);
#: the process does not always exit.
REFUSED = "Failed to activate SuperNode"


def _read_from(path: Path, offset: int) -> str:
    """The text of ``path`` from byte ``offset`` on ("" when unreadable)."""
    try:
        with open(path, "rb") as fh:
            fh.seek(offset)
            return fh.read().decode(errors="replace")
    except OSError:
        return ""


class Faults:
    """The faults of one deploy run (module docstring), injected by :meth:`step`.

    Args:
        opts: the deploy options (``kill-node``, ``kill-after``, ``restart-after``, ``chaos``, ``chaos-seed``,
            ``kill-server-after``).
        dep: the running deployment.
        specs: its authorised SuperNodes, by partition id.
        num_partitions: ``num-clients`` (the SuperNodes' ``num-partitions``).
        restart_server: ``() -> Proc``, starts ``flwr run`` again with ``resume`` (the new runner).
        checkpoint: the run's checkpoint file (faults that need one wait for it).
        say: progress lines.
    """

    def __init__(self, opts: Mapping[str, Any], dep: Deployment, specs: Sequence[NodeSpec], num_partitions: int,
                 restart_server: Callable[[], Proc], checkpoint: Path, say: Callable[[str], None]) -> None:
        self.opts, self.dep, self.specs, self.num_partitions = opts, dep, list(specs), num_partitions
        self.restart_server, self.checkpoint, self.say = restart_server, checkpoint, say
        self.rng = random.Random(int(opts["chaos-seed"]))
        self.t_run = time.monotonic()
        #: what happened, in order: ``(seconds into the run, event, partition id or None)``
        self.events: list[tuple[float, str, int | None]] = []
        self.down: dict[int, float] = {}  # partition id -> when to start it again
        #: partition id -> the size of its log when it was started again, until the SuperLink lets it in
        self.rejoining: dict[int, int] = {}
        self.refused: set[int] = set()  # partition ids refused by the SuperLink, waiting to be started again
        self.single_done = opts["kill-node"] < 0
        self.server_done = opts["kill-server-after"] <= 0
        self.chaos_left = int(opts["chaos"])
        self.next_chaos: float | None = None

    def _note(self, event: str, pid: int | None = None) -> None:
        at = time.monotonic() - self.t_run
        self.events.append((round(at, 3), event, pid))
        self.say(f"{event}" + (f" {pid}" if pid is not None else "") + f" {at:.1f} s into the run")

    def _kill_node(self, pid: int, now: float, restart_after: float) -> None:
        spec = self.specs[pid]
        assert spec.proc is not None
        self.dep.processes.kill(spec.proc)
        self._note("killed SuperNode (SIGKILL)", pid)
        if restart_after > 0:
            self.down[pid] = now + restart_after

    def step(self, runner: Proc, first_row_at: float | None) -> Proc:
        """Inject what is due now; returns the runner (a new one after a ServerApp kill)."""
        now = time.monotonic()
        for pid, at in list(self.down.items()):
            if now >= at:
                spec = self.specs[pid]
                log_at = spec.proc.log_path.stat().st_size if spec.proc is not None else 0
                self.dep.start_node(spec, self.num_partitions)
                del self.down[pid]
                if pid in self.refused:
                    self.refused.discard(pid)
                else:
                    self._note("restarted SuperNode", pid)
                self.rejoining[pid] = log_at
        for pid, log_at in list(self.rejoining.items()):
            proc = self.specs[pid].proc
            assert proc is not None
            text = _read_from(proc.log_path, log_at)
            if JOINED in text:
                del self.rejoining[pid]
            elif not proc.alive() or REFUSED in text:
                # the SuperLink refuses the node's key while its killed predecessor counts as online (until its
                # heartbeat lapses: up to 2 x 30 s in Flower 1.41, 1.42): stop what is left of it and start it again
                self.dep.processes.kill(proc)
                del self.rejoining[pid]
                self.refused.add(pid)
                self.down[pid] = time.monotonic() + REJOIN_RETRY_S
        if first_row_at is None:
            return runner
        o = self.opts
        if not self.single_done and now - first_row_at >= o["kill-after"]:
            self._kill_node(o["kill-node"], now, o["restart-after"])
            self.single_done = True
        ready = self.checkpoint.is_file()
        if self.chaos_left and ready and not self.down and not self.rejoining:  # one node down at a time
            if self.next_chaos is None:
                self.next_chaos = now + self.rng.uniform(1.0, 4.0)
            elif now >= self.next_chaos:
                self._kill_node(self.rng.randrange(len(self.specs)), now, max(1.0, o["restart-after"]))
                self.chaos_left -= 1
                self.next_chaos = None
        if not self.server_done and ready and now - first_row_at >= o["kill-server-after"]:
            found = self.dep.serverapp_pids()
            for pid in found:
                self.dep.processes.kill_pid(pid)
            self.dep.processes.kill(runner)
            self._note(f"killed the ServerApp (SIGKILL, {len(found)} process{'es' if len(found) != 1 else ''})")
            runner = self.restart_server()
            self._note("restarted the ServerApp with resume")
            self.server_done = True
        return runner

    def record(self) -> dict[str, Any]:
        """The faults for ``deploy.json``: the events, and how many of each."""
        return {"events": [{"at_s": at, "event": e, "node": pid} for at, e, pid in self.events],
                "node_kills": sum(1 for _, e, _ in self.events if e.startswith("killed SuperNode")),
                "server_kills": sum(1 for _, e, _ in self.events if e.startswith("killed the ServerApp"))}
