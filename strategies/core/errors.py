"""Why a run stops early: divergence and failure, and the check of a training loss."""

from __future__ import annotations

import torch


#: A failure reason that contains this (any case) means the client's node is gone, not broken: Flower's
#: SuperLink says "Node Unavailable" when a SuperNode misses its heartbeats, and the session transport
#: says it when a node's stream breaks. Such a client may be re-admitted after a fresh handshake
#: (:meth:`strategies.core.membership.Membership.readmit`); any other exclusion is final.
NODE_UNAVAILABLE = "node unavailable"


class DivergedError(RuntimeError):
    """Training produced a non-finite loss; the run stops, metrics are kept."""


class RunFailedError(RuntimeError):
    """The run cannot go on (no live clients, handshake failure)."""


class NodeLostError(RunFailedError):
    """A client's node is gone (:data:`NODE_UNAVAILABLE`) in a run with ``node-loss=rollback``: the run goes back
    to its last checkpoint instead of excluding the client.

    Attributes:
        partition_id: the client whose node was lost.
    """

    def __init__(self, partition_id: int, reason: str) -> None:
        super().__init__(f"client {partition_id}'s node was lost ({reason})")
        self.partition_id = partition_id


def check_loss(loss: torch.Tensor, where: str) -> None:
    """Raise :class:`DivergedError` when a training loss (any shape) is not finite; ``where`` names the step."""
    if not torch.isfinite(loss).all():
        raise DivergedError(f"non-finite training loss ({float(loss)}) in {where}")
