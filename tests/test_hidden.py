"""Client-side models hidden from the server, ``hide-client-models`` (fl_app/privacy/hidden.py, strategies/core/hidden.py).

* The cryptography: both ends of a pair derive one key, and only they; a
  sealed state opens to the same tensors, and an altered byte, another key
  or another uploader's id fails authentication.
* The clients' own aggregation is the weighted mean, against hand-computed values.
* Nothing the server receives or sends, and no file of the run directory,
  contains a client-side weight tensor that any client ever held (the hidden
  init, every trained state, every aggregate), U-shaped and prefix; the same
  search finds them in a run without the mode.
* With the hidden seed set to the public one, a hidden run's metrics equal the
  plain run's exactly; with a drawn seed the initial client-side model differs
  from the public one.
* Refusals: one line, exit 2.
"""

from __future__ import annotations

import csv
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from flwr.app import ArrayRecord, ConfigRecord, Context, Message, RecordDict

from fl_app import protocol as P
from fl_app.client.hidden import STATE_KEY, open_bundle
from fl_app.client.state import slot_key
from fl_app.client_app import app as real_app
from fl_app.run.config import RunConfig
from fl_app.privacy.hidden import (
    OVERHEAD,
    GroupSecret,
    HiddenError,
    bundle_record,
    new_private_key,
    pairwise_key,
    public_key,
    seal,
    seal_state,
    unseal,
    unseal_state,
    upload_aad,
)
from simulation import cli
from simulation.engine import run_inprocess
from simulation.server_app import plan_run

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BASE = {
    "dataset": "mnist-5k", "model": "lenet5", "strategy": "splitfed-v1", "num-clients": 3, "concurrency": 3,
    "partition": "iid", "local-iterations": 2, "batch-size": 8, "global-iterations": 2, "eval-samples": 200,
    "seed": 1,
}


def _run(tmp_path: Path, client_app=None, **overrides) -> Path:
    cfg = RunConfig.from_mapping({**BASE, "output-dir": str(tmp_path), **overrides})
    run_inprocess(plan_run(cfg), progress=False, client_app=client_app)
    return tmp_path


# --- 1. the cryptography --------------------------------------------------------------------------------
def test_pairwise_keys_agree_and_sealing_authenticates():
    a, b, c = new_private_key(), new_private_key(), new_private_key()
    k_ab = pairwise_key(a, public_key(b), b"ctx")
    assert k_ab == pairwise_key(b, public_key(a), b"ctx") and len(k_ab) == 32
    assert k_ab != pairwise_key(a, public_key(b), b"other") and k_ab != pairwise_key(c, public_key(b), b"ctx")
    blob = seal(k_ab, b"secret weights", b"aad")
    assert len(blob) == len(b"secret weights") + OVERHEAD and b"secret weights" not in blob
    assert unseal(k_ab, blob, b"aad") == b"secret weights"
    altered = bytearray(blob)
    altered[20] ^= 1
    for key, data, aad in ((k_ab, bytes(altered), b"aad"), (k_ab, blob, b"other"),
                           (pairwise_key(c, public_key(b), b"ctx"), blob, b"aad")):
        with pytest.raises(HiddenError, match="failed authentication"):
            unseal(key, data, aad)
    secret = GroupSecret.draw()
    assert GroupSecret.from_bytes(secret.to_bytes()) == secret and secret.init_seed < 2 ** 63


def test_sealed_state_round_trips_and_is_bound_to_its_uploader():
    state = {"w": torch.randn(4, 3), "n": torch.tensor([7])}
    key = GroupSecret.draw().key
    blob = seal_state(key, state, upload_aad(2))
    assert blob.dtype == np.uint8
    got = unseal_state(key, blob, upload_aad(2))
    assert torch.equal(got["w"], state["w"]) and torch.equal(got["n"], state["n"])
    with pytest.raises(HiddenError):
        unseal_state(key, blob, upload_aad(3))


def test_clients_average_the_bundle_by_hand():
    """Uploads w=[1, 2] (weight 1) and w=[3, 6] (weight 3): (1·[1,2] + 3·[3,6]) / 4 = [2.5, 5.0]; each
    uploader's head and tail ciphertexts merge into one state."""
    secret = GroupSecret.draw()
    node = SimpleNamespace(state=RecordDict({STATE_KEY: ConfigRecord({"secret": secret.to_bytes()})}))
    uploads = {0: {"h": seal_state(secret.key, {"h": torch.tensor([1.0, 2.0])}, upload_aad(0)),
                   "t": seal_state(secret.key, {"t": torch.tensor([10.0])}, upload_aad(0))},
               5: {"h": seal_state(secret.key, {"h": torch.tensor([3.0, 6.0])}, upload_aad(5)),
                   "t": seal_state(secret.key, {"t": torch.tensor([30.0])}, upload_aad(5))}}
    out = open_bundle(node, bundle_record(uploads, {0: 1.0, 5: 3.0}))
    assert torch.allclose(out["h"], torch.tensor([2.5, 5.0])) and torch.allclose(out["t"], torch.tensor([25.0]))


# --- 2. the server never holds a client-side weight ---------------------------------------------------------
class Watch:
    """A ClientApp wrapper: the raw bytes of every array the server sends and receives, and every
    client-side weight tensor any client holds after any message (own and tail slots)."""

    def __init__(self) -> None:
        self.seen: list[bytes] = []
        self.truth: dict[bytes, str] = {}
        self.contexts: list[Context] = []

    @staticmethod
    def _arrays(content: RecordDict) -> list[bytes]:
        return [record[n].numpy().tobytes() for record in content.values() if isinstance(record, ArrayRecord)
                for n in record.keys()]

    def __call__(self, msg: Message, context: Context) -> Message:
        self.seen += self._arrays(msg.content)
        reply = real_app(msg, context)
        if not reply.has_error():
            self.seen += self._arrays(reply.content)
        for slot in (P.OWN_SLOT, P.TAIL_SLOT):
            weights = context.state.get(slot_key(slot, "weights"))
            if isinstance(weights, ArrayRecord):
                for name in weights.keys():
                    arr = weights[name].numpy()
                    if arr.dtype == np.float32 and arr.size >= 16 and float(arr.std()) > 0:
                        self.truth[arr.tobytes()] = f"{slot}/{name}"
        return reply

    def leaks(self, run_dir: Path) -> list[str]:
        """Client-side tensors found in a message or a run-directory file."""
        files = [p.read_bytes() for p in run_dir.rglob("*") if p.is_file()]
        return [name for t, name in self.truth.items() if any(t in s for s in self.seen + files)]


@pytest.mark.parametrize("split", [{"cut-layers": "1,9"}, {"cut-layer": 2}])
def test_the_server_never_holds_client_side_weights(tmp_path, split):
    hidden, plain = Watch(), Watch()
    _run(tmp_path / "hidden", hidden, **split, **{"hide-client-models": True})
    _run(tmp_path / "plain", plain, **split)
    assert len(hidden.truth) >= 3 * 3  # init, trained, averaged states of several tensors
    assert hidden.leaks(tmp_path / "hidden") == []
    assert plain.leaks(tmp_path / "plain")  # the same search finds them without the mode
    rows = list(csv.DictReader(open(tmp_path / "hidden" / "metrics.csv")))
    assert len(rows) == 3 and all(0 < float(r["test_accuracy"]) <= 1 for r in rows)


# --- 3. the same numbers with the same init ---------------------------------------------------------------
@pytest.mark.parametrize("strategy", ["splitfed-v1", "splitfed-v2", "minibatch-sfl", "vanilla-sl"])
def test_hidden_run_equals_plain_run_with_the_public_seed(tmp_path, monkeypatch, strategy):
    """The hidden seed set to the public one (seed 1): every metric but the bytes, virtual and wall time (the
    key agreement and the bundles cost) is the plain run's exactly."""
    _run(tmp_path / "plain", strategy=strategy, **{"cut-layers": "1,9"})
    draw = GroupSecret.draw
    monkeypatch.setattr(GroupSecret, "draw", staticmethod(lambda: GroupSecret(draw().key, BASE["seed"])))
    _run(tmp_path / "hidden", strategy=strategy, **{"cut-layers": "1,9", "hide-client-models": True})
    plain, hidden = ([(r["test_accuracy"], r["test_loss"], r["server_updates"]) for r in
                      csv.DictReader(open(tmp_path / d / "metrics.csv"))] for d in ("plain", "hidden"))
    assert plain == hidden and len(plain) == 3


def test_a_drawn_seed_gives_another_initial_model(tmp_path):
    seen = {}

    def app(msg: Message, context: Context) -> Message:
        reply = real_app(msg, context)
        weights = context.state.get(slot_key(P.OWN_SLOT, "weights"))
        if isinstance(weights, ArrayRecord) and "first" not in seen:
            seen["first"] = P.record_state(weights)
        return reply

    _run(tmp_path, app, **{"cut-layers": "1,9", "hide-client-models": True, "global-iterations": 1})
    public = RunConfig.from_mapping(BASE)
    from fl_app.learning.task import load_task
    init = load_task(public).build_model().state_dict()
    name = next(k for k in seen["first"] if seen["first"][k].numel() >= 16)
    assert not torch.equal(seen["first"][name], init[name])
    assert seen["first"][name].std() == pytest.approx(init[name].std(), rel=0.5)  # same initialiser


# --- 4. bad input ------------------------------------------------------------------------------------------
@pytest.mark.parametrize("args, message", [
    (["strategy=psl"], "not supported for strategy psl"),
    (["checkpoint-every=1"], "does not support checkpoint-every"),
    (["compress-up=fp16"], "does not support compress-up"),
])
def test_refusals_are_one_line_exit_2(tmp_path, capsys, args, message):
    base = [f"{k}={v}" for k, v in BASE.items() if k != "strategy"]
    argv = ["run", "-q", "strategy=splitfed-v1", *base, "hide-client-models=true", f"output-dir={tmp_path}", *args]
    assert cli.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1
