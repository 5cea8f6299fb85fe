"""The base class that owns the event loop of every sflower strategy.

DESIGN.md section 5. :class:`SFLStrategy` subclasses Flower's
``Strategy`` and overrides ``start(grid, ...)``. It owns:

* node discovery and the ``query.info`` handshake (node id -> partition id,
  example counts, label histograms);
* client selection (seeded);
* the :class:`~strategies.dispatcher.Dispatcher`: :class:`Request` objects
  with tags, a FIFO queue per node (one message in flight per node), due
  times from the :class:`~strategies.clock.Timing`, ``gather`` with
  ``first``/``deadline``, ``cancel``, and :meth:`SFLStrategy.expected_duration`;
* compute and transfer figures of any block range (:attr:`SFLStrategy.costs`);
* evaluation of the global model, metric rows, progress, stop conditions;
* error replies, timeouts and malformed replies (:meth:`SFLStrategy.validate_reply`,
  :mod:`strategies.validation`): the client's work is dropped, the client is
  excluded with a one-line reason in the log, and the run goes on;
* checkpoints (``checkpoint-every``) and resume (:meth:`SFLStrategy.write_checkpoint`,
  :meth:`SFLStrategy.restore_checkpoint`, :mod:`strategies.checkpoint`).

Two loop shapes are provided:

* :class:`SyncStrategy`: ``run_round(cohort)`` per global iteration; a
  round's virtual time is its slowest member's.
* :class:`AsyncStrategy`: ``on_reply(reply)`` for each reply
  in virtual completion-time order; the subclass calls
  :meth:`SFLStrategy.end_global_iteration` when a global iteration is done.
"""

from __future__ import annotations

import copy
import logging
import math
import time
from collections import defaultdict
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
import torch
from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result, Strategy

from fl_app import protocol as P
from fl_app.config import DEFAULTS, Option, RunConfig
from fl_app.costs import BlockCosts
from fl_app.device import model_device, resolve_device, to_device
from fl_app.models import BlockModel
from fl_app.task import Task
from fl_app.training import evaluate_model
from strategies import checkpoint as ckpt
from strategies.clock import Clock, Timing
from strategies.errors import DivergedError, RunFailedError, check_loss
from strategies.dispatcher import SCHEDULED, Dispatcher, Pending, Reply, Request
from strategies.requests import RequestBuilder
from strategies.validation import ReplyChecker, ReplyProblem

log = logging.getLogger("sflower")

STREAM_SELECTION = 3

#: Why checkpoints need the in-process engine (one line, for errors).
CHECKPOINT_UNSUPPORTED = ("checkpoint-every and resume need the in-process engine (engine=inprocess): under Ray "
                          "and in deployment the clients' state lives on the nodes, out of the server's reach")


@dataclass
class ClientInfo:
    """What the handshake tells about a client.

    Attributes:
        partition_id: the data partition it holds.
        node_id: its Flower node id.
        num_examples: training examples ``|D_k|``.
        label_histogram: int64 ``[num_classes]`` label counts.
    """

    partition_id: int
    node_id: int
    num_examples: int
    label_histogram: np.ndarray


class SFLStrategy(Strategy):
    """Base class of all strategies; subclasses supply hooks, not loops.

    Args:
        cfg: the run configuration.
        task: dataset, partitions and model.
        clock: virtual or wall clock.
        timing: device timing (seconds per piece of client work).
        recorder: receives one metric row per evaluation (``append(row)``)
            and the summary (``finish(summary)``); optional.
        progress: show a progress bar.
    """

    #: Registry name, e.g. ``"splitfed-v1"``.
    name: ClassVar[str] = ""
    #: Run-config keys this class adds to the common ones (see :meth:`all_options`).
    options: ClassVar[tuple[Option, ...]] = ()
    #: The settings the algorithm's authors ran it with, as ``sflower strategies`` prints them
    #: (e.g. a ``preset=``); empty: the global defaults.
    run_with: ClassVar[str] = ""
    #: Rate (bits/s) of the device-to-device links that requests with
    #: ``d2d_bits`` use (RingSFL's relay hops); infinite: such hops are free.
    d2d_bps: float = math.inf

    def __init__(self, cfg: RunConfig, task: Task, *, clock: Clock, timing: Timing,
                 recorder: Any = None, progress: bool = True) -> None:
        self.cfg = cfg
        self.task = task
        self.clock = clock
        self.timing = timing
        self.recorder = recorder
        self.progress = progress
        self.rng = np.random.default_rng([cfg.seed, STREAM_SELECTION])
        self.global_iteration = 0
        self.server_updates = 0
        self.bytes_up = 0
        self.bytes_down = 0
        self.clients: dict[int, ClientInfo] = {}
        self.failed: set[int] = set()
        #: partition id -> ``"action: reason"`` of each excluded client (in ``summary.json``)
        self.failure_reasons: dict[int, str] = {}
        self._non_finite: set[int] = set()
        self._checker: ReplyChecker | None = None
        self.rows: list[dict[str, Any]] = []
        self.best_accuracy = float("nan")
        self.status = "running"
        self._draws: dict[int, int] = defaultdict(int)
        #: wall seconds spent evaluating inside run() (excluded from ``server_compute_s``)
        self.eval_seconds = 0.0
        #: the initial evaluation, made by :meth:`prepare` during the handshake, until recorded
        self._early_evaluation: tuple[float, float, dict[str, float]] | None = None
        self.run_seconds = 0.0
        #: replies to earlier requests that a later gather received (see :meth:`gather_replies`)
        self.stray_replies: list[Reply] = []
        self.costs = BlockCosts(task.profiles, cfg.batch_parallel)
        #: typed configs to timed requests (:mod:`strategies.requests`)
        self.requests = RequestBuilder(self.costs, task.cut_layer)
        self._wall0 = time.monotonic()
        self._bar: Any = None
        self.dispatcher: Dispatcher | None = None
        #: where :meth:`maybe_checkpoint` writes (set by the runner when ``checkpoint-every`` > 0)
        self.checkpoint_path: Path | None = None
        #: the checkpoint :meth:`start` resumes from instead of starting afresh (set by the runner)
        self.resume_from: Path | None = None
        #: global iteration of the last checkpoint written or resumed from
        self._checkpointed = 0
        self._resumed = False
        #: wall clock (monotonic s) of :meth:`readmit`'s last look, and the nodes it asked and refused
        self._readmit_looked = 0.0
        self._readmit_refused: set[int] = set()
        self._run_start = 0.0

    # ------------------------------------------------------------------ Flower API
    # Flower's per-round API is not used: start() runs the strategy's own loop.
    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Unused: sflower strategies run their own loop in :meth:`start`."""
        raise NotImplementedError("sflower strategies run their own event loop in start()")

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Unused: see :meth:`configure_train`."""
        raise NotImplementedError("sflower strategies run their own event loop in start()")

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Unused: evaluation is centralised, see :meth:`evaluate_global`."""
        raise NotImplementedError("sflower strategies evaluate centrally")

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Unused: see :meth:`configure_evaluate`."""
        raise NotImplementedError("sflower strategies evaluate centrally")

    @classmethod
    def check_config(cls, cfg: RunConfig, task: Task) -> None:
        """Strategy-specific checks of a configuration against its task, before anything runs.

        Called by :func:`fl_app.server_app.plan_run`, so bad input fails
        before any output is written. The default accepts everything.

        Raises:
            ConfigError: the configuration does not fit this strategy (one line).
        """

    @classmethod
    def all_options(cls) -> list[Option]:
        """The strategy's own run-config options and those of its base classes, base first."""
        seen: dict[str, Option] = {}
        for klass in reversed(cls.__mro__):
            for opt in vars(klass).get("options", ()):
                seen[opt.key] = opt
        return list(seen.values())

    def summary(self) -> None:
        """Log the strategy and its main settings."""
        c = self.cfg
        local = f"{c.local_epochs} local epochs" if c.local_epochs else f"E={c.local_iterations}"
        log.info("%s: %d clients, %d concurrent, %d global iterations, %s, B=%d, lr=%g",
                 self.name, c.num_clients, c.concurrency, c.global_iterations, local, c.batch_size, c.lr)

    def start(self, grid: Grid, initial_arrays: ArrayRecord | None = None, num_rounds: int | None = None,
              timeout: float | None = None, train_config: ConfigRecord | None = None,
              evaluate_config: ConfigRecord | None = None,
              evaluate_fn: Callable[[int, ArrayRecord], MetricRecord | None] | None = None) -> Result:
        """Run the whole strategy on ``grid`` and return Flower's ``Result``.

        ``initial_arrays`` (full-model weights) replace the seeded initial
        model when given; ``num_rounds`` overrides ``global-iterations``.

        Raises:
            DivergedError: a loss became non-finite (metrics so far are kept).
            RunFailedError: handshake failed or every client failed.
        """
        if num_rounds is not None:
            self.cfg = self.cfg.replace(global_iterations=num_rounds)
        self.summary()
        # Server-side randomness drawn from torch's global generator (dropout in a
        # server-side model) follows the seed; clients draw theirs under fixed_rng.
        torch.manual_seed(self.cfg.seed)
        try:
            if self.resume_from is not None:  # everything below comes from the checkpoint
                self.restore_checkpoint(grid, self.resume_from)
                self._open_progress()
            else:
                self.connect(grid, timeout if timeout is not None else self.cfg.node_timeout,
                             meanwhile=lambda: self.prepare(initial_arrays))
                self._open_progress()
                self.evaluate_and_record()
            if not self.should_stop():
                if not self._resumed:
                    self.eval_seconds = 0.0  # count only the evaluations inside run()
                self._run_start = time.perf_counter() - self.run_seconds
                try:
                    self.run()
                finally:
                    self.run_seconds = time.perf_counter() - self._run_start
            self.status = "completed"
        except DivergedError as err:
            self.status = f"diverged: {err}"
            raise
        except RunFailedError as err:
            self.status = f"failed: {err}"
            raise
        except BaseException as err:
            self.status = f"interrupted: {type(err).__name__}"
            raise
        finally:
            self._close_progress()
            if self.recorder is not None:
                self.recorder.finish(self.summary_dict())
        result = Result(arrays=P.state_record(self.global_model().state_dict()))
        for row in self.rows:
            result.evaluate_metrics_serverapp[int(row["global_iteration"])] = MetricRecord(
                {k: float(v) for k, v in row.items() if isinstance(v, (int, float))})
        return result

    # ------------------------------------------------------------------ hooks
    def initialize(self) -> None:
        """Build server-side state (models, buffers) after the handshake."""

    def run(self) -> None:
        """The strategy's loop; provided by :class:`SyncStrategy` / :class:`AsyncStrategy`."""
        raise NotImplementedError

    def global_model(self) -> BlockModel:
        """The full model evaluated on the test set (client ∘ server parts)."""
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        """The server side's torch device: the ``device`` key resolved here (:mod:`fl_app.device`)."""
        return resolve_device(self.cfg.device)

    def on_device(self, tensor: torch.Tensor) -> torch.Tensor:
        """``tensor`` (e.g. decoded from a reply, always on the CPU) moved to :attr:`device`."""
        return to_device(tensor, self.device)

    def extra_metrics(self) -> dict[str, float]:
        """Extra columns for the metric row of the current evaluation."""
        return {}

    def on_failure(self, partition_id: int, action: str, reason: str) -> None:
        """Called after a client's error reply, timeout or malformed reply (it is already excluded)."""

    def prepare(self, initial_arrays: ArrayRecord | None = None) -> None:
        """The server's set-up that needs no client, run while the handshake's replies are on their way.

        :meth:`initialize`, the initial weights (``initial_arrays``, full-model
        weights, when given) and, when the strategy evaluates one global model
        (no :meth:`evaluation_models` of its own), the initial evaluation,
        which :meth:`evaluate_and_record` then records. Overlapping them with
        the handshake hides the clients' start (a Ray actor's imports, a
        deployment round trip) behind the server's own work; nothing they
        compute depends on the handshake, so no number changes.
        """
        self.initialize()
        if initial_arrays is not None:
            self.global_model().load_state_dict(P.record_state(initial_arrays))
        if type(self).evaluation_models is SFLStrategy.evaluation_models:  # per-client models need the clients
            t0 = time.perf_counter()
            self._early_evaluation = self.evaluate_global(full=False)
            self.eval_seconds += time.perf_counter() - t0

    # ------------------------------------------------------------------ handshake
    def connect(self, grid: Grid, timeout: float, meanwhile: Callable[[], None] | None = None) -> None:
        """Wait for ``num-clients`` nodes, handshake, and map node ids to partitions.

        A node that reports a negative partition id (device-local data and no
        ``partition-id`` in its node_config) is assigned one of the ids no
        node claimed, in node-id order, by a second ``query.info`` whose
        ``info`` record carries it. Nodes beyond ``num-clients`` are left out
        with a warning.

        With ``min-clients`` > 0 the wait for all ``num-clients`` nodes ends
        after ``join-timeout`` seconds (0: ``timeout``), and the run starts
        with the nodes present if they are at least ``min-clients``; the
        partitions no node holds take no part (``failure_reasons`` says so).

        ``meanwhile`` (e.g. :meth:`prepare`) runs once the ``query.info``
        requests are sent, before their replies are read.

        Raises:
            RunFailedError: too few nodes within ``timeout`` seconds, or a
                node's handshake failed or is malformed, or two nodes claim
                one partition, or a partition has no node (and fewer than
                ``min-clients`` nodes joined).
        """
        need = self.cfg.num_clients
        least = self.cfg.min_clients or need  # min-clients: start with fewer nodes after join-timeout
        wait = self.cfg.join_timeout or timeout
        t0 = time.monotonic()
        node_ids = list(grid.get_node_ids())
        warned = False
        while len(node_ids) < need:
            if not warned and time.monotonic() - t0 > 10:
                log.warning("waiting for %d nodes, %d connected (num-supernodes must equal num-clients)",
                            need, len(node_ids))
                warned = True
            if time.monotonic() - t0 > wait:
                if len(node_ids) >= least:
                    log.warning("starting with %d of %d nodes after %g s (min-clients=%d)",
                                len(node_ids), need, wait, least)
                    break
                raise RunFailedError(f"only {len(node_ids)} of {need} nodes connected after {wait:.0f} s")
            time.sleep(0.2)
            node_ids = list(grid.get_node_ids())
        unassigned: list[int] = []
        for nid, info in self._handshake(grid, self._task_contents(node_ids), t0, timeout, meanwhile):
            if int(info[P.INFO_PARTITION_ID]) < 0:  # device-local data and no partition-id: assign one below
                unassigned.append(nid)
            else:
                self._register(nid, info)
        if unassigned:
            # Partition ids the nodes did not claim go to the nodes without one, in node-id order; the
            # node keeps its id in its context.state for the rest of the run (fl_app.client_app._partition_id).
            free = [p for p in range(need) if p not in self.clients]
            unassigned.sort()
            for nid in unassigned[len(free):]:
                log.warning("node %d left out: all %d partition ids are taken", nid, need)
            assigned = dict(zip(unassigned, free))
            contents = self._task_contents(assigned)
            for nid, pid in assigned.items():
                contents[nid][P.INFO] = ConfigRecord({P.INFO_PARTITION_ID: pid})
            for nid, info in self._handshake(grid, contents, t0, timeout):
                if int(info[P.INFO_PARTITION_ID]) != assigned[nid]:
                    raise RunFailedError(f"node {nid} did not take partition id {assigned[nid]} "
                                         f"(it replied {info[P.INFO_PARTITION_ID]})")
                self._register(nid, info)
                log.info("node %d holds its own data: partition id %d assigned", nid, assigned[nid])
        missing = sorted(set(range(need)) - set(self.clients))
        if missing and len(self.clients) < least:
            raise RunFailedError(f"no node holds partitions {missing}")
        for p in missing:  # fewer nodes than num-clients (min-clients): these partitions take no part
            self.failure_reasons[p] = "query.info: no node joined"
        if missing:
            log.warning("no node holds partitions %s; the run goes on with %d clients", missing, len(self.clients))
        self.dispatcher = self._new_dispatcher(grid)

    def _new_dispatcher(self, grid: Grid) -> Dispatcher:
        """A dispatcher on ``grid`` for the registered clients' nodes."""
        return Dispatcher(grid, self.clock, {p: c.node_id for p, c in self.clients.items()},
                          timeout=self.cfg.node_timeout)

    def _task_contents(self, node_ids: Iterable[int]) -> dict[int, RecordDict]:
        """The ``query.info`` content for each of ``node_ids``: the run's configuration (the task)."""
        task_record = ConfigRecord(self.cfg.as_dict())
        return {nid: RecordDict({P.TASK: task_record}) for nid in node_ids}

    @staticmethod
    def _handshake(grid: Grid, contents: Mapping[int, RecordDict], t0: float, timeout: float,
                   meanwhile: Callable[[], None] | None = None) -> list[tuple[int, ConfigRecord]]:
        """Send ``query.info`` with ``contents[node_id]`` to each node; ``(node id, info record)`` per reply.

        ``meanwhile`` runs after the requests are sent, before the replies
        are read (a reply that has arrived by then is never late).

        Raises:
            RunFailedError: a node answered with an error or without an info
                record, or not all answered by ``t0 + timeout`` (monotonic s).
        """
        msgs = [Message(content, nid, P.QUERY_INFO) for nid, content in contents.items()]
        ids = set(grid.push_messages(msgs))
        if meanwhile is not None:
            meanwhile()
        replies: list[Message] = []
        while ids:
            got = list(grid.pull_messages(list(ids)))
            for r in got:
                ids.discard(r.metadata.reply_to_message_id)
            replies.extend(got)
            if ids and time.monotonic() - t0 > timeout:  # a reply that has arrived is never late
                raise RunFailedError(f"{len(ids)} nodes did not answer the handshake within {timeout:g} s")
            if ids:
                time.sleep(0.01)
        out = []
        for reply in replies:
            nid = reply.metadata.src_node_id
            if reply.has_error():
                raise RunFailedError(f"handshake failed on node {nid}: {_last_line(reply.error.reason)}")
            info = reply.content.get(P.INFO)
            if not isinstance(info, ConfigRecord) or P.INFO_PARTITION_ID not in info:
                raise RunFailedError(f"handshake failed on node {nid}: the reply has no {P.INFO}/{P.INFO_PARTITION_ID}")
            out.append((nid, info))
        return out

    def _register(self, nid: int, info: ConfigRecord) -> None:
        """Record a node's handshake (partition id, size, label histogram) after checking it.

        Raises:
            RunFailedError: the partition is taken, or the size or the
                histogram is malformed (wrong length, negative, sum != size).
        """
        pid = int(info[P.INFO_PARTITION_ID])
        if pid in self.clients:
            raise RunFailedError(f"nodes {self.clients[pid].node_id} and {nid} both hold partition {pid}")
        try:
            size = info[P.INFO_NUM_EXAMPLES]
            hist = np.asarray(info[P.INFO_LABEL_HISTOGRAM], dtype=np.int64)
        except (KeyError, TypeError, ValueError) as err:
            raise RunFailedError(f"malformed handshake from node {nid}: {type(err).__name__}: {err}") from None
        classes = self.task.data.num_classes
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise RunFailedError(f"malformed handshake from node {nid}: {size!r} examples")
        if hist.shape != (classes,) or (hist < 0).any() or int(hist.sum()) != size:
            raise RunFailedError(f"malformed handshake from node {nid}: label histogram of {hist.size} "
                                 f"counts summing to {int(hist.sum())}, expected {classes} summing to {size}")
        self.clients[pid] = ClientInfo(pid, nid, int(size), hist)

    #: wall seconds between two looks for excluded SuperNodes that came back (:meth:`readmit`)
    readmit_every_s: ClassVar[float] = 5.0

    def readmit(self) -> list[int]:
        """Re-admit excluded clients whose SuperNode came back, after a fresh handshake (wall clock only).

        A client excluded because the SuperLink reported its node unavailable
        (the SuperNode died: no heartbeat) is handshaken again once a node is
        online that no live client uses: its old node id (a SuperNode restarted
        with the same key keeps its id) or a new one. A node that replies with
        that partition id, the same size and the same label histogram takes the
        partition again, and ``failure_reasons`` notes it. Other exclusions
        (malformed or non-finite replies, ClientApp errors, timeouts) are final:
        their nodes are not asked, nor is a node that answered and was refused.
        Does nothing on the virtual clock, so simulated runs are unchanged. Looks
        at most every :attr:`readmit_every_s` seconds; a failed handshake is
        logged and skipped.

        Returns:
            the partition ids re-admitted.
        """
        if self.cfg.clock != "wall" or self.dispatcher is None:
            return []
        gone = [p for p in sorted(self.failed) if "node unavailable" in self.failure_reasons.get(p, "").lower()]
        if not gone or time.monotonic() - self._readmit_looked < self.readmit_every_s:
            return []
        self._readmit_looked = time.monotonic()
        grid = self.dispatcher.grid
        # the nodes of live clients and of clients excluded for good are never asked; nor is a node once refused
        taken = {c.node_id for p, c in self.clients.items() if p not in gone} | self._readmit_refused
        fresh = [n for n in grid.get_node_ids() if n not in taken]
        if not fresh:
            return []
        try:
            answers = self._handshake(grid, self._task_contents(fresh), time.monotonic(),
                                      min(self.cfg.node_timeout, 120.0))
        except RunFailedError as err:
            log.warning("re-admission handshake failed (%s); will look again", err)
            return []
        back = []
        for nid, info in answers:
            pid = int(info[P.INFO_PARTITION_ID])
            old = self.clients.get(pid)
            if pid not in gone or old is None or pid in back:
                self._readmit_refused.add(nid)
                continue
            hist = np.asarray(info.get(P.INFO_LABEL_HISTOGRAM, []), dtype=np.int64)
            if info.get(P.INFO_NUM_EXAMPLES) != old.num_examples or not np.array_equal(hist, old.label_histogram):
                log.warning("node %d claims partition %d with other data; not re-admitted", nid, pid)
                self._readmit_refused.add(nid)
                continue
            self.clients[pid] = ClientInfo(pid, nid, old.num_examples, old.label_histogram)
            self.dispatcher.node_of[pid] = nid
            self.failed.discard(pid)
            self.failure_reasons[pid] += "; re-admitted after a fresh handshake"
            back.append(pid)
            log.warning("client %d is back (node %d): re-admitted after a fresh handshake", pid, nid)
        return back

    # ------------------------------------------------------------------ selection
    def live_clients(self) -> list[int]:
        """Partition ids not excluded after a failure, ascending."""
        return [p for p in sorted(self.clients) if p not in self.failed]

    def select(self, k: int, exclude: Iterable[int] = ()) -> list[int]:
        """Draw up to ``k`` distinct live clients uniformly (seeded), excluding some."""
        skip = set(exclude)
        pool = [p for p in self.live_clients() if p not in skip]
        k = min(k, len(pool))
        if k == 0:
            return []
        return [int(pool[i]) for i in self.rng.choice(len(pool), size=k, replace=False)]

    def local_steps(self, pid: int, batch: int | None = None) -> int:
        """Client ``pid``'s local iterations in one local round (E).

        ``local-iterations``; or, with ``local-epochs=N > 0``, ``N`` passes over
        its own partition of ``|D_k|`` examples: ``N·⌊|D_k|/b⌋`` steps of
        ``b = batch`` (default ``batch-size``) examples, at least ``N`` (the
        RingSFL authors' loaders drop the last partial batch, as sflower's
        sampler does). With unequal partitions the counts differ per client.
        """
        c = self.cfg
        if not c.local_epochs:
            return c.local_iterations
        return c.local_epochs * max(1, self.clients[pid].num_examples // (batch or c.batch_size))

    def cohort_steps(self, members: Sequence[int]) -> int:
        """Steps of a round that feeds every member in lockstep or in turn: the most of the
        members' :meth:`local_steps` (``local-iterations`` without ``local-epochs``).

        RingSFL's round (every step feeds one batch of every member; a member whose
        partition runs out starts its next pass) and vanilla SL's ``sl-order=batch``
        round, which RingSFL §6 counts as ``local_epoch_num × batch_num`` steps, a
        client's batches per epoch, not the cohort's."""
        return max(self.local_steps(int(p)) for p in members)

    def aggregation_weight(self, pid: int) -> float:
        """Weight of a client's model in averaging: ``|D_k|`` (GAS eq. 10), or 1 with ``aggregation=uniform``."""
        return 1.0 if self.cfg.aggregation == "uniform" else float(self.clients[pid].num_examples)

    # ------------------------------------------------------------------ messaging
    def send(self, pid: int, request: Request) -> Pending:
        """Send work to a client; it is due after its device's compute + transfer time.

        The duration comes from the timing model: ``request.flops`` of
        compute, ``request.bits_up`` of upload and ``request.bits_down`` (by
        default the content's array payload) of download. Requests to a busy
        client queue behind its earlier ones (one message in flight per node).

        Returns:
            the dispatcher's :class:`~strategies.dispatcher.Pending` entry.
        """
        assert self.dispatcher is not None
        self.bytes_down += request.payload_bytes
        draw = self._draws[pid]
        self._draws[pid] += 1
        return self.dispatcher.send(pid, request, self._duration(pid, request, draw))

    def expected_duration(self, pid: int, request: Request) -> float:
        """Seconds the timing model expects ``request`` to take on client ``pid``.

        For schedules that adapt to device speed (S²FL's per-client cut,
        RingSFL's propagation lengths). Random straggler delays are replaced by
        their mean; nothing is sent and no random draw is consumed.
        """
        return self._duration(pid, request, None)

    def _duration(self, pid: int, request: Request, draw: int | None) -> float:
        """Compute and client-server transfer time of ``request``, plus its D2D hop
        (``request.d2d_bits`` at :attr:`d2d_bps`) when it has one."""
        seconds = self.timing.duration(pid, request.flops, request.bits_up, request.download_bits, draw)
        if request.d2d_bits:
            seconds += self.timing.link_duration(request.d2d_bits, self.d2d_bps)
        return seconds

    def receive(self, until: float | None = None) -> Reply | None:
        """The next reply in clock order (see :meth:`Dispatcher.next_reply`).

        A failed client (error reply, timeout, or a reply that
        :meth:`validate_reply` rejects) gives a :class:`Reply` with
        ``content=None``; the client is then excluded (one warning line in the
        log), its other requests are cancelled, and :meth:`on_failure` is
        called.

        Raises:
            DivergedError: the last live client was excluded and every
                exclusion was for non-finite values.
            RunFailedError: the last live client was excluded otherwise.

        Args:
            until: return None instead of a reply due after this clock time.
        """
        assert self.dispatcher is not None
        got = self.dispatcher.next_reply(until)
        if got is None:
            return None
        pending, reply = got
        pid = pending.partition_id
        if reply is None or reply.has_error():
            reason = "timed out" if reply is None else _last_line(reply.error.reason)
            log.warning("client %d failed on %s (%s); excluded from the run", pid, pending.action, reason)
            return self._exclude(pending, reason)
        problem = self.validate_reply(pid, pending.request, reply.content)
        if problem is not None:
            log.warning("client %d sent a malformed reply to %s (%s); excluded from the run",
                        pid, pending.action, problem.reason)
            return self._exclude(pending, f"malformed reply: {problem.reason}", problem.non_finite)
        if pending.request.metered:
            self.bytes_up += sum(P.record_bytes(r) for r in P.array_records(reply.content).values())
        return Reply(pid, pending.request, reply.content, pending.due, pending.seq)

    def _exclude(self, pending: Pending, reason: str, non_finite: bool = False) -> Reply:
        """Exclude a failed client: cancel its work, call :meth:`on_failure`, return an empty reply.

        Raises:
            DivergedError: no live client is left and every exclusion was for
                non-finite values (the run itself diverged).
            RunFailedError: no live client is left otherwise.
        """
        assert self.dispatcher is not None
        pid = pending.partition_id
        self.failed.add(pid)
        self.failure_reasons[pid] = f"{pending.action}: {reason}"
        if non_finite:
            self._non_finite.add(pid)
        self.dispatcher.cancel(pid)
        self.on_failure(pid, pending.action, reason)
        if not self.live_clients():
            if self.failed <= self._non_finite:
                raise DivergedError(f"every client sent non-finite values (last: client {pid}, {reason})")
            raise RunFailedError("every client has failed")
        return Reply(pid, pending.request, None, pending.due, pending.seq)

    def validate_reply(self, pid: int, request: Request, content: RecordDict) -> ReplyProblem | None:
        """Hook: why ``content`` is unusable as client ``pid``'s reply to ``request``, or None.

        Called by :meth:`receive` on every successful reply before any
        strategy code decodes it; a problem excludes the client like an error
        reply. The default is :class:`~strategies.validation.ReplyChecker`
        (records present, shapes, dtypes, batch size, label range, weight
        names, example count, finiteness). A subclass that returns records of
        its own may extend it (and call ``super()``).
        """
        if self._checker is None:
            self._checker = ReplyChecker(self.task)
        info = self.clients.get(pid)
        return self._checker.problem(request, content, info.num_examples if info is not None else None)

    def gather_replies(self, requests: Iterable[tuple[int, Request]], *, first: int | None = None,
                       deadline: float | None = None, rest: str = "keep") -> list[Reply]:
        """Send requests and wait for their replies, in clock order.

        Several requests may go to one client: they queue (see :meth:`send`).

        Args:
            requests: ``(pid, request)`` pairs, sent in this order.
            first: return once this many have succeeded (the first ``first``
                in virtual completion order).
            deadline: a clock time (s): stop waiting for replies due after it;
                the clock then moves to the deadline (a straggler cut-off).
            rest: what happens to requests still scheduled on return:
                ``"keep"`` (their replies come later, through :meth:`receive`
                or as :attr:`stray_replies` of a later gather) or ``"cancel"``.

        Returns:
            the successful replies, in the order they were handled. Replies to
            earlier requests that arrive meanwhile go to :attr:`stray_replies`.

        Raises:
            ValueError: ``rest`` is neither ``"keep"`` nor ``"cancel"``.
        """
        if rest not in ("keep", "cancel"):
            raise ValueError(f"rest must be 'keep' or 'cancel', got {rest!r}")
        assert self.dispatcher is not None
        mine = [self.send(pid, req) for pid, req in requests]
        seqs = {p.seq for p in mine}
        out: list[Reply] = []
        while any(p.state == SCHEDULED for p in mine) and (first is None or len(out) < first):
            reply = self.receive(until=deadline)
            if reply is None:
                self.clock.advance_to(deadline)
                break
            if reply.seq not in seqs:
                self.stray_replies.append(reply)
            elif reply.ok:
                out.append(reply)
        if rest == "cancel":
            for pending in mine:
                self.dispatcher.cancel_pending(pending)
        return out

    def gather(self, requests: Mapping[int, Request], **kwargs: Any) -> dict[int, RecordDict]:
        """One request per client, then wait (a synchronous step); see :meth:`gather_replies`.

        Returns:
            ``pid -> reply content`` for the clients that succeeded. The clock
            ends at the latest due time among those waited for.
        """
        return {r.pid: r.content for r in self.gather_replies(requests.items(), **kwargs)}

    def cancel(self, pid: int) -> int:
        """Cancel every scheduled request of client ``pid``; returns how many."""
        assert self.dispatcher is not None
        return len(self.dispatcher.cancel(pid))

    # ------------------------------------------------------------------ evaluation
    def evaluation_models(self) -> Mapping[Any, BlockModel] | None:
        """Per-client full models to evaluate instead of :meth:`global_model`.

        Strategies that keep a client-side model per client (the PSL family)
        return ``{pid: client_k ∘ server}``; the default None evaluates the
        one global model.
        """
        return None

    def evaluate_global(self, full: bool = True) -> tuple[float, float, dict[str, float]]:
        """Test loss and accuracy of :meth:`global_model`, or of :meth:`evaluation_models`.

        With ``full=False`` and ``eval-samples`` > 0, only the first
        ``eval-samples`` test images are used (a cheaper intermediate estimate).

        Returns:
            ``(loss, accuracy, extra columns)``. With per-client models, loss
            and accuracy are the means over clients, and the extra columns
            hold ``client_accuracy_mean/min/max``.
        """
        limit = 0 if full else self.cfg.eval_samples

        def evaluate(model: BlockModel) -> tuple[float, float]:
            if model_device(model) != self.device:  # e.g. an FL model, aggregated on the CPU
                model = copy.deepcopy(model).to(self.device)
            batches = self.task.data.test_batches()
            loss, acc, _ = evaluate_model(model, _take(batches, limit) if limit else batches)
            return loss, acc

        models = self.evaluation_models()
        if models is None:
            return (*evaluate(self.global_model()), {})
        results = np.array([evaluate(m) for m in models.values()], dtype=np.float64)
        accs = results[:, 1]
        extra = {"client_accuracy_mean": float(accs.mean()), "client_accuracy_min": float(accs.min()),
                 "client_accuracy_max": float(accs.max())}
        return float(results[:, 0].mean()), float(accs.mean()), extra

    def evaluate_and_record(self, final: bool = False) -> dict[str, Any]:
        """Evaluate (on the full test set when ``final``), append a metric row, update progress."""
        if self._early_evaluation is not None and not final:  # the initial evaluation, made by prepare()
            (loss, acc, per_client), self._early_evaluation = self._early_evaluation, None
        else:
            t0 = time.perf_counter()
            loss, acc, per_client = self.evaluate_global(full=final)
            self.eval_seconds += time.perf_counter() - t0
        row = {
            "global_iteration": self.global_iteration,
            "server_updates": self.server_updates,
            "virtual_time_s": round(self.clock.now(), 6),
            "wall_time_s": round(time.monotonic() - self._wall0, 3),
            "test_accuracy": acc,
            "test_loss": loss,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "exchanges": self.dispatcher.exchanges if self.dispatcher else 0,
            **per_client,
            **self.extra_metrics(),
        }
        self.rows.append(row)
        if not (acc <= self.best_accuracy):
            self.best_accuracy = acc
        if self.recorder is not None:
            self.recorder.append(row)
        if self._bar is not None:
            self._bar.set_postfix(acc=f"{acc:.4f}", vtime=f"{self.clock.now():.1f}s")
        if not math.isfinite(loss):
            raise DivergedError(f"test loss is {loss} at global iteration {self.global_iteration}")
        return row

    def end_global_iteration(self) -> None:
        """Count a global iteration; evaluate when due."""
        self.global_iteration += 1
        if self._bar is not None:
            self._bar.update(1)
        every = self.cfg.eval_every
        last = self.global_iteration >= self.cfg.global_iterations
        if (every and self.global_iteration % every == 0) or last:
            self.evaluate_and_record(final=last)

    def should_stop(self) -> bool:
        """Stop conditions: iteration budget, target accuracy, virtual-time budget."""
        c = self.cfg
        if self.global_iteration >= c.global_iterations:
            return True
        if c.target_accuracy > 0 and self.rows and self.rows[-1]["test_accuracy"] >= c.target_accuracy:
            return True
        if c.max_virtual_time > 0 and self.clock.now() >= c.max_virtual_time:
            return True
        return False

    #: Raise :class:`DivergedError` when a training loss is not finite (:func:`strategies.errors.check_loss`).
    check_loss = staticmethod(check_loss)

    def summary_dict(self) -> dict[str, Any]:
        """The summary.json content."""
        last = self.rows[-1] if self.rows else {}
        return {
            "strategy": self.name,
            "status": self.status,
            "final_accuracy": last.get("test_accuracy", float("nan")),
            "best_accuracy": self.best_accuracy,
            "final_loss": last.get("test_loss", float("nan")),
            "global_iterations": self.global_iteration,
            "server_updates": self.server_updates,
            "virtual_time_s": self.clock.now(),
            "wall_time_s": time.monotonic() - self._wall0,
            "bytes_up": self.bytes_up,
            "bytes_down": self.bytes_down,
            "exchanges": self.dispatcher.exchanges if self.dispatcher else 0,
            "failed_clients": sorted(self.failed),
            "failure_reasons": {str(p): self.failure_reasons[p] for p in sorted(self.failure_reasons)},
            # the handshake's sizes: with device-local data, the server's own partition_sizes do not apply
            "client_examples": {str(p): self.clients[p].num_examples for p in sorted(self.clients)},
            "server_compute_s": self.server_compute_seconds(),
        }

    def server_compute_seconds(self) -> float:
        """Wall seconds of the strategy's loop outside the dispatcher and evaluation: server-side compute."""
        waited = self.dispatcher.seconds if self.dispatcher else 0.0
        return max(0.0, self.run_seconds - waited - self.eval_seconds)

    # ------------------------------------------------------------------ checkpoints
    #: Attributes that are not server state: the run's environment (the resumed run brings its own),
    #: wall-clock bookkeeping (saved as elapsed seconds), and the dispatcher (saved by its own state_dict).
    NOT_CHECKPOINTED: ClassVar[frozenset[str]] = frozenset({
        "cfg", "task", "clock", "timing", "recorder", "progress", "costs", "requests", "dispatcher", "_bar", "_checker",
        "_wall0", "_run_start", "checkpoint_path", "resume_from", "_resumed",
    })

    def checkpoint_state(self) -> dict[str, Any]:
        """Hook: the strategy's server state for a checkpoint (models, optimizers, buffers, generators,
        counters, metric rows).

        The default is every instance attribute except :attr:`NOT_CHECKPOINTED`;
        it is written in one :func:`torch.save` with the dispatcher's and the
        clients' state, so shared objects (an optimizer's parameters, a
        request both pending and tagged) stay shared. References to the
        run's environment (the strategy itself, ``cfg``, ``task`` and its
        attributes, clock, timing, recorder, grid) are written by name and
        resolve to the resumed run's objects, which are rebuilt from the
        configuration: a strategy must keep its changing state in its own
        attributes, not in those objects. A subclass holding something that
        cannot be pickled overrides this and :meth:`load_checkpoint_state`.
        """
        return {k: v for k, v in vars(self).items() if k not in self.NOT_CHECKPOINTED}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Hook: restore :meth:`checkpoint_state` (the resumed run skips :meth:`initialize`)."""
        self.__dict__.update(state)

    def maybe_checkpoint(self) -> None:
        """Write a checkpoint when ``checkpoint-every`` global iterations have passed since the last one.

        The loops call it where the server state is whole: before each round
        (:class:`SyncStrategy`), before waiting for each reply
        (:class:`AsyncStrategy`). No checkpoint is written once the run has
        stopped.
        """
        every = self.cfg.checkpoint_every
        if every and self.checkpoint_path is not None and self.global_iteration >= self._checkpointed + every:
            self.write_checkpoint(self.checkpoint_path)

    def between_rounds(self) -> None:
        """What a round-based loop does before each round: :meth:`maybe_checkpoint`, then :meth:`readmit`."""
        self.maybe_checkpoint()
        self.readmit()

    def _environment(self, grid: Grid) -> dict[str, Any]:
        """The run's objects that a checkpoint refers to by name instead of writing them (see :mod:`strategies.checkpoint`)."""
        env = {"strategy": self, "cfg": self.cfg, "task": self.task, "clock": self.clock, "timing": self.timing,
               "recorder": self.recorder, "costs": self.costs, "grid": grid}
        env.update({f"task.{k}": v for k, v in vars(self.task).items()
                    if not isinstance(v, (bool, int, float, str, bytes, type(None)))})
        return {k: v for k, v in env.items() if v is not None}

    def write_checkpoint(self, path: str | Path) -> None:
        """Write the server state to ``path`` (atomically; see :mod:`strategies.checkpoint`).

        Saved: :meth:`checkpoint_state`, the dispatcher's pending work, the
        engine's client state (``grid.checkpoint_state()``), the clock, the
        process RNG states and the wall seconds so far.

        Raises:
            CheckpointError: the grid cannot save its clients' state (their
                state lives on the nodes: Ray, deployment).
        """
        assert self.dispatcher is not None
        grid = self.dispatcher.grid
        if not hasattr(grid, "checkpoint_state"):
            raise ckpt.CheckpointError(CHECKPOINT_UNSUPPORTED)
        self._checkpointed = self.global_iteration
        state = {
            "strategy": self.checkpoint_state(),
            "dispatcher": self.dispatcher.state_dict(),
            "grid": grid.checkpoint_state(),
            "clock": self.clock.now(),
            "rng": ckpt.rng_state(),
            "wall_s": time.monotonic() - self._wall0,
            "run_s": time.perf_counter() - self._run_start,
        }
        data = ckpt.dumps(state, self._environment(grid))
        meta = {"strategy": self.name, "config": self.cfg.as_dict(), "global_iteration": self.global_iteration,
                "rows": len(self.rows), "virtual_time_s": self.clock.now()}
        ckpt.write(path, meta, data)
        log.info("checkpoint at global iteration %d -> %s", self.global_iteration, path)

    def restore_checkpoint(self, grid: Grid, path: str | Path) -> None:
        """Continue from a checkpoint instead of the handshake, :meth:`initialize` and the first evaluation.

        Restores the strategy, the clients' state on ``grid``, the pending
        work (a new :class:`Dispatcher` on ``grid``), the clock, the RNG
        states, and truncates the recorder's metrics.csv to the rows written
        by then (``recorder.resume(rows)``).

        Raises:
            CheckpointError: unreadable file, another strategy or
                configuration (``checkpoint-every`` and ``output-dir`` may
                differ), or a grid that cannot restore client state.
        """
        meta, data = ckpt.read(path)
        if meta.get("strategy") != self.name:
            raise ckpt.CheckpointError(f"{path} is a checkpoint of strategy '{meta.get('strategy')}', not '{self.name}'")
        mine, theirs = self.cfg.as_dict(), dict(meta.get("config", {}))
        # a key newer than the checkpoint had its default then: it does not differ if it has it now
        theirs = {**{k: v for k, v in DEFAULTS.items() if k in mine}, **theirs}
        diff = sorted(k for k in set(mine) | set(theirs)
                      if k not in ("checkpoint-every", "output-dir") and mine.get(k) != theirs.get(k))
        if diff:
            k = diff[0]
            raise ckpt.CheckpointError(f"configuration differs from the checkpoint's: {k}={mine.get(k)!r} "
                                       f"(checkpoint: {theirs.get(k)!r})" + (f" and {len(diff) - 1} more" if len(diff) > 1 else ""))
        if not hasattr(grid, "restore_checkpoint_state"):
            raise ckpt.CheckpointError(CHECKPOINT_UNSUPPORTED)
        state = ckpt.loads(data, self._environment(grid))
        try:
            grid.restore_checkpoint_state(state["grid"])
        except ValueError as err:
            raise ckpt.CheckpointError(f"{path}: {err}") from None
        self.load_checkpoint_state(state["strategy"])
        self.dispatcher = self._new_dispatcher(grid)
        self.dispatcher.load_state_dict(state["dispatcher"])
        self.clock.resume_at(float(state["clock"]))
        ckpt.set_rng_state(state["rng"])
        self._wall0 = time.monotonic() - float(state["wall_s"])
        self.run_seconds = float(state["run_s"])
        if self.recorder is not None and hasattr(self.recorder, "resume"):
            self.recorder.resume(self.rows)
        self._resumed = True
        log.info("resumed %s at global iteration %d (virtual time %.3f s) from %s",
                 self.name, self.global_iteration, self.clock.now(), path)

    # ------------------------------------------------------------------ progress
    def _open_progress(self) -> None:
        if self.progress:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=self.cfg.global_iterations, initial=self.global_iteration, desc=self.name,
                             unit="it", leave=True)

    def _close_progress(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _last_line(text: str) -> str:
    """The last non-empty line of an error reason (a traceback's final line)."""
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no reason given)"


def _take(batches: Iterable[tuple[torch.Tensor, torch.Tensor]], limit: int) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
    """The first ``limit`` examples of a stream of ``(x, y)`` batches."""
    left = limit
    for x, y in batches:
        if left <= 0:
            return
        yield x[:left], y[:left]
        left -= int(y.shape[0])


class SyncStrategy(SFLStrategy):
    """Synchronous strategies: select a cohort, run a round, repeat."""

    def run(self) -> None:
        """Rounds until a stop condition holds."""
        while not self.should_stop():
            self.between_rounds()
            cohort = self.next_cohort()
            if not cohort:
                raise RunFailedError("no live clients left to select")
            self.run_round(cohort)
            self.end_global_iteration()

    def next_cohort(self) -> list[int]:
        """Hook: the clients of the next round: ``concurrency`` live clients drawn uniformly (seeded)."""
        return self.select(self.cfg.concurrency)

    def run_round(self, cohort: list[int]) -> None:
        """One global iteration with ``cohort`` (partition ids)."""
        raise NotImplementedError


class AsyncStrategy(SFLStrategy):
    """Asynchronous strategies: handle replies one by one in clock order.

    The subclass starts work in :meth:`launch` (called for each free slot),
    handles each reply in :meth:`on_reply`, and calls
    :meth:`end_global_iteration` when its global iteration completes.
    """

    def run(self) -> None:
        """Keep ``concurrency`` clients busy; dispatch replies until a stop condition."""
        assert self.dispatcher is not None
        if not self._resumed:  # a resumed run's clients are at work already (the checkpoint's pending work)
            for pid in self.select(self.cfg.concurrency):
                self.launch(pid)
        while not self.should_stop():
            self.maybe_checkpoint()
            if self.dispatcher.in_flight == 0:
                raise RunFailedError("no client is training and none can be started")
            reply = self.receive()
            if reply is None or not reply.ok:
                self.refill()
                continue
            self.on_reply(reply)

    def idle_clients(self) -> list[int]:
        """Live clients with no message in flight."""
        assert self.dispatcher is not None
        return [p for p in self.live_clients() if not self.dispatcher.busy(p)]

    def refill(self) -> None:
        """Start new clients (uniformly from the idle ones) until ``concurrency`` are busy."""
        assert self.dispatcher is not None
        if self.should_stop():
            return
        self.readmit()
        free = self.cfg.concurrency - self.dispatcher.in_flight
        busy = [p for p in self.live_clients() if self.dispatcher.busy(p)]
        for pid in self.select(free, exclude=busy):
            self.launch(pid)

    def launch(self, pid: int) -> None:
        """Start a client's local work."""
        raise NotImplementedError

    def on_reply(self, reply: Reply) -> None:
        """Handle one successful reply (in virtual completion-time order)."""
        raise NotImplementedError
