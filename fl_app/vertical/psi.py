"""Private set intersection (PSI): which sample IDs two parties share, and nothing else.

The protocol is the Diffie–Hellman PSI of Meadows (1986) / Huberman, Franklin and Hogg (1999), run
one direction at a time between a **receiver**, who learns the intersection (or only its size), and a
**sender**, who learns only the size of the receiver's set. Every message is opaque bytes, so the
ServerApp can relay it between two nodes (Flower has no node-to-node channel) and learns only the
sizes of the sets from the sizes of the messages.

Two backends compute it:

* ``openmined``: OpenMined's ``openmined.psi`` 2.0.4 (ECDH on P-256, the library NVFlare uses), with
  the exact ``RAW`` data structure (no false positives). Its 2.0.5 and 2.0.6 wheels pin a protobuf that
  flwr's gRPC health check rejects (issue 45), so only 2.0.4 is supported (the ``vertical`` extra).
* ``dh``: the textbook protocol on X25519 with ``cryptography``, the fallback when the former does not
  import. An ID ``x`` is hashed to a curve coordinate ``H(x) = SHA-256("sflower-psi" || x)``; the
  receiver sends ``a·H(x)`` for each of its IDs, in order; the sender returns ``b·(a·H(x))`` in the
  same order and ``b·H(y)`` for each of its IDs in a shuffled order; the receiver computes
  ``a·(b·H(y))`` and keeps the positions of its IDs whose double encryption is among them. Scalar
  multiplication commutes, so ``ab·H(x) = ba·H(y)`` iff ``x = y`` (up to SHA-256 collisions). With
  ``reveal=False`` (cardinality only) the sender shuffles the double encryptions too, so the receiver
  can count the matches but not tell which of its IDs they are.

What each side learns (semi-honest parties; DDH on the curve):

* the receiver: the intersection ``X ∩ Y`` (``reveal=True``) or ``|X ∩ Y|`` (``reveal=False``), and ``|Y|``;
* the sender: ``|X|``;
* the relay (the ServerApp): ``|X|`` and ``|Y|`` from the message sizes, and no ID.

:func:`run_psi` runs the three steps in one process (tests, the benchmark); a strategy runs
:class:`Receiver` and :class:`Sender` on two nodes and relays their bytes. Each step's CPU time is in
:attr:`PSIStats` with the bytes of each message, so that the virtual clock can charge both.
"""

from __future__ import annotations

import hashlib
import struct
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from fl_app.run.errors import ConfigError

#: The PSI backends, the first that imports being the default (``psi-backend=auto``).
BACKENDS = ("openmined", "dh")
_DOMAIN = b"sflower-psi"
_POINT = 32  # bytes of an X25519 coordinate


def openmined_available() -> bool:
    """Whether ``openmined.psi`` (module ``private_set_intersection``) imports."""
    try:
        import private_set_intersection.python  # noqa: F401
    except ImportError:
        return False
    return True


def resolve_backend(name: str) -> str:
    """``auto`` -> ``openmined`` if it imports, else ``dh``; a named backend is checked.

    Raises:
        ConfigError: unknown backend, or ``openmined`` requested but not installed.
    """
    if name == "auto":
        return "openmined" if openmined_available() else "dh"
    if name not in BACKENDS:
        raise ConfigError(f"psi-backend={name!r}: choose one of auto, {', '.join(BACKENDS)}")
    if name == "openmined" and not openmined_available():
        raise ConfigError("psi-backend=openmined: install openmined.psi==2.0.4 (pip install 'sflower[vertical]')")
    return name


def check_ids(ids: Sequence[str], who: str) -> list[str]:
    """``ids`` as strings, refused in one line when empty or duplicated.

    Raises:
        ConfigError: no IDs, or an ID that occurs twice (named, with the party ``who``).
    """
    out = [str(i) for i in ids]
    if not out:
        raise ConfigError(f"{who}: no sample IDs")
    if len(set(out)) != len(out):
        seen: set[str] = set()
        dup = next(i for i in out if i in seen or seen.add(i))
        raise ConfigError(f"{who}: duplicate sample ID {dup!r}: IDs must be unique for PSI")
    return out


@dataclass
class PSIStats:
    """The cost of one PSI: CPU seconds per party and bytes per message.

    Attributes:
        seconds: ``role -> CPU seconds`` (``receiver``, ``sender``), summed over its steps.
        bytes: ``message -> bytes`` (``request``: receiver to sender, ``response``: sender to receiver).
    """

    seconds: dict[str, float] = field(default_factory=lambda: {"receiver": 0.0, "sender": 0.0})
    bytes: dict[str, int] = field(default_factory=lambda: {"request": 0, "response": 0})

    @property
    def total_bytes(self) -> int:
        """Bytes of every message."""
        return sum(self.bytes.values())

    @property
    def total_seconds(self) -> float:
        """CPU seconds of both parties."""
        return sum(self.seconds.values())


def _hash_point(x: str) -> bytes:
    return hashlib.sha256(_DOMAIN + x.encode()).digest()


def _x25519():
    from cryptography.hazmat.primitives.asymmetric.x25519 import (
        X25519PrivateKey,
        X25519PublicKey,
    )
    return X25519PrivateKey, X25519PublicKey


def _mul(key, points: Sequence[bytes]) -> list[bytes]:
    _, pub = _x25519()
    return [key.exchange(pub.from_public_bytes(p)) for p in points]


def _pack(points: Sequence[bytes]) -> bytes:
    return b"".join(points)


def _unpack(blob: bytes) -> list[bytes]:
    if len(blob) % _POINT:
        raise ValueError(f"PSI message of {len(blob)} bytes is not a list of {_POINT}-byte points")
    return [blob[i:i + _POINT] for i in range(0, len(blob), _POINT)]


class Receiver:
    """The party that learns the intersection (or its size) of its IDs with a sender's.

    Args:
        ids: this party's sample IDs (unique strings).
        backend: ``openmined`` or ``dh`` (:func:`resolve_backend`).
        reveal: True: learn which IDs are shared; False: only how many.
        key: a private key from :meth:`key_bytes` (a node keeps it in its state between steps); None: new.
    """

    def __init__(self, ids: Sequence[str], backend: str, reveal: bool = True, key: bytes | None = None) -> None:
        self.ids, self.backend, self.reveal = check_ids(ids, "PSI receiver"), backend, reveal
        if backend == "openmined":
            from private_set_intersection.python import client
            self._c = (client.CreateFromKey(key, reveal) if key else client.CreateWithNewKey(reveal))
        else:
            priv, _ = _x25519()
            self._k = priv.from_private_bytes(key) if key else priv.generate()

    def key_bytes(self) -> bytes:
        """The private key (stays on the node)."""
        if self.backend == "openmined":
            return self._c.GetPrivateKeyBytes()
        from cryptography.hazmat.primitives import serialization as s
        return self._k.private_bytes(s.Encoding.Raw, s.PrivateFormat.Raw, s.NoEncryption())

    def request(self) -> bytes:
        """Step 1, to the sender: this party's IDs, each encrypted under its key."""
        if self.backend == "openmined":
            return self._c.CreateRequest(self.ids).SerializeToString()
        return _pack(_mul(self._k, [_hash_point(x) for x in self.ids]))

    def intersect(self, response: bytes) -> np.ndarray | int:
        """Step 3: the sorted positions in ``ids`` of the shared IDs (``reveal``), else their number."""
        if self.backend == "openmined":
            from private_set_intersection.python import Response, ServerSetup
            n = struct.unpack(">Q", response[:8])[0]
            setup, resp = ServerSetup(), Response()
            setup.ParseFromString(response[8:8 + n])
            resp.ParseFromString(response[8 + n:])
            if not self.reveal:
                return int(self._c.GetIntersectionSize(setup, resp))
            return np.sort(np.asarray(self._c.GetIntersection(setup, resp), dtype=np.int64))
        n = struct.unpack(">Q", response[:8])[0]
        doubled = _unpack(response[8:8 + n])
        theirs = set(_mul(self._k, _unpack(response[8 + n:])))
        hits = [i for i, d in enumerate(doubled) if d in theirs]
        return np.asarray(hits, dtype=np.int64) if self.reveal else len(hits)


class Sender:
    """The party that answers a receiver's request, learning only the size of the receiver's set.

    Args:
        ids: this party's sample IDs (unique strings).
        backend: ``openmined`` or ``dh``.
        reveal: must equal the receiver's (False: the receiver learns only the size).
        seed: seeds the shuffle of the sender's encrypted IDs (``dh``); the key is always fresh.
    """

    def __init__(self, ids: Sequence[str], backend: str, reveal: bool = True, seed: int = 0) -> None:
        self.ids, self.backend, self.reveal, self.seed = check_ids(ids, "PSI sender"), backend, reveal, seed

    def respond(self, request: bytes) -> bytes:
        """Step 2, to the receiver: the request encrypted again, with this party's IDs encrypted once."""
        rng = np.random.default_rng([self.seed, 45])
        if self.backend == "openmined":
            from private_set_intersection.python import DataStructure, Request, server
            srv = server.CreateWithNewKey(self.reveal)
            req = Request()
            req.ParseFromString(request)
            n_client = len(req.encrypted_elements)
            setup = srv.CreateSetupMessage(1e-9, max(n_client, 1), self.ids, DataStructure.RAW).SerializeToString()
            resp = srv.ProcessRequest(req).SerializeToString()
            return struct.pack(">Q", len(setup)) + setup + resp
        priv, _ = _x25519()
        key = priv.generate()
        doubled = _mul(key, _unpack(request))
        if not self.reveal:
            doubled = [doubled[i] for i in rng.permutation(len(doubled))]
        mine = _mul(key, [_hash_point(self.ids[i]) for i in rng.permutation(len(self.ids))])
        body = _pack(doubled)
        return struct.pack(">Q", len(body)) + body + _pack(mine)


def run_psi(receiver_ids: Sequence[str], sender_ids: Sequence[str], backend: str = "auto", reveal: bool = True,
            seed: int = 0) -> tuple[np.ndarray | int, PSIStats]:
    """One PSI in this process: the receiver's positions of the shared IDs (or their number) and its cost.

    Raises:
        ConfigError: an empty or duplicated ID list, or an unavailable backend.
    """
    backend = resolve_backend(backend)
    stats = PSIStats()
    t = time.process_time()
    rec = Receiver(receiver_ids, backend, reveal)
    req = rec.request()
    stats.seconds["receiver"] += time.process_time() - t
    t = time.process_time()
    resp = Sender(sender_ids, backend, reveal, seed).respond(req)
    stats.seconds["sender"] += time.process_time() - t
    t = time.process_time()
    out = rec.intersect(resp)
    stats.seconds["receiver"] += time.process_time() - t
    stats.bytes.update(request=len(req), response=len(resp))
    return out, stats


def align(label_ids: Sequence[str], feature_ids: Sequence[Sequence[str]], backend: str = "auto",
          seed: int = 0) -> tuple[list[str], list[PSIStats]]:
    """The multi-party alignment: the IDs every party holds, sorted, and the cost of each PSI.

    Two rounds of two-party PSI, ``K`` feature parties:

    1. the label party receives against each feature party ``k`` and learns ``I_k = X_L ∩ X_k``;
       the final intersection is ``I = ∩_k I_k``. **With K > 1 the label party learns every
       pairwise intersection** ``I_k``, not only ``I`` (inherent to pairwise PSI);
    2. each feature party ``k`` receives against the label party's ``I`` and learns ``I ∩ X_k = I``.

    So a feature party learns ``I``, ``|X_L|`` and ``|I|``, and no ID outside ``I``; the label party
    learns the ``I_k`` and each ``|X_k|``. Every party sorts ``I`` the same way, which fixes the rows'
    common order (mini-batches are positions in it). Here all in one process; :class:`Receiver` and
    :class:`Sender` are the nodes' halves.

    Raises:
        ConfigError: an empty or duplicated ID list, or an empty intersection (one line).
    """
    label_ids = check_ids(label_ids, "label party")
    stats, shared = [], set(label_ids)
    for k, ids in enumerate(feature_ids):
        pos, s = run_psi(label_ids, check_ids(ids, f"feature party {k}"), backend, True, seed + k)
        shared &= {label_ids[i] for i in pos}
        stats.append(s)
    if not shared:
        raise ConfigError("PSI: the parties share no sample ID (empty intersection)")
    final = sorted(shared)
    for k, ids in enumerate(feature_ids):
        pos, s = run_psi(ids, final, backend, True, seed + 100 + k)
        if len(pos) != len(final):
            raise ConfigError(f"PSI: feature party {k} does not hold every shared ID")
        stats.append(s)
    return final, stats
