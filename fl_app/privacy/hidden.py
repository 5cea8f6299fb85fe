"""Client-side models hidden from the server: the clients' group key and sealed model states (issue 43).

With ``hide-client-models=true`` the clients play SplitFed's separate *fed
server* (Thapa et al., "SplitFed: When Federated Learning Meets Split
Learning", AAAI 2022, §3: the fed server averages the client-side models and
is not the main server) among themselves, with the ServerApp as a blind
relay. This module is the cryptography, with no Flower message in it:

* every client has an X25519 key pair (RFC 7748); the server relays the
  public keys; :func:`pairwise_key` derives a 32-byte AES key from a pair
  with HKDF-SHA256 (RFC 5869);
* the lowest-id client (the *leader*) draws a :class:`GroupSecret`: a random
  32-byte group key and the 63-bit seed of the client-side models' initial
  weights, and sends it to every other client sealed under their pairwise key;
* a client-side model state is uploaded as :func:`seal_state`: AES-256-GCM
  (NIST SP 800-38D) under the group key, a 12-byte random nonce, the
  uploader's id as associated data. The server stores and relays the
  ciphertexts only.

The server never sees the group key, the seed, a client-side state or their
average. Integrity: a ciphertext altered by the server fails
authentication (:class:`HiddenError`).
"""

from __future__ import annotations

import io
import os
from dataclasses import dataclass

from flwr.app import Array, ArrayRecord

import numpy as np
import torch
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

#: The message type of the clients' key agreement and federated evaluation (:mod:`fl_app.client.hidden`).
QUERY_HIDDEN = "query.hidden"
#: Record of a reply that carries a sealed client-side state instead of :data:`~fl_app.protocol.WEIGHTS`.
SEALED = "sealed"
#: Record of a request that carries the previous round's sealed uploads (the clients average them).
BUNDLE = "bundle"
#: Bytes a sealed message adds to its plaintext: the nonce and the GCM tag.
OVERHEAD = 12 + 16
_INFO = b"sflower hide-client-models v1"
#: The array that marks an ArrayRecord of weights as a bundle; the name of an uploader's weight in it.
MARK, WEIGHT = "hidden-bundle", "weight"


class HiddenError(ValueError):
    """A ciphertext that fails authentication, or a key agreement out of order (one line)."""


def new_private_key() -> bytes:
    """A fresh X25519 private key, 32 raw bytes (from the OS's random source)."""
    return X25519PrivateKey.generate().private_bytes(ser.Encoding.Raw, ser.PrivateFormat.Raw, ser.NoEncryption())


def public_key(private: bytes) -> bytes:
    """The 32 raw bytes of the X25519 public key of ``private``."""
    key = X25519PrivateKey.from_private_bytes(private).public_key()
    return key.public_bytes(ser.Encoding.Raw, ser.PublicFormat.Raw)


def pairwise_key(private: bytes, peer_public: bytes, context: bytes) -> bytes:
    """A 32-byte AES key both ends of a pair derive: HKDF-SHA256 of their X25519 shared secret.

    Args:
        private: this end's raw private key.
        peer_public: the other end's raw public key.
        context: bound into HKDF's ``info`` (e.g. both ids), so that one pair's key serves one purpose.
    """
    shared = X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO + b"|" + context).derive(shared)


def seal(key: bytes, plaintext: bytes, aad: bytes) -> bytes:
    """AES-256-GCM of ``plaintext`` under ``key``: ``nonce (12 bytes) || ciphertext || tag (16 bytes)``."""
    nonce = os.urandom(12)
    return nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def unseal(key: bytes, blob: bytes, aad: bytes) -> bytes:
    """The plaintext of :func:`seal`'s ``blob``.

    Raises:
        HiddenError: wrong key, wrong ``aad``, or altered bytes.
    """
    try:
        return AESGCM(key).decrypt(bytes(blob[:12]), bytes(blob[12:]), aad)
    except InvalidTag:
        raise HiddenError("a sealed client-side model failed authentication (wrong key or altered bytes)") from None


@dataclass(frozen=True)
class GroupSecret:
    """What the clients share and the server never learns.

    Attributes:
        key: the 32-byte AES-256-GCM group key of the client-side model uploads.
        init_seed: the seed of the client-side models' initial weights (63 bits).
    """

    key: bytes
    init_seed: int

    @staticmethod
    def draw() -> GroupSecret:
        """A fresh secret from the OS's random source."""
        return GroupSecret(os.urandom(32), int.from_bytes(os.urandom(8), "big") >> 1)

    def to_bytes(self) -> bytes:
        """40 bytes: the key, then the seed big-endian."""
        return self.key + self.init_seed.to_bytes(8, "big")

    @staticmethod
    def from_bytes(data: bytes) -> GroupSecret:
        """The inverse of :meth:`to_bytes`.

        Raises:
            HiddenError: not 40 bytes.
        """
        if len(data) != 40:
            raise HiddenError(f"a group secret is 40 bytes, got {len(data)}")
        return GroupSecret(bytes(data[:32]), int.from_bytes(data[32:], "big"))


def upload_aad(pid: int) -> bytes:
    """The associated data of client ``pid``'s sealed uploads: a ciphertext cannot be passed off as another's."""
    return f"upload|{pid}".encode()


def envelope_aad(leader: int, member: int) -> bytes:
    """The associated data (and the HKDF context) of the group secret the leader seals for ``member``."""
    return f"group|{leader}|{member}".encode()


def seal_state(key: bytes, state: dict[str, torch.Tensor], aad: bytes) -> np.ndarray:
    """A state dict as one uint8 array: :func:`seal` of its ``.npz`` serialisation (no pickle).

    Its length is the tensors' bytes plus the ``.npz`` headers plus :data:`OVERHEAD`.
    """
    buf = io.BytesIO()
    np.savez(buf, **{k: v.detach().cpu().numpy() for k, v in state.items()})
    return np.frombuffer(seal(key, buf.getvalue(), aad), dtype=np.uint8)


def unseal_state(key: bytes, blob: np.ndarray, aad: bytes) -> dict[str, torch.Tensor]:
    """The state dict of :func:`seal_state`'s ``blob`` (CPU tensors).

    Raises:
        HiddenError: authentication fails.
    """
    plain = io.BytesIO(unseal(key, np.asarray(blob, dtype=np.uint8).tobytes(), aad))
    with np.load(plain, allow_pickle=False) as z:
        return {k: torch.from_numpy(z[k].copy()) for k in z.files}


def bundle_record(uploads: dict[int, dict[str, np.ndarray]], weights: dict[int, float]) -> ArrayRecord:
    """The round's *bundle*: ``pid -> {name: ciphertext}`` sealed uploads and their aggregation weights.

    An ArrayRecord: :data:`MARK`; for each uploader ``pid``, its ciphertexts
    ``"{pid}/{name}"`` (uint8; the head's and, U-shaped, the tail's) and its
    weight ``"{pid}/weight"`` (float64 ``[1]``). No upload: the clients build
    the hidden initial model (:func:`fl_app.client.hidden.open_bundle`).
    """
    arrays = {MARK: Array(np.zeros(1, dtype=np.uint8))}
    for pid in sorted(uploads):
        for name, blob in sorted(uploads[pid].items()):
            arrays[f"{pid}/{name}"] = Array(np.asarray(blob, dtype=np.uint8))
        arrays[f"{pid}/{WEIGHT}"] = Array(np.array([weights[pid]], dtype=np.float64))
    return ArrayRecord(arrays)


def is_bundle(record: ArrayRecord) -> bool:
    """Whether ``record`` is a bundle rather than plaintext weights."""
    return MARK in record.keys()
