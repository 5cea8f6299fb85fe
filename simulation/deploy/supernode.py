"""The SuperNode launcher of ``sflower deploy``: ``flower-supernode``, given time to start its ClientApps.

Started as ``python -m simulation.deploy supernode [flower-supernode args]``
(:mod:`simulation.deploy.__main__`) by :meth:`simulation.deploy.cluster.Deployment.start_node`. Two changes
to Flower's SuperNode, both in its own process and nothing else:

* **the ClientApp's start window** (always): :func:`widen_start_window`;
* **idle sleeps capped** (``fast=true``): :func:`_cap_sleeps`.
"""

from __future__ import annotations

import logging
import os
import sys
import time
import types
from collections.abc import Sequence
from datetime import timedelta
from typing import Any

from simulation.deploy.cluster import FAST_POLL_S

#: Seconds added to the time a ClientApp process has, after its SuperNode claimed the message's task, to ask
#: for it (Flower's 30 s; :func:`widen_start_window`); ``SFLOWER_CLIENTAPP_START_S`` overrides it.
CLIENTAPP_START_S = 300.0


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


def widen_start_window(state_class: Any, seconds: float) -> bool:
    """Give each ClientApp process ``seconds`` more than Flower's 30 from its task's claim to its first request.

    Flower 1.42's SuperNode claims a message's task, then starts a ``flwr-clientapp`` process, which must
    ask for the task (``pull-task-input``) within ``HEARTBEAT_DEFAULT_INTERVAL`` (30 s) of the claim, or the
    token expires, the task goes back to pending and the process fails with "Runtime task-token
    authentication failed" (``flwr.supercore.corestate.in_memory_corestate``). Importing Flower takes
    about 2.5 CPU seconds, so on loopback the handshake of 20 SuperNodes on 2 cores (20 processes at
    once) missed it: every node retried, each retry added a process, and the main job deployed made no
    progress in 5 minutes. Here ``state_class.claim_task`` is wrapped so that a fresh claim's token lives
    ``seconds`` longer; once the process asks for its task, Flower's own heartbeat window applies as before
    (``activate_task``), so a ClientApp that dies while running is detected as quickly as in Flower.

    Args:
        state_class: the SuperNode's state class (``InMemoryCoreState``).
        seconds: seconds added to the start window.

    Returns:
        True when wrapped; False when the class no longer looks as expected (another Flower release):
        the SuperNode then runs unchanged.
    """
    claim = getattr(state_class, "claim_task", None)
    if claim is None or getattr(claim, "sflower_start_window", None) is not None:
        return claim is not None

    def claim_task(self: Any, task_id: int) -> str | None:
        token = claim(self, task_id)
        if token is None:
            return None
        store, lock = getattr(self, "task_token_store", None), getattr(self, "lock_task_store", None)
        if isinstance(store, dict) and lock is not None:
            with lock:
                record = store.get(task_id)
                if record is not None and getattr(record, "token", None) == token:
                    record.active_until += timedelta(seconds=seconds)
        return token

    claim_task.sflower_start_window = seconds  # type: ignore[attr-defined]
    state_class.claim_task = claim_task
    return True


def supernode_main(argv: Sequence[str], fast: bool = False) -> None:
    """Start ``flower-supernode ARGV`` with the ClientApp's start window widened by
    ``SFLOWER_CLIENTAPP_START_S`` (default :data:`CLIENTAPP_START_S`; :func:`widen_start_window`) and, with
    ``fast``, its idle sleeps capped (:func:`_cap_sleeps`). Nothing else in Flower is touched.

    Raises:
        UnpatchableFlower: with ``fast``, see :func:`check_patchable` (the SuperNode does not start).
    """
    import flwr.supernode.start_client_internal as sci
    from flwr.supercore.corestate import in_memory_corestate

    window = float(os.environ.get("SFLOWER_CLIENTAPP_START_S", CLIENTAPP_START_S))
    if not widen_start_window(getattr(in_memory_corestate, "InMemoryCoreState", None), window):
        logging.getLogger("sflower.deploy").warning(
            "this Flower's SuperNode state has no claim_task: ClientApps keep Flower's start window")
    if fast:
        _cap_sleeps(sci)
    from flwr.supernode.cli import flower_supernode

    sys.argv = ["flower-supernode", *argv]
    flower_supernode()


def _cap_sleeps(sci: types.ModuleType) -> None:
    """Replace the ``time`` of Flower's SuperNode module ``sci`` by one whose ``sleep`` is capped at
    ``SFLOWER_SUPERNODE_POLL_S`` seconds (default :data:`FAST_POLL_S`; ``fast=true``).

    Flower 1.41 and 1.42's SuperNode sleeps a hard-coded 3 s whenever a pull finds no message
    (``flwr.supernode.start_client_internal``), and 0.5 s between checks for a ClientApp's reply; in a split
    exchange over Flower's messages the node is idle between every pair of messages, so this sleep adds up
    to 3 s to each exchange.

    Raises:
        UnpatchableFlower: see :func:`check_patchable`.
    """
    check_patchable(sci)
    cap = float(os.environ.get("SFLOWER_SUPERNODE_POLL_S", FAST_POLL_S))
    real_sleep = time.sleep
    shim = types.ModuleType("time")
    shim.__dict__.update({k: v for k, v in vars(time).items() if not k.startswith("__")})
    shim.sleep = lambda seconds: real_sleep(min(float(seconds), cap))  # type: ignore[attr-defined]
    sci.time = shim  # type: ignore[attr-defined]

