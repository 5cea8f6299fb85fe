"""The clients' state in a checkpoint: fetched from the nodes and pushed back, on every engine.

docs/explanation/design.md §7. A node keeps its whole state in ``context.state``
(:mod:`fl_app.client.state`), which lives where the node runs: in this process
(in-process engine), in a Ray actor's node state, on a SuperNode. The
ServerApp reaches it with two protocol actions of their own
(:mod:`fl_app.client.checkpoint`): ``query.checkpoint`` returns it at a
checkpoint, ``query.restore`` replaces it at a resume. Both are sent
straight to the grid, outside the dispatcher's queues, and only when nothing
else is on the wire to a node (:meth:`~strategies.core.dispatcher.Dispatcher.drain`),
so a node's state is whole and its messages stay in order.

:func:`round_trip` is the one loop that pushes messages and waits for all
their replies (the handshake uses it too).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable, Mapping
from typing import TypeVar

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from fl_app import protocol as P
from strategies.core.errors import NODE_UNAVAILABLE, RunFailedError

log = logging.getLogger("sflower")
T = TypeVar("T")

#: Seconds between pulls while waiting for replies.
POLL_S = 0.01
#: Seconds between two tries of an exchange that failed because a node was gone (:func:`when_nodes_are_back`).
RETRY_S = 2.0


def round_trip(grid: Grid, messages: Iterable[Message], deadline: float, what: str,
               meanwhile: object = None) -> list[Message]:
    """Push ``messages`` and wait for a reply to each, until ``deadline`` (monotonic s).

    ``meanwhile`` (a callable) runs after the push, before the replies are
    read: a reply that has arrived by then is never late.

    Returns:
        the replies, in arrival order (error replies included).

    Raises:
        RunFailedError: not every node answered by ``deadline`` (``what`` names the exchange and its limit).
    """
    ids = set(grid.push_messages(list(messages)))
    if callable(meanwhile):
        meanwhile()
    replies: list[Message] = []
    while ids:
        pulled_at = time.monotonic()
        got = list(grid.pull_messages(list(ids)))
        for reply in got:
            ids.discard(reply.metadata.reply_to_message_id)
        replies.extend(got)
        if ids and time.monotonic() > deadline:  # a reply that has arrived is never late
            raise RunFailedError(f"{len(ids)} nodes did not answer {what}")
        if ids:
            # A pull costs time in proportion to the ids still waiting (Flower checks each one): wait at least
            # as long as it took, so that the pulls never take more than half of this process's time from
            # the threads that deliver the messages (10,000 nodes: most of the handshake's time otherwise).
            time.sleep(max(POLL_S, time.monotonic() - pulled_at))
    return replies


def last_line(text: str) -> str:
    """The last non-empty line of an error reason (a traceback's final line)."""
    lines = [line for line in str(text).strip().splitlines() if line.strip()]
    return lines[-1].strip() if lines else "(no reason given)"


def _by_partition(replies: list[Message], node_of: Mapping[int, int], what: str) -> dict[int, RecordDict]:
    pid_of = {nid: pid for pid, nid in node_of.items()}
    out = {}
    for reply in replies:
        pid = pid_of[reply.metadata.src_node_id]
        if reply.has_error():
            raise RunFailedError(f"{what} failed on client {pid}: {last_line(reply.error.reason)}")
        out[pid] = reply.content
    return out


def fetch(grid: Grid, node_of: Mapping[int, int], timeout: float) -> dict[int, RecordDict]:
    """Every client's ``context.state`` (``query.checkpoint``): ``{partition id: its records}``.

    Args:
        node_of: partition id -> node id of the clients to ask (the live ones).
        timeout: wall seconds to wait for all replies.

    Raises:
        RunFailedError: a node failed or did not answer in time.
    """
    msgs = [Message(RecordDict(), nid, P.QUERY_CHECKPOINT) for nid in node_of.values()]
    replies = round_trip(grid, msgs, time.monotonic() + timeout, f"{P.QUERY_CHECKPOINT} within {timeout:g} s")
    return _by_partition(replies, node_of, P.QUERY_CHECKPOINT)


def push(grid: Grid, node_of: Mapping[int, int], states: Mapping[int, RecordDict], timeout: float) -> None:
    """Replace each client's ``context.state`` with ``states[partition id]`` (``query.restore``).

    Raises:
        RunFailedError: a node failed or did not answer in ``timeout`` wall seconds.
    """
    msgs = [Message(states[pid], node_of[pid], P.QUERY_RESTORE) for pid in sorted(states)]
    replies = round_trip(grid, msgs, time.monotonic() + timeout, f"{P.QUERY_RESTORE} within {timeout:g} s")
    _by_partition(replies, node_of, P.QUERY_RESTORE)


def when_nodes_are_back(step: Callable[[], T], timeout: float) -> T:
    """``step()``, tried again every :data:`RETRY_S` seconds while it fails because a node is gone (a
    :class:`~strategies.core.errors.RunFailedError` whose reason holds
    :data:`~strategies.core.errors.NODE_UNAVAILABLE`: a SuperNode killed and not yet back), for up to ``timeout``
    wall seconds: a resume waits for restarted nodes instead of failing.

    Raises:
        RunFailedError: any other failure at once, or a node still gone after ``timeout``.
    """
    end = time.monotonic() + timeout
    while True:
        try:
            return step()
        except RunFailedError as err:
            if NODE_UNAVAILABLE not in str(err).lower() or time.monotonic() + RETRY_S > end:
                raise
            log.warning("%s; trying again in %g s", err, RETRY_S)
            time.sleep(RETRY_S)
