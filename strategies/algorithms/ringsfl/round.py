"""One RingSFL round: every client's batch relayed round the ring, hop by hop, then one step per node.

Algorithm 2 of the RingSFL paper on a :class:`~strategies.algorithms.ringsfl.schedule.RingSchedule`
(see :mod:`strategies.algorithms.ringsfl.strategy` for the relay through the server and its
timing). :class:`RingRound` builds every hop's request on the shared
builders (:class:`~strategies.core.requests.RequestBuilder`, typed configs with
``loss``, ``accumulate``, ``weight`` and ``model_slot``, tagged with
:class:`~fl_app.protocol.RelayTag`), and reacts to each reply in clock order;
it receives the strategy's ``send`` and ``receive`` as callbacks.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import torch
from flwr.app import ArrayRecord, RecordDict

from fl_app import protocol as P
from strategies.core.dispatcher import Reply, Request
from strategies.core.requests import RequestBuilder
from strategies.algorithms.ringsfl.schedule import RingSchedule


class RingBroken(Exception):
    """A ring member failed mid-round (or an injected failure struck); the round is lost."""

    def __init__(self, pids: Sequence[int], reason: str) -> None:
        super().__init__(f"clients {list(pids)} failed: {reason}")
        self.pids = list(pids)


class RingRound:
    """``steps`` ring steps from the global weights ``start`` (see the module docstring).

    Args:
        schedule: the ring, its paths and weights.
        requests: the shared request builder.
        settings: the optimizer fields of every message (:func:`~strategies.core.requests.optimizer_settings`
            at the run's lr); the step uses ``N·lr`` (the compensation after eq. 6) and the
            schedule's per-block multipliers (eq. 7).
        batch: examples per client batch.
        steps: ring steps in the round.
        start: the global model, sent with each origin's first forward.
    """

    def __init__(self, schedule: RingSchedule, requests: RequestBuilder, settings: dict[str, Any], batch: int,
                 steps: int, start: ArrayRecord) -> None:
        self.s, self.requests, self.settings = schedule, requests, settings
        self.batch, self.steps, self.start = batch, steps, start
        self.total = sum(schedule.lengths)
        #: configs per (origin, hop) and per node: built once, their records shared by every step's messages
        self._configs: dict[tuple[Any, ...], P.ActionConfig] = {}
        self.losses: list[float] = []

    def _slots(self, origin: int, hop: int) -> dict[str, Any]:
        """A hop's slot (the origin's own at hop 0, ``relay:<origin>`` after) on the node's one model."""
        if hop == 0:
            return {"slot": P.OWN_SLOT, "model_slot": ""}
        return {"slot": P.relay_slot(self.s.ring[origin]), "model_slot": P.OWN_SLOT}

    def _config(self, key: tuple[Any, ...]) -> P.ActionConfig:
        config = self._configs.get(key)
        if config is None:
            kind, origin, hop = key
            if kind == "step":
                lr = self.settings["lr"] * self.s.size
                config = P.StepConfig(slot=P.OWN_SLOT, start=0, end=self.total, return_weights=bool(hop),
                                      **{**self.settings, "lr": lr}, lr_scale=self.s.lr_scale[origin])
            elif kind == "fwd":
                _, a, b = self.s.paths[origin][hop]
                config = P.ForwardConfig(**self._slots(origin, hop), start=a, end=b, batch_size=self.batch,
                                         loss=hop == self.s.size - 1, accumulate=True,
                                         weight=self.s.weights[origin], **self.settings)
            else:
                config = P.BackwardConfig(**self._slots(origin, hop), accumulate=True, weight=self.s.weights[origin],
                                          **self.settings)
            self._configs[key] = config
        return config

    def hop(self, step: int, origin: int, hop: int, relayed: RecordDict | None) -> tuple[int, Request]:
        """Forward of ``origin``'s batch at its ``hop``-th node (input: the previous hop's reply, relayed as
        it is; the global weights with the first); the last hop computes the loss."""
        config = self._config(("fwd", origin, hop))
        weights = self.start if hop == 0 and step == 0 else None
        tag = P.RelayTag("fwd", step, origin, hop)
        return self.s.ring[self.s.paths[origin][hop][0]], self.requests.forward(
            config, weights=weights, relayed=relayed, tag=tag, d2d=True)

    def back(self, step: int, origin: int, hop: int, relayed: RecordDict) -> tuple[int, Request]:
        """Backward of the gradient in ``relayed`` (the next hop's reply) through ``origin``'s ``hop``-th
        node's range; accumulated with weight ``a_origin``."""
        j, a, b = self.s.paths[origin][hop]
        request = self.requests.backward(self._config(("bwd", origin, hop)), relayed, start=a, end=b,
                                         batch=self.batch, tag=P.RelayTag("bwd", step, origin, hop), d2d=True)
        return self.s.ring[j], request

    def step_requests(self, step: int) -> list[tuple[int, Request]]:
        """Every node applies its accumulated gradient; in the last step it returns its blended model."""
        final = int(step == self.steps - 1)
        return [(pid, self.requests.step(self._config(("step", j, final)), tag=P.RelayTag("step", step, j, 0)))
                for j, pid in enumerate(self.s.ring)]

    def run(self, send: Callable[[int, Request], Any], receive: Callable[[], Reply | None],
            check_loss: Callable[[torch.Tensor, str], None], failing: Sequence[int] = (), fail_at: int = -1,
            ) -> dict[int, dict[str, torch.Tensor]]:
        """Run the round; each member's blended model (eq. 4) by partition id.

        Args:
            send, receive: the strategy's (metered, timed) messaging.
            check_loss: raises when a loss is not finite.
            failing: members that fail (injected) at step ``fail_at`` (-1: none).

        Raises:
            RingBroken: a member failed; the caller discards the round.
        """
        n = self.s.size

        def begin(step: int) -> None:
            if step == fail_at:
                raise RingBroken(failing, f"injected failure at step {step + 1} of {self.steps}")
            for origin in range(n):
                send(*self.hop(step, origin, 0, None))

        states: dict[int, dict[str, torch.Tensor]] = {}
        done = 0
        begin(0)
        while len(states) < n:
            reply = receive()
            assert reply is not None
            if not reply.ok:
                raise RingBroken([reply.pid], f"{reply.action} failed")
            kind, step, origin, hop = reply.tag
            if kind == "step":
                if step == self.steps - 1:
                    states[reply.pid] = P.record_state(P.array_of(reply.content, P.WEIGHTS))
                continue
            if kind == "fwd" and hop < n - 1:
                send(*self.hop(step, origin, hop + 1, reply.content))
                continue
            if kind == "fwd":
                loss = P.replies.loss(reply.content)
                check_loss(torch.tensor(loss), "ring step")
                self.losses.append(loss)
            if hop > 0:
                send(*self.back(step, origin, hop - 1, reply.content))
                continue
            done += 1
            if done == n:  # every client's batch went round: every node steps, then the next batch
                done = 0
                for pid, request in self.step_requests(step):
                    send(pid, request)
                if step + 1 < self.steps:
                    begin(step + 1)
        return states

    @property
    def train_loss(self) -> float:
        """Mean loss of the round's batches (NaN before any)."""
        return float(np.mean(self.losses)) if self.losses else float("nan")
