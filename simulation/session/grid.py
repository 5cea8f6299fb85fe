"""The session grid: a Flower :class:`~flwr.serverapp.Grid` that carries a node's requests over its session.

docs/explanation/design.md §4 ("The session transport"). :class:`SessionGrid` wraps the
grid Flower gives the ServerApp and sits under the dispatcher
(:class:`strategies.core.dispatcher.Dispatcher` only pushes and pulls), so no
strategy changes:

* every request goes over the node's session, the handshake (``query.info``,
  which gives a node its task and partition) included. The first one opens
  it: one ``query.session`` message through Flower (the endpoint's address,
  the session id and secret, the CA) and the request waits in the session's
  queue until the node connects. So a node starts one ClientApp process for
  the whole run, at the handshake (in a deployment Flower starts a process
  per message: two per node, when the handshake went through Flower, and the
  second one in the first global iteration);
* a request whose session fails before its reply arrives gets an error
  reply with the reason: the dispatcher reports it and the strategy excludes
  the node as for any failed message. So does every later request to that
  node, until a fresh handshake (``query.info``, re-admission) starts it
  over: it opens a new session, with a new secret.
  Reasons: the node did not connect within ``session-timeout`` seconds; a
  wrong or replayed secret; the stream broke (the node was killed, the
  network went away); the node's ``query.session`` handler failed; a
  request for a closed session.

:meth:`SessionGrid.close` closes every session (each node's handler returns
and Flower stores its ``context.state``), waits for the opening messages'
replies and stops the endpoint, so no port stays open after the run.
"""

from __future__ import annotations

import logging
import time
import uuid
from collections.abc import Iterable
from typing import Any

from flwr.app import ConfigRecord, Error, Message, RecordDict
from flwr.serverapp import Grid

from fl_app.session.client import OPEN_ACTION, SESSION
from simulation.messages import reply_message
from simulation.session.endpoint import CLOSED, FAILED, OPEN, OPENING, Session, SessionEndpoint

log = logging.getLogger("sflower")

#: The handshake: one sent to a node whose session failed starts the session over (re-admission).
HANDSHAKE_ACTIONS = frozenset({"query.info"})
#: Error code of a request that failed with its session.
SESSION_FAILED = 2
#: Wall seconds between checks of the opening messages' replies (each is a call to the SuperLink).
WATCH_INTERVAL = 0.25


class SessionGrid(Grid):
    """``grid`` with every request carried by a session (module docstring).

    Args:
        grid: Flower's grid (the deployment's).
        endpoint: the running endpoint.
        connect_timeout: wall seconds a node has to connect after its opening message (``session-timeout``).
    """

    def __init__(self, grid: Grid, endpoint: SessionEndpoint, connect_timeout: float) -> None:
        self.grid = grid
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.sessions: dict[int, Session] = {}
        self._all: list[Session] = []  # every session opened, replaced ones included (for the wire bytes)
        self._opening: dict[str, Session] = {}  # Flower id of an opening message -> its session
        self._requests: dict[str, tuple[Message, Session]] = {}
        self._last_watch = 0.0
        self._closed = False

    # ------------------------------------------------------------------ Grid, delegated
    @property
    def run(self) -> Any:
        """The run (Flower's)."""
        return self.grid.run

    def set_run(self, run_id: int) -> None:
        """Flower's :meth:`Grid.set_run`."""
        self.grid.set_run(run_id)

    def create_message(self, content: RecordDict, message_type: str, dst_node_id: int, group_id: str,
                       ttl: float | None = None) -> Message:
        """Flower's (deprecated) helper."""
        return self.grid.create_message(content, message_type, dst_node_id, group_id, ttl)

    def get_node_ids(self) -> Iterable[int]:
        """The connected SuperNodes (Flower's)."""
        return self.grid.get_node_ids()

    def send_and_receive(self, messages: Iterable[Message], *, timeout: float | None = None) -> Iterable[Message]:
        """Push, then pull until every reply is in or ``timeout`` (s) passes."""
        ids = list(self.push_messages(messages))
        end = None if timeout is None else time.monotonic() + timeout
        out: list[Message] = []
        while ids and (end is None or time.monotonic() < end):
            got = list(self.pull_messages(ids))
            out += got
            done = {m.metadata.reply_to_message_id for m in got}
            ids = [i for i in ids if i not in done]
            if ids:
                time.sleep(0.01)
        return out

    # ------------------------------------------------------------------ requests
    def push_messages(self, messages: Iterable[Message]) -> Iterable[str]:
        """Send each message over the node's session (opened by its first message)."""
        ids = []
        for msg in messages:
            if msg.metadata.message_type in HANDSHAKE_ACTIONS:
                old = self.sessions.get(msg.metadata.dst_node_id)
                if old is not None and old.state == FAILED:  # a fresh handshake (re-admission) starts over
                    del self.sessions[msg.metadata.dst_node_id]
            session = self._session(msg.metadata.dst_node_id)
            request_id = uuid.uuid4().hex
            self._requests[request_id] = (msg, session)
            session.send(request_id, msg.metadata.message_type, msg.content)
            ids.append(request_id)
        return ids

    def pull_messages(self, message_ids: Iterable[str]) -> Iterable[Message]:
        """The replies in for ``message_ids`` (ids this grid gave): the sessions' and the error replies of
        failed sessions. An id it did not give has no reply."""
        self._watch()
        out = []
        for mid in message_ids:
            entry = self._requests.get(mid)
            if entry is None:
                continue
            msg, session = entry
            got = session.take(mid)
            if got is not None:
                head, content = got
                answer: RecordDict | Error = (Error(code=SESSION_FAILED, reason=str(head["error"]))
                                              if "error" in head else content or RecordDict())
            elif session.state == FAILED:
                answer = Error(code=SESSION_FAILED, reason=f"session failed: {session.reason}")
            else:
                continue
            del self._requests[mid]
            out.append(reply_message(msg, mid, answer))
        return out

    # ------------------------------------------------------------------ sessions
    def _session(self, node_id: int) -> Session:
        """The node's live session, or a new one with its opening message sent."""
        session = self.sessions.get(node_id)
        if session is not None and session.state != CLOSED:
            return session  # live, or failed: its requests fail with its reason until a fresh handshake
        if self._closed:  # after close(): nothing is sent, the request fails with the reason
            session = Session(node_id)
            session.fail("a request for a closed session (the run's sessions were closed)")
            return session
        session = self.endpoint.new_session(node_id)
        self._all.append(session)
        record = ConfigRecord({"address": self.endpoint.address, "session": session.id, "secret": session.secret,
                               "tls": self.endpoint.tls is not None, "ca": self.endpoint.ca_pem.decode()})
        (open_id,) = list(self.grid.push_messages([Message(RecordDict({SESSION: record}), node_id, OPEN_ACTION)]))
        self._opening[open_id] = session
        self.sessions[node_id] = session
        return session

    def _watch(self, every: bool = False) -> None:
        """Fail sessions whose node did not connect in time or whose opening message came back early.

        Only the opening messages of sessions still waiting for their node
        are pulled from Flower (each pull is a call to the SuperLink, about
        0.1 s): an open session's failures show on its stream. ``every``
        (when closing): pull them all.
        """
        now = time.monotonic()
        if now - self._last_watch < WATCH_INTERVAL:
            return
        self._last_watch = now
        for session in self.sessions.values():
            if session.state == OPENING and now - session.created > self.connect_timeout:
                session.fail(f"the node did not connect within session-timeout={self.connect_timeout:g} s")
        waiting = [oid for oid, s in self._opening.items() if every or s.state == OPENING]
        if waiting:
            for reply in self.grid.pull_messages(waiting):
                session = self._opening.pop(reply.metadata.reply_to_message_id)
                if reply.has_error():
                    session.fail(f"the node's session handler failed: {reply.error.reason}")
                elif session.state != CLOSED:
                    session.fail("the node's session handler returned before the session was closed")

    def wire_bytes(self) -> dict[str, int]:
        """Bytes the sessions carried so far: ``wire_bytes_up`` (reply frames from the nodes) and
        ``wire_bytes_down`` (request frames queued for them: all sent, unless a session failed first),
        each frame's header and framing included (the handshake's too); the openings, which go through
        Flower, are not in them. Compare with ``bytes_up``/``bytes_down``, the arrays' bytes that the
        virtual clock charges."""
        return {"wire_bytes_up": sum(s.wire_up for s in self._all),
                "wire_bytes_down": sum(s.wire_down for s in self._all)}

    def close(self, timeout: float = 30.0) -> None:
        """Close every session, wait (up to ``timeout`` s) for the nodes' handlers to return, stop the endpoint."""
        self._closed = True
        connected = {id(s) for s in self.sessions.values() if s.state == OPEN}
        for session in self.sessions.values():
            session.close()
        end = time.monotonic() + timeout
        try:
            for session in self.sessions.values():
                session.wait_ended(max(0.0, end - time.monotonic()))
            # only a connected node's handler returns now: a failed session's node may be gone (killed), and one
            # that never connected may never answer its opening message
            self._opening = {oid: s for oid, s in self._opening.items() if id(s) in connected}
            while self._opening and time.monotonic() < end:
                self._last_watch = 0.0
                self._watch(every=True)
                time.sleep(0.05)
        except Exception as err:  # noqa: BLE001 - e.g. the SuperLink is gone: the endpoint stops all the same
            log.warning("closing the sessions: %s: %s", type(err).__name__, err)
        finally:
            self.endpoint.stop()
