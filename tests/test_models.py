"""Tests for fl_app.models: block models, splitting, deterministic init, profiling."""

import hashlib

import numpy as np
import pytest
import torch
from torch import nn

from fl_app.run.errors import ConfigError
from fl_app.models import (
    INITS,
    MODELS,
    BlockModel,
    BlockProfile,
    build_model,
    fixed_rng,
    profile_blocks,
    segment_profile,
    split_model,
)

# one intra-op thread: the machine's two cores are shared, and extra threads only contend
pytestmark = pytest.mark.usefixtures("one_torch_thread")

SHAPES = [(1, 28, 28), (3, 32, 32)]
ALEXNET_NAMES = ["conv1", "conv2", "conv3", "conv4", "conv5", "fc1", "fc2", "fc3"]


def _x(shape, n=3, seed=1):
    return torch.randn(n, *shape, generator=torch.Generator().manual_seed(seed))


# --------------------------------------------------------------------- shapes


def test_models_tuple():
    assert MODELS == ("alexnet", "alexnet-gas", "lenet5", "lenet5-ringsfl", "vgg16", "resnet18", "alexnet17",
                      "vit-small")


def test_lenet5_ringsfl_is_the_authors_model():
    """RingSFL's LeNet_Mnist (DistRingSFL model/LeNet.py), block for block: average pooling, not max."""
    ours = build_model("lenet5-ringsfl", (1, 28, 28), 10, seed=2)
    theirs = nn.ModuleList([nn.Conv2d(1, 6, 5, 1, 2), nn.ReLU(), nn.AvgPool2d(2, 2), nn.Conv2d(6, 16, 5), nn.ReLU(),
                            nn.AvgPool2d(2, 2), nn.Flatten(), nn.Linear(400, 120), nn.ReLU(), nn.Linear(120, 84),
                            nn.ReLU(), nn.Linear(84, 10)])
    assert len(ours) == len(theirs) == 12
    with torch.no_grad():
        for t, p in zip([m for m in theirs if isinstance(m, (nn.Conv2d, nn.Linear))],
                        [m for m in ours.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]):
            t.weight.copy_(p.weight)
            t.bias.copy_(p.bias)
    x = _x((1, 28, 28))
    for i in range(12):  # every cut point agrees
        ref = x
        for m in theirs[:i + 1]:
            ref = m(ref)
        assert torch.allclose(ours.segment(0, i + 1)(x), ref, atol=1e-6), i
    maxpool = build_model("lenet5", (1, 28, 28), 10)
    maxpool.load_state_dict(ours.state_dict())
    assert not torch.allclose(maxpool(x), ours(x), atol=1e-4)


def _gas_authors_alexnet(channels: int, classes: int) -> tuple[nn.Module, nn.Module]:
    """The GAS authors' AlexNetDown/AlexNetUp (utils/network.py of eejiarong/GAS), layer for layer."""
    down = nn.Sequential(nn.Conv2d(channels, 32, 3, padding=1), nn.MaxPool2d(2, 2), nn.ReLU(),
                         nn.Conv2d(32, 64, 3, 1, 1), nn.MaxPool2d(2, 2), nn.ReLU())
    up = nn.Sequential(nn.Conv2d(64, 128, 3, 1, 1), nn.Conv2d(128, 256, 3, 1, 1), nn.Conv2d(256, 256, 3, 1, 1),
                       nn.MaxPool2d(3, 2), nn.ReLU(), nn.Flatten(),
                       nn.Linear(256 * 3 * 3, 1024), nn.Linear(1024, 512), nn.Linear(512, classes))
    return down, up


@pytest.mark.parametrize("shape", SHAPES)
def test_alexnet_gas_is_the_authors_model(shape):
    """Same weights in, same logits out as the authors' two halves, at their cut (2); ``alexnet``, with its
    four extra ReLUs, gives other logits from the same weights."""
    ours = build_model("alexnet-gas", shape, 10, seed=3)
    down, up = _gas_authors_alexnet(shape[0], 10)
    layers = [m for m in [*down, *up] if isinstance(m, (nn.Conv2d, nn.Linear))]
    params = [p for name, p in ours.named_parameters()]
    assert len(params) == 2 * len(layers)
    with torch.no_grad():
        for layer, (w, b) in zip(layers, zip(params[::2], params[1::2])):
            layer.weight.copy_(w)
            layer.bias.copy_(b)
    x = _x(shape)
    client, server = split_model(ours, 2)
    assert torch.allclose(client(x), down(x), atol=1e-6)
    assert torch.allclose(ours(x), up(down(x)), atol=1e-5)
    relu = build_model("alexnet", shape, 10)
    relu.load_state_dict(ours.state_dict())
    assert not torch.allclose(relu(x), ours(x), atol=1e-3)


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
    """In training mode: BatchNorm on batch statistics, dropout under one seed."""
    shape = (1, 28, 28)
    m = build_model(name, shape, 10)
    x = _x(shape, n=1 if name in ("vgg16", "resnet18") else 3)  # ~1 GFLOP per sample and pass
    with torch.no_grad():
        with fixed_rng(3):
            full = m(x)
        for cut in range(1, len(m)):
            client, server = split_model(m, cut)
            assert len(client) == cut and len(server) == len(m) - cut
            with fixed_rng(3):
                assert torch.equal(server(client(x)), full), cut


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


# ===================================================== models as block lists
# vgg16, resnet18, alexnet17 (RingSFL) and vit-small (GAS); the paper init;
# BatchNorm and dropout in the split runtime.


NEW_MODELS = ("vgg16", "resnet18", "alexnet17", "vit-small")
VGG16_NAMES = [f"conv{i}" for i in range(1, 14)] + ["fc1", "fc2", "fc3"]
RESNET18_NAMES = ["stem"] + [f"layer{s}_{j}" for s in range(1, 5) for j in range(2)] + ["head"]
ALEXNET17_NAMES = ["conv1", "pool1", "relu1", "conv2", "pool2", "relu2", "conv3", "conv4", "conv5",
                   "pool3", "relu3", "flatten", "fc1", "relu4", "fc2", "relu5", "fc3"]
VIT_NAMES = ["embed"] + [f"layer{i}" for i in range(1, 7)] + ["head"]
NAMES = {"vgg16": VGG16_NAMES, "resnet18": RESNET18_NAMES, "alexnet17": ALEXNET17_NAMES, "vit-small": VIT_NAMES}
# parameters with 10 classes (the CIFAR ResNet-18 figure 11,173,962 is the well-known one)
PARAMS = {
    ("vgg16", (1, 28, 28)): 15_252_426, ("vgg16", (3, 32, 32)): 15_253_578,
    ("resnet18", (1, 28, 28)): 11_172_810, ("resnet18", (3, 32, 32)): 11_173_962,
    ("alexnet17", (1, 28, 28)): 3_868_170, ("alexnet17", (3, 32, 32)): 5_703_754,
    ("vit-small", (1, 28, 28)): 1_199_882, ("vit-small", (3, 32, 32)): 1_205_898,
}


def _built(name, shape, init="default"):
    """One cached model per (name, shape, init): building ResNet/VGG costs ~0.3 s."""
    key = (name, shape, init)
    if key not in _BUILT:
        _BUILT[key] = build_model(name, shape, 10, seed=0, init=init)
    return _BUILT[key]


_BUILT: dict = {}


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", NEW_MODELS)
def test_new_model_blocks_shapes_params(name, shape):
    m = _built(name, shape)
    assert m.names == NAMES[name]
    assert m.training
    assert sum(p.numel() for p in m.parameters()) == PARAMS[(name, shape)]
    with torch.no_grad(), fixed_rng(0):
        assert m(_x(shape, n=2)).shape == (2, 10)


@pytest.mark.parametrize("shape", SHAPES)
def test_vgg16_cuts(shape):
    m = _built("vgg16", shape)
    x = _x(shape, n=2)
    with torch.no_grad():
        client, _ = split_model(m, 4)  # GAPSL: the first four conv layers
        assert client(x).shape == (2, 128, 8, 8)
        # GAS's L1..L4 (torchvision layers 10, 17, 24, 31) = cut-layers 4, 7, 10, 13
        assert m.segment(0, 10)(x).shape == (2, 512, 2, 2)
        assert m.segment(0, 13)(x).shape == (2, 512, 1, 1)
    assert sum(isinstance(mod, torch.nn.Conv2d) for mod in m.modules()) == 13
    assert sum(isinstance(mod, torch.nn.Linear) for mod in m.modules()) == 3
    assert sum(isinstance(mod, torch.nn.BatchNorm2d) for mod in m.modules()) == 13


def test_vgg16_28_is_zero_padded_to_32():
    m = _built("vgg16", (1, 28, 28))
    conv = m.blocks["conv1"][0]
    assert conv.padding == (3, 3)
    x = _x((1, 28, 28), n=2)
    padded = torch.nn.functional.pad(x, (2, 2, 2, 2))
    ref = torch.nn.functional.conv2d(padded, conv.weight, conv.bias, padding=1)
    with torch.no_grad():
        assert torch.allclose(conv(x), ref, atol=1e-6)


@pytest.mark.parametrize("shape", SHAPES)
def test_resnet18_stages(shape):
    m = _built("resnet18", shape)
    side = shape[1]
    x = _x(shape, n=2)
    with torch.no_grad():
        assert m.segment(0, 3)(x).shape == (2, 64, side, side)  # GAS: after the first residual layer
        assert m.segment(0, 9)(x).shape == (2, 512, 4, 4)
    # shortcut convs only where the stride or the width changes
    assert [len(m.blocks[n].shortcut) for n in RESNET18_NAMES[1:-1]] == [0, 0, 2, 0, 2, 0, 2, 0]


@pytest.mark.parametrize("shape,flat", [((1, 28, 28), 2304), ((3, 32, 32), 4096)])
def test_alexnet17_layers(shape, flat):
    m = _built("alexnet17", shape)
    with torch.no_grad():
        assert m.segment(0, 12)(_x(shape, n=2)).shape == (2, flat)
    assert m.blocks["fc1"].in_features == flat
    # one layer per block; ReLUs only where RingSFL's code has them (none after conv3, conv4)
    for n in ALEXNET17_NAMES:
        assert not isinstance(m.blocks[n], torch.nn.Sequential)
    assert [n for n in ALEXNET17_NAMES if n.startswith("relu")] == ["relu1", "relu2", "relu3", "relu4", "relu5"]


@pytest.mark.parametrize("shape,tokens", [((1, 28, 28), 50), ((3, 32, 32), 65)])
def test_vit_small_tokens_and_cut(shape, tokens):
    m = _built("vit-small", shape)
    client, server = split_model(m, 2)  # GAS: after the first transformer layer
    assert client.names == ["embed", "layer1"]
    x = _x(shape, n=2)
    with torch.no_grad():
        assert client(x).shape == (2, tokens, 128)
    layer = m.blocks["layer1"]
    assert layer.heads == 8 and layer.fc1.out_features == 512
    assert all(d.p == 0.1 for d in m.modules() if isinstance(d, torch.nn.Dropout))


def test_vit_dropout_is_random_unless_seeded():
    m = _built("vit-small", (1, 28, 28))
    x = _x((1, 28, 28), n=2)
    with torch.no_grad():
        a, b = m(x), m(x)
        assert not torch.equal(a, b)  # training mode: dropout
        with fixed_rng(7):
            c = m(x)
        with fixed_rng(7):
            d = m(x)
        assert torch.equal(c, d)
        m.eval()
        try:
            assert torch.equal(m(x), m(x))
        finally:
            m.train()


def test_fixed_rng_restores_global_state():
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    with fixed_rng(1):
        torch.rand(10)
    assert torch.equal(torch.rand(3), expected)
    with fixed_rng(None):  # no-op
        pass


def _block_outputs(m, shape):
    x = _x(shape, n=2)
    outs = []
    with torch.no_grad(), fixed_rng(0):
        for block in m.blocks.values():
            x = block(x)
            outs.append(tuple(x.shape[1:]))
    return outs


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", NEW_MODELS)
def test_new_models_profiles(name, shape):
    m = _built(name, shape)
    ps = profile_blocks(m, shape)
    assert [p.name for p in ps] == m.names
    assert [p.output_shape for p in ps] == _block_outputs(m, shape)
    for p, block in zip(ps, m.blocks.values()):
        has_params = any(True for _ in block.parameters())
        assert p.param_bytes == 4 * sum(t.numel() for t in block.parameters()) + sum(
            t.numel() * t.element_size() for t in block.buffers())
        if has_params:  # conv / linear / attention blocks
            assert p.forward_flops > 0 and p.backward_flops > 0, p.name
        else:  # relu / pool / flatten
            assert p.forward_flops == 0, p.name
    # a server part profiled on its own input shape gives the same figures
    cut = 2
    _, server = split_model(m, cut)
    assert profile_blocks(server, ps[cut - 1].output_shape) == ps[cut:]


def test_profile_new_models_closed_form():
    """Hand counts (2 FLOPs per multiply-accumulate) for some blocks."""
    vgg = {p.name: p for p in profile_blocks(_built("vgg16", (1, 28, 28)), (1, 28, 28))}
    assert vgg["conv1"].forward_flops == 2 * (1 * 9) * 64 * 32 * 32  # computed on the padded 32x32
    assert vgg["conv4"].forward_flops == 2 * (128 * 9) * 128 * 16 * 16
    assert vgg["fc1"].forward_flops == 2 * 512 * 512
    res = {p.name: p for p in profile_blocks(_built("resnet18", (3, 32, 32)), (3, 32, 32))}
    assert res["stem"].forward_flops == 2 * 27 * 64 * 32 * 32
    assert res["layer2_0"].forward_flops == 2 * 16 * 16 * 128 * (64 * 9 + 128 * 9 + 64)  # two convs + 1x1 shortcut
    assert res["head"].forward_flops == 2 * 512 * 10
    vit = {p.name: p for p in profile_blocks(_built("vit-small", (3, 32, 32)), (3, 32, 32))}
    t, d, mlp = 65, 128, 512
    assert vit["embed"].forward_flops == 2 * 64 * (3 * 16) * d
    assert vit["layer3"].forward_flops == 2 * t * d * 3 * d + 2 * 2 * t * t * d + 2 * t * d * d + 2 * 2 * t * d * mlp
    assert vit["head"].forward_flops == 2 * d * 10
    alex = {p.name: p for p in profile_blocks(_built("alexnet17", (1, 28, 28)), (1, 28, 28))}
    assert alex["conv5"].forward_flops == 2 * (256 * 9) * 256 * 7 * 7
    assert alex["fc1"].forward_flops == 2 * 2304 * 1024


def test_profile_cache_tells_vit_grids_apart():
    a = profile_blocks(_built("vit-small", (1, 28, 28)), (1, 28, 28))
    b = profile_blocks(_built("vit-small", (3, 32, 32)), (3, 32, 32))
    assert a[0].output_shape == (50, 128) and b[0].output_shape == (65, 128)


# ----------------------------------------------------------------------- init


#: sha256 (first 16 hex digits) of the seeded initial state dicts before the
#: ``init`` option existed: ``init="default"`` must stay bit-identical.
GOLDEN_INIT = {
    ("alexnet", (1, 28, 28), 0): "13680f5f13e05d3a",
    ("alexnet", (3, 32, 32), 3): "ec68ecf1e157c671",
    ("lenet5", (1, 28, 28), 0): "862faaf76c90d5bf",
    ("lenet5", (3, 32, 32), 3): "89e0f341414af336",
}


def _digest(m):
    h = hashlib.sha256()
    for k, v in m.state_dict().items():
        h.update(k.encode())
        h.update(v.detach().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


@pytest.mark.parametrize("key", list(GOLDEN_INIT))
def test_default_init_is_bit_identical_to_before(key):
    name, shape, seed = key
    assert _digest(build_model(name, shape, 10, seed=seed)) == GOLDEN_INIT[key]
    assert _digest(build_model(name, shape, 10, seed=seed, init="default")) == GOLDEN_INIT[key]


def test_inits():
    assert INITS == ("default", "ringsfl", "torch-default")
    with pytest.raises(ConfigError) as e:
        build_model("vgg16", (3, 32, 32), 10, init="xavier")
    assert "default" in str(e.value) and "ringsfl" in str(e.value)


@pytest.mark.parametrize("name", ["vgg16", "resnet18"])
def test_paper_init_deterministic_and_different(name):
    a = build_model(name, (3, 32, 32), 10, seed=1, init="ringsfl").state_dict()
    b = build_model(name, (3, 32, 32), 10, seed=1, init="ringsfl").state_dict()
    c = build_model(name, (3, 32, 32), 10, seed=1).state_dict()
    d = build_model(name, (3, 32, 32), 10, seed=1, init="torch-default").state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert any(not torch.equal(a[k], c[k]) for k in a) and any(not torch.equal(a[k], d[k]) for k in a)


@pytest.mark.parametrize("name", ["lenet5", "lenet5-ringsfl", "alexnet17", "alexnet", "vit-small"])
def test_paper_init_without_batchnorm_is_pytorchs_with_one_line(name, caplog):
    """The RingSFL authors apply their init only to BatchNorm models; elsewhere PyTorch's own, said once."""
    from fl_app.models import init

    init._NOTED.discard(name)
    with caplog.at_level("WARNING", logger="sflower"):
        a = build_model(name, (1, 28, 28), 10, seed=1, init="ringsfl").state_dict()
        build_model(name, (1, 28, 28), 10, seed=1, init="ringsfl")
    torch_default = build_model(name, (1, 28, 28), 10, seed=1, init="torch-default").state_dict()
    assert all(torch.equal(a[k], torch_default[k]) for k in a)
    notes = [r.getMessage() for r in caplog.records if "init=ringsfl" in r.getMessage()]
    assert len(notes) == 1 and name in notes[0] and "\n" not in notes[0]


def test_paper_init_statistics():
    m = _built("vgg16", (3, 32, 32), init="ringsfl")
    conv = m.blocks["conv8"][0]  # 256 -> 512: fan_out = 512 * 9
    assert abs(float(conv.weight.detach().std()) - (2 / (512 * 9)) ** 0.5) < 0.02 * (2 / (512 * 9)) ** 0.5
    assert torch.all(conv.bias == 0)
    fc = m.blocks["fc1"][1]
    assert abs(float(fc.weight.detach().std()) - 0.01) < 0.0005 and torch.all(fc.bias == 0)
    for mod in m.modules():
        if isinstance(mod, torch.nn.BatchNorm2d):
            assert torch.all(mod.weight == 1) and torch.all(mod.bias == 0)
    r = _built("resnet18", (3, 32, 32), init="ringsfl")
    w = r.blocks["layer4_1"].conv2.weight  # fan_out = 512 * 9
    assert abs(float(w.detach().std()) - (2 / (512 * 9)) ** 0.5) < 0.02 * (2 / (512 * 9)) ** 0.5
    assert abs(float(r.blocks["head"][2].weight.detach().std()) - 0.01) < 0.002


def test_default_init_statistics():
    m = _built("vgg16", (3, 32, 32))
    conv = m.blocks["conv8"][0]  # He, fan_in = 256 * 9
    assert abs(float(conv.weight.detach().std()) - (2 / (256 * 9)) ** 0.5) < 0.02 * (2 / (256 * 9)) ** 0.5
    v = _built("vit-small", (1, 28, 28))
    layer = v.blocks["layer2"]
    assert abs(float(layer.fc1.weight.detach().std()) - 0.02) < 0.001 and torch.all(layer.fc1.bias == 0)
    assert torch.all(layer.ln1.weight == 1) and torch.all(layer.ln1.bias == 0)
    emb = v.blocks["embed"]
    assert 0.015 < float(emb.pos_embed.detach().std()) < 0.025 and float(emb.cls_token.detach().abs().max()) > 0


def test_task_threads_init(tiny_cfg):
    from fl_app.learning.task import load_task

    default = load_task(tiny_cfg(model="lenet5"))
    paper = load_task(tiny_cfg(model="lenet5", init="ringsfl"))
    assert default.init == "default" and paper.init == "ringsfl"
    shape, classes = paper.data.input_shape, paper.data.num_classes
    want = build_model("lenet5", shape, classes, seed=paper.seed, init="ringsfl").state_dict()
    got = paper.build_model().state_dict()
    assert all(torch.equal(got[k], want[k]) for k in want)
    seg = paper.build_segment(0, 3).state_dict()
    assert all(torch.equal(seg[k], want[k]) for k in seg)
    assert not torch.equal(default.build_model().state_dict()["blocks.fc1.weight"], want["blocks.fc1.weight"])


# ------------------------------------------- BatchNorm and dropout at runtime


@pytest.fixture
def client_node(server_identity, one_torch_thread):
    """``node(model, cut) -> (strategy, grid, task)``: 2 in-process nodes, batch 4, mnist-5k."""
    from fl_app.client_app import app
    from fl_app.learning.task import load_task
    from simulation.timing.clocks import VirtualClock
    from simulation.engine import InProcessGrid
    from strategies.core.base import SFLStrategy
    from simulation.timing.durations import ZeroTiming
    from tests.conftest import make_cfg

    def build(model, cut):
        cfg = make_cfg(model=model, cut_layer=cut, num_clients=2, concurrency=2, batch_size=4, seed=4)
        task = load_task(cfg)
        grid = InProcessGrid(app, 2, seed=4)
        s = SFLStrategy(cfg, task, clock=VirtualClock(), timing=ZeroTiming(), progress=False)
        s.connect(grid, timeout=30)
        return s, grid, task

    return build


OPT = {"lr": 0.1, "momentum": 0.0, "weight_decay": 0.0, "clip_norm": 0.0}


def _exchange(s, cut, g_seed=1, accumulate=False):
    """train.forward then train.backward (and train.step when accumulating) on partition 0."""
    from flwr.app import RecordDict

    from fl_app import protocol as P
    from strategies.core.dispatcher import Request

    fwd = P.ForwardConfig(start=0, end=cut, batch_size=4, **OPT)
    r = s.gather({0: Request(P.TRAIN_FORWARD, RecordDict({P.CONFIG: fwd.to_record()}))})[0]
    acts = P.record_tensor(r.array_records[P.ACTIVATIONS], "x")
    g = torch.randn(acts.shape, generator=torch.Generator().manual_seed(g_seed))
    back = P.BackwardConfig(accumulate=accumulate, **OPT)
    content = RecordDict({P.CONFIG: back.to_record(), P.GRADIENT: P.tensor_record("g", g)})
    s.gather({0: Request(P.TRAIN_BACKWARD, content)})
    if accumulate:
        step = P.StepConfig(**OPT)
        s.gather({0: Request(P.TRAIN_STEP, RecordDict({P.CONFIG: step.to_record()}))})
    return acts, g


def _node_state(s, grid):
    return grid.contexts[s.clients[0].node_id].state


def _reference_step(task, cut, state, g, seed):
    """One in-process forward (train mode, dropout under ``seed``) + backward + SGD step of blocks [0, cut)."""
    from fl_app.learning.training import load_batch

    batch = state.config_records["slot.own.batch"]
    x, _ = load_batch(task, 0, batch["indices"], int(batch["step"]))
    ref = task.build_model().segment(0, cut)
    with fixed_rng(seed):
        acts = ref(x)
    acts.backward(g)
    with torch.no_grad():
        for p in ref.parameters():
            p -= OPT["lr"] * p.grad
    return acts.detach(), ref.state_dict()


def test_dropout_recompute_uses_the_forward_masks(client_node, monkeypatch):
    """vit-small cut 2: train.backward's recomputed forward equals train.forward's output
    (same dropout masks), and the step equals one in-process forward/backward."""
    from fl_app.client import live
    from fl_app import protocol as P
    from fl_app.client.state import RNG_SEED

    # the recomputation as under Ray and in deployment: in-process nodes would otherwise reuse the
    # forward pass's own graph (fl_app.client.live; test_ringsfl.py::test_live_objects_change_no_number)
    monkeypatch.setattr(live, "ENABLED", False)
    s, grid, task = client_node("vit-small", 2)
    outputs = []
    real_forward = BlockModel.forward

    def spy(self, x):
        out = real_forward(self, x)
        outputs.append(out.detach().clone())
        return out

    monkeypatch.setattr(BlockModel, "forward", spy)
    acts, g = _exchange(s, 2)
    assert len(outputs) == 2 and torch.equal(outputs[0], outputs[1])  # forward, recompute
    state = _node_state(s, grid)
    seed = state.config_records["slot.own.batch"][RNG_SEED]
    ref_acts, ref_state = _reference_step(task, 2, state, g, seed)
    assert torch.equal(ref_acts, acts)
    stored = P.record_state(state.array_records["slot.own.weights"])
    for k, v in ref_state.items():
        assert torch.allclose(stored[k], v, atol=1e-6, rtol=0), k
    # the next forward draws new masks
    _exchange(s, 2)
    assert state.config_records["slot.own.batch"][RNG_SEED] != seed


@pytest.mark.parametrize("accumulate", [False, True])
def test_batchnorm_running_stats_updated_once(client_node, accumulate):
    """vgg16 cut 2: after forward + backward (+ step) the stored BatchNorm buffers are
    those of ONE training-mode forward pass, stepped or accumulated alike."""
    from fl_app import protocol as P

    s, grid, task = client_node("vgg16", 2)
    acts, g = _exchange(s, 2, accumulate=accumulate)
    state = _node_state(s, grid)
    ref_acts, ref_state = _reference_step(task, 2, state, g, None)
    assert torch.equal(ref_acts, acts)
    stored = P.record_state(state.array_records["slot.own.weights"])
    assert set(stored) == set(ref_state)
    for k, v in ref_state.items():
        assert stored[k].dtype == v.dtype, k
        assert torch.allclose(stored[k], v, atol=1e-6, rtol=0), k
    assert int(stored["blocks.conv1.1.num_batches_tracked"]) == 1
    assert not torch.equal(stored["blocks.conv2.1.running_mean"], torch.zeros(64))
    # a second exchange updates them a second time
    _exchange(s, 2, accumulate=accumulate)
    stored = P.record_state(state.array_records["slot.own.weights"])
    assert int(stored["blocks.conv2.1.num_batches_tracked"]) == 2


def test_averaging_and_records_keep_batchnorm_buffers():
    """average_uploads averages float buffers and keeps int64 num_batches_tracked;
    state_record / record_state round-trip keeps dtypes and 0-d shapes."""
    from fl_app import protocol as P
    from strategies.core.aggregation import apply_update, average_uploads, state_delta

    m = _built("resnet18", (1, 28, 28))
    a = {k: v.clone() for k, v in m.segment(0, 3).state_dict().items()}
    b = {k: (v + 1 if torch.is_floating_point(v) else v + 5) for k, v in a.items()}
    avg = average_uploads({0: a, 1: b}, lambda pid: 1.0 + pid)  # weights 1 and 2
    key = "blocks.stem.1.num_batches_tracked"
    assert avg[key].dtype == torch.int64 and avg[key].shape == () and int(avg[key]) == int(a[key])
    assert torch.allclose(avg["blocks.stem.1.running_var"], a["blocks.stem.1.running_var"] + 2 / 3)
    back = P.record_state(P.state_record(avg))
    assert all(back[k].dtype == v.dtype and back[k].shape == v.shape and torch.equal(back[k], v)
               for k, v in avg.items())
    seg = build_model("resnet18", (1, 28, 28), 10).segment(0, 3)
    seg.load_state_dict(back)
    delta = state_delta(b, a)
    assert key not in delta
    assert apply_update(a, delta, 1.0)[key].dtype == torch.int64


def test_torch_default_init_is_pytorchs_own():
    """``torch-default`` keeps each layer's reset_parameters() draw: Linear weights uniform in ±1/√fan_in."""
    m = build_model("lenet5", (1, 28, 28), 10, seed=3, init="torch-default")
    w = m.blocks["fc1"].weight.detach()
    bound = 1 / w.shape[1] ** 0.5
    assert float(w.abs().max()) <= bound and float(w.abs().max()) > 0.9 * bound  # uniform, not normal
    again = build_model("lenet5", (1, 28, 28), 10, seed=3, init="torch-default").state_dict()
    assert all(torch.equal(v, again[k]) for k, v in m.state_dict().items())


def test_init_seed_sets_the_initial_weights_alone(tmp_path, capsys):
    """``init-seed`` seeds the initial model and nothing else: two runs with different seeds and the
    same init-seed start from the same weights but draw different data; -1 means ``seed``."""
    from fl_app.run.config import RunConfig
    from fl_app.learning.task import load_task
    from simulation.cli import main
    from tests.conftest import cli_args

    def task(**keys):
        return load_task(RunConfig.from_mapping({"partition": "iid", **keys}))

    a, b = task(seed=1, **{"init-seed": 7}), task(seed=2, **{"init-seed": 7})
    assert all(torch.equal(x, y) for x, y in zip(a.build_model().parameters(), b.build_model().parameters()))
    assert not np.array_equal(a.partitions[0], b.partitions[0])  # the rest still follows seed
    own = task(seed=7)
    assert all(torch.equal(x, y) for x, y in zip(own.build_model().parameters(), a.build_model().parameters()))
    other = task(seed=1)
    assert not torch.equal(next(other.build_model().parameters()), next(a.build_model().parameters()))
    assert main(cli_args({"init-seed": -2, "output-dir": tmp_path / "x"})) == 2
    assert "init-seed must be >= 0, or -1" in capsys.readouterr().err


def test_draws_random_knows_dropout_and_doubts_unknown_modules():
    """A model with only known deterministic layers draws nothing (no seed, no forked RNG); dropout or an
    unknown module type counts as drawing."""
    from torch import nn

    from fl_app.models import draws_random

    plain = nn.Sequential(nn.Conv2d(1, 2, 3), nn.ReLU(), nn.AvgPool2d(2), nn.Flatten(), nn.Linear(8, 2))
    assert not draws_random(plain)
    assert draws_random(nn.Sequential(nn.Linear(2, 2), nn.Dropout(0.1)))

    class Noisy(nn.Module):
        def forward(self, x):
            return x + torch.randn_like(x)

    assert draws_random(nn.Sequential(nn.Linear(2, 2), Noisy()))
    state = torch.random.get_rng_state()
    plain(torch.zeros(1, 1, 6, 6))
    assert torch.equal(torch.random.get_rng_state(), state)


@pytest.mark.parametrize("name", MODELS)
def test_shipped_models_said_not_to_draw_leave_the_rng_alone(name):
    """Every shipped model that draws_random calls deterministic leaves the torch RNG untouched in a
    training forward pass (and the ones with dropout are said to draw)."""
    from fl_app.models import draws_random

    shape = (3, 32, 32) if name in ("vgg16", "resnet18", "vit-small") else (1, 28, 28)
    model = build_model(name, shape, 10, seed=0)
    has_dropout = any(isinstance(m, nn.modules.dropout._DropoutNd) for m in model.modules())
    if has_dropout:
        assert draws_random(model)
    if not draws_random(model):
        state = torch.random.get_rng_state()
        model(torch.zeros(2, *shape))
        assert torch.equal(torch.random.get_rng_state(), state)
