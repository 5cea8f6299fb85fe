"""Flower's ``Strategy`` with its per-round methods stubbed: the class every sflower strategy derives from.

**Why subclass Flower's** ``Strategy``. sflower strategies run their own
event-driven loops, which Flower's per-round ``configure_*``/``aggregate_*``
methods cannot express, so those four are stubbed here (they raise). We keep
the subclass rather than an adapter because Flower's ServerApp contract is
``strategy.start(grid, ...) -> Result``, which
:meth:`strategies.core.base.SFLStrategy.start` implements directly: a strategy is
usable wherever Flower expects its ``Strategy`` (``isinstance`` checks, type
hints, ``flwr run``), with one object for one lifecycle. An adapter would add
a second object with the same lifecycle and its own ``start``, to save four
three-line stubs.
"""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import ArrayRecord, ConfigRecord, Message, MetricRecord
from flwr.serverapp import Grid
from flwr.serverapp.strategy import Strategy


class EventLoopStrategy(Strategy):
    """A Flower ``Strategy`` whose ``start`` runs its own loop; the per-round methods raise (module docstring)."""

    def configure_train(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Unused: sflower strategies run their own loop in ``start``."""
        raise NotImplementedError("sflower strategies run their own event loop in start()")

    def aggregate_train(self, server_round: int, replies: Iterable[Message]) -> tuple[ArrayRecord | None, MetricRecord | None]:
        """Unused: see :meth:`configure_train`."""
        raise NotImplementedError("sflower strategies run their own event loop in start()")

    def configure_evaluate(self, server_round: int, arrays: ArrayRecord, config: ConfigRecord, grid: Grid) -> Iterable[Message]:
        """Unused: evaluation is centralised (``SFLStrategy.evaluate_global``)."""
        raise NotImplementedError("sflower strategies evaluate centrally")

    def aggregate_evaluate(self, server_round: int, replies: Iterable[Message]) -> MetricRecord | None:
        """Unused: see :meth:`configure_evaluate`."""
        raise NotImplementedError("sflower strategies evaluate centrally")
