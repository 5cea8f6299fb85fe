"""The ``fast=true`` SuperNode launcher: ``flower-supernode`` with its idle sleeps capped.

Started as ``python -m simulation.deploy supernode [flower-supernode args]``
(:mod:`simulation.deploy.__main__`) by :meth:`simulation.deploy.cluster.Deployment.start_node`.
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Sequence

from simulation.deploy.cluster import FAST_POLL_S


def supernode_main(argv: Sequence[str]) -> None:
    """Start ``flower-supernode ARGV`` with its idle sleeps capped at :data:`FAST_POLL_S` seconds.

    Flower 1.41's SuperNode sleeps a hard-coded 3 s whenever a pull finds no
    message (``flwr.supernode.start_client_internal``), and 0.5 s between
    checks for a ClientApp's reply; in a split exchange the node is idle
    between every pair of messages, so this sleep adds up to 3 s to each
    exchange. This launcher replaces that module's ``time`` with one whose
    ``sleep`` is capped, then runs the SuperNode unchanged. Nothing else in
    Flower is touched. The cap is ``SFLOWER_SUPERNODE_POLL_S`` (default
    :data:`FAST_POLL_S`).
    """
    import types

    import flwr.supernode.start_client_internal as sci

    cap = float(os.environ.get("SFLOWER_SUPERNODE_POLL_S", FAST_POLL_S))
    real_sleep = time.sleep
    shim = types.ModuleType("time")
    shim.__dict__.update({k: v for k, v in vars(time).items() if not k.startswith("__")})
    shim.sleep = lambda seconds: real_sleep(min(float(seconds), cap))  # type: ignore[attr-defined]
    sci.time = shim  # type: ignore[attr-defined]
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *argv]
    flower_supernode()

