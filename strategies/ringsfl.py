"""RingSFL: clients in a ring relay each other's batches through segments of their own models.

Source: ``papers/ringsfl.txt`` (Shen et al., "RingSFL: An Adaptive Split
Federated Learning Towards Taming Client Heterogeneity"), Algorithms 1-2 and
eqs. 4-7, with DESIGN.md section 7 for what the authors' code does where the
paper is vague.

**The ring.** The live clients, in partition order, form a ring
``u_0 → u_1 → … → u_{N-1} → u_0``. Client ``u_j`` has a propagation length
``L_j`` (blocks it runs per hop, ``Σ L_j = W``, the model's block count) and
an aggregation weight ``a_j = D_j / ΣD``. Every node keeps its own full
local model ``W_j`` (all ``W`` blocks).

**One step** (Algorithm 2, for every client ``i`` at once): client ``i``'s
batch runs through blocks ``[0, L_i)`` of ``W_i``, then blocks
``[L_i, L_i + L_{i+1})`` of ``W_{i+1}``, and so on round the ring
(:func:`ring_path`), so that the path of every client covers each of the ``W``
blocks exactly once. The node where the forward ends computes the mean
cross-entropy and back-propagates at once; the gradient travels the path
backwards; each node adds ``a_i·g`` to its accumulator for the blocks it ran.
When every path is done, every node steps its model once (eq. 4) with the
learning rate multiplied by ``N`` (the compensation after eq. 6) and, in v2,
each block's rate multiplied by its overlap count ``|U_{j,(b)}|`` (eq. 7,
:func:`overlap_counts`). A round is ``local-iterations`` steps; the global
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
(:attr:`~strategies.dispatcher.Request.d2d_bits`), on the node that sends it.
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

**Lengths** come from ``ring-lengths`` (``"8:1:1:1:1"``: one per client,
summing to ``W``), or from the devices' compute speeds ``C_i``
(:func:`propagation_lengths`). When the ring shrinks, hand lengths are
rescaled over the survivors by the same rounding (6:1:1:1:1 without two of
the 1s gives 8:1:1, without the 6 and a 1 gives 4:3:3, as the authors' examples).
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
from flwr.app import ConfigRecord, RecordDict

from fl_app import protocol as P
from fl_app.config import Option, RunConfig
from fl_app.errors import ConfigError
from fl_app.models import BlockModel
from fl_app.task import Task
from strategies.aggregation import weighted_average
from strategies.base import SFLStrategy
from strategies.dispatcher import Request
from strategies.registry import register

log = logging.getLogger("sflower")

#: Seed stream of the injected failures (``drop-per-round``).
STREAM_RING_DROP = 37


def parse_lengths(text: str) -> tuple[int, ...]:
    """``"8:1:1:1:1"`` -> ``(8, 1, 1, 1, 1)``; ``""`` -> ``()``.

    Raises:
        ConfigError: an entry is not an integer >= 1.
    """
    text = text.strip()
    if not text:
        return ()
    out = []
    for part in text.split(":"):
        try:
            value = int(part.strip())
        except ValueError:
            raise ConfigError(f"ring-lengths='{text}': '{part}' is not an integer (write e.g. 8:1:1:1:1)") from None
        if value < 1:
            raise ConfigError(f"ring-lengths='{text}': every propagation length must be >= 1")
        out.append(value)
    return tuple(out)


def propagation_lengths(shares: Sequence[float], total: int) -> list[int]:
    """RingSFL's propagation lengths ``L_i = C_i / ΣC · W`` (Sec. 3.3, eq. 3), as integers.

    ``share_i / Σ share · total`` rounded by largest remainder (ties to the
    lower index), then every length raised to at least 1, each unit taken
    from the longest (lowest index among equals); so ``Σ L_i = total``.

    Args:
        shares: ``N`` positive weights, e.g. compute speeds ``C_i`` in FLOP/s
            or the hand lengths of the clients left in a ring.
        total: the block count ``W``.

    Returns:
        ``N`` integers ``>= 1`` summing to ``total``; e.g. speeds 2:1:1 on
        ``W = 12`` give ``[6, 3, 3]``, 1:1:1 on 10 give ``[4, 3, 3]``.

    Raises:
        ConfigError: no shares, a share that is not positive and finite, or
            more shares than blocks.
    """
    n = len(shares)
    if n == 0:
        raise ConfigError("a ring needs at least one client")
    if n > total:
        raise ConfigError(f"a ring of {n} clients needs at least {n} model blocks, the model has {total}")
    if not all(s > 0 and math.isfinite(s) for s in shares):
        raise ConfigError(f"propagation-length shares must be positive and finite, got {list(shares)}")
    s_total = float(sum(shares))
    ideal = [float(s) / s_total * total for s in shares]
    lengths = [int(math.floor(x)) for x in ideal]
    order = sorted(range(n), key=lambda i: (-(ideal[i] - lengths[i]), i))
    for i in order[:total - sum(lengths)]:
        lengths[i] += 1
    for i in range(n):
        while lengths[i] < 1:
            donor = min(range(n), key=lambda j: (-lengths[j], j))
            lengths[donor] -= 1
            lengths[i] += 1
    return lengths


def ring_path(lengths: Sequence[int], origin: int) -> list[tuple[int, int, int]]:
    """The path of the client at ring position ``origin`` (Algorithm 2, lines 1-6).

    Its batch visits positions ``origin, origin+1, …`` (mod ``N``); position
    ``j`` runs blocks ``[l, l + L_j)`` of its own model, where ``l`` is the sum
    of the lengths of the positions visited before (``l_stop + 1``).

    Returns:
        ``N`` hops ``(position, start, end)``: block ranges, ``end``
        exclusive, covering ``[0, Σ L)`` in order.
    """
    n = len(lengths)
    out, start = [], 0
    for k in range(n):
        j = (origin + k) % n
        out.append((j, start, start + lengths[j]))
        start += lengths[j]
    return out


def overlap_counts(lengths: Sequence[int]) -> list[list[int]]:
    """``|U_{j,(b)}|``: how many client paths cross block ``b`` of node ``j``'s model (eq. 7).

    Fig. 5 (2 clients, lengths 2:4 on 6 blocks): node 0 ``[1, 1, 0, 0, 1, 1]``,
    node 1 ``[1, 1, 2, 2, 1, 1]`` (its blocks 2-3 overlap). Every block has
    ``N`` crossings over all nodes together.

    Returns:
        ``N`` lists of ``W = Σ L`` non-negative integers, by ring position.
    """
    n, total = len(lengths), int(sum(lengths))
    counts = [[0] * total for _ in range(n)]
    for origin in range(n):
        for j, a, b in ring_path(lengths, origin):
            for block in range(a, b):
                counts[j][block] += 1
    return counts


class RingBroken(Exception):
    """A ring member failed mid-round (or an injected failure struck); the round is lost."""

    def __init__(self, pids: Sequence[int], reason: str) -> None:
        super().__init__(f"clients {list(pids)} failed: {reason}")
        self.pids = list(pids)


@register
class RingSFL(SFLStrategy):
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
    run_with = ("preset=ringsfl-reference (the authors' code: plain SGD at lr 0.02, which eq. 7's v2 "
                "multiplier assumes; v1 and v2 alike; add partition=label-sorted for their non-IID split)")
    options = (
        Option("ring-lengths", "", "propagation lengths L_0:...:L_{N-1}, one per client, summing to the model's "
               "block count (empty: from device compute speeds, L_i = C_i/ΣC·W)"),
        Option("ring-version", 2, "1: RingSFLv1; 2: RingSFLv2, an overlapping block's lr times its overlap count (eq. 7)"),
        Option("d2d-rate", 135.0, "rate of the D2D links between ring neighbours, Mbit/s (the paper's 135)"),
        Option("drop-per-round", 0, "K random ring members fail at a random step of each round (seeded); "
               "the ring is rebuilt and the round rerun without them"),
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

    # ------------------------------------------------------------------ configuration
    @classmethod
    def check_config(cls, cfg: RunConfig, task: Task) -> None:
        """Lengths, ring size, failures and optimiser against the model's ``W`` blocks.

        Raises:
            ConfigError: more clients than blocks; hand lengths not one per
                client or not summing to ``W``; ``drop-per-round`` leaving no
                client; an optimiser other than SGD.
        """
        total = len(task.profiles)
        n = cfg.num_clients
        if n > total:
            raise ConfigError(f"ringsfl: {n} clients need at least {n} model blocks; {task.model_name} has {total}")
        hand = parse_lengths(cfg.ring_lengths)
        if hand and len(hand) != n:
            raise ConfigError(f"ring-lengths='{cfg.ring_lengths}' has {len(hand)} entries for {n} clients")
        if hand and sum(hand) != total:
            raise ConfigError(f"ring-lengths='{cfg.ring_lengths}' sums to {sum(hand)}; {task.model_name} has "
                              f"{total} blocks")
        if cfg.drop_per_round >= n:
            raise ConfigError(f"drop-per-round={cfg.drop_per_round} leaves no client of {n} in the ring")
        if cfg.get("optimizer") != "sgd":
            raise ConfigError(f"ringsfl trains with SGD (eqs. 4-7), not optimizer={cfg.get('optimizer')}")

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

    @property
    def num_blocks(self) -> int:
        """``W``, the model's block count."""
        return self.costs.num_blocks

    def compute_shares(self, ring: Sequence[int]) -> list[float]:
        """The compute speeds ``C_i`` (FLOP/s) of the ring members, from the timing model.

        ``C_i = F / t_i`` with ``t_i`` the expected time of a full-model
        forward and backward pass on a batch (``F`` FLOPs, no transfer). With
        a timing that charges nothing (the wall clock), all speeds are equal.
        """
        flops = self.costs.flops(0, self.num_blocks, self.cfg.batch_size, backward=True)
        seconds = [self.expected_duration(p, Request(P.TRAIN_FORWARD, RecordDict(), flops)) for p in ring]
        if not all(t > 0 for t in seconds):
            return [1.0] * len(ring)
        return [flops / t for t in seconds]

    def ring_lengths(self, ring: Sequence[int]) -> list[int]:
        """``L`` for a ring (partition ids in ring order): the hand lengths, rescaled over the
        members when the ring has lost some (:func:`propagation_lengths`), or from compute speeds."""
        hand = parse_lengths(self.cfg.ring_lengths)
        if hand:
            if len(ring) == len(hand):
                return list(hand)
            return propagation_lengths([hand[p] for p in ring], self.num_blocks)
        return propagation_lengths(self.compute_shares(ring), self.num_blocks)

    def injected_failures(self, members: Sequence[int]) -> tuple[list[int], int]:
        """``drop-per-round``: the members that fail this round and the step at which they do.

        Drawn from ``(seed, STREAM_RING_DROP, global iteration)``; at least one
        member is left.

        Returns:
            ``(failing partition ids ascending, step index in [0, local-iterations))``,
            or ``([], -1)`` when none fail.
        """
        k = min(self.cfg.drop_per_round, len(members) - 1)
        if k <= 0:
            return [], -1
        rng = np.random.default_rng([self.cfg.seed, STREAM_RING_DROP, self.global_iteration])
        chosen = sorted(int(members[i]) for i in rng.choice(len(members), size=k, replace=False))
        return chosen, int(rng.integers(0, self.cohort_steps(members)))

    # ------------------------------------------------------------------ loop
    def run(self) -> None:
        """Rounds of the whole live ring until a stop condition holds."""
        while not self.should_stop():
            self.between_rounds()
            self.run_round()
            self.end_global_iteration()

    def run_round(self) -> None:
        """One global iteration (Algorithm 1): train the ring, rebuilding it after failures; aggregate."""
        out, fail_at = self.injected_failures(self.live_clients())
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
        self.model.load_state_dict(weighted_average([states[p] for p in ring], [1.0] * len(ring)))  # eq. 6
        self.server_updates += 1

    def _send(self, pid: int, request: Request) -> None:
        self.d2d_bytes += int(request.d2d_bits // 8)
        self.send(pid, request)

    def train_ring(self, ring: list[int], failing: Sequence[int], fail_at: int) -> dict[int, dict[str, torch.Tensor]]:
        """``local-iterations`` ring steps from the global model; returns each member's blended model.

        Args:
            ring: partition ids in ring order.
            failing: members that fail (injected) at step ``fail_at`` (-1: none).

        Raises:
            RingBroken: a member failed; the caller discards the round.
        """
        n, total, c = len(ring), self.num_blocks, self.cfg
        self.ring, self.lengths = list(ring), self.ring_lengths(ring)
        paths = [ring_path(self.lengths, i) for i in range(n)]
        data = [self.clients[p].num_examples for p in ring]
        weight = [d / sum(data) for d in data]  # a_i = D_i / ΣD
        scale = overlap_counts(self.lengths) if c.ring_version == 2 else None
        opt = {"momentum": c.momentum, "weight_decay": c.weight_decay, "clip_norm": c.clip_norm}
        steps, batch = self.cohort_steps(ring), c.batch_size
        start = P.state_record(self.model.state_dict())

        # What a hop sends does not depend on the step: built once per (origin, hop). The config
        # records are sent again in every step (a message's content is only read).
        @functools.cache
        def hop_plan(origin: int, hop: int) -> tuple[int, ConfigRecord, float, float]:
            j, a, b = paths[origin][hop]
            last = hop == n - 1
            cfg = P.ForwardConfig(slot=P.OWN_SLOT if hop == 0 else P.relay_slot(ring[origin]),
                                  model_slot="" if hop == 0 else P.OWN_SLOT, start=a, end=b, batch_size=batch,
                                  loss=last, accumulate=True, weight=weight[origin], lr=c.lr, **opt)
            flops = self.costs.flops(a, b, batch, backward=last)
            d2d = (self.costs.activation_bits(a, batch, labels=False) if a > 0 else 0.0) if last \
                else self.costs.activation_bits(b, batch)
            return ring[j], cfg.to_record(), flops, d2d

        @functools.cache
        def back_plan(origin: int, hop: int) -> tuple[int, ConfigRecord, float, float]:
            j, a, b = paths[origin][hop]
            cfg = P.BackwardConfig(slot=P.OWN_SLOT if hop == 0 else P.relay_slot(ring[origin]),
                                   model_slot="" if hop == 0 else P.OWN_SLOT, accumulate=True,
                                   weight=weight[origin], lr=c.lr, **opt)
            d2d = self.costs.activation_bits(a, batch, labels=False) if a > 0 else 0.0
            return ring[j], cfg.to_record(), self.costs.flops(a, b, batch, forward=False, backward=True), d2d

        @functools.cache
        def step_plan(j: int, final: bool) -> tuple[ConfigRecord, float]:
            lr_scale = tuple(float(max(s, 1)) for s in scale[j]) if scale is not None else ()
            cfg = P.StepConfig(slot=P.OWN_SLOT, start=0, end=total, return_weights=final, lr=c.lr * n,
                               lr_scale=lr_scale, **opt)
            return cfg.to_record(), (self.costs.param_bits(0, total) if final else 0.0)

        def hop_request(step: int, origin: int, hop: int, relayed: RecordDict | None) -> None:
            """Forward of ``origin``'s batch at its ``hop``-th node (input: the previous hop's reply, whose
            activation and label records are relayed as they are); the last one computes the loss."""
            pid, cfg, flops, d2d = hop_plan(origin, hop)
            content = RecordDict({P.CONFIG: cfg})
            if hop == 0 and step == 0:
                content[P.WEIGHTS] = start  # the global model, downloaded at the start of the round
            if relayed is not None:
                content[P.ACTIVATIONS] = P.array_of(relayed, P.ACTIVATIONS)
                content[P.LABELS] = P.array_of(relayed, P.LABELS)
            self._send(pid, Request(P.TRAIN_FORWARD, content, flops, bits_down=None if hop == 0 else 0.0,
                                    tag=("fwd", step, origin, hop), d2d_bits=d2d))

        def back_request(step: int, origin: int, hop: int, relayed: RecordDict) -> None:
            """Backward of the gradient in ``relayed`` (the next hop's reply) through ``origin``'s
            ``hop``-th node's range; accumulated with weight ``a_origin``."""
            pid, cfg, flops, d2d = back_plan(origin, hop)
            content = RecordDict({P.CONFIG: cfg, P.GRADIENT: P.array_of(relayed, P.GRADIENT)})
            self._send(pid, Request(P.TRAIN_BACKWARD, content, flops, bits_down=0.0,
                                    tag=("bwd", step, origin, hop), d2d_bits=d2d))

        def step_requests(step: int) -> None:
            """Every node applies its accumulated gradient: lr·N (eq. 6), v2 per-block overlap counts (eq. 7)."""
            final = step == steps - 1
            for j, pid in enumerate(ring):
                cfg, bits = step_plan(j, final)
                self._send(pid, Request(P.TRAIN_STEP, RecordDict({P.CONFIG: cfg}), 0.0, bits,
                                        tag=("step", step, j, 0)))

        def begin(step: int) -> None:
            if step == fail_at:
                raise RingBroken(failing, f"injected failure at step {step + 1} of {steps}")
            for origin in range(n):
                hop_request(step, origin, 0, None)

        losses: list[float] = []
        states: dict[int, dict[str, torch.Tensor]] = {}
        done = 0
        begin(0)
        while len(states) < n:
            reply = self.receive()
            assert reply is not None
            if not reply.ok:
                raise RingBroken([reply.pid], f"{reply.action} failed")
            kind, step, origin, hop = reply.tag
            if kind == "step":
                if step == steps - 1:
                    states[reply.pid] = P.record_state(P.array_of(reply.content, P.WEIGHTS))
                continue
            path_done = False
            if kind == "fwd" and hop < n - 1:
                hop_request(step, origin, hop + 1, reply.content)
            elif kind == "fwd":
                loss = float(P.config_of(reply.content, P.INFO)[P.INFO_LOSS])
                self.check_loss(torch.tensor(loss), "ring step")
                losses.append(loss)
                if hop > 0:
                    back_request(step, origin, hop - 1, reply.content)
                else:
                    path_done = True
            elif hop > 0:
                back_request(step, origin, hop - 1, reply.content)
            else:
                path_done = True
            if path_done:
                done += 1
                if done == n:  # every client's batch went round: every node steps, then the next batch
                    done = 0
                    step_requests(step)
                    if step + 1 < steps:
                        begin(step + 1)
        self.train_loss = float(np.mean(losses)) if losses else float("nan")
        return states

    # ------------------------------------------------------------------ outputs
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
