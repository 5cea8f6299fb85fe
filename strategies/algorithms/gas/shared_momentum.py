"""One client-side SGD momentum buffer that the server holds for all clients.

The GAS authors' code (``eejiarong/GAS``, ``GAS_main.py``) steps every
client's client-side model with one ``torch.optim.SGD`` (momentum 0.9), so
its momentum buffer mixes all clients' gradients in the order of their
iterations, across local rounds. A distributed run cannot share an object
between nodes, so here the server holds the buffer ``m``:

1. with each activation gradient, client k is sent ``m`` (the
   :data:`~fl_app.protocol.OPTIMIZER` record of its ``train.backward``);
2. it steps with it, as torch's SGD: ``m_k = β·m_sent + d_k`` with ``d_k``
   its clipped gradient plus weight decay, ``w ← w − lr·m_k``, and returns
   ``m_k``;
3. the server folds the client's part in: ``m ← β·m + (m_k − β·m_sent)``.

When iterations do not overlap, ``m_sent`` is the current ``m`` and step 3
sets ``m = m_k``: the authors' single optimizer exactly. When they overlap,
client k stepped with an ``m`` that lacks the gradients folded in meanwhile
(a stale buffer, as its model is stale), and none is lost. The buffer
travels both ways: one client-side model's worth of bits each.
"""

from __future__ import annotations

import dataclasses

import torch
from flwr.app import ArrayRecord

from fl_app import protocol as P
from fl_app.run.config import RunConfig
from fl_app.run.options import Option
from fl_app.run.errors import ConfigError
from strategies.core.dispatcher import Request

#: The ``client-momentum`` option (GAS).
CLIENT_MOMENTUM_OPTION = Option(
    "client-momentum", "own", "client-side SGD momentum: each client's own, from zero every local round (own), "
    "or one buffer the server holds for all clients, as the GAS authors' single client optimizer (shared)",
    ("own", "shared"))


def check_shared_momentum(cfg: RunConfig) -> None:
    """``client-momentum=shared`` shares an SGD momentum buffer between first-order clients.

    Raises:
        ConfigError: ``client-momentum=shared`` with ZO clients or with AdamW.
    """
    if cfg.get("client-momentum") == "shared" and (cfg.get("client-optimizer") == "zo" or cfg.optimizer != "sgd"):
        raise ConfigError("client-momentum=shared needs SGD clients (client-optimizer=sgd optimizer=sgd): "
                          "it shares an SGD momentum buffer")


class SharedMomentum:
    """The server's momentum buffer ``m`` (parameter name → tensor) and what each client was sent.

    Args:
        beta: SGD momentum β (the run's ``momentum``).
        device: where ``m`` lives (the server's device).
    """

    def __init__(self, beta: float, device: torch.device | str = "cpu") -> None:
        self.beta = float(beta)
        self.device = torch.device(device)
        #: m, empty until the first client returns a buffer (torch's SGD then starts from d_k)
        self.buffer: dict[str, torch.Tensor] = {}
        #: the m each client with a step in flight was sent
        self.sent: dict[int, dict[str, torch.Tensor]] = {}

    def attach(self, pid: int, request: Request, bits: float) -> Request:
        """Client ``pid``'s ``train.backward`` carrying ``m`` down; its reply carries ``m_k`` back,
        charged as ``bits`` more upload (one client-side model, :meth:`BlockCosts.param_bits`)."""
        request.content[P.OPTIMIZER] = P.state_record(self.buffer)
        self.sent[pid] = self.buffer
        return dataclasses.replace(request, bits_up=request.bits_up + bits)

    def fold(self, pid: int, returned: ArrayRecord) -> None:
        """``m ← β·m + (m_k − β·m_sent)`` for client ``pid``'s returned buffer ``m_k``."""
        sent = self.sent.pop(pid, {})
        new = {}
        for name, m_k in P.record_state(returned).items():
            m_k = m_k.to(self.device)
            old, base = self.buffer.get(name), sent.get(name)
            d = m_k if base is None else m_k - self.beta * base
            new[name] = d if old is None else self.beta * old + d
        self.buffer = new

    def forget(self, pid: int) -> None:
        """Client ``pid`` failed: its step never comes back."""
        self.sent.pop(pid, None)
