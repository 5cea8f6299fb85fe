"""The server as a blind relay of the client-side models (``hide-client-models``, issue 43).

Threat model: an honest-but-curious ServerApp; the clients do not collude
with it. Without this mode the server initialises the client-side models
from the public seed, sends them each round and averages them; with a tail's
weights it infers labels by gradient matching, with a head's it inverts
inputs. With it, the clients play SplitFed's *fed server* (Thapa et al.,
AAAI 2022, §3) among themselves and the server only relays ciphertexts
(:mod:`fl_app.privacy.hidden`, :mod:`fl_app.client.hidden`):

1. **Key agreement**, once, before the first evaluation: every client's
   X25519 public key up (``query.hidden keys``); the others' public keys to the
   lowest-id client, which draws the group key and the hidden init seed and
   returns them sealed for each member (``lead``); each envelope to its member
   (``join``). Three exchanges; 32 bytes up per member, ``68`` bytes per
   member down and up again.
2. **Each round**: instead of the client-side weights, every cohort member's
   first forward carries the *bundle*: the previous round's sealed uploads
   (the head's and, U-shaped, the tail's ciphertext per uploader) and their
   aggregation weights; each client averages them itself
   (:func:`fl_app.learning.averaging.weighted_average`, ascending id, the server's own
   default rule, so all clients agree bit for bit). The first round's bundle
   holds no upload: the clients build the initial client-side model from the
   hidden seed. The uploads at the end of the round are ciphertexts. Cost:
   each member downloads ``K`` ciphertexts (``K`` uploaders) instead of one
   model; no extra message, no leader to trust or wait for.
3. **Evaluation** is federated: each live client gets the server-side model
   (plaintext) and the bundle, puts the whole model together and scores its
   shard of the test set; the server combines the counts. Its traffic is not
   counted in ``bytes_up``/``bytes_down`` and takes no virtual time, as the
   server's own evaluation does not.

Why not Flower's SecAgg+: it reveals the *aggregate* to the server, and the
aggregate is the next round's starting client-side model, exactly what must
stay hidden.

The server's own copy of the client-side model is filled with NaN: it holds
no client-side weight, so neither do its checkpoints (refused anyway: they
carry the clients' states) nor its saved model.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from flwr.app import Array, ArrayRecord, ConfigRecord, RecordDict

from fl_app import protocol as P
from fl_app.run.config import RunConfig
from fl_app.run.errors import ConfigError
from fl_app.privacy.hidden import BUNDLE, QUERY_HIDDEN, SEALED, bundle_record
from strategies.core.base import SFLStrategy
from strategies.core.dispatcher import Request
from strategies.core.validation import ReplyProblem

if TYPE_CHECKING:
    from strategies.core.split import SyncSplitStrategy

#: The key agreement's bytes per member (X25519 public key; sealed 40-byte secret).
PUBLIC_BYTES, ENVELOPE_BYTES = 32, 40 + 28


def check_hidden(cls: type, cfg: RunConfig) -> None:
    """Refuse ``hide-client-models`` where it cannot hold.

    Raises:
        ConfigError: (one line) the strategy has no hidden form (class attribute ``hides_client_models``), it
            overrides the aggregation hook (the clients average with the default rule), or the run asks for
            checkpoints (``checkpoint-every``, ``resume``: they carry the clients' keys to the server),
            zeroth-order clients, or a model codec (``compress-up``/``compress-down`` would alter ciphertexts).
    """
    if not cfg.get("hide-client-models"):
        return
    if not getattr(cls, "hides_client_models", False):
        raise ConfigError(f"hide-client-models is not supported for strategy {cls.name} "
                          "(supported: splitfed-v1, splitfed-v2, minibatch-sfl, vanilla-sl)")
    from strategies.core.aggregation import ModelAggregation
    if cls.aggregate_models is not ModelAggregation.aggregate_models:
        raise ConfigError(f"hide-client-models: {cls.name} overrides aggregate_models; the clients average "
                          "with the default weighted mean")
    if int(cfg.get("checkpoint-every")) or str(cfg.get("resume")):
        raise ConfigError("hide-client-models does not support checkpoint-every or resume: a checkpoint carries "
                          "the clients' keys and models to the server")
    if cfg.get("client-optimizer") == "zo":
        raise ConfigError("hide-client-models needs first-order clients (client-optimizer=sgd)")
    for key in ("compress-up", "compress-down"):
        if str(cfg.get(key) or "none") != "none":
            raise ConfigError(f"hide-client-models does not support {key}: the codec would alter the ciphertexts")


class SealedModels:
    """The server's side of the mode (the module docstring): relay keys, keep ciphertexts, gather evaluations.

    Args:
        strategy: the synchronous split strategy it serves (its ``gather``, ``live_clients``,
            ``aggregation_weight``, ``server_model``, ``exchange``).
    """

    def __init__(self, strategy: SyncSplitStrategy) -> None:
        self.strategy = strategy
        #: the latest round's sealed uploads, ``pid -> {name: uint8 ciphertext}``, and their weights
        self.uploads: dict[int, dict[str, np.ndarray]] = {}
        self.weights: dict[int, float] = {}
        #: the clients that hold the group key (empty: no key agreement yet)
        self.members: list[int] = []
        with torch.no_grad():
            for p in strategy.client_model.parameters():
                p.fill_(math.nan)  # the server holds no client-side weight

    # ------------------------------------------------------------------ key agreement
    @staticmethod
    def _request(phase: str, arrays: Mapping[str, np.ndarray] | None = None, bits_up: float = 0.0,
                 **config: Any) -> Request:
        content = RecordDict({P.CONFIG: ConfigRecord({"phase": phase, **config})})
        if arrays:
            content["hidden"] = ArrayRecord({k: Array(np.asarray(v)) for k, v in arrays.items()})
        return Request(QUERY_HIDDEN, content, 0.0, bits_up)

    def ensure_group(self) -> None:
        """Run the key agreement among the live clients, once (the module docstring, step 1)."""
        if self.members:
            return
        s = self.strategy
        replies = s.gather({pid: self._request("keys", bits_up=8.0 * PUBLIC_BYTES) for pid in s.live_clients()})
        public = {pid: c["hidden"]["public"].numpy() for pid, c in replies.items()}
        leader, others = min(public), sorted(public)[1:]
        lead = s.gather({leader: self._request("lead", {f"public/{p}": public[p] for p in others},
                                               bits_up=8.0 * ENVELOPE_BYTES * len(others))})
        if leader not in lead:
            raise RuntimeError("hide-client-models: the leader of the key agreement failed")
        envelopes = lead[leader]["hidden"]
        joined = s.gather({p: self._request("join", {"public": public[leader],
                                                     "envelope": envelopes[f"envelope/{p}"].numpy()}, leader=leader)
                           for p in others})
        self.members = sorted([leader, *joined])

    # ------------------------------------------------------------------ rounds
    def bundle(self) -> ArrayRecord:
        """The round's start weights: the latest sealed uploads and their weights (none: the hidden init)."""
        self.ensure_group()
        return bundle_record(self.uploads, self.weights)

    def collect(self, uploads: Mapping[int, Mapping[str, torch.Tensor]]) -> None:
        """Keep a round's sealed uploads (ciphertexts as :meth:`sealed_weights` read them) and their weights."""
        if uploads:
            self.uploads = {pid: {k: v.numpy() for k, v in up.items()} for pid, up in uploads.items()}
            self.weights = {pid: float(self.strategy.aggregation_weight(pid)) for pid in uploads}

    @staticmethod
    def sealed_weights(content: RecordDict) -> tuple[dict[str, torch.Tensor], int]:
        """``({name: uint8 ciphertext}, num_examples)`` of a sealed weights reply."""
        record = content[SEALED]
        return ({k: torch.from_numpy(record[k].numpy().copy()) for k in record.keys()},
                int(P.get_config(content, P.INFO)[P.INFO_NUM_EXAMPLES]))

    @staticmethod
    def problem(content: RecordDict) -> ReplyProblem | None:
        """Why a reply is unusable in this mode: plaintext client-side weights, or a malformed sealed record."""
        if P.get_array(content, P.WEIGHTS) is not None:
            return ReplyProblem("plaintext client-side weights in a hide-client-models run")
        record = P.get_array(content, SEALED)
        if record is None:
            return None
        if len(record) != 1 or any(str(a.dtype) != "uint8" or len(a.shape) != 1 for a in record.values()):
            return ReplyProblem(f"{SEALED} must hold one 1-D uint8 ciphertext")
        info = P.get_config(content, P.INFO)
        count = None if info is None else info.get(P.INFO_NUM_EXAMPLES)
        if isinstance(count, bool) or not isinstance(count, int) or count < 1:
            return ReplyProblem(f"{P.INFO}/{P.INFO_NUM_EXAMPLES} is {count!r}, expected a positive integer")
        return None

    # ------------------------------------------------------------------ evaluation
    def evaluate(self, limit: int) -> tuple[float, float, dict[str, float]]:
        """Federated evaluation (the module docstring, step 3) on the first ``limit`` test images (0: all).

        Returns:
            ``(loss, accuracy, {})`` over the examples the clients scored (a client that fails leaves its
            shard out).
        """
        self.ensure_group()
        s = self.strategy
        members = [p for p in self.members if p in set(s.live_clients())]
        weights = P.state_record(s.server_model.state_dict())
        bundle = self.bundle()
        requests = {}
        for i, pid in enumerate(members):
            content = RecordDict({P.CONFIG: ConfigRecord({"phase": "evaluate", "shard": i, "shards": len(members),
                                                          "limit": int(limit)}),
                                  P.WEIGHTS: weights, BUNDLE: bundle})
            requests[pid] = Request(QUERY_HIDDEN, content, 0.0, 0.0, bits_down=0.0, metered=False)
        before = s.exchange.bytes_down
        replies = s.gather(requests)
        s.exchange.bytes_down = before  # not a training cost: the server's own evaluation sends nothing
        loss_sum, correct, count = 0.0, 0, 0
        for content in replies.values():
            info = P.get_config(content, P.INFO)
            n = int(info[P.INFO_NUM_EXAMPLES])
            loss_sum += float(info[P.INFO_LOSS]) * n
            correct += round(float(info[P.INFO_ACCURACY]) * n)
            count += n
        if count == 0:
            return math.nan, math.nan, {}
        return loss_sum / count, correct / count, {}


class HiddenClientModels(SFLStrategy):
    """The hooks of a split strategy (a base of :class:`~strategies.core.split.SplitMixin`) that read sealed
    replies, refuse plaintext ones and evaluate on the clients when :attr:`sealed` is set."""

    #: the mode's server side, or None (set by :meth:`strategies.core.split.SplitMixin.initialize`)
    sealed: SealedModels | None = None

    @staticmethod
    def weights_of(content: RecordDict) -> tuple[dict[str, torch.Tensor], int]:
        """``(state_dict, num_examples)`` of a weights reply (:func:`fl_app.protocol.replies.weights`); of a
        sealed one (``hide-client-models``), ``({name: uint8 ciphertext}, num_examples)``."""
        if SEALED in content:
            return SealedModels.sealed_weights(content)
        return P.replies.weights(content)

    def validate_reply(self, pid: int, request: Request, content: RecordDict) -> ReplyProblem | None:
        """With ``hide-client-models``, no plaintext client-side weights and well-formed sealed ones
        (:meth:`SealedModels.problem`) first."""
        if self.sealed is not None and content is not None:
            problem = self.sealed.problem(content)
            if problem is not None or SEALED in content:
                return problem
        return super().validate_reply(pid, request, content)

    def evaluate_global(self, full: bool = True) -> tuple[float, float, dict[str, float]]:
        """With ``hide-client-models``, the clients' federated evaluation (:meth:`SealedModels.evaluate`)."""
        if self.sealed is not None:
            return self.sealed.evaluate(0 if full else self.cfg.eval_samples)
        return super().evaluate_global(full)
