"""Vertical split learning (issue 45): PSI, vertical data, the vertical strategy."""

from __future__ import annotations

import numpy as np
import pytest

from fl_app import psi
from fl_app.errors import ConfigError

BACKENDS = [b for b in psi.BACKENDS if b != "openmined" or psi.openmined_available()]


def _parties(n: int, overlap: float, seed: int = 0) -> tuple[list[str], list[str], set[str]]:
    rng = np.random.default_rng(seed)
    shared = round(overlap * n)
    pool = [f"cust-{v:010d}" for v in rng.choice(10**8, size=2 * n - shared, replace=False)]
    a, b = pool[:n], pool[n - shared:]
    return [a[i] for i in rng.permutation(n)], [b[i] for i in rng.permutation(n)], set(a) & set(b)


# ---------------------------------------------------------------- PSI
@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("overlap", [0.5, 0.8, 1.0])
def test_psi_equals_the_true_intersection(backend, overlap):
    a, b, truth = _parties(400, overlap, seed=int(overlap * 10))
    pos, stats = psi.run_psi(a, b, backend)
    assert {a[i] for i in pos} == truth and len(pos) == len(truth) == round(overlap * 400)
    assert stats.bytes["request"] > 0 and stats.bytes["response"] > 0 and stats.total_seconds > 0
    size, _ = psi.run_psi(a, b, backend, reveal=False)  # cardinality only
    assert size == len(truth)


def test_psi_cardinality_mode_hides_which_ids():
    """With reveal=False (dh) the double encryptions come back shuffled: their order is not the request's."""
    a, b, _ = _parties(200, 0.5)
    rec = psi.Receiver(a, "dh", reveal=False)
    req = rec.request()
    ordered = psi.Sender(b, "dh", reveal=True, seed=3).respond(req)
    shuffled = psi.Sender(b, "dh", reveal=False, seed=3).respond(req)
    assert ordered[:8] == shuffled[:8] and ordered[8:8 + 200 * 32] != shuffled[8:8 + 200 * 32]
    assert rec.intersect(shuffled) == 100


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_party_receives_an_id_outside_the_intersection(backend, monkeypatch):
    """Every message a party receives during the alignment carries no ID (nor its hash) outside the
    intersection, and what each feature party learns is exactly the final intersection."""
    label, f1, _ = _parties(300, 0.8, seed=1)
    f2 = label[:200] + [f"only-f2-{i:06d}" for i in range(50)]
    received: list[bytes] = []
    real_respond, real_request = psi.Sender.respond, psi.Receiver.request

    def respond(self, request):
        received.append(request)  # what the sender receives
        out = real_respond(self, request)
        received.append(out)  # what the receiver receives
        return out

    monkeypatch.setattr(psi.Sender, "respond", respond)
    monkeypatch.setattr(psi.Receiver, "request", real_request)
    final, stats = psi.align(label, [f1, f2], backend)
    assert set(final) == set(label) & set(f1) & set(f2) and len(stats) == 4
    outside = (set(label) | set(f1) | set(f2)) - set(final)
    blob = b"".join(received)
    for x in outside:
        assert x.encode() not in blob and psi._hash_point(x) not in blob
    for ids in (f1, f2):  # a feature party's own view: its positions in the final intersection
        pos, _ = psi.run_psi(ids, final, backend)
        assert {ids[i] for i in pos} == set(final)


def test_psi_one_line_errors():
    with pytest.raises(ConfigError, match="duplicate sample ID 'a'"):
        psi.run_psi(["a", "b", "a"], ["b"], "dh")
    with pytest.raises(ConfigError, match="share no sample ID"):
        psi.align(["a", "b"], [["c", "d"]], "dh")
    with pytest.raises(ConfigError, match="no sample IDs"):
        psi.run_psi([], ["b"], "dh")
    with pytest.raises(ConfigError, match="psi-backend"):
        psi.resolve_backend("rsa")
