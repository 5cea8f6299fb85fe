"""The dispatcher: push, pull, one message in flight per node, due times.

DESIGN.md section 5. Every message gets a due time when it is sent
(``clock.now() + duration``). With an ordered (virtual) clock,
:meth:`Dispatcher.next_reply` returns the reply of the earliest-due message,
ties broken by send order, and moves the clock to its due time; replies
that arrive earlier in real time wait in a buffer. With the wall clock,
replies are returned in arrival order.

It polls ``grid.pull_messages`` (``send_and_receive`` sleeps for seconds).
"""

from __future__ import annotations

import heapq
import itertools
import time
from dataclasses import dataclass, field

from flwr.app import Message, RecordDict
from flwr.serverapp import Grid

from strategies.clock import Clock


class NodeTimeoutError(RuntimeError):
    """A reply did not arrive within the node timeout (wall seconds)."""


@dataclass(order=True)
class Pending:
    """One message in flight.

    Attributes:
        due: virtual due time (s); ordering key.
        seq: send order; breaks ties.
        message_id: Flower message id.
        partition_id: the client it went to.
        action: its message type, e.g. ``"train.forward"``.
        sent_at: clock time (s) when it was sent.
        wall_sent: ``time.monotonic()`` when it was sent (for timeouts).
    """

    due: float
    seq: int
    message_id: str = field(compare=False)
    partition_id: int = field(compare=False)
    action: str = field(compare=False)
    sent_at: float = field(compare=False)
    wall_sent: float = field(compare=False)


class Dispatcher:
    """Sends messages to partitions and hands back replies in clock order.

    Args:
        grid: the Flower grid.
        clock: time source; ``clock.ordered`` selects due-time order.
        node_of: partition id -> Flower node id (from the handshake).
        poll_interval: seconds between empty pulls.
        timeout: wall seconds a node may take before its message counts as
            failed (the reply is reported as an error).
    """

    def __init__(self, grid: Grid, clock: Clock, node_of: dict[int, int],
                 poll_interval: float = 0.002, timeout: float = 600.0) -> None:
        self.grid = grid
        self.clock = clock
        self.node_of = dict(node_of)
        self.poll_interval = poll_interval
        self.timeout = timeout
        self._seq = itertools.count()
        self._heap: list[Pending] = []
        self._by_partition: dict[int, Pending] = {}
        self._arrived: dict[str, Message] = {}
        self._arrival_order: list[str] = []
        self.exchanges = 0

    def busy(self, partition_id: int) -> bool:
        """Whether a message to this partition is in flight."""
        return partition_id in self._by_partition

    @property
    def in_flight(self) -> int:
        """Number of messages in flight."""
        return len(self._by_partition)

    def send(self, partition_id: int, action: str, content: RecordDict, duration: float) -> Pending:
        """Push one message; it will be due at ``clock.now() + duration``.

        Raises:
            RuntimeError: a message to this partition is already in flight
                (Flower would run both concurrently and lose state).
        """
        if partition_id in self._by_partition:
            raise RuntimeError(f"partition {partition_id} already has a message in flight")
        msg = Message(content, self.node_of[partition_id], action)
        (msg_id,) = list(self.grid.push_messages([msg]))
        now = self.clock.now()
        pending = Pending(now + max(0.0, duration), next(self._seq), msg_id, partition_id,
                          action, now, time.monotonic())
        heapq.heappush(self._heap, pending)
        self._by_partition[partition_id] = pending
        return pending

    def _pull(self) -> None:
        waiting = [p.message_id for p in self._by_partition.values() if p.message_id not in self._arrived]
        if not waiting:
            return
        for reply in self.grid.pull_messages(waiting):
            mid = reply.metadata.reply_to_message_id
            self._arrived[mid] = reply
            self._arrival_order.append(mid)

    def _pop(self, pending: Pending) -> tuple[Pending, Message | None]:
        self._heap.remove(pending)
        heapq.heapify(self._heap)
        del self._by_partition[pending.partition_id]
        reply = self._arrived.pop(pending.message_id, None)
        if pending.message_id in self._arrival_order:
            self._arrival_order.remove(pending.message_id)
        self.clock.advance_to(pending.due)
        self.exchanges += 1
        return pending, reply

    def next_reply(self) -> tuple[Pending, Message | None]:
        """Wait for the next reply to handle.

        Returns:
            ``(pending, reply)``; ``reply`` is ``None`` when the node timed
            out. Check ``reply.has_error()`` for a node's error reply.

        Raises:
            RuntimeError: nothing is in flight.
        """
        if not self._heap:
            raise RuntimeError("next_reply() with no message in flight")
        while True:
            self._pull()
            if self.clock.ordered:
                head = self._heap[0]
                if head.message_id in self._arrived:
                    return self._pop(head)
                oldest = head
            else:
                if self._arrival_order:
                    mid = self._arrival_order[0]
                    pending = next(p for p in self._heap if p.message_id == mid)
                    return self._pop(pending)
                oldest = min(self._heap, key=lambda p: p.wall_sent)
            if time.monotonic() - oldest.wall_sent > self.timeout:
                return self._pop(oldest)
            time.sleep(self.poll_interval)
