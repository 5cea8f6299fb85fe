"""The Ray engine: Flower's simulation engine (Ray-backed virtual SuperNodes).

:func:`run_ray` runs a planned job through ``flwr.simulation.run_simulation``.
Under it ``context.run_config`` is empty, so the configuration travels in the
ServerApp closure (:func:`simulation.engine.make_server_app`) and, to clients,
in the handshake. It starts a local Ray instance or joins a running cluster
(``ray-address``), hands the driver's dataset to the actors once, picks up
pushed messages at once (not on Flower's 0.1 s poll) and records where each
message ran (``placement.json``). :mod:`simulation.engine_options` parses
the engine's own ``sflower run`` keys (``ray-address``, ``ray-cpus``,
``ray-gpus``).
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from flwr.app import Context, Message
from flwr.clientapp import ClientApp

from fl_app.client.warm_up import start_warm_up
from fl_app.run.errors import ConfigError
from simulation.server_app import RunPlan
from simulation.engine import make_server_app
from simulation.engine_options import RAY_ADDRESS_KEY, RAY_CPUS_KEY, check_ray_address

#: Longest wait (s) of Flower's message pick-up loop when no push wakes it (Flower's own poll is 0.1 s).
PICKUP_TIMEOUT_S = 0.1
#: Name of the file a Ray run writes beside summary.json: which Ray node and process ran each message.
PLACEMENT_FILE = "placement.json"


class RayClientApp(ClientApp):
    """The ClientApp as the Ray engine's actors run it: the same handlers, plus two things per process.

    * **The task, once.** The first message in an actor process registers
      the driver's task (dataset, partitions), fetched from Ray's object
      store, with :func:`fl_app.learning.task.preload_task`: no actor reads and
      partitions the dataset again.
    * **Placement.** Each message's Ray node, process and wall-clock span
      go to a :func:`_placement_log` actor, for ``placement.json``.

    Nothing else changes: the handlers, their inputs and their state are
    the wrapped app's, so results equal the in-process engine's.

    Args:
        app: the ClientApp to run.
        task_ref: a Ray ObjectRef of ``(RunConfig, Task)``, or None.
        log: the placement log actor handle, or None.
        yield_cpu: with the task, put the actor process at Linux's idle priority (:func:`_yield_cpu`;
            ``ray-idle=true``).
    """

    def __init__(self, app: ClientApp, task_ref: Any = None, log: Any = None, yield_cpu: bool = False) -> None:
        super().__init__()
        self.app = app
        self.yield_cpu = yield_cpu
        self.task_ref = task_ref
        self._task_id = task_ref.hex() if task_ref is not None else None
        self.log = log

    def __call__(self, message: Message, context: Context) -> Message:
        """Run ``message`` through the wrapped app (after the per-process set-up)."""
        import ray

        if self.task_ref is not None and _PROCESS.get("task") != self._task_id:
            cfg, task = ray.get(self.task_ref)
            from fl_app.learning.task import preload_task

            preload_task(cfg, task)
            _PROCESS["task"] = self._task_id
            if self.yield_cpu:
                _yield_cpu()
            start_warm_up()
        start = time.time()
        try:
            return self.app(message, context)
        finally:
            if self.log is not None:
                if "node" not in _PROCESS:
                    _PROCESS["node"] = ray.get_runtime_context().get_node_id()
                ray.get(self.log.add.remote((
                    int(context.node_config.get("partition-id", -1)), message.metadata.message_type,
                    _PROCESS["node"], os.getpid(), start, time.time())))


#: Per-process facts of a Ray actor process (the preloaded task's object id, the Ray node id).
_PROCESS: dict[str, str] = {}


def _yield_cpu() -> None:
    """Put every thread of this actor process in Linux's ``SCHED_IDLE`` class (elsewhere: nothing); ``ray-idle``.

    On one machine the ServerApp shares the cores with the client actors, and in split learning its
    server-side model is most of the work (GAS's main job: 82 %). Its intra-op threads then wait at every
    parallel region for a thread that an actor pre-empted: with Ray's own worker niceness (15) the main job's
    server side still took 20 % longer beside one actor on 2 cores (docs/performance.md). An idle-class
    thread runs only on a core that nothing else wants and gives it up at once when a server thread wakes.
    The cost: any other busy process on the machine starves the actors, hence opt-in. No number changes:
    the actors run the same handlers, only later. New threads inherit the class from the thread that starts
    them.
    """
    if not hasattr(os, "SCHED_IDLE"):
        return
    try:
        threads = [int(t) for t in os.listdir("/proc/self/task")]
    except OSError:
        threads = [0]
    for tid in threads:
        with contextlib.suppress(OSError):
            os.sched_setscheduler(tid, os.SCHED_IDLE, os.sched_param(0))


def _placement_log() -> Any:
    """A new placement log actor (zero CPUs, so that the client actors keep every CPU)."""
    import ray

    @ray.remote(num_cpus=0)
    class PlacementLog:
        def __init__(self) -> None:
            self.rows: list[tuple] = []

        def add(self, row: tuple) -> None:
            self.rows.append(row)

        def get(self) -> list[tuple]:
            return self.rows

    return PlacementLog.remote()


@contextlib.contextmanager
def _prompt_delivery(wake: threading.Event) -> Iterator[None]:
    """Let Flower's simulation pick up pushed messages at once instead of on its 0.1 s poll.

    flwr 1.41 and 1.42's ``vce_api.add_messages_to_queue`` scans the nodes for new
    messages every 0.1 s (a fixed ``f_stop.wait(0.1)``), which delays every
    request by up to 0.1 s. For the duration of the run it is replaced by
    the same scan that waits on ``wake`` (set by each push, see
    :func:`make_server_app`), with :data:`PICKUP_TIMEOUT_S` as the longest
    wait. Which messages go to which node is unchanged.
    """
    from flwr.server.superlink.fleet.vce import vce_api

    original = vce_api.add_messages_to_queue

    def add_messages_to_queue(state: Any, queue: Any, nodes_mapping: Mapping[int, int],
                              f_stop: threading.Event) -> None:
        order = {node_id: i for i, node_id in enumerate(nodes_mapping)}
        while not f_stop.is_set():
            wake.clear()
            for msg in _pick_up(state, order):
                queue.put(msg)
            wake.wait(PICKUP_TIMEOUT_S)

    vce_api.add_messages_to_queue = add_messages_to_queue
    try:
        yield
    finally:
        vce_api.add_messages_to_queue = original


def _pick_up(state: Any, order: Mapping[int, int]) -> list[Message]:
    """One scan of Flower's pick-up loop: each node's first undelivered message, marked delivered, in the order
    of ``order`` (node id -> its place in Flower's node mapping).

    Flower's scan (``vce_api.add_messages_to_queue``) calls ``state.get_message_ins(node_id, limit=1)``
    for every registered node, and each call walks the whole message store under the state's lock,
    checking every stored message (expiry, federation): N nodes × M stored messages per scan, and a scan
    runs at every push. At 10,000 nodes the handshake alone (M = N) had not ended after 9 minutes here. One
    walk over the in-memory store does what those N calls do instead: for each node a message is addressed to,
    its first undelivered message in store order, checked by the state's own ``_check_stored_messages``
    and marked delivered, as ``get_message_ins`` does. The queue receives the same messages in the same
    order. A link state that is not Flower's in-memory one (another Flower version) is scanned Flower's way.
    """
    store = getattr(state, "message_ins_store", None)
    check = getattr(state, "_check_stored_messages", None)
    lock = getattr(state, "lock", None)
    if not isinstance(store, dict) or check is None or lock is None:
        return [m for node_id in order for m in state.get_message_ins(node_id=node_id, limit=1)]
    from flwr.supercore.date import now

    picked: dict[int, Message] = {}
    with lock:
        for msg_id in list(store):
            msg = store.get(msg_id)
            if msg is None or msg.metadata.delivered_at != "":
                continue
            dst = msg.metadata.dst_node_id
            if dst not in order or dst in picked:
                continue
            check({msg_id})  # expired, or its nodes left the federation: deleted, as Flower's scan would
            if (msg := store.get(msg_id)) is not None:
                picked[dst] = msg
        stamp = now().isoformat()
        for msg in picked.values():
            msg.metadata.delivered_at = stamp
    return [picked[n] for n in sorted(picked, key=order.__getitem__)]


def _init_ray(address: str | None, num_cpus: int) -> float:
    """Start a local Ray instance with ``num_cpus`` CPUs, or join the cluster at ``address``; seconds taken.

    Flower's Ray backend then finds Ray initialised and uses it as it is
    (it would otherwise start its own with ``init_args``). Workers get this
    process's ``sys.path``: inherited locally, through the job's
    ``runtime_env`` on a cluster (whose nodes need the same install).

    Raises:
        ConfigError: the cluster cannot be joined (one line).
    """
    import ray

    pythonpath = os.pathsep.join(sys.path)
    if os.environ.get("PYTHONPATH"):
        pythonpath = f"{pythonpath}{os.pathsep}{os.environ['PYTHONPATH']}"
    os.environ["PYTHONPATH"] = pythonpath
    kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": False,
                              "logging_level": logging.WARNING}
    if address is None:
        # "local": a new instance of our size, even where `ray start` runs on this machine or RAY_ADDRESS is set
        kwargs.update(address="local", num_cpus=num_cpus)
    else:
        _probe_head(address)
        kwargs.update(address=address, runtime_env={"env_vars": {"PYTHONPATH": pythonpath}})
    t0 = time.perf_counter()
    try:
        ray.init(**kwargs)
    except (ConnectionError, RuntimeError, ValueError) as err:
        if address is None:
            raise
        reason = (str(err).strip().splitlines() or [type(err).__name__])[0]
        raise ConfigError(f"cannot join the Ray cluster at {RAY_ADDRESS_KEY}={address}: {reason}") from None
    return time.perf_counter() - t0


def _probe_head(address: str, timeout: float = 5.0) -> None:
    """Check that a Ray head answers at ``address`` (``ray.init`` retries a dead address for minutes).

    ``auto`` is resolved as Ray resolves it (``RAY_ADDRESS``, then the
    cluster ``ray start`` last started on this machine).

    Raises:
        ConfigError: no cluster to join, or nothing listens at the address.
    """
    import socket

    target = address
    if address == "auto":
        try:
            from ray._private.services import canonicalize_bootstrap_address

            target = canonicalize_bootstrap_address("auto") or ""
        except Exception as err:  # noqa: BLE001 - Ray says no cluster runs here, or its API moved
            raise ConfigError(f"{RAY_ADDRESS_KEY}=auto: no running Ray cluster found on this machine "
                              f"({(str(err).strip().splitlines() or [type(err).__name__])[0]}); start one with "
                              f"'ray start --head' or give HOST:PORT") from None
        if not target:
            raise ConfigError(f"{RAY_ADDRESS_KEY}=auto: no running Ray cluster found on this machine; start one "
                              f"with 'ray start --head' or give HOST:PORT")
    host, _, port = target.rpartition(":")
    try:
        with socket.create_connection((host.strip("[]"), int(port)), timeout=timeout):
            pass
    except (OSError, ValueError) as err:
        raise ConfigError(f"cannot join the Ray cluster at {RAY_ADDRESS_KEY}={address}: nothing answers at "
                          f"{target} ({err.__class__.__name__}: {err}); is 'ray start --head' running there?") from None


def _ray_nodes() -> list[dict[str, Any]]:
    """The live Ray nodes: id, address, CPUs, and whether it is the head."""
    import ray

    nodes = []
    for n in ray.nodes():
        if not n.get("Alive") or not n.get("Resources"):
            continue
        nodes.append({"node_id": n["NodeID"], "address": n.get("NodeManagerAddress"),
                      "port": n.get("NodeManagerPort"), "cpus": n["Resources"].get("CPU", 0.0),
                      "head": "node:__internal_head__" in n["Resources"]})
    return nodes


def placement_table(rows: Sequence[Sequence[Any]], nodes: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Summarise the placement log of a Ray run.

    Args:
        rows: ``(partition id, message type, Ray node id, pid, start, end)``
            per message; start and end are wall-clock seconds (``time.time()``).
        nodes: :func:`_ray_nodes`.

    Returns:
        ``nodes`` (each with its message count and its actor processes),
        ``clients`` (partition id -> messages per Ray node name, ``node-K``
        in ``nodes`` order), ``messages``,
        and the parallelism of the client work: ``busy_s`` (wall seconds
        with at least one message running), ``handler_s`` (their summed
        durations), ``mean_parallel`` (= handler_s / busy_s) and
        ``max_parallel`` (most messages running at once).
    """
    names = {n["node_id"]: f"node-{i}" for i, n in enumerate(nodes)}
    by_node: dict[str, dict[str, Any]] = {}
    clients: dict[str, dict[str, int]] = {}
    for pid, _kind, node, proc, _t0, _t1 in rows:
        entry = by_node.setdefault(node, {"messages": 0, "processes": set()})
        entry["messages"] += 1
        entry["processes"].add(int(proc))
        per = clients.setdefault(str(pid), {})
        name = names.get(node, node)
        per[name] = per.get(name, 0) + 1
    table = []
    for n in nodes:
        used = by_node.get(n["node_id"], {"messages": 0, "processes": set()})
        table.append({"name": names[n["node_id"]], **n, "messages": used["messages"],
                      "processes": sorted(used["processes"])})
    events = sorted([(float(r[4]), 1) for r in rows] + [(float(r[5]), -1) for r in rows])
    running = peak = 0
    busy = 0.0
    last = None
    for t, step in events:
        if running > 0 and last is not None:
            busy += t - last
        running += step
        peak = max(peak, running)
        last = t
    handler = float(sum(float(r[5]) - float(r[4]) for r in rows))
    return {"nodes": table, "clients": {k: clients[k] for k in sorted(clients, key=int)}, "messages": len(rows),
            "busy_s": busy, "handler_s": handler, "mean_parallel": handler / busy if busy > 0 else 0.0,
            "max_parallel": peak}


class _QuietDeprecation(logging.Filter):
    """Drops Flower's notice that ``run_simulation`` is deprecated (it is the engine's documented entry point
    in 1.41 and 1.42, docs/explanation/design.md §4; the notice is printed twice per run and says nothing a
    user can act on)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "`run_simulation` function is deprecated" not in record.getMessage()


def run_ray(plan: RunPlan, *, progress: bool = True, num_cpus: int | None = None,
            address: str | None = None, num_gpus: float = 0.0, idle_actors: bool = False) -> dict[str, Any]:
    """Run a planned job on Flower's Ray simulation engine; returns the summary.

    One client actor per CPU runs the nodes' messages (Flower's actor pool);
    up to that many messages run at once. Besides the run's own outputs it
    writes ``placement.json`` (see :func:`placement_table`) and adds a
    ``ray`` entry to summary.json: where the clients ran, the parallelism
    reached, and the seconds Ray took to start or join.

    Args:
        plan: the planned run.
        progress: show the progress bar.
        num_cpus: CPUs of the local Ray instance (default: all of this
            machine's); not with ``address``.
        address: join the running Ray cluster at ``auto`` or ``HOST:PORT``
            instead of starting one; its nodes' CPUs size the actor pool.
        num_gpus: GPU fraction of each client actor (Flower's
            ``client_resources.num_gpus``); 0 keeps the actors on the CPU.
        idle_actors: run the client actors at Linux's idle priority (:func:`_yield_cpu`; ``ray-idle``).

    Raises:
        ConfigError: a bad or unreachable ``address``, or both arguments.
        RuntimeError: the run wrote no summary (it failed inside Flower).
    """
    import dataclasses
    import json

    if address is not None:
        address = check_ray_address(address)
        if num_cpus is not None:
            raise ConfigError(f"give {RAY_ADDRESS_KEY} or {RAY_CPUS_KEY}, not both")
    os.environ.setdefault("FLWR_TELEMETRY_ENABLED", "0")
    os.environ.setdefault("RAY_DEDUP_LOGS", "0")
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray
    from flwr.simulation import run_simulation

    from fl_app.client_app import app as client_app

    cpus = num_cpus or os.cpu_count() or 2
    summary_path = plan.out_dir / "summary.json"
    if summary_path.exists():
        summary_path.unlink()
    flwr_log = logging.getLogger("flwr")
    flwr_log.setLevel(logging.WARNING)
    if not any(isinstance(f, _QuietDeprecation) for f in flwr_log.filters):
        flwr_log.addFilter(_QuietDeprecation())
    start_s = _init_ray(address, cpus) if not ray.is_initialized() else 0.0
    # Flower shuts Ray down when the simulation ends: what we need from Ray is read before that.
    nodes = _ray_nodes()
    log = _placement_log()
    task_ref = ray.put((plan.cfg, dataclasses.replace(plan.task)))  # data and partitions; no built models
    rows: list[tuple] = []

    def collect() -> None:
        try:
            rows.extend(ray.get(log.get.remote(), timeout=60))
        except Exception as err:  # noqa: BLE001 - never mask the run's own outcome; placement is a report
            logging.getLogger(__name__).warning("no placement log from Ray: %s", err)

    wake = threading.Event()
    with _prompt_delivery(wake):
        run_simulation(
            server_app=make_server_app(plan, progress=progress, wake=wake, finish=collect),
            client_app=RayClientApp(client_app, task_ref, log, yield_cpu=idle_actors),
            num_supernodes=plan.cfg.num_clients,
            # Ray is already initialised (above), so Flower's backend takes it as it is: no init_args
            backend_config={"client_resources": {"num_cpus": 1, "num_gpus": float(num_gpus)}},
        )
    if not summary_path.exists():
        raise RuntimeError("the Ray simulation ended without writing summary.json; see the log above")
    placement = placement_table(rows, nodes)
    (plan.out_dir / PLACEMENT_FILE).write_text(json.dumps(placement, indent=2) + "\n")
    summary = json.loads(summary_path.read_text())
    summary["ray"] = {
        "address": address or "local", "start_s": start_s, "nodes": len(nodes),
        "cpus": sum(n["cpus"] for n in nodes), "nodes_used": sum(1 for n in placement["nodes"] if n["messages"]),
        "mean_parallel": placement["mean_parallel"], "max_parallel": placement["max_parallel"],
    }
    summary_path.write_text(json.dumps(summary, indent=2))
    return summary

