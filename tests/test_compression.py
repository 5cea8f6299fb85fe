"""Codecs for what crosses the cut (issue 36): fl_app/cut/compression.py and the seam that applies them."""

from __future__ import annotations

import json

import math

import numpy as np
import pytest

from flwr.app import ArrayRecord

from fl_app import protocol as P
from fl_app.cut.compression import CODECS, decode_arrays, make_codec
from fl_app.run.errors import ConfigError


def _x(shape=(8, 6, 5, 5), seed=0):
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


def test_fp16_round_trip_within_half_precision():
    x = _x()
    y = decode_arrays(make_codec("fp16").encode("x", x))["x"]
    assert y.dtype == np.float32 and y.shape == x.shape
    # fp16 keeps 11 significant bits: relative error <= 2^-11 for normal values
    assert np.all(np.abs(y - x) <= 2.0**-11 * np.abs(x) + 1e-7)


def test_bf16_round_trip_within_bfloat16_precision():
    x = _x()
    enc = make_codec("bf16").encode("x", x)
    assert enc["x"].dtype == np.uint16
    y = decode_arrays(enc)["x"]
    # bf16 keeps 8 significant bits: relative error <= 2^-8 (round to nearest)
    assert np.all(np.abs(y - x) <= 2.0**-8 * np.abs(x))


def test_int8_hand_computed_example():
    # range [-0.51, 1.02]: scale = 1.53 / 255 = 0.006, zero = -128 - round(-0.51 / 0.006) = -128 + 85 = -43
    x = np.array([-0.51, 0.0, 0.25, 1.02], np.float32)
    enc = make_codec("int8").encode("x", x)
    assert float(enc["x::scale"]) == pytest.approx(0.006)
    assert int(enc["x::zero"]) == -43
    # codes: round(x / 0.006) - 43 = -85 - 43, 0 - 43, round(41.67) - 43, 170 - 43
    assert enc["x"].tolist() == [-128, -43, -1, 127]
    # decoded (q + 43) * 0.006: -0.51, 0, 42 * 0.006 = 0.252, 1.02
    np.testing.assert_allclose(decode_arrays(enc)["x"], [-0.51, 0.0, 0.252, 1.02], rtol=0, atol=1e-6)


def test_int8_error_at_most_half_a_step_and_per_channel_scales():
    x = _x()
    x[:, 2] *= 100  # one loud channel: per-tensor steps are coarse everywhere, per-channel ones only there
    for name in ("int8", "int8-channel"):
        enc = make_codec(name).encode("x", x, axis=1)
        y = decode_arrays(enc)["x"]
        scale = enc["x::scale"]
        assert np.all(np.abs(y - x) <= scale / 2 + 1e-5 * np.abs(x).max())
    per_channel = make_codec("int8-channel").encode("x", x, axis=1)
    assert per_channel["x::scale"].shape == (1, 6, 1, 1)
    quiet = np.delete(np.arange(6), 2)
    err_t = np.abs(decode_arrays(make_codec("int8").encode("x", x))["x"] - x)[:, quiet].max()
    err_c = np.abs(decode_arrays(per_channel)["x"] - x)[:, quiet].max()
    assert err_c < err_t / 10


def test_int8_codes_match_torch_quantize_per_tensor():
    torch = pytest.importorskip("torch")
    x = _x((64,), seed=3)
    enc = make_codec("int8").encode("x", x)
    ref = torch.quantize_per_tensor(torch.from_numpy(x), float(enc["x::scale"]), int(enc["x::zero"]), torch.qint8)
    assert np.abs(ref.int_repr().numpy().astype(int) - enc["x"].astype(int)).max() <= 1  # ties may round apart


def test_topk_error_feedback_keeps_what_it_drops():
    codec = make_codec("topk", 0.25)
    a, b = _x((4, 8), seed=1), _x((4, 8), seed=2)
    ea = codec.encode("g", a, stream="s")
    assert ea["g"].size == math.ceil(0.25 * a.size) == 8
    da = decode_arrays(ea)["g"]
    np.testing.assert_array_equal(codec.residuals["s"].reshape(a.shape), a - da)  # the residual is what was dropped
    assert np.count_nonzero(da) == 8 and np.all(np.abs(da[da != 0]).min() >= np.abs(a[da == 0]).max())
    db = decode_arrays(codec.encode("g", b, stream="s"))["g"]
    np.testing.assert_allclose(da + db + codec.residuals["s"].reshape(b.shape), a + b, rtol=0, atol=1e-6)


def test_topk_new_shape_starts_a_fresh_residual():
    codec = make_codec("topk", 0.5)
    codec.encode("g", _x((4, 8)), stream="s")
    small = _x((2, 8), seed=5)
    d = decode_arrays(codec.encode("g", small, stream="s"))["g"]
    np.testing.assert_array_equal(d + codec.residuals["s"].reshape(small.shape), small)


@pytest.mark.parametrize("name", CODECS)
@pytest.mark.parametrize("shape,axis", [((32, 64, 7, 7), 1), ((64, 32, 5, 5), 0), ((10,), 0), ((7, 3), 1)])
def test_encoded_bytes_equal_charged_bytes(name, shape, axis):
    codec = make_codec(name, 0.1)
    enc = codec.encode("x", _x(shape), axis=axis, stream="s")
    assert sum(a.nbytes for a in enc.values()) == codec.nbytes(shape, axis)
    assert decode_arrays(enc)["x"].shape == shape


def test_charged_bytes_by_hand():
    shape = (32, 64, 7, 7)  # 100,352 values
    n = 100_352
    assert make_codec("fp16").nbytes(shape) == 2 * n
    assert make_codec("int8").nbytes(shape) == n + 5  # codes + float32 scale + int8 zero-point
    assert make_codec("int8-channel").nbytes(shape, 1) == n + 5 * 64
    assert make_codec("topk", 0.1).nbytes(shape) == 10_036 * 8 + 4 * 4  # k = ceil(10,035.2)


@pytest.mark.parametrize("name,ratio,message", [
    ("gzip", 0.1, "unknown codec 'gzip'"),
    ("topk", 0.0, "topk-ratio must be in (0, 1]"),
    ("topk", 1.5, "topk-ratio must be in (0, 1]"),
])
def test_bad_codec_input_is_one_line(name, ratio, message):
    with pytest.raises(ConfigError) as err:
        make_codec(name, ratio)
    assert message in str(err.value) and "\n" not in str(err.value)


# --- the seam (fl_app/cut/link.py) and the charged bytes ------------------------------------------------
def test_link_encodes_float_records_only_and_decodes_back():
    import torch

    from fl_app import protocol as P
    from fl_app.cut.link import LinkCodecs, decode

    links = LinkCodecs(make_codec("int8"), make_codec("none"))
    x, y = torch.from_numpy(_x((4, 3, 2, 2))), torch.arange(4)
    content = P.record_dict({P.ACTIVATIONS: P.tensor_record("x", x), P.LABELS: P.tensor_record("y", y)})
    wire = links.encode(content, up=True)
    assert sorted(P.array_of(wire, P.ACTIVATIONS).keys()) == ["x", "x::scale", "x::zero"]
    assert P.array_of(wire, P.LABELS) is P.array_of(content, P.LABELS)  # int64 labels pass as they are
    assert P.record_bytes(P.array_of(wire, P.ACTIVATIONS)) == 48 + 5
    back = decode(wire)
    assert torch.allclose(P.record_tensor(P.array_of(back, P.ACTIVATIONS), "x"), x,
                          atol=float(P.array_of(wire, P.ACTIVATIONS)["x::scale"].numpy().reshape(-1)[0]) / 2 + 1e-6)
    assert links.encode(content, up=False) is content and decode(content) is content


def test_topk_link_leaves_model_weights_float32():
    import torch

    from fl_app import protocol as P
    from fl_app.cut.link import LinkCodecs

    links = LinkCodecs(make_codec("topk", 0.1), make_codec("none"))
    content = P.record_dict({P.WEIGHTS: P.state_record({"w": torch.ones(3, 2)}),
                             P.GRADIENT: P.tensor_record("g", torch.ones(4, 5))})
    wire = links.encode(content, up=True)
    assert P.array_of(wire, P.WEIGHTS) is P.array_of(content, P.WEIGHTS)
    assert sorted(P.array_of(wire, P.GRADIENT).keys()) == ["g", "g::idx", "g::shape"]


@pytest.mark.parametrize("key,value,message", [
    ("compress_up", "gzip", "compress-up must be one of none, fp16, bf16, int8, int8-channel, topk; got 'gzip'"),
    ("topk_ratio", 0, "topk-ratio must be > 0, got 0.0"),
    ("topk_ratio", 1.5, "topk-ratio must be <= 1, got 1.5"),
])
def test_bad_run_config_is_one_line(key, value, message):
    from tests.conftest import make_cfg

    with pytest.raises(ConfigError) as err:
        make_cfg(**{key: value})
    assert str(err.value) == message


def _tiny_run(tmp_path, monkeypatch, **keys):
    """A LeNet-5 SplitFed-V1 run (3 clients, 1 global iteration of 2 steps, batch 8); every metered reply's
    encoded bytes are checked against the bits its request charged the virtual clock."""
    from simulation.engine import run_inprocess
    from simulation.server_app import plan_run
    from strategies.core.exchange import Exchange
    from tests.conftest import make_cfg

    receive, charged = Exchange.receive, []

    def checked(self, until=None):
        before = self.bytes_up
        reply = receive(self, until)
        if reply is not None and reply.content is not None and reply.request.metered:
            charged.append((8 * (self.bytes_up - before), reply.request.bits_up))
        return reply

    monkeypatch.setattr(Exchange, "receive", checked)
    cfg = make_cfg(model="lenet5", num_clients=3, concurrency=3, local_iterations=2, eval_samples=100,
                   output_dir=str(tmp_path / ("_".join(f"{v}" for v in keys.values()) or "f32")), **keys)
    summary = run_inprocess(plan_run(cfg), progress=False)
    assert summary["status"] == "completed"
    assert charged and all(sent == pytest.approx(bits, abs=1e-9) for sent, bits in charged)
    return summary


@pytest.mark.usefixtures("one_torch_thread")
def test_tiny_run_with_int8_uplink_sends_a_quarter_plus_overhead(tmp_path, monkeypatch):
    from fl_app.learning.task import load_task
    from tests.conftest import make_cfg

    f32 = _tiny_run(tmp_path, monkeypatch)
    int8 = _tiny_run(tmp_path, monkeypatch, compress_up="int8")
    # up: 6 activation messages (3 clients x 2 steps) of 8x6x12x12 float32 with 8 int64 labels each,
    # then each client's blocks [0, 2) (conv weight and bias). int8: a quarter of every float32 byte,
    # plus a 4-byte scale and a 1-byte zero-point per float tensor; labels unchanged.
    labels = 6 * 8 * 8
    task = load_task(make_cfg(model="lenet5", num_clients=3))
    tensors = 6 + 3 * sum(t.is_floating_point() for t in task.build_segment(0, 2).state_dict().values())
    floats = f32["bytes_up"] - labels
    assert int8["bytes_up"] == floats // 4 + 5 * tensors + labels
    assert 0.25 < int8["bytes_up"] / f32["bytes_up"] < 0.2505  # 226,704 / 905,424 = 0.25038
    assert int8["bytes_down"] == f32["bytes_down"]  # compress-down stays none
    assert int8["virtual_time_s"] < f32["virtual_time_s"]


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("up,down", [("topk", "int8-channel"), ("bf16", "fp16")])
def test_tiny_run_charges_what_it_sends(tmp_path, monkeypatch, up, down):
    _tiny_run(tmp_path, monkeypatch, compress_up=up, compress_down=down)


# --- the session transport carries the encoded arrays --------------------------------------------------
from tests.test_session import certs, run_over_sessions  # noqa: E402,F401 - the fixture and the helper


@pytest.mark.usefixtures("one_torch_thread")
def test_session_transport_carries_the_encoded_bytes(certs, tmp_path, monkeypatch):  # noqa: F811
    """Over TLS sessions (ThreadedGrid), the reply frames hold the encoded arrays: what ``bytes_up`` counts
    plus only the frames' own overhead (names, ``.npy`` headers), and the counts equal an in-process run's."""
    import fl_app.session.client as session_client
    from fl_app.client_app import app
    from simulation.engine import run_inprocess
    from simulation.server_app import plan_run
    from tests.conftest import make_cfg

    frames: list[int] = []
    encode = session_client.encode_frame

    def counting(head, content=None):
        frame = encode(head, content)
        if head.get("kind") == "reply" and content is not None:
            frames.append(len(frame))
        return frame

    monkeypatch.setattr(session_client, "encode_frame", counting)
    keys = dict(strategy="splitfed-v1", model="lenet5", num_clients=2, concurrency=2, global_iterations=1,
                local_iterations=2, eval_samples=100, compress_up="int8", compress_down="topk", clock="virtual")
    cfg = make_cfg(output_dir=str(tmp_path / "session"), transport="session", session_address="localhost:0",
                   session_timeout=20.0, session_certificate=str(certs["cert"]), session_key=str(certs["key"]),
                   session_ca=str(certs["ca"]), **keys)
    run = run_over_sessions(cfg, app)
    local = run_inprocess(plan_run(make_cfg(output_dir=str(tmp_path / "local"), transport="flower", **keys)),
                          progress=False)
    assert run.summary["status"] == "completed"
    assert (run.summary["bytes_up"], run.summary["bytes_down"]) == (local["bytes_up"], local["bytes_down"])
    wire = sum(frames)
    # every training reply went over a session; a frame adds its framing: names and a .npy header (about 128
    # bytes) per array. Measured: 157,436 bytes in 6 reply frames for 151,136 counted (4 % framing)
    assert run.summary["bytes_up"] <= wire <= run.summary["bytes_up"] + 1500 * len(frames)
    # the endpoint measures the same frames, and summary.json states them beside the charged bytes
    written = json.loads((tmp_path / "session" / "summary.json").read_text())
    assert written["wire_bytes_up"] == wire
    assert written["bytes_down"] < written["wire_bytes_down"] <= 1.1 * written["bytes_down"]


# --- a codec on a link where it has nothing to encode ----------------------------------------------------
WEIGHTS_ONLY_CASES = [  # (keys, the links the strategy declares weights-only)
    (dict(strategy="fedavg"), {"up", "down"}),
    (dict(strategy="fedbuff"), {"up", "down"}),
    (dict(strategy="mu-splitfed"), {"down"}),
    (dict(strategy="splitfed-v1", client_optimizer="zo"), {"down"}),
    (dict(strategy="gas", client_optimizer="zo"), {"down"}),
    (dict(strategy="gas"), set()),
    (dict(strategy="splitfed-v1"), set()),
    (dict(strategy="psl"), set()),
    (dict(strategy="ringsfl"), set()),
]


@pytest.mark.usefixtures("one_torch_thread")
@pytest.mark.parametrize("keys,declared", WEIGHTS_ONLY_CASES, ids=lambda v: "-".join(map(str, v.values()))
                         if isinstance(v, dict) else None)
def test_weights_only_links_are_what_crosses(tmp_path, monkeypatch, keys, declared):
    """The links a strategy declares weights-only carry, in a run with fp16 on both links, no encoded record
    but model weights; the others carry activations, gradients or perturbations. Top-k there is refused in
    one line, before the run; on the other links it is accepted."""
    from fl_app.cut.link import ENCODED, LinkCodecs
    from simulation.engine import run_inprocess
    from simulation.server_app import plan_run
    from tests.conftest import make_cfg

    seen: dict[str, set[str]] = {"up": set(), "down": set()}
    encode = LinkCodecs.encode

    def spying(self, content, *, up, owner=None):
        seen["up" if up else "down"].update(
            key for key, record in content.items() if key in ENCODED and isinstance(record, ArrayRecord)
            and any(a.dtype == "float32" for a in record.values()))
        return encode(self, content, up=up, owner=owner)

    monkeypatch.setattr(LinkCodecs, "encode", spying)
    base = dict(model="lenet5", num_clients=3, concurrency=3, local_iterations=2, eval_samples=100, **keys)
    summary = run_inprocess(plan_run(make_cfg(output_dir=str(tmp_path / "fp16"), compress_up="fp16",
                                              compress_down="fp16", **base)), progress=False)
    assert summary["status"] == "completed"
    assert {link for link in seen if seen[link] <= {P.WEIGHTS}} == declared, seen
    for link in ("up", "down"):
        cfg = make_cfg(output_dir=str(tmp_path / f"topk-{link}"), **{f"compress_{link}": "topk"}, **base)
        if link in declared:
            with pytest.raises(ConfigError, match=f"compress-{link}=topk: .* only model weights {link}"):
                plan_run(cfg)
        else:
            plan_run(cfg)
