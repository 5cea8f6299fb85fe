"""Engines that run the same ServerApp and ClientApp code.

* :func:`run_inprocess`: an :class:`InProcessGrid` that calls the ClientApp
  directly, one ``Context`` per virtual node. No Ray, no SuperLink: for fast
  experiments on one machine.
* :func:`simulation.ray_engine.run_ray`: Flower's simulation engine
  (Ray-backed virtual SuperNodes), in its own module; it runs the
  ServerApp of :func:`make_server_app`.

``flwr run .`` is the third way in; it reads the configuration from
``pyproject.toml`` and ``--run-config``.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import numpy as np
from flwr.app import Context, Error, Message, RecordDict
from flwr.clientapp import ClientApp
from flwr.serverapp import Grid, ServerApp
from flwr.supercore.run import Run
from flwr.supercore.task_identity import TaskIdentity

from simulation.messages import reply_message
from simulation.server_app import RunPlan, run_server

ENGINES = ("inprocess", "ray")
#: Node id of the ServerApp side of an in-process run (Flower's SuperLink uses 0 too).
SERVER_NODE_ID = 0


class InProcessGrid(Grid):
    """A Grid whose nodes are ClientApp calls in this process.

    Node ids are random 63-bit integers (seeded), not partition ids, so the
    handshake is exercised exactly as with real SuperNodes. A message is
    executed when it is pushed; its reply (or an error reply carrying the
    exception) waits until pulled.

    Args:
        client_app: the ClientApp to call.
        num_nodes: virtual nodes; node ``i`` holds partition ``i``.
        seed: seeds the node ids.
        node_configs: the ``node_config`` of each node, in place of
            ``{"partition-id": i, "num-partitions": num_nodes}`` (e.g.
            ``{"data-dir": DIR}`` for a node with its own data, as
            ``flower-supernode --node-config`` gives it); one per node.

    Raises:
        ValueError: ``node_configs`` does not have ``num_nodes`` entries.
    """

    def __init__(self, client_app: ClientApp, num_nodes: int, seed: int = 0,
                 node_configs: Sequence[Mapping[str, Any]] | None = None) -> None:
        self.client_app = client_app
        if node_configs is not None and len(node_configs) != num_nodes:
            raise ValueError(f"{len(node_configs)} node configs for {num_nodes} nodes")
        rng = np.random.default_rng([seed, 99])
        ids = rng.choice(2**62, size=num_nodes, replace=False) + 1
        self.contexts: dict[int, Context] = {}
        for pid, nid in enumerate(ids):
            node_config = ({"partition-id": pid, "num-partitions": num_nodes} if node_configs is None
                           else dict(node_configs[pid]))
            self.contexts[int(nid)] = Context(
                run_id=1, node_id=int(nid), node_config=node_config, state=RecordDict(), run_config={},
            )
        self._replies: dict[str, Message] = {}
        #: message ids: a random prefix per grid (a restored checkpoint's replies keep their ids) and a counter
        self._id_prefix, self._ids = f"{uuid.uuid4().hex}-", itertools.count()
        self._run = Run.create_empty(1)
        self.client_seconds = 0.0

    @property
    def run(self) -> Run:
        """The (single) run."""
        return self._run

    def set_run(self, run: Run) -> None:
        """Replace the run object."""
        self._run = run

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int,
                       group_id: str, ttl: float | None = None) -> Message:
        """Build a message (Flower's deprecated helper, kept for the interface)."""
        return Message(content, dst_node_id, message_type, ttl=ttl, group_id=group_id)

    def get_node_ids(self) -> Iterable[int]:
        """All virtual node ids."""
        return list(self.contexts)

    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Execute each message on its node now; keep the reply for :meth:`pull_messages`."""
        ids = []
        for msg in messages:
            msg_id = f"{self._id_prefix}{next(self._ids)}"  # unique in this grid, and across grids
            msg.metadata.__dict__["_message_id"] = msg_id
            msg.metadata.__dict__["_run_id"] = self._run.run_id
            ctx = self.contexts[msg.metadata.dst_node_id]
            t0 = time.perf_counter()
            try:
                reply = self.client_app(msg, ctx)
            except Exception as exc:  # noqa: BLE001 - becomes the node's error reply
                reply = reply_message(msg, msg_id, Error(code=1, reason=f"{type(exc).__name__}: {exc}"))
            self.client_seconds += time.perf_counter() - t0
            reply.metadata.__dict__["_reply_to_message_id"] = msg_id
            self._replies[msg_id] = reply
            ids.append(msg_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """Replies available for ``message_ids`` (each returned once)."""
        return [self._replies.pop(m) for m in list(message_ids) if m in self._replies]

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Push and pull at once (everything is synchronous here)."""
        return self.pull_messages(self.push_messages(messages))


def run_inprocess(plan: RunPlan, *, progress: bool = True, client_app: ClientApp | None = None,
                  node_configs: Sequence[Mapping[str, Any]] | None = None) -> dict[str, Any]:
    """Run a planned job on the in-process engine; returns the summary.

    ``node_configs`` (one per client) replace the simulation's node configs,
    see :class:`InProcessGrid`.
    """
    from fl_app.client_app import app as default_client_app

    grid = InProcessGrid(client_app or default_client_app, plan.cfg.num_clients, plan.cfg.seed, node_configs)
    with _task_identity(grid.run.run_id):
        summary = run_server(grid, plan, progress=progress)
    summary["client_compute_s"] = grid.client_seconds
    return summary


@contextlib.contextmanager
def _task_identity(run_id: int) -> Iterator[None]:
    """Give this process the identity of a ServerApp task (Flower's Message needs one)."""
    saved = (TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id)
    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = run_id, SERVER_NODE_ID, 1
    try:
        yield
    finally:
        TaskIdentity._run_id, TaskIdentity._node_id, TaskIdentity._task_id = saved


def make_server_app(plan: RunPlan, *, progress: bool = True, wake: threading.Event | None = None,
                    finish: Callable[[], None] | None = None) -> ServerApp:
    """A ServerApp that runs ``plan`` (for ``run_simulation``, which has no run config).

    Args:
        wake: set after every push of messages (see :func:`_prompt_delivery`).
        finish: called after the run, also when it fails, while the engine
            is still up (:func:`run_ray` collects its placement log there).
    """
    server_app = ServerApp()

    @server_app.main()
    def _main(grid: Grid, context: Context) -> None:
        if wake is not None:
            push = grid.push_messages

            def push_and_wake(messages: Iterable[Message]) -> Iterable[str]:
                ids = list(push(messages))
                wake.set()
                return ids

            grid.push_messages = push_and_wake  # type: ignore[method-assign]
        try:
            run_server(grid, plan, progress=progress)
        finally:
            if finish is not None:
                finish()

    return server_app
