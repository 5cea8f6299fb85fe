"""Membership: who takes part in a run, the handshake, re-admission, selection and exclusion.

:class:`Membership` holds the clients the ``query.info`` handshake
registered (:class:`ClientInfo`), the excluded ones with their reasons, and
the seeded selection generator, and derives the step counts and averaging
weights from the clients' example counts. It receives the grid and the run
configuration with each call; :class:`~strategies.core.base.SFLStrategy` keeps
one and delegates ``connect``, ``readmit``, ``live_clients``, ``select``,
``local_steps``, ``cohort_steps`` and ``aggregation_weight`` to it.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
from flwr.app import ConfigRecord, Message, RecordDict
from flwr.serverapp import Grid

from fl_app import protocol as P
from fl_app.run.config import RunConfig
from strategies.core.client_states import last_line as _last_line, round_trip
from strategies.core.errors import NODE_UNAVAILABLE, DivergedError, RunFailedError

log = logging.getLogger("sflower")

#: Seed stream of client selection.
STREAM_SELECTION = 3


@dataclass
class ClientInfo:
    """What the handshake tells about a client.

    Attributes:
        partition_id: the data partition it holds.
        node_id: its Flower node id.
        num_examples: training examples ``|D_k|``.
        label_histogram: int64 ``[num_classes]`` label counts; empty where the run keeps them on the nodes
            (``Membership.histograms`` False: U-shaped).
    """

    partition_id: int
    node_id: int
    num_examples: int
    label_histogram: np.ndarray


class Membership:
    """The run's clients: registered, live or excluded, and their seeded selection.

    Args:
        seed: the run's seed (selection draws from ``(seed, STREAM_SELECTION)``).
        num_classes: the task's label count (a handshake's histogram must have it).
        histograms: whether a handshake must report the node's label histogram; False in a label-private
            (U-shaped) run, whose nodes keep it (:attr:`ClientInfo.label_histogram` is then empty).
    """

    #: whether handshakes carry label histograms (see the class docstring)
    histograms: bool = True

    #: wall seconds between two looks for excluded SuperNodes that came back (:meth:`readmit`)
    readmit_every_s: float = 5.0

    def __init__(self, seed: int, num_classes: int, histograms: bool = True) -> None:
        self.num_classes = num_classes
        self.histograms = histograms
        self.rng = np.random.default_rng([seed, STREAM_SELECTION])
        self.clients: dict[int, ClientInfo] = {}
        self.failed: set[int] = set()
        #: partition id -> ``"action: reason"`` of each excluded client (in ``summary.json``)
        self.failure_reasons: dict[int, str] = {}
        self.non_finite: set[int] = set()
        #: wall clock (monotonic s) of :meth:`readmit`'s last look, and the nodes it asked and refused
        self.readmit_looked = 0.0
        self.readmit_refused: set[int] = set()

    # ------------------------------------------------------------------ handshake
    def connect(self, grid: Grid, cfg: RunConfig, timeout: float, meanwhile: Callable[[], None] | None = None) -> None:
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

        ``meanwhile`` (e.g. :meth:`~strategies.core.base.SFLStrategy.prepare`) runs once the ``query.info``
        requests are sent, before their replies are read.

        Raises:
            RunFailedError: too few nodes within ``timeout`` seconds, or a
                node's handshake failed or is malformed, or two nodes claim
                one partition, or a partition has no node (and fewer than
                ``min-clients`` nodes joined).
        """
        need = cfg.num_clients
        least = cfg.min_clients or need  # min-clients: start with fewer nodes after join-timeout
        wait = cfg.join_timeout or timeout
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
        for nid, info in self._handshake(grid, self._task_contents(cfg, node_ids), t0, timeout, meanwhile):
            if int(info[P.INFO_PARTITION_ID]) < 0:  # device-local data and no partition-id: assign one below
                unassigned.append(nid)
            else:
                self._register(nid, info)
        if unassigned:
            # Partition ids the nodes did not claim go to the nodes without one, in node-id order; the
            # node keeps its id in its context.state for the rest of the run (fl_app.client.node._partition_id).
            free = [p for p in range(need) if p not in self.clients]
            unassigned.sort()
            for nid in unassigned[len(free):]:
                log.warning("node %d left out: all %d partition ids are taken", nid, need)
            assigned = dict(zip(unassigned, free))
            for nid, info in self._handshake(grid, self._task_contents(cfg, assigned, assigned), t0, timeout):
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

    @staticmethod
    def _task_contents(cfg: RunConfig, node_ids: Iterable[int],
                       partition_ids: Mapping[int, int] | None = None) -> dict[int, RecordDict]:
        """The ``query.info`` content for each of ``node_ids``: the run's configuration (the task), and
        the partition id ``partition_ids[node_id]`` assigned to a node holding its own data."""
        task_record, assigned = ConfigRecord(cfg.as_dict()), partition_ids or {}
        return {nid: P.requests.query_info(task_record, assigned.get(nid)) for nid in node_ids}

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
        replies = round_trip(grid, msgs, t0 + timeout, f"the handshake within {timeout:g} s", meanwhile)
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
            hist = np.asarray(info[P.INFO_LABEL_HISTOGRAM] if self.histograms else [], dtype=np.int64)
        except (KeyError, TypeError, ValueError) as err:
            raise RunFailedError(f"malformed handshake from node {nid}: {type(err).__name__}: {err}") from None
        classes = self.num_classes
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise RunFailedError(f"malformed handshake from node {nid}: {size!r} examples")
        if self.histograms and (hist.shape != (classes,) or (hist < 0).any() or int(hist.sum()) != size):
            raise RunFailedError(f"malformed handshake from node {nid}: label histogram of {hist.size} "
                                 f"counts summing to {int(hist.sum())}, expected {classes} summing to {size}")
        self.clients[pid] = ClientInfo(pid, nid, int(size), hist)

    def readmit(self, grid: Grid, cfg: RunConfig) -> list[int]:
        """Re-admit excluded clients whose SuperNode came back, after a fresh handshake (wall clock only).

        A client excluded because its node is gone (the reason contains
        :data:`~strategies.core.errors.NODE_UNAVAILABLE`: the SuperLink reported no
        heartbeat, or the node's session stream broke) is handshaken again once a node is
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
            the partition ids re-admitted (the caller points their messages at their new nodes).
        """
        if cfg.clock != "wall":
            return []
        gone = [p for p in sorted(self.failed) if NODE_UNAVAILABLE in self.failure_reasons.get(p, "").lower()]
        if not gone or time.monotonic() - self.readmit_looked < self.readmit_every_s:
            return []
        self.readmit_looked = time.monotonic()
        # the nodes of live clients and of clients excluded for good are never asked; nor is a node once refused
        taken = {c.node_id for p, c in self.clients.items() if p not in gone} | self.readmit_refused
        fresh = [n for n in grid.get_node_ids() if n not in taken]
        if not fresh:
            return []
        try:
            answers = self._handshake(grid, self._task_contents(cfg, fresh), time.monotonic(),
                                      min(cfg.node_timeout, 120.0))
        except RunFailedError as err:
            log.warning("re-admission handshake failed (%s); will look again", err)
            return []
        back = []
        for nid, info in answers:
            pid = int(info[P.INFO_PARTITION_ID])
            old = self.clients.get(pid)
            if pid not in gone or old is None or pid in back:
                self.readmit_refused.add(nid)
                continue
            hist = np.asarray(info.get(P.INFO_LABEL_HISTOGRAM, []) if self.histograms else [], dtype=np.int64)
            if info.get(P.INFO_NUM_EXAMPLES) != old.num_examples or not np.array_equal(hist, old.label_histogram):
                log.warning("node %d claims partition %d with other data; not re-admitted", nid, pid)
                self.readmit_refused.add(nid)
                continue
            self.clients[pid] = ClientInfo(pid, nid, old.num_examples, old.label_histogram)
            self.failed.discard(pid)
            self.failure_reasons[pid] += "; re-admitted after a fresh handshake"
            back.append(pid)
            log.warning("client %d is back (node %d): re-admitted after a fresh handshake", pid, nid)
        return back

    def reconnect(self, grid: Grid, cfg: RunConfig, timeout: float) -> dict[int, int]:
        """A resume's handshake: find the nodes of the live clients again (their node ids may have changed:
        a new Ray run, restarted SuperNodes) and point the clients at them.

        It is :meth:`connect`'s handshake on a fresh membership, waiting for at
        least as many nodes as there are live clients; each live client's
        partition must come back with the same example count and label
        histogram as the checkpoint's. Excluded clients stay excluded.

        Returns:
            partition id -> node id of the live clients.

        Raises:
            RunFailedError: too few nodes, a failed handshake, or a live partition that no node holds now or
                that holds other data (one line).
        """
        live = self.live_clients()
        fresh = Membership(0, self.num_classes, self.histograms)
        fresh.connect(grid, cfg.replace(min_clients=len(live), join_timeout=cfg.join_timeout or timeout), timeout)
        for pid in live:
            old, new = self.clients[pid], fresh.clients.get(pid)
            if new is None:
                raise RunFailedError(f"resume: no node holds partition {pid} now")
            if new.num_examples != old.num_examples or not np.array_equal(new.label_histogram, old.label_histogram):
                raise RunFailedError(f"resume: node {new.node_id} holds other data for partition {pid} than the "
                                     f"checkpoint's ({new.num_examples} examples, not {old.num_examples})")
            old.node_id = new.node_id
        return {pid: self.clients[pid].node_id for pid in live}

    # ------------------------------------------------------------------ selection and exclusion
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

    def exclude(self, pid: int, reason: str, non_finite: bool = False) -> None:
        """Record client ``pid``'s exclusion (``reason``: ``"action: why"``; ``non_finite``: for NaN or
        infinite values)."""
        self.failed.add(pid)
        self.failure_reasons[pid] = reason
        if non_finite:
            self.non_finite.add(pid)

    def check_any_left(self, pid: int, reason: str) -> None:
        """After excluding ``pid`` for ``reason``: stop the run when no live client is left.

        Raises:
            DivergedError: every exclusion was for non-finite values (the run itself diverged).
            RunFailedError: otherwise.
        """
        if not self.live_clients():
            if self.failed <= self.non_finite:
                raise DivergedError(f"every client sent non-finite values (last: client {pid}, {reason})")
            raise RunFailedError("every client has failed")

    # ------------------------------------------------------------------ the clients' data sizes
    def local_steps(self, pid: int, cfg: RunConfig, batch: int | None = None) -> int:
        """Client ``pid``'s local iterations in one local round (E).

        ``local-iterations``; or, with ``local-epochs=N > 0``, ``N`` passes over
        its own partition of ``|D_k|`` examples: ``N·⌊|D_k|/b⌋`` steps of
        ``b = batch`` (default ``batch-size``) examples, at least ``N`` (the
        RingSFL authors' loaders drop the last partial batch, as sflower's
        sampler does). With unequal partitions the counts differ per client.
        """
        if not cfg.local_epochs:
            return cfg.local_iterations
        return cfg.local_epochs * max(1, self.clients[pid].num_examples // (batch or cfg.batch_size))

    def cohort_steps(self, members: Sequence[int], cfg: RunConfig) -> int:
        """Steps of a round that feeds every member in lockstep or in turn: the most of the
        members' :meth:`local_steps` (``local-iterations`` without ``local-epochs``).

        RingSFL's round (every step feeds one batch of every member; a member whose
        partition runs out starts its next pass) and vanilla SL's ``sl-order=batch``
        round, which RingSFL §6 counts as ``local_epoch_num × batch_num`` steps, a
        client's batches per epoch, not the cohort's."""
        return max(self.local_steps(int(p), cfg) for p in members)

    def aggregation_weight(self, pid: int, cfg: RunConfig) -> float:
        """Weight of a client's model in averaging: ``|D_k|`` (GAS eq. 10), or 1 with ``aggregation=uniform``."""
        return 1.0 if cfg.aggregation == "uniform" else float(self.clients[pid].num_examples)

    def summary(self) -> dict[str, Any]:
        """The clients' part of ``summary.json``: the excluded clients, why, and the handshake's example
        counts (with device-local data, the server's own partition sizes do not apply)."""
        return {"failed_clients": sorted(self.failed),
                "failure_reasons": {str(p): self.failure_reasons[p] for p in sorted(self.failure_reasons)},
                "client_examples": {str(p): self.clients[p].num_examples for p in sorted(self.clients)}}
