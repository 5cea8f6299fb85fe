"""The ``fast=true`` SuperNode launcher: ``flower-supernode`` with its idle sleeps capped.

Started as ``python -m simulation.deploy supernode [flower-supernode args]``
(:mod:`simulation.deploy.__main__`) by :meth:`simulation.deploy.cluster.Deployment.start_node`.
"""

from __future__ import annotations

import os
import sys
import time
import types
from collections.abc import Sequence

from simulation.deploy.cluster import FAST_POLL_S


class UnpatchableFlower(RuntimeError):
    """Flower's SuperNode module no longer looks as ``fast=true`` expects."""


def check_patchable(module: types.ModuleType) -> None:
    """Check that ``module`` (``flwr.supernode.start_client_internal``) sleeps through its global ``time``.

    Raises:
        UnpatchableFlower: it has no module-level ``time`` that is the ``time``
            module, or its source calls no ``time.sleep(``: capping would do
            nothing (another Flower release), so ``fast=true`` refuses to start
            the SuperNode rather than run slow without saying so.
    """
    import inspect

    try:
        source = inspect.getsource(module)
    except (OSError, TypeError):
        source = ""
    if getattr(module, "time", None) is not time or "time.sleep(" not in source:
        raise UnpatchableFlower(f"fast=true: {module.__name__} no longer sleeps through its module-level `time` "
                                "(another Flower release?); run without fast=true")


def supernode_main(argv: Sequence[str]) -> None:
    """Start ``flower-supernode ARGV`` with its idle sleeps capped at :data:`FAST_POLL_S` seconds.

    Flower 1.41 and 1.42's SuperNode sleeps a hard-coded 3 s whenever a pull finds no
    message (``flwr.supernode.start_client_internal``), and 0.5 s between
    checks for a ClientApp's reply; in a split exchange the node is idle
    between every pair of messages, so this sleep adds up to 3 s to each
    exchange. This launcher replaces that module's ``time`` with one whose
    ``sleep`` is capped, then runs the SuperNode unchanged. Nothing else in
    Flower is touched. The cap is ``SFLOWER_SUPERNODE_POLL_S`` (default
    :data:`FAST_POLL_S`).

    Raises:
        UnpatchableFlower: see :func:`check_patchable` (the SuperNode does not start).
    """
    import flwr.supernode.start_client_internal as sci

    check_patchable(sci)
    cap = float(os.environ.get("SFLOWER_SUPERNODE_POLL_S", FAST_POLL_S))
    real_sleep = time.sleep
    shim = types.ModuleType("time")
    shim.__dict__.update({k: v for k, v in vars(time).items() if not k.startswith("__")})
    shim.sleep = lambda seconds: real_sleep(min(float(seconds), cap))  # type: ignore[attr-defined]
    sci.time = shim  # type: ignore[attr-defined]
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *argv]
    flower_supernode()

