"""The loop shapes of sflower strategies: synchronous rounds and asynchronous reply handling.

docs/explanation/design.md §5. Both run inside :meth:`strategies.core.base.SFLStrategy.start`
(the lifecycle, stop rules and hooks are in :mod:`strategies.core.base`):

* :class:`SyncStrategy`: ``run_round(cohort)`` per global iteration, the
  cohort from :meth:`SyncStrategy.next_cohort`; a round's virtual time is
  its slowest member's;
* :class:`AsyncStrategy`: ``launch(pid)`` per free slot, ``on_reply(reply)``
  for each reply in virtual completion-time order; the subclass calls
  :meth:`SFLStrategy.end_global_iteration` when a global iteration is done.
"""

from __future__ import annotations

from strategies.core.base import SFLStrategy
from strategies.core.dispatcher import Reply
from strategies.core.errors import RunFailedError

__all__ = ["AsyncStrategy", "SyncStrategy"]


class SyncStrategy(SFLStrategy):
    """Synchronous strategies: select a cohort, run a round, repeat.

    Hooks, beside :class:`~strategies.core.base.SFLStrategy`'s:

    - ``run_round(cohort)`` (required): one global iteration with ``cohort`` (partition ids); virtual
      time passes in ``gather``, so a round's time is its slowest member's.
    - ``next_cohort()``: the clients of the next round (default: ``concurrency`` live clients drawn,
      seeded; RingSFL: every live client).
    """

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
    """Asynchronous strategies: handle replies one by one in clock order (the module docstring's loop shapes).

    Hooks, beside :class:`~strategies.core.base.SFLStrategy`'s:

    - ``launch(pid)`` (required): start a client's local work (send its first requests).
    - ``on_reply(reply)`` (required): handle one successful reply, in virtual completion-time order; call
      ``end_global_iteration()`` when a global iteration completes.
    """

    def run(self) -> None:
        """Keep ``concurrency`` clients busy; dispatch replies until a stop condition."""
        assert self.dispatcher is not None
        if not self.checkpoints.resumed:  # a resumed run's clients are at work already (the checkpoint's pending work)
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
