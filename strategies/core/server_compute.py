"""The server's compute on the virtual clock: ``server-speed`` (docs/explanation/design.md §6, "Server compute").

:class:`ServerCompute` is a base of every split strategy (:class:`~strategies.core.split.SplitMixin`): the FLOPs
of the server-side blocks from the block profiles (:meth:`ServerCompute.server_flops`) and the one place that
charges them (:meth:`ServerCompute.charge_server`). At the default ``server-speed=0`` (free) nothing is charged and
no number changes.

Imports: ``strategies.core`` only (the clock and the timing it charges through are the strategy's).
"""

from __future__ import annotations

import math
from typing import Any


class ServerCompute:
    """Server FLOPs and their charge on the clock; a mixin of :class:`~strategies.core.base.SFLStrategy`
    subclasses (it reads their ``cfg``, ``clock``, ``timing``, ``costs``, ``cut`` and ``cuts``)."""

    #: virtual seconds the server computed (:meth:`charge_server`; 0 unless ``server-speed`` is set)
    server_virtual_s: float = 0.0

    def server_flops(self, batch: float, *, forward: bool = True, backward: bool = True) -> float:
        """FLOPs of the server-side blocks (``[cut, L)``, or the middle ``[c1, c2)`` of a U-shaped split) on
        ``batch`` samples: forward and/or backward (the backward with the input gradient), from the block
        profiles (:meth:`fl_app.learning.costs.BlockCosts.flops`; ``batch-parallel`` counts one sample). What
        :meth:`charge_server` charges for a server step."""
        start, end = self.cuts if self.cuts else (self.cut, self.costs.num_blocks)
        return self.costs.flops(start, end, batch, forward=forward, backward=backward)

    def charge_server(self, flops: float) -> float:
        """Charge ``flops`` FLOPs of server compute on the virtual clock; returns the seconds charged.

        The server is one queue (docs/explanation/design.md §6, "Server compute"): its work starts when it
        handles the reply that triggers it, or when its previous work ends, whichever is later, and
        takes ``flops / server-speed`` seconds (:meth:`Timing.server_seconds
        <strategies.core.clock.Timing.server_seconds>`). Since the event loop *is* the server, the clock
        moves forward by that much: requests sent after the work start after it, and replies due
        meanwhile wait to be handled until it ends (the clock never moves backwards). Clients go on
        with work already sent. At the default ``server-speed=0`` (free; and with the wall clock, where
        the work takes its real time) this charges 0 s and changes nothing.

        Every split strategy charges through here: :meth:`~strategies.core.split.SplitMixin.zo_server_update` and
        :meth:`~strategies.core.split.SplitMixin.feedback` (ZO), :meth:`~strategies.core.split.SyncSplitStrategy.serve` after each synchronous server iteration, and GAS's activation
        gradients, server steps and generation. The FL strategies (the server only averages) and RingSFL
        (no server-side blocks) charge nothing.
        """
        seconds = self.timing.server_seconds(flops)
        if seconds > 0:
            self.clock.advance_to(self.clock.now() + seconds)
            self.server_virtual_s += seconds
        return seconds

    def summary_dict(self) -> dict[str, Any]:
        """The base summary, plus ``server_virtual_s`` when ``server-speed`` is set (the default run's
        summary is unchanged)."""
        out = super().summary_dict()  # type: ignore[misc]
        if self.cfg.server_speed > 0:
            out["server_virtual_s"] = self.server_virtual_s
        return out
