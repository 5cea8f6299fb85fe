"""Tests for fl_app.models: block models, splitting, deterministic init, profiling."""

import pytest
import torch

from fl_app.errors import ConfigError
from fl_app.models import (
    MODELS,
    BlockModel,
    BlockProfile,
    build_model,
    profile_blocks,
    segment_profile,
    split_model,
)

SHAPES = [(1, 28, 28), (3, 32, 32)]
ALEXNET_NAMES = ["conv1", "conv2", "conv3", "conv4", "conv5", "fc1", "fc2", "fc3"]


def _x(shape, n=3, seed=1):
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------- shapes


def test_models_tuple():
    assert MODELS == ("alexnet", "lenet5")


@pytest.mark.parametrize("shape", SHAPES)
def test_alexnet_blocks_and_shapes(shape):
    m = build_model("alexnet", shape, 10)
    assert m.names == ALEXNET_NAMES
    assert len(m) == 8
    x = _x(shape)
    assert m(x).shape == (3, 10)
    client, _ = split_model(m, 2)
    act = client(x)
    expected = (64, 7, 7) if shape[1] == 28 else (64, 8, 8)
    assert act.shape == (3, *expected)
    # fc input is 256x3x3 for both forms
    assert m.segment(0, 5)(x).shape == (3, 256, 3, 3)


@pytest.mark.parametrize("shape", SHAPES)
def test_lenet5_has_12_blocks(shape):
    m = build_model("lenet5", shape, 7)
    assert len(m) == 12
    assert len(set(m.names)) == 12
    assert m(_x(shape)).shape == (3, 7)
    assert m.segment(0, 7)(_x(shape)).shape == (3, 400)  # 16x5x5 feature map


def test_unknown_model():
    with pytest.raises(ConfigError) as e:
        build_model("resnet1000", (1, 28, 28), 10)
    msg = str(e.value)
    assert "\n" not in msg
    for name in MODELS:
        assert name in msg


@pytest.mark.parametrize("bad", [(1, 28), (0, 28, 28), (1, 4, 4)])
def test_bad_input_shape(bad):
    with pytest.raises(ConfigError):
        build_model("alexnet", bad, 10)


def test_bad_num_classes():
    with pytest.raises(ConfigError):
        build_model("lenet5", (1, 28, 28), 0)


# ---------------------------------------------------------------------- split


@pytest.mark.parametrize("name", MODELS)
def test_split_equals_whole_every_cut(name):
    shape = (1, 28, 28)
    m = build_model(name, shape, 10)
    x = _x(shape)
    with torch.no_grad():
        full = m(x)
        for cut in range(1, len(m)):
            client, server = split_model(m, cut)
            assert len(client) == cut and len(server) == len(m) - cut
            assert torch.equal(server(client(x)), full)


@pytest.mark.parametrize("name", MODELS)
def test_split_state_dict_union(name):
    m = build_model(name, (3, 32, 32), 10)
    whole = m.state_dict()
    for cut in range(1, len(m)):
        client, server = split_model(m, cut)
        cs, ss = client.state_dict(), server.state_dict()
        assert not set(cs) & set(ss)
        union = {**cs, **ss}
        assert set(union) == set(whole)
        for k, v in whole.items():
            assert torch.equal(union[k], v)
        assert all(k.startswith("blocks.") for k in union)


def test_segment_shares_parameters():
    m = build_model("alexnet", (1, 28, 28), 10)
    seg = m.segment(1, 3)
    assert seg.names == ["conv2", "conv3"]
    assert seg.blocks["conv2"] is m.blocks["conv2"]
    with torch.no_grad():
        seg.blocks["conv2"][0].weight.fill_(0.5)
    assert torch.all(m.state_dict()["blocks.conv2.0.weight"] == 0.5)
    # loading a segment state_dict writes into the whole model
    sd = seg.state_dict()
    sd["blocks.conv3.0.bias"] = torch.full_like(sd["blocks.conv3.0.bias"], 2.0)
    seg.load_state_dict(sd)
    assert torch.all(m.blocks["conv3"][0].bias == 2.0)


def test_gradients_flow_through_split():
    m = build_model("alexnet", (1, 28, 28), 10)
    client, server = split_model(m, 2)
    x = _x((1, 28, 28))
    act = client(x)
    smashed = act.detach().requires_grad_(True)
    server(smashed).sum().backward()
    act.backward(smashed.grad)
    assert m.blocks["conv1"][0].weight.grad is not None
    assert m.blocks["fc3"].weight.grad is not None


@pytest.mark.parametrize("cut", [0, 8, 9, -1])
def test_cut_out_of_range(cut):
    m = build_model("alexnet", (1, 28, 28), 10)
    with pytest.raises(ConfigError) as e:
        split_model(m, cut)
    msg = str(e.value)
    assert "\n" not in msg
    assert msg == f"cut-layer {cut} out of range for alexnet (8 blocks): choose 1..7"


@pytest.mark.parametrize("start,end", [(-1, 2), (3, 3), (4, 2), (0, 9)])
def test_bad_segment(start, end):
    m = build_model("alexnet", (1, 28, 28), 10)
    with pytest.raises(ConfigError) as e:
        m.segment(start, end)
    assert "\n" not in str(e.value)


def test_block_model_rejects_duplicates():
    with pytest.raises(ValueError):
        BlockModel([("a", torch.nn.ReLU()), ("a", torch.nn.ReLU())])


# ----------------------------------------------------------------------- init


@pytest.mark.parametrize("name", MODELS)
def test_deterministic_init(name):
    a = build_model(name, (1, 28, 28), 10, seed=3).state_dict()
    b = build_model(name, (1, 28, 28), 10, seed=3).state_dict()
    c = build_model(name, (1, 28, 28), 10, seed=4).state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a)


def test_init_leaves_global_rng_untouched():
    torch.manual_seed(123)
    expected = torch.rand(4)
    torch.manual_seed(123)
    build_model("alexnet", (3, 32, 32), 10, seed=0)
    assert torch.equal(torch.rand(4), expected)


# -------------------------------------------------------------------- profile


def test_profile_alexnet_28():
    m = build_model("alexnet", (1, 28, 28), 10)
    ps = profile_blocks(m, (1, 28, 28))
    assert [p.name for p in ps] == ALEXNET_NAMES
    assert all(isinstance(p, BlockProfile) for p in ps)
    # FlopCounterMode: 2 FLOPs per multiply-accumulate, bias / relu / pool not counted.
    # conv: 2 * (Cin*k*k) * Cout * Hout * Wout (Hout before pooling)
    fwd = {
        "conv1": 2 * (1 * 9) * 32 * 28 * 28,  # 451,584
        "conv2": 2 * (32 * 9) * 64 * 14 * 14,
        "conv3": 2 * (64 * 9) * 128 * 7 * 7,
        "conv4": 2 * (128 * 9) * 256 * 7 * 7,
        "conv5": 2 * (256 * 9) * 256 * 7 * 7,
        "fc1": 2 * (256 * 3 * 3) * 1024,
        "fc2": 2 * 1024 * 512,
        "fc3": 2 * 512 * 10,
    }
    assert fwd["conv1"] == 451_584
    for p in ps:
        assert p.forward_flops == fwd[p.name], p.name
        # grads wrt input and weights: each costs one forward -> exactly 2x
        assert p.backward_flops == 2 * fwd[p.name], p.name
    by = {p.name: p for p in ps}
    assert by["conv2"].param_bytes == (32 * 64 * 9 + 64) * 4
    assert by["conv2"].output_shape == (64, 7, 7)
    assert by["conv1"].output_shape == (32, 14, 14)
    assert by["conv5"].output_shape == (256, 3, 3)
    assert by["fc1"].output_shape == (1024,)
    assert by["fc3"].output_shape == (10,)
    assert by["fc3"].param_bytes == (512 * 10 + 10) * 4
    assert sum(p.param_bytes for p in ps) == 4 * sum(t.numel() for t in m.parameters())


def test_profile_alexnet_32_and_classes():
    m = build_model("alexnet", (3, 32, 32), 100)
    ps = profile_blocks(m, (3, 32, 32))
    by = {p.name: p for p in ps}
    assert by["conv1"].forward_flops == 2 * (3 * 9) * 32 * 32 * 32
    assert by["conv2"].output_shape == (64, 8, 8)
    assert by["fc3"].forward_flops == 2 * 512 * 100


def test_profile_lenet5_parameter_free_blocks():
    m = build_model("lenet5", (1, 28, 28), 10)
    ps = profile_blocks(m, (1, 28, 28))
    assert len(ps) == 12
    by = {p.name: p for p in ps}
    assert by["conv1"].forward_flops == 2 * 25 * 6 * 28 * 28
    assert by["fc1"].forward_flops == 2 * 400 * 120
    for name in ("relu1", "pool1", "flatten", "relu4"):
        assert by[name].forward_flops == 0 and by[name].param_bytes == 0
    assert by["flatten"].output_shape == (400,)


def test_profile_does_not_touch_model():
    m = build_model("alexnet", (1, 28, 28), 10, seed=5)
    before = {k: v.clone() for k, v in m.state_dict().items()}
    profile_blocks(m, (1, 28, 28))
    assert all(p.grad is None for p in m.parameters())
    assert all(torch.equal(before[k], v) for k, v in m.state_dict().items())


def test_profile_segment_matches_whole():
    m = build_model("alexnet", (1, 28, 28), 10)
    whole = profile_blocks(m, (1, 28, 28))
    _, server = split_model(m, 2)
    part = profile_blocks(server, (64, 7, 7))
    assert part == whole[2:]


def test_segment_profile():
    m = build_model("alexnet", (1, 28, 28), 10)
    ps = profile_blocks(m, (1, 28, 28))
    seg = segment_profile(ps, 0, 2)
    assert seg.forward_flops == ps[0].forward_flops + ps[1].forward_flops
    assert seg.backward_flops == ps[0].backward_flops + ps[1].backward_flops
    assert seg.param_bytes == ps[0].param_bytes + ps[1].param_bytes
    assert seg.output_shape == (64, 7, 7)
    assert segment_profile(ps, 7, 8) == ps[7]
    full = segment_profile(ps, 0, 8)
    assert full.output_shape == (10,)
    with pytest.raises(ConfigError):
        segment_profile(ps, 3, 3)
    with pytest.raises(ConfigError):
        segment_profile(ps, 0, 9)
