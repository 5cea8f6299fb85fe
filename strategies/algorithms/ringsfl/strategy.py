"""RingSFL: clients in a ring relay each other's batches through segments of their own models.

Source: the RingSFL paper (Shen et al., "RingSFL: An Adaptive Split
Federated Learning Towards Taming Client Heterogeneity"), Algorithms 1-2 and
eqs. 4-7, with docs/explanation/design.md §7 for what the authors' code does where the
paper is vague.

**The ring.** The live clients, in partition order, form a ring
``u_0 → u_1 → … → u_{N-1} → u_0``. Client ``u_j`` has a propagation length
``L_j`` (blocks it runs per hop, ``Σ L_j = W``, the model's block count) and
an aggregation weight ``a_j = D_j / ΣD``. Every node keeps its own full
local model ``W_j`` (all ``W`` blocks).

**One step** (Algorithm 2, for every client ``i`` at once): client ``i``'s
batch runs through blocks ``[0, L_i)`` of ``W_i``, then blocks
``[L_i, L_i + L_{i+1})`` of ``W_{i+1}``, and so on round the ring
(:func:`~strategies.algorithms.ringsfl.schedule.ring_path`), so that the path of every client covers each of the ``W``
blocks exactly once. The node where the forward ends computes the mean
cross-entropy and back-propagates at once; the gradient travels the path
backwards; each node adds ``a_i·g`` to its accumulator for the blocks it ran.
When every path is done, every node steps its model once (eq. 4) with the
learning rate multiplied by ``N`` (the compensation after eq. 6) and, in v2,
each block's rate multiplied by its overlap count ``|U_{j,(b)}|`` (eq. 7,
:func:`~strategies.algorithms.ringsfl.schedule.overlap_counts`). A round is ``local-iterations`` steps; the global
model is then the plain average of the ``N`` blended models (eq. 6).

**Weighted or summed gradients.** The accumulator holds ``Σ a_i g_i`` and the
step uses ``N·η``, as the paper writes it. The authors' code adds the
gradients (``Σ g_i``) and steps at ``η``: the same update when the ``a_i`` are
equal (``a_i = 1/N``), as with their equal-size IID and label-sorted
partitions; with unequal partitions the paper's weighting keeps the global
update ``η Σ a_i g_i`` of eq. 6 (FedAvg's weighting).

**Relay through the server.** Flower has no node-to-node channel, so each
hop's activations (with the labels, so that the last node can compute the
loss) and gradients go through the ServerApp: every hop is one request to the
next node, queued per node by the dispatcher and tagged with
``(kind, step, origin position, hop)``. On the virtual clock a hop is charged
once, as a device-to-device transfer at ``d2d-rate`` Mbit/s
(:attr:`~strategies.core.dispatcher.Request.d2d_bits`), on the node that sends it.
The labels travel with the activations and the loss is computed where the
forward ends, instead of the output travelling back to ``u_i`` (two fewer
hops of ``B × classes`` floats than the paper). Each path through a node keeps
its input in its own slot (``relay:<origin>``) while all of them train the
node's one model (``model_slot`` = its own slot).

**Dropout** (Sec. 3.2.5). A node that fails mid-round (an error reply or a
timeout; it is excluded from the run) breaks the ring: the round's work is
discarded (nothing is aggregated; the nodes' accumulators and half-trained
models are reset by the global weights that start the next attempt), the
ring is rebuilt from the live nodes with recomputed lengths, and the round is
run again from the global model; the time spent is lost. ``drop-per-round=K``
injects ``K`` such failures per round (seeded): ``K`` random ring members fail
at a random step of the round and sit out the rest of it, so the round is
trained by the others and the model is the average of the participants, as in
the authors' experiment (which removes 2 random clients before each round);
they are back the next round.

**Modules.** The schedule (lengths, paths, overlap counts, injected
failures) is :mod:`strategies.algorithms.ringsfl.schedule`; one round's relay is
:class:`strategies.algorithms.ringsfl.round.RingRound`; this module holds the strategy.

**Lengths** come from ``ring-lengths`` (``"8:1:1:1:1"``: one per client,
summing to ``W``), or from the devices' compute speeds ``C_i``
(:func:`~strategies.algorithms.ringsfl.schedule.propagation_lengths`). When the ring shrinks, hand lengths are
rescaled over the survivors by the same rounding (6:1:1:1:1 without two of
the 1s gives 8:1:1, without the 6 and a 1 gives 4:3:3, as the authors' examples).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

import torch
from flwr.app import RecordDict

from fl_app import protocol as P
from fl_app.run.config import RunConfig
from fl_app.run.options import Option
from fl_app.models import BlockModel
from fl_app.learning.task import Task
from strategies.core.loops import SyncStrategy
from strategies.core.dispatcher import Request
from strategies.core.registry import register
from strategies.core.requests import optimizer_settings
from strategies.algorithms.ringsfl.round import RingBroken, RingRound
from strategies.algorithms.ringsfl.schedule import RingSchedule, check_ring, injected_failures, parse_lengths, ring_lengths

log = logging.getLogger("sflower")


@register
class RingSFL(SyncStrategy):
    """RingSFL (Shen et al.): a ring of clients relaying batches through segments of their own models.

    v1 steps each node's model with the accumulated ``Σ a_i g_i`` at ``N·η``
    (eqs. 4-6); v2 also multiplies each block's rate by its overlap count
    (eq. 7). See the module docstring for the step, the relay, the D2D
    timing and dropout.

    Every live client is in the ring (``concurrency`` is not used); a
    round is ``local-iterations`` ring steps, i.e. that many batches of each
    client (the paper's 2 local epochs of MNIST/5 at B = 64 are 375).

    Extra metric columns: ``ring_size`` (participants of the last round),
    ``ring_rebuilds`` (rings rebuilt after failures, cumulative),
    ``train_loss`` (mean loss of the last round's batches) and ``d2d_bytes``
    (relay traffic, each hop counted once, cumulative).
    """

    name = "ringsfl"
    ushaped_refusal = ("it has no server-side model: each batch is relayed client to client round the ring with "
                       "its labels, to the node that computes the loss (RingSFL Sec. 3)")
    run_with = ("preset=ringsfl-reference (the authors' code: plain SGD at lr 0.02, which eq. 7's v2 "
                "multiplier assumes; v1 and v2 alike; add partition=label-sorted for their non-IID split)")
    options = (
        Option("ring-lengths", "", "propagation lengths L_0:...:L_{N-1}, one per client, summing to the model's "
               "block count (empty: from device compute speeds, L_i = C_i/ΣC·W)", source="RingSFL eq. 9"),
        Option("ring-version", 2, "1: RingSFLv1; 2: RingSFLv2, an overlapping block's lr times its overlap count (eq. 7)",
               (1, 2), source="RingSFL eqs. 6-7"),
        Option("d2d-rate", 135.0, "rate of the D2D links between ring neighbours, Mbit/s (the paper's 135)", above=0,
               source="RingSFL §6"),
        Option("drop-per-round", 0, "K random ring members fail at a random step of each round (seeded); "
               "the ring is rebuilt and the round rerun without them", at_least=0),
    )

    def __init__(self, cfg: RunConfig, task: Task, **kwargs: Any) -> None:
        self.check_config(cfg, task)
        super().__init__(cfg, task, **kwargs)
        self.d2d_bps = float(cfg.d2d_rate) * 1e6
        self.ring: list[int] = []
        self.lengths: list[int] = []
        self.rebuilds = 0
        self.d2d_bytes = 0
        self.train_loss = float("nan")
        #: pid -> state_dict of each participant's blended model after the last round (eq. 4)
        self.blended: dict[int, dict[str, torch.Tensor]] = {}

    @classmethod
    def check_config(cls, cfg: RunConfig, task: Task) -> None:
        """Lengths, ring size, failures and optimiser against the model (:func:`~strategies.algorithms.ringsfl.schedule.check_ring`)."""
        check_ring(cfg, task)

    def summary(self) -> None:
        """Log the strategy and its main settings, and one warning for v2 under momentum.

        Eq. 7's overlap multiplier scales the learning rate of a block that
        ``k`` paths train by ``k``. The authors derived it for plain SGD: their
        code steps once per path, with no momentum. Under momentum the scaled
        steps accumulate in the momentum buffer, which eq. 7 does not account for.
        """
        c = self.cfg
        if c.ring_version == 2 and c.momentum > 0:
            log.warning("ringsfl v2: eq. 7's overlap multiplier assumes plain SGD (the authors step once per path, "
                        "with no momentum), but momentum=%g; the authors run momentum=0 lr=0.02", c.momentum)
        per_round = f"{c.local_epochs} local epochs" if c.local_epochs else f"{c.local_iterations} steps"
        log.info("ringsfl v%d: %d clients, lengths %s, %d global iterations, %s per round, B=%d, lr=%g, "
                 "D2D %g Mbit/s, %d failures per round", c.ring_version, c.num_clients, c.ring_lengths or "from speeds",
                 c.global_iterations, per_round, c.batch_size, c.lr, c.d2d_rate, c.drop_per_round)

    def initialize(self) -> None:
        """The global model ``W^t``."""
        super().initialize()
        self.model = self.task.build_model()

    def global_model(self) -> BlockModel:
        """The global model: the plain average of the last round's blended models (eq. 6)."""
        return self.model

    def compute_shares(self, ring: Sequence[int]) -> list[float]:
        """The compute speeds ``C_i`` (FLOP/s) of the ring members, from the timing model: ``F / t_i``,
        ``t_i`` the expected time of a full-model forward and backward pass on a batch (``F`` FLOPs, no
        transfer). With a timing that charges nothing (the wall clock), all speeds are equal."""
        flops = self.costs.flops(0, self.costs.num_blocks, self.cfg.batch_size, backward=True)
        seconds = [self.expected_duration(p, Request(P.TRAIN_FORWARD, RecordDict(), flops)) for p in ring]
        if not all(t > 0 for t in seconds):
            return [1.0] * len(ring)
        return [flops / t for t in seconds]

    def next_cohort(self) -> list[int]:
        """Every live client is in the ring (no draw)."""
        return self.live_clients()

    def run_round(self, cohort: list[int]) -> None:
        """One global iteration (Algorithm 1): train the ring, rebuilding it after failures; aggregate."""
        c = self.cfg
        out, fail_at = injected_failures(c.seed, c.drop_per_round, self.global_iteration, cohort,
                                         self.cohort_steps(cohort))
        inject = bool(out)
        while True:
            live = self.live_clients()
            ring = live if inject else ([p for p in live if p not in out] or live)
            try:
                states = self.train_ring(ring, out if inject else [], fail_at if inject else -1)
                break
            except RingBroken as err:
                log.info("ringsfl: round %d: %s; ring rebuilt from the live clients", self.global_iteration + 1, err)
                for pid in ring:
                    self.cancel(pid)
                self.rebuilds += 1
                inject = False
        self.blended = states
        self.model.load_state_dict(self.aggregate_models([states[p] for p in ring], [1.0] * len(ring)))  # eq. 6
        self.server_updates += 1

    def _send(self, pid: int, request: Request) -> None:
        self.d2d_bytes += int(request.d2d_bits // 8)
        self.send(pid, request)

    def train_ring(self, ring: list[int], failing: Sequence[int], fail_at: int) -> dict[int, dict[str, torch.Tensor]]:
        """``local-iterations`` ring steps (:class:`~strategies.algorithms.ringsfl.round.RingRound`) from the global model;
        each member's blended model. Raises :class:`RingBroken` when a member fails."""
        c = self.cfg
        self.ring = list(ring)
        self.lengths = ring_lengths(ring, parse_lengths(c.ring_lengths), self.costs.num_blocks, self.compute_shares)
        schedule = RingSchedule.build(ring, self.lengths, [self.clients[p].num_examples for p in ring], c.ring_version)
        round_ = RingRound(schedule, self.requests, optimizer_settings(c, c.lr), c.batch_size, self.cohort_steps(ring),
                           P.state_record(self.model.state_dict()))
        states = round_.run(self._send, self.receive, self.check_loss, failing, fail_at)
        self.train_loss = round_.train_loss
        return states

    def extra_metrics(self) -> dict[str, float]:
        """``ring_size``, ``ring_rebuilds``, ``train_loss`` and ``d2d_bytes`` (see the class docstring)."""
        return {"ring_size": len(self.ring), "ring_rebuilds": self.rebuilds, "train_loss": self.train_loss,
                "d2d_bytes": self.d2d_bytes}

    def summary_dict(self) -> dict[str, Any]:
        """The base summary plus the last ring and its propagation lengths."""
        out = super().summary_dict()
        out["ring"] = list(self.ring)
        out["ring_lengths"] = ":".join(str(v) for v in self.lengths)
        return out
