"""The strategy core: the lifecycle, the stop rules, the loop shapes and the hooks of every sflower strategy.

docs/explanation/design.md §5. :class:`SFLStrategy` runs a strategy from the handshake
to the summary; each concern beside the lifecycle is a collaborator that
receives data and callbacks, not the strategy:

* membership (:class:`~strategies.core.membership.Membership`): the ``query.info`` handshake, re-admission,
  seeded selection, exclusion, step counts and averaging weights from the clients' example counts;
* exchange (:class:`~strategies.core.exchange.Exchange`): sending, receiving and gathering through the
  :class:`~strategies.core.dispatcher.Dispatcher`, due times from the :class:`~strategies.core.clock.Timing`,
  metering (``bytes_up``, ``bytes_down``), reply validation, excluding a failed client;
* evaluation (:func:`strategies.core.evaluation.evaluate_models`); metric rows and the summary
  (:class:`~strategies.core.metrics.MetricLog`); checkpointing (:class:`~strategies.core.checkpoint.Checkpointer`);
  requests (:class:`~strategies.core.requests.RequestBuilder`); the progress bar (:mod:`strategies.core.progress`).

The base class delegates to them with thin methods (``connect``, ``select``, ``send``, ``gather``,
``local_steps``, ...) that subclasses call. The hooks a strategy overrides are listed, each with its
contract, in one place: the docstrings of :class:`SFLStrategy` and of the loop shapes of
:mod:`strategies.core.loops` and the split strategies of :mod:`strategies.core.split` (rendered together
on the docs' reference page "Strategy hooks").

Flower's per-round ``configure_*``/``aggregate_*`` methods are stubbed in
:class:`strategies.core.flower_api.EventLoopStrategy` (which says why sflower
subclasses Flower's ``Strategy``); :meth:`SFLStrategy.start` is Flower's
``strategy.start(grid, ...) -> Result``.
"""

from __future__ import annotations

import functools
import logging
import math
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, ClassVar

import torch
from flwr.app import ArrayRecord, ConfigRecord, MetricRecord, RecordDict
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Result

from fl_app import protocol as P
from fl_app.run.config import RunConfig, defaults
from fl_app.run.options import Option
from fl_app.run.plugins import options_of
from fl_app.cut.link import LinkCodecs, block_costs
from fl_app.run.device import resolve_device, to_device
from fl_app.models import BlockModel
from fl_app.learning.task import Task
from strategies.core import checkpoint as ckpt
from strategies.core import metrics
from strategies.core import progress as progress_bar
from strategies.core.aggregation import ModelAggregation
from strategies.core.checkpoint import Checkpointer
from strategies.core.clock import Clock, Timing
from strategies.core.dispatcher import Dispatcher, Pending, Reply, Request
from strategies.core.errors import DivergedError, RunFailedError, check_loss
from strategies.core.evaluation import evaluate_models
from strategies.core.exchange import Exchange, request_seconds
from strategies.core.flower_api import EventLoopStrategy
from strategies.core.membership import STREAM_SELECTION, ClientInfo, Membership
from strategies.core.requests import RequestBuilder
from strategies.core.validation import ReplyChecker, ReplyProblem

#: Names other modules import from here.
__all__ = ["STREAM_SELECTION", "ClientInfo", "DivergedError", "RunFailedError",
           "SFLStrategy"]

log = logging.getLogger("sflower")


class SFLStrategy(ModelAggregation, EventLoopStrategy):
    """Base class of all strategies; subclasses supply hooks, not loops.

    The hooks of every strategy (the loop shape adds its own: :class:`~strategies.core.loops.SyncStrategy`,
    :class:`~strategies.core.loops.AsyncStrategy`). Override only these; the other methods are the
    machinery that subclasses call (``send``, ``gather``, ``select``, ...):

    - ``name``, ``options``, ``run_with`` (class attributes): the registry name; the run-config keys the
      class adds, a tuple of :class:`~fl_app.run.options.Option`; the settings its authors ran it with.
    - ``d2d_bps`` (attribute): the rate (bits/s) of device-to-device hops (RingSFL sets it in ``__init__``).
    - ``check_config(cfg, task)`` (classmethod): raise ``ConfigError`` (one line) for a configuration it
      cannot run; called by ``plan_run`` before anything runs.
    - ``weights_only_links(cfg)`` (classmethod): the links on which it sends model weights only (a codec
      that leaves weights float32 is refused there).
    - ``summary()``: log its settings once, before the handshake.
    - ``initialize()``: server-side state (models, optimizers, buffers); runs during the handshake, so it
      must not read ``self.clients``.
    - ``global_model()`` (required): the full model evaluated on the test set and returned.
    - ``evaluation_models()``: ``{key: full model}`` to evaluate instead (per-client models), or None.
    - ``extra_metrics()``: extra columns of the current metric row.
    - ``aggregate_models(models, weights)``: combine K state dicts into one; every model average of a
      strategy goes through it (default: the weighted mean,
      :class:`~strategies.core.aggregation.ModelAggregation`).
    - ``on_failure(partition_id, action, reason)``: a client was excluded (error, timeout, malformed
      reply): drop its work.
    - ``validate_reply(pid, request, content)``: why a reply is unusable, or None (extend with ``super()``).
    - ``between_rounds()``: what a round-based loop does before each round (default: checkpoint, re-admit).
    - ``summary_dict()``: ``summary.json`` (extend with ``super()``).
    - ``checkpoint_state()`` / ``load_checkpoint_state(state)``: the server state a checkpoint saves and
      restores (default: every attribute but :attr:`NOT_CHECKPOINTED`); override only for state the
      checkpoint codec cannot write.
    - ``run()``: the loop itself, provided by the loop shapes, not overridden.

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
        self.cfg, self.task, self.clock, self.timing = cfg, task, clock, timing
        self.recorder, self.progress = recorder, progress
        self.global_iteration = 0
        self.server_updates = 0
        #: the clients: handshake, re-admission, selection, exclusion
        self.membership = Membership(cfg.seed, task.data.num_classes, histograms=not cfg.ushaped)
        #: sending, receiving, metering (its dispatcher is made after the handshake)
        self.exchange = Exchange(clock, self._duration, self.validate_reply, self.membership, self.on_failure)
        self._checker: ReplyChecker | None = None
        #: the metric rows, the best accuracy, the evaluation seconds (:class:`~strategies.core.metrics.MetricLog`)
        self.metric_log = metrics.MetricLog()
        self.status = "running"
        self.run_seconds = 0.0
        #: FLOPs and bits of block ranges, bits as the links' codecs encode them (:mod:`fl_app.cut.link`)
        self.exchange.links = LinkCodecs.from_config(cfg)
        self.costs = block_costs(task, cfg.batch_parallel, self.exchange.links)
        #: typed configs to timed requests (:mod:`strategies.core.requests`)
        self.requests = RequestBuilder(self.costs, task.cut_layer)
        self._wall0 = time.monotonic()
        self._bar: Any = None
        #: when and where checkpoints are written, and the resume (:class:`~strategies.core.checkpoint.Checkpointer`)
        self.checkpoints = Checkpointer(self.name, self.checkpoint_state, self.load_checkpoint_state,
                                        self._environment, self._new_dispatcher,
                                        lambda: {p: self.clients[p].node_id for p in self.live_clients()},
                                        lambda grid: self.membership.reconnect(grid, self.cfg, self.cfg.node_timeout),
                                        cfg.node_timeout)
        self._run_start = 0.0

    @classmethod
    def check_config(cls, cfg: RunConfig, task: Task) -> None:
        """Strategy-specific checks of a configuration against its task, before anything runs (called by
        :func:`simulation.server_app.plan_run`, so bad input fails before any output). The default accepts all.

        Raises:
            ConfigError: the configuration does not fit this strategy (one line).
        """

    @classmethod
    def weights_only_links(cls, cfg: RunConfig) -> frozenset[str]:
        """The links (``"up"``, ``"down"``) on which this strategy, so configured, sends no float tensor but
        model weights: no activations, gradients or perturbations. A codec that leaves weights float32
        (top-k) has nothing to do there, and :func:`fl_app.cut.link.check_links` refuses it. The default: the
        downlink where clients train zeroth-order (``client-optimizer=zo``: loss differences, numbers in a
        config, and models go down, no gradient), else none."""
        return frozenset({"down"}) if cfg.get("client-optimizer") == "zo" else frozenset()

    @classmethod
    def all_options(cls) -> list[Option]:
        """The strategy's own run-config options and those of its base classes, base first."""
        return options_of(cls)

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
        """Run the whole strategy on ``grid`` and return Flower's ``Result``: ``initial_arrays`` (full-model
        weights) replace the seeded initial model when given; ``num_rounds`` overrides ``global-iterations``.

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
            else:
                self.connect(grid, timeout if timeout is not None else self.cfg.node_timeout,
                             meanwhile=lambda: self.prepare(initial_arrays))
            self._bar = progress_bar.open_bar(self.progress, self.cfg.global_iterations, self.global_iteration,
                                              self.name, self.dispatcher.exchanges if self.dispatcher else 0)
            if self._bar is not None:  # the bar moves with each reply, within a global iteration too
                self.exchange.on_reply = functools.partial(progress_bar.advance, self._bar)
            if not self.checkpoints.resumed:
                self.evaluate_and_record()
            if not self.should_stop():
                if not self.checkpoints.resumed:
                    self.metric_log.eval_seconds = 0.0  # count only the evaluations inside run()
                self._run_start = time.perf_counter() - self.run_seconds
                try:
                    self._run_rolling_back(grid)
                finally:
                    self.run_seconds = time.perf_counter() - self._run_start
            self.status = "completed"
        except BaseException as err:
            self.status = metrics.run_status(err)
            raise
        finally:
            progress_bar.close_bar(self._bar)
            self._bar = self.exchange.on_reply = None
            if self.recorder is not None:
                self.recorder.finish(self.summary_dict())
        return self.metric_log.result(P.state_record(self.global_model().state_dict()))

    def _run_rolling_back(self, grid: Grid) -> None:
        """:meth:`run`; with ``node-loss=rollback``, a lost node sends the run back to its last checkpoint
        (:meth:`Checkpointer.run <strategies.core.checkpoint.Checkpointer.run>`)."""
        self.exchange.roll_back = self.cfg.node_loss == "rollback"

        def roll_back(path: Path) -> None:
            self.dispatcher.drain(self.cfg.node_timeout)  # the other nodes finish what they were sent
            on_reply = self.exchange.on_reply
            self.restore_checkpoint(grid, path)
            self.exchange.roll_back, self.exchange.on_reply = True, on_reply
            self._run_start = time.perf_counter() - self.run_seconds

        self.checkpoints.run(self.run, roll_back)

    # ------------------------------------------------------------------ hooks
    def initialize(self) -> None:
        """Build server-side state (models, buffers) after the handshake."""

    def run(self) -> None:
        """The strategy's loop; provided by :class:`~strategies.core.loops.SyncStrategy` / :class:`~strategies.core.loops.AsyncStrategy`."""
        raise NotImplementedError

    def global_model(self) -> BlockModel:
        """The full model evaluated on the test set (client ∘ server parts)."""
        raise NotImplementedError

    @property
    def device(self) -> torch.device:
        """The server side's torch device: the ``device`` key resolved here (:mod:`fl_app.run.device`)."""
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
        """The server's set-up that needs no client, run while the handshake's replies are on their way:
        :meth:`initialize`, the initial weights (``initial_arrays``, full-model weights, when given) and, for one
        global model (no :meth:`evaluation_models`, not ``hide-client-models``: those need the clients), the
        initial evaluation that :meth:`evaluate_and_record` then records. This hides the clients' start (a Ray actor's imports, a deployment round trip) behind
        the server's own work; nothing it computes depends on the handshake, so no number changes."""
        self.initialize()
        if initial_arrays is not None:
            self.global_model().load_state_dict(P.record_state(initial_arrays))
        if type(self).evaluation_models is SFLStrategy.evaluation_models and not self.cfg.get("hide-client-models"):
            self.metric_log.early = self.metric_log.timed(lambda: self.evaluate_global(full=False))

    # ------------------------------------------------------------------ membership (delegated)
    clients = property(lambda self: self.membership.clients, lambda self, v: setattr(self.membership, "clients", v),
                       doc="Partition id -> :class:`ClientInfo` of every client the handshake registered.")
    readmit_every_s = 5.0  # kept in step with Membership.readmit_every_s by readmit()

    def connect(self, grid: Grid, timeout: float, meanwhile: Callable[[], None] | None = None) -> None:
        """The handshake (:meth:`~strategies.core.membership.Membership.connect`), then the clients' dispatcher."""
        self.membership.connect(grid, self.cfg, timeout, meanwhile)
        self.dispatcher = self._new_dispatcher(grid)

    def _new_dispatcher(self, grid: Grid) -> Dispatcher:
        """A dispatcher on ``grid`` for the registered clients' nodes."""
        return Dispatcher(grid, self.clock, {p: c.node_id for p, c in self.clients.items()},
                          timeout=self.cfg.node_timeout)

    def readmit(self) -> list[int]:
        """Re-admit excluded clients whose SuperNode came back (:meth:`~strategies.core.exchange.Exchange.readmit`)."""
        self.membership.readmit_every_s = self.readmit_every_s
        return self.exchange.readmit(self.cfg)

    def live_clients(self) -> list[int]:
        """Partition ids not excluded after a failure, ascending."""
        return self.membership.live_clients()

    def select(self, k: int, exclude: Iterable[int] = ()) -> list[int]:
        """Draw up to ``k`` distinct live clients uniformly (seeded), excluding some."""
        return self.membership.select(k, exclude)

    def local_steps(self, pid: int, batch: int | None = None) -> int:
        """Client ``pid``'s local iterations in one round, E (:meth:`~strategies.core.membership.Membership.local_steps`)."""
        return self.membership.local_steps(pid, self.cfg, batch)

    def cohort_steps(self, members: Sequence[int]) -> int:
        """Steps of a round feeding every member in turn (:meth:`~strategies.core.membership.Membership.cohort_steps`)."""
        return self.membership.cohort_steps(members, self.cfg)

    def aggregation_weight(self, pid: int) -> float:
        """Weight of a client's model in averaging: ``|D_k|`` (GAS eq. 10), or 1 with ``aggregation=uniform``."""
        return self.membership.aggregation_weight(pid, self.cfg)

    # ------------------------------------------------------------------ exchange (delegated)
    dispatcher = property(lambda self: self.exchange.dispatcher,
                          lambda self, v: setattr(self.exchange, "dispatcher", v),
                          doc="The :class:`~strategies.core.dispatcher.Dispatcher` (None before the handshake).")
    bytes_up = property(lambda self: self.exchange.bytes_up, doc="Metered reply payload so far (bytes).")
    bytes_down = property(lambda self: self.exchange.bytes_down, doc="Request payload so far (bytes).")
    stray_replies = property(lambda self: self.exchange.stray_replies,
                             doc="Replies to earlier requests that a later gather received.")

    def send(self, pid: int, request: Request) -> Pending:
        """Send work to a client (:meth:`Exchange.send <strategies.core.exchange.Exchange.send>`)."""
        return self.exchange.send(pid, request)

    def receive(self, until: float | None = None) -> Reply | None:
        """The next reply in clock order (:meth:`Exchange.receive <strategies.core.exchange.Exchange.receive>`)."""
        return self.exchange.receive(until)

    def gather_replies(self, requests: Iterable[tuple[int, Request]], **kwargs: Any) -> list[Reply]:
        """Send requests, wait for their replies (:meth:`~strategies.core.exchange.Exchange.gather_replies`)."""
        return self.exchange.gather_replies(requests, **kwargs)

    def gather(self, requests: Mapping[int, Request], **kwargs: Any) -> dict[int, RecordDict]:
        """One request per client, then wait: ``pid -> content`` (:meth:`~strategies.core.exchange.Exchange.gather`)."""
        return self.exchange.gather(requests, **kwargs)

    def cancel(self, pid: int) -> int:
        """Cancel every scheduled request of client ``pid``; returns how many."""
        return self.exchange.cancel(pid)

    def expected_duration(self, pid: int, request: Request) -> float:
        """Seconds the timing model expects ``request`` to take on client ``pid``, for schedules that adapt to
        device speed (S²FL's per-client cut, RingSFL's propagation lengths): random straggler delays replaced
        by their mean; nothing is sent and no random draw is consumed."""
        return self._duration(pid, request, None)

    def _duration(self, pid: int, request: Request, draw: int | None) -> float:
        """:func:`strategies.core.exchange.request_seconds` with the run's timing and :attr:`d2d_bps`."""
        return request_seconds(self.timing, self.d2d_bps, pid, request, draw)

    def validate_reply(self, pid: int, request: Request, content: RecordDict) -> ReplyProblem | None:
        """Hook: why ``content`` is unusable as client ``pid``'s reply to ``request``, or None. Called by
        :meth:`receive` on every successful reply before any strategy code decodes it; a problem excludes the
        client like an error reply. The default is :class:`~strategies.core.validation.ReplyChecker` (records,
        shapes, dtypes, batch size, label range, weight names, example count, finiteness); a subclass that
        returns records of its own may extend it (and call ``super()``)."""
        if self._checker is None:
            self._checker = ReplyChecker(self.task)
        info = self.clients.get(pid)
        return self._checker.problem(request, content, info.num_examples if info is not None else None)

    def evaluation_models(self) -> Mapping[Any, BlockModel] | None:
        """Per-client full models to evaluate instead of :meth:`global_model`: ``{pid: client_k ∘ server}`` for
        strategies that keep a client-side model per client (the PSL family); the default None: the global one."""
        return None

    def evaluate_global(self, full: bool = True) -> tuple[float, float, dict[str, float]]:
        """Test loss and accuracy of :meth:`global_model`, or of :meth:`evaluation_models`
        (:func:`strategies.core.evaluation.evaluate_models`); with ``full=False`` and ``eval-samples`` > 0,
        only the first ``eval-samples`` test images (a cheaper intermediate estimate)."""
        models = self.evaluation_models()
        return evaluate_models(self.global_model() if models is None else None, models, self.device,
                               self.task.data.test_batches, 0 if full else self.cfg.eval_samples)

    def evaluate_and_record(self, final: bool = False) -> dict[str, Any]:
        """Evaluate (on the full test set when ``final``; else the initial evaluation of :meth:`prepare` when
        there is one), append a metric row (:meth:`MetricLog.record <strategies.core.metrics.MetricLog.record>`)."""
        loss, acc, per_client = self.metric_log.evaluation(lambda: self.evaluate_global(full=final), not final)
        counters = self.counters()
        row = self.metric_log.record(counters, (loss, acc, per_client), self.extra_metrics(), self.recorder)
        progress_bar.show(self._bar, acc, counters["virtual_time_s"])
        if not math.isfinite(loss):
            raise DivergedError(f"test loss is {loss} at global iteration {self.global_iteration}")
        return row

    rows = property(lambda self: self.metric_log.rows, doc="The metric rows so far (one per evaluation).")

    def counters(self) -> dict[str, Any]:
        """The run's counters now (iterations, updates, virtual and wall seconds, bytes, exchanges), for
        :mod:`strategies.core.metrics`."""
        return {"global_iteration": self.global_iteration, "server_updates": self.server_updates,
                "virtual_time_s": self.clock.now(), "wall_time_s": time.monotonic() - self._wall0,
                "bytes_up": self.bytes_up, "bytes_down": self.bytes_down,
                "exchanges": self.dispatcher.exchanges if self.dispatcher else 0}

    def end_global_iteration(self) -> None:
        """Count a global iteration; evaluate when due."""
        self.global_iteration += 1
        progress_bar.tick(self._bar, self.global_iteration, self.dispatcher.exchanges if self.dispatcher else 0)
        every = self.cfg.eval_every
        last = self.global_iteration >= self.cfg.global_iterations
        if (every and self.global_iteration % every == 0) or last:
            self.evaluate_and_record(final=last)

    def should_stop(self) -> bool:
        """Stop conditions: iteration budget, target accuracy, virtual-time budget."""
        c, rows = self.cfg, self.rows
        return (self.global_iteration >= c.global_iterations
                or (c.target_accuracy > 0 and bool(rows) and rows[-1]["test_accuracy"] >= c.target_accuracy)
                or (c.max_virtual_time > 0 and self.clock.now() >= c.max_virtual_time))

    #: Raise :class:`DivergedError` when a training loss is not finite (:func:`strategies.core.errors.check_loss`).
    check_loss = staticmethod(check_loss)

    def summary_dict(self) -> dict[str, Any]:
        """The summary.json content (:meth:`MetricLog.summary <strategies.core.metrics.MetricLog.summary>`)."""
        waited = self.dispatcher.seconds if self.dispatcher else 0.0
        clients = {**self.membership.summary(), "rollbacks": self.checkpoints.rollbacks}
        return self.metric_log.summary(self.name, self.status, self.counters(), clients,
                                       metrics.server_compute_seconds(self.run_seconds, waited,
                                                                      self.metric_log.eval_seconds))

    # ------------------------------------------------------------------ checkpoints
    #: Attributes that are not server state: the run's environment (the resumed run brings its own), wall-clock
    #: bookkeeping (saved as elapsed seconds), the checkpointing itself. The exchange leaves out its dispatcher.
    NOT_CHECKPOINTED: ClassVar[frozenset[str]] = frozenset({
        "cfg", "task", "clock", "timing", "recorder", "progress", "costs", "requests", "_bar", "_checker",
        "_wall0", "_run_start", "checkpoints"})
    checkpoint_path = property(lambda self: self.checkpoints.path, lambda self, v: setattr(self.checkpoints, "path", v),
                               doc="Where :meth:`maybe_checkpoint` writes (set by the runner).")
    resume_from = property(lambda self: self.checkpoints.resume_from,
                           lambda self, v: setattr(self.checkpoints, "resume_from", v),
                           doc="The checkpoint :meth:`start` resumes from (set by the runner).")

    def checkpoint_state(self) -> dict[str, Any]:
        """Hook: the strategy's server state for a checkpoint (models, optimizers, buffers, generators, counters,
        metric rows); by default every instance attribute but :attr:`NOT_CHECKPOINTED`. What it may hold and
        how it is written: :class:`~strategies.core.checkpoint.Checkpointer`."""
        return {k: v for k, v in vars(self).items() if k not in self.NOT_CHECKPOINTED}

    def load_checkpoint_state(self, state: dict[str, Any]) -> None:
        """Hook: restore :meth:`checkpoint_state` (the resumed run skips :meth:`initialize`); attributes made
        after the checkpoint are dropped, as a fresh process would not have them (a rollback restores in place)."""
        for key in [k for k in vars(self) if k not in self.NOT_CHECKPOINTED and k not in state]:
            delattr(self, key)
        self.__dict__.update(state)

    def maybe_checkpoint(self) -> None:
        """Write a checkpoint (:meth:`Checkpointer.write <strategies.core.checkpoint.Checkpointer.write>`) when
        ``checkpoint-every`` global iterations have passed since the last one. The loops call it where the
        server state is whole: before each round (:class:`~strategies.core.loops.SyncStrategy`), before waiting for each reply
        (:class:`~strategies.core.loops.AsyncStrategy`); none is written once the run has stopped."""
        if self.checkpoints.due(self.cfg.checkpoint_every, self.global_iteration):
            assert self.dispatcher is not None
            meta = {"strategy": self.name, "config": self.cfg.as_dict(), "global_iteration": self.global_iteration,
                    "rows": len(self.rows), "virtual_time_s": self.clock.now()}
            self.checkpoints.write(self.checkpoint_path, self.dispatcher, meta,
                                   (time.monotonic() - self._wall0, time.perf_counter() - self._run_start))

    def between_rounds(self) -> None:
        """What a round-based loop does before each round: :meth:`maybe_checkpoint`, then :meth:`readmit`."""
        self.maybe_checkpoint()
        self.readmit()

    def _environment(self, grid: Grid) -> dict[str, Any]:
        """The run's objects that a checkpoint refers to by name (:func:`strategies.core.checkpoint.environment`)."""
        return ckpt.environment({"strategy": self, "cfg": self.cfg, "task": self.task, "clock": self.clock,
                                 "timing": self.timing, "recorder": self.recorder, "costs": self.costs,
                                 "grid": grid}, self.task)

    def restore_checkpoint(self, grid: Grid, path: str | Path) -> None:
        """Continue from a checkpoint instead of the handshake, :meth:`initialize` and the first evaluation
        (:meth:`Checkpointer.restore <strategies.core.checkpoint.Checkpointer.restore>`; raises its
        ``CheckpointError``), and truncate the recorder's metrics.csv to the rows written by then."""
        self.dispatcher, wall_s, self.run_seconds = self.checkpoints.restore(grid, path, self.cfg.as_dict(),
                                                                             defaults(), self.clock)
        self.checkpoints.last = self.global_iteration
        self._wall0 = time.monotonic() - wall_s
        if self.recorder is not None and hasattr(self.recorder, "resume"):
            self.recorder.resume(self.rows)
        log.info("resumed %s at global iteration %d (virtual time %.3f s) from %s",
                 self.name, self.global_iteration, self.clock.now(), path)

