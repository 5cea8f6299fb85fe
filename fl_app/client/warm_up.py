"""A client process's one-time imports, done in the background before its first training message.

Building the first ``torch.optim`` optimizer in a process imports ``torch._dynamo``: about 1.1 CPU
seconds (3 s of wall time per process with 20 of them starting on 2 cores). A client process that
lives for many messages pays it once, in its first training message, unless something paid it
earlier. Two kinds of client process live that long:

* a Ray actor (:class:`simulation.ray_engine.RayClientApp`), which starts the warm-up after its first
  message (the handshake), overlapping the server's initial evaluation;
* a deployed node's ClientApp process serving a session (``query.session``,
  :func:`fl_app.session.client.serve_session`), which starts it when the session opens and answers its
  first request (the handshake) only once it is done (:func:`warmed`). Without it, the 20 nodes of the
  main job deployed paid it in global iteration 1, beside the ServerApp's compute; started but not
  waited for, it still ran there, since the handshake ends as soon as the nodes reply.

No number changes: nothing is computed that a handler uses, and no random number is drawn.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

from flwr.app import Context, Message

#: A message handler: ``(message, context) -> reply``.
Handler = Callable[[Message, Context], Message]

_LOCK = threading.Lock()
_thread: threading.Thread | None = None


def warm_up() -> None:
    """Import what a client's first training message would import (the first optimizer's ``torch._dynamo``)."""
    import torch

    torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)


def start_warm_up() -> bool:
    """Run :func:`warm_up` in a daemon thread, once per process.

    Returns:
        True when this call started it; False when an earlier call of this process did.
    """
    global _thread
    with _LOCK:
        if _thread is not None:
            return False
        _thread = threading.Thread(target=warm_up, name="sflower-warm-up", daemon=True)
        _thread.start()
    return True


def wait_warm_up() -> None:
    """Block until this process's warm-up has finished (at once when none was started)."""
    if _thread is not None:
        _thread.join()


def warmed(handle: Handler) -> Handler:
    """Start the warm-up now and return ``handle``, made to wait for it before running.

    Args:
        handle: a message handler ``(message, context) -> reply``.
    """
    start_warm_up()

    def run(message: Message, context: Context) -> Message:
        wait_warm_up()
        return handle(message, context)

    return run
