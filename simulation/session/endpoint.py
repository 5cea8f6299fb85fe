"""The ServerApp's session endpoint: a gRPC server with one authenticated stream of frames per node.

docs/explanation/design.md §4 ("The session transport"). :class:`SessionEndpoint` serves
:data:`fl_app.session.client.METHOD` (a bidirectional stream of
:mod:`fl_app.session.wire` frames) with grpcio, over TLS with the
deployment's certificate, or in plaintext only when asked for explicitly.

A :class:`Session` is made for one node before its opening message is sent
(:meth:`SessionEndpoint.new_session`): a random id and a random 256-bit
secret. The node's first frame must be ``hello`` with both; the endpoint
compares the secret in constant time, accepts it once, and refuses (and
fails the session with the reason, for the strategy to exclude the node):

* a wrong secret;
* a replayed one (the session was connected already, or has ended);
* an unknown session id (logged only: there is no node to blame).

After the hello, requests queued on the session (:meth:`Session.send`) go
down the stream in order, and each reply frame is stored at once under its
request id (:meth:`Session.take`), so a reply the server has received is
never lost, whatever happens to the stream afterwards. A broken stream, or
a node that ends it, fails the session; its requests without a reply then
fail with that reason.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from flwr.app import RecordDict

from fl_app.run.errors import ConfigError
from fl_app.session.client import CHANNEL_OPTIONS, METHOD
from fl_app.session.wire import FrameError, decode_frame, encode_frame
from strategies.core.errors import NODE_UNAVAILABLE

#: The largest TLS file (certificate, key, CA) read, in bytes.
MAX_PEM_BYTES = 1 << 20

log = logging.getLogger("sflower")

OPENING, OPEN, CLOSED, FAILED = "opening", "open", "closed", "failed"
#: Wall seconds a connection has to send its hello before the endpoint drops it.
HELLO_TIMEOUT = 5.0
_CLOSE = object()  # the outbound queue's end marker


@dataclass
class TlsFiles:
    """The endpoint's TLS material: PEM file paths on the ServerApp's machine.

    Attributes:
        certificate: the endpoint's certificate (its names must include the host of ``session-address``).
        key: its private key.
        ca: the CA certificate that signed it; sent to each node in its opening message.
    """

    certificate: Path
    key: Path
    ca: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        """``(certificate, key, ca)`` bytes, each parsed (``cryptography``: a PEM certificate, an unencrypted PEM
        private key) before it reaches grpc, and at most :data:`MAX_PEM_BYTES`.

        Raises:
            ConfigError: a file cannot be read, is too large, or is not what its key says (one line).
        """
        from cryptography import x509
        from cryptography.hazmat.primitives.serialization import load_pem_private_key

        out = []
        for name, path, parse in (("session-certificate", self.certificate, x509.load_pem_x509_certificate),
                                  ("session-key", self.key, lambda b: load_pem_private_key(b, password=None)),
                                  ("session-ca", self.ca, x509.load_pem_x509_certificate)):
            try:
                with open(path, "rb") as fh:
                    data = fh.read(MAX_PEM_BYTES + 1)
            except OSError as err:
                raise ConfigError(f"{name}: cannot read {path}: {err.strerror}") from None
            try:
                if len(data) > MAX_PEM_BYTES:
                    raise ValueError(f"larger than {MAX_PEM_BYTES} bytes")
                parse(data)
            except (ValueError, TypeError) as err:
                raise ConfigError(f"{name}: {path} is not a PEM {'private key' if name == 'session-key' else 'certificate'}"
                                  f" ({' '.join(str(err).split())[:120]})") from None
            out.append(data)
        return out[0], out[1], out[2]


@dataclass
class Session:
    """One node's session (module docstring).

    Attributes:
        node_id: the Flower node it serves.
        id: random hex id, sent in the opening message.
        secret: random hex secret (256 bits), sent in the opening message.
        state: ``opening`` (waiting for the node), ``open``, ``closed`` (by the server) or ``failed``.
        reason: why it failed ("" otherwise).
        created: ``time.monotonic()`` when made (for the connect timeout).
        wire_down: bytes of the request frames queued for the node (headers and framing included).
        wire_up: bytes of the reply frames read from the node (headers and framing included).
    """

    node_id: int
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    secret: str = field(default_factory=lambda: secrets.token_hex(32), repr=False)
    state: str = OPENING
    reason: str = ""
    created: float = field(default_factory=time.monotonic)
    wire_down: int = 0
    wire_up: int = 0
    _outbound: deque[Any] = field(default_factory=deque, repr=False)
    _replies: dict[str, tuple[dict[str, Any], RecordDict | None]] = field(default_factory=dict, repr=False)
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)
    _ended: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def ended(self) -> bool:
        """Closed or failed: it takes no more requests."""
        return self.state in (CLOSED, FAILED)

    def send(self, request_id: str, action: str, content: RecordDict) -> None:
        """Queue a request for the node (sent once it has connected, in order)."""
        frame = encode_frame({"kind": "request", "id": request_id, "action": action}, content)
        with self._cond:
            self.wire_down += len(frame)
            self._outbound.append(frame)
            self._cond.notify_all()

    def take(self, request_id: str) -> tuple[dict[str, Any], RecordDict | None] | None:
        """The reply to ``request_id`` (header and content), once; None while there is none."""
        with self._cond:
            return self._replies.pop(request_id, None)

    def fail(self, reason: str) -> None:
        """End the session with ``reason`` (no-op once ended); its stream is closed."""
        with self._cond:
            if self.ended:
                return
            connected = self.state == OPEN
            self.state, self.reason = FAILED, reason
            self._outbound.append(_CLOSE)
            self._cond.notify_all()
        if not connected:  # no stream to wait for
            self._ended.set()
        log.warning("session of node %d failed: %s", self.node_id, reason)

    def close(self) -> None:
        """End the session normally: the node's handler returns after the ``close`` frame."""
        with self._cond:
            if self.ended:
                return
            was_open = self.state == OPEN
            self.state = CLOSED
            if was_open:
                self._outbound.append(encode_frame({"kind": "close"}))
            self._outbound.append(_CLOSE)
            self._cond.notify_all()
        if not was_open:
            self._ended.set()

    def wait_ended(self, timeout: float) -> bool:
        """Wait until the node's stream has ended (after :meth:`close` or :meth:`fail`)."""
        return self._ended.wait(timeout)

    def _next_frame(self) -> Any:
        with self._cond:
            while not self._outbound:
                self._cond.wait()
            return self._outbound.popleft()

    def _store(self, head: dict[str, Any], content: RecordDict | None) -> None:
        with self._cond:
            self._replies[str(head.get("id"))] = (head, content)


class SessionEndpoint:
    """The gRPC server of the sessions (module docstring).

    Args:
        address: ``host:port`` to bind (``session-address``); port 0 picks a
            free port, and :attr:`address` then names the one bound.
        tls: the certificate, key and CA; None for plaintext (``session-tls=false``).
        max_sessions: streams served at once (one thread each).

    Raises:
        ConfigError: the address cannot be bound, or a TLS file cannot be read.
    """

    def __init__(self, address: str, tls: TlsFiles | None, max_sessions: int) -> None:
        import grpc  # a Flower dependency

        self._grpc = grpc
        self.sessions: dict[str, Session] = {}
        self._lock = threading.Lock()
        self.tls = tls
        self.ca_pem = b""
        self._server = grpc.server(ThreadPoolExecutor(max_workers=2 * max_sessions + 8,
                                                      thread_name_prefix="sflower-session"),
                                   options=CHANNEL_OPTIONS + [("grpc.so_reuseport", 0),  # a bound port is refused
                                                              ("grpc.keepalive_permit_without_calls", 1),
                                                              ("grpc.http2.min_ping_interval_without_data_ms",
                                                               5_000)])
        service, method = METHOD.strip("/").split("/")
        handler = grpc.stream_stream_rpc_method_handler(self._serve)
        self._server.add_generic_rpc_handlers([grpc.method_handlers_generic_handler(service, {method: handler})])
        host = address.rsplit(":", 1)[0]
        try:
            if tls is not None:
                cert, key, self.ca_pem = tls.read()
                port = self._server.add_secure_port(address, grpc.ssl_server_credentials([(key, cert)]))
            else:
                port = self._server.add_insecure_port(address)
        except RuntimeError as err:
            raise ConfigError(f"session-address {address}: cannot bind it ({err})") from None
        if port == 0:
            raise ConfigError(f"session-address {address}: cannot bind it")
        #: the ``host:port`` the nodes connect to
        self.address = f"{host}:{port}"
        self.port = port
        self._server.start()

    def new_session(self, node_id: int) -> Session:
        """A new session for ``node_id`` (its id and secret go into the opening message)."""
        session = Session(node_id)
        with self._lock:
            self.sessions[session.id] = session
        return session

    def stop(self, grace: float = 1.0) -> None:
        """Fail what is still open and stop the server; the port is closed when this returns."""
        for session in list(self.sessions.values()):
            session.fail("the endpoint stopped")
        self._server.stop(grace).wait()

    # ------------------------------------------------------------------ one stream
    def _serve(self, frames: Any, context: Any) -> Any:
        """The stream of one node: check its hello, then send its requests and store its replies."""
        session = self._hello(frames, context)
        if session is None:
            return
        reader = threading.Thread(target=self._read, args=(session, frames), daemon=True,
                                  name=f"sflower-session-{session.node_id}")
        reader.start()
        try:
            while (frame := session._next_frame()) is not _CLOSE:
                yield frame
        finally:
            if not session.ended:  # the generator was closed by gRPC: the stream is gone
                session.fail(f"{NODE_UNAVAILABLE}: the stream broke")
            session._ended.set()

    def _hello(self, frames: Any, context: Any) -> Session | None:
        """The session the first frame authenticates, or None (refused: a ``refused`` frame is not sent,
        the call is aborted with UNAUTHENTICATED and the reason)."""
        timer = threading.Timer(HELLO_TIMEOUT, context.cancel)  # a silent connection does not hold a thread
        timer.start()
        try:
            head, _ = decode_frame(next(frames))
        except (StopIteration, FrameError, self._grpc.RpcError) as err:
            log.warning("session endpoint: a connection without a valid hello (%s)", type(err).__name__)
            context.abort(self._grpc.StatusCode.UNAUTHENTICATED, "no valid hello")
        finally:
            timer.cancel()
        with self._lock:
            session = self.sessions.get(str(head.get("session")))
            if session is None:
                reason = "an unknown session id"
            elif not hmac.compare_digest(str(head.get("secret", "")).encode(), session.secret.encode()):
                reason = "a wrong secret"
            elif session.state != OPENING:
                reason = "a replayed secret (the session was connected before)"
            else:
                session.state = OPEN
                return session
        if session is not None:
            session.fail(f"refused a connection with {reason}")
        else:
            log.warning("session endpoint: refused a connection with %s", reason)
        context.abort(self._grpc.StatusCode.UNAUTHENTICATED, reason)
        return None

    def _read(self, session: Session, frames: Any) -> None:
        """Store every reply frame as it arrives; fail the session when the stream ends unasked."""
        try:
            for frame in frames:
                head, content = decode_frame(frame)
                if head.get("kind") == "reply":
                    session.wire_up += len(frame)
                    session._store(head, content)
        except FrameError as err:
            session.fail(f"a malformed frame ({err})")
            return
        except Exception as err:  # noqa: BLE001 - grpc.RpcError and friends: the connection is gone
            session.fail(f"{NODE_UNAVAILABLE}: the stream broke ({type(err).__name__})")
            return
        if session.state == OPEN:
            session.fail(f"{NODE_UNAVAILABLE}: the node ended the stream")
