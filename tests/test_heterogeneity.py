"""Tests for simulation.timing: the device models (GAS wireless cell, MU-SplitFed stragglers), profiles and timing."""

import json
import math

import numpy as np
import pytest

import simulation.timing.devices as het
from fl_app.run.errors import ConfigError
from simulation.timing.channels import channel_rate_bps, path_loss_db
from simulation.timing.devices import (
    HETEROGENEITY,
    DeviceModel,
    ExponentialModel,
    GasModel,
    HomogeneousModel,
    device_model_names,
    draw_profiles,
    get_device_model,
    register_device_model,
)
from simulation.timing.durations import DeviceTiming
from simulation.timing.profiles import DeviceProfile, profiles_frame

# ---------------------------------------------------------------- channel


def test_path_loss_hand_values():
    assert path_loss_db(1.0) == pytest.approx(128.1, abs=1e-12)
    # log10(0.1) = -1  ->  128.1 - 37.6 = 90.5
    assert path_loss_db(0.1) == pytest.approx(90.5, abs=1e-12)
    arr = path_loss_db(np.array([0.1, 1.0]))
    assert isinstance(arr, np.ndarray)
    np.testing.assert_allclose(arr, [90.5, 128.1])


def test_channel_rate_at_1km_by_hand():
    # PL(1 km) = 128.1 dB  ->  h = 10**(-12.81)
    h = 10.0 ** (-12.81)
    signal = 0.2 * h  # P*h = 0.2 W * h
    noise = 10e6 * 3.981e-21  # W*N0 = 3.981e-14 W
    snr = signal / noise  # about 0.778
    expected = 10e6 * math.log2(1.0 + snr)  # about 8.30e6 bit/s
    assert 0.77 < snr < 0.79
    assert 8.2e6 < expected < 8.4e6
    assert channel_rate_bps(1.0) == pytest.approx(expected, rel=1e-9)


def test_channel_rate_at_half_km_by_hand():
    # PL(0.5 km) = 128.1 + 37.6*log10(0.5) = 128.1 - 37.6*0.30103 = 116.7813 dB
    pl = 128.1 + 37.6 * math.log10(0.5)
    assert pl == pytest.approx(116.7813, abs=1e-4)
    h = 10.0 ** (-pl / 10.0)
    snr = 0.2 * h / (10e6 * 3.981e-21)
    expected = 10e6 * math.log2(1.0 + snr)
    assert channel_rate_bps(0.5) == pytest.approx(expected, rel=1e-9)


def test_channel_rate_decreasing_in_distance():
    d = np.linspace(0.1, 1.0, 50)
    rates = channel_rate_bps(d)
    assert isinstance(rates, np.ndarray)
    assert np.all(np.diff(rates) < 0)
    assert channel_rate_bps(0.1) > channel_rate_bps(0.5) > channel_rate_bps(1.0)


def test_channel_bad_inputs():
    with pytest.raises(ConfigError):
        path_loss_db(0.0)
    with pytest.raises(ConfigError):
        channel_rate_bps(-1.0)
    with pytest.raises(ConfigError):
        channel_rate_bps(1.0, bandwidth_hz=0.0)


# ---------------------------------------------------------------- profiles


def test_gas_profiles_within_bounds():
    profiles = draw_profiles("gas", 200, seed=3)
    assert [p.partition_id for p in profiles] == list(range(200))
    for p in profiles:
        assert 1e9 <= p.flops_per_s <= 1e10
        assert 0.1 <= p.distance_km <= 1.0
        assert p.uplink_bps == pytest.approx(channel_rate_bps(p.distance_km), rel=1e-12)
        assert channel_rate_bps(1.0) <= p.uplink_bps <= channel_rate_bps(0.1)
        assert p.downlink_bps == math.inf
        assert p.straggler == "none"


def test_gas_profiles_deterministic_and_seed_dependent():
    a = draw_profiles("gas", 10, seed=2023)
    assert a == draw_profiles("gas", 10, seed=2023)
    b = draw_profiles("gas", 10, seed=1998)
    assert all(x != y for x, y in zip(a, b))


def test_profile_k_independent_of_num_clients():
    small = draw_profiles("gas", 5, seed=7)
    large = draw_profiles("gas", 50, seed=7)
    assert large[:5] == small


def test_gas_downlink_option():
    profiles = draw_profiles("gas", 4, seed=1, downlink=True)
    for p in profiles:
        assert p.downlink_bps == p.uplink_bps


def test_exponential_and_none_profiles():
    for kind, straggler in (("exponential", "exponential"), ("none", "none")):
        profiles = draw_profiles(kind, 3, seed=0)
        for p in profiles:
            assert p.flops_per_s == 5e9
            assert p.uplink_bps == math.inf and p.downlink_bps == math.inf
            assert math.isnan(p.distance_km)
            assert p.straggler == straggler


def test_bad_kind_and_counts():
    assert HETEROGENEITY == ("gas", "exponential", "none", "ringsfl-testbed")
    with pytest.raises(ConfigError):
        draw_profiles("wireless", 3, seed=0)
    with pytest.raises(ConfigError):
        draw_profiles("gas", 0, seed=0)
    with pytest.raises(ConfigError):
        draw_profiles("gas", 3, seed=-1)
    with pytest.raises(ConfigError):
        DeviceProfile(partition_id=0, flops_per_s=0.0)
    with pytest.raises(ConfigError):
        DeviceProfile(partition_id=0, flops_per_s=1e9, straggler="slow")


def test_gas_profiles_use_per_client_stream():
    # profile k comes from np.random.default_rng([seed, 1, k]): U[1e9,1e10] FLOP/s, then U[0.1,1] km
    for k, p in enumerate(draw_profiles("gas", 4, seed=9)):
        rng = np.random.default_rng([9, 1, k])
        assert p.flops_per_s == float(rng.uniform(1e9, 1e10))
        assert p.distance_km == float(rng.uniform(0.1, 1.0))


# ---------------------------------------------------------------- registry


def test_builtin_models_registered():
    assert device_model_names()[:4] == HETEROGENEITY
    assert get_device_model("gas") is GasModel
    assert get_device_model("exponential") is ExponentialModel
    assert get_device_model("none") is HomogeneousModel
    assert GasModel().draw(5, 3) == draw_profiles("gas", 5, seed=3)
    assert GasModel().draw(2, 3, downlink=True) == draw_profiles("gas", 2, seed=3, downlink=True)
    with pytest.raises(ConfigError):
        GasModel().draw(0, 3)


def test_unknown_model_lists_names():
    with pytest.raises(ConfigError, match="choose one of gas, exponential, none"):
        draw_profiles("wireless", 3, seed=0)
    with pytest.raises(ConfigError):
        get_device_model(["gas"])  # unhashable


@pytest.fixture
def scratch_registry(monkeypatch):
    monkeypatch.setattr(het, "_DEVICE_MODELS", dict(het._DEVICE_MODELS))


def test_new_model_is_one_class(scratch_registry):
    @register_device_model
    class Slow(DeviceModel):
        """Test model: every device at 1 GFLOP/s."""

        name = "slow-test"

        def profile(self, partition_id, seed, *, downlink):
            return DeviceProfile(partition_id=partition_id, flops_per_s=1e9 * (1 + partition_id))

    assert "slow-test" in device_model_names()
    assert HETEROGENEITY == ("gas", "exponential", "none", "ringsfl-testbed")  # built-ins only
    profiles = draw_profiles("slow-test", 3, seed=0)
    assert [p.flops_per_s for p in profiles] == [1e9, 2e9, 3e9]
    with pytest.raises(ValueError):
        @register_device_model
        class Clash(Slow):
            name = "gas"
    with pytest.raises(ValueError):
        @register_device_model
        class Nameless(Slow):
            name = ""
    with pytest.raises(TypeError):
        register_device_model(int)


def test_as_dict_is_strict_json():
    d = draw_profiles("none", 1, seed=0)[0].as_dict()
    assert d["uplink_bps"] == "inf" and d["downlink_bps"] == "inf"
    assert d["distance_km"] is None
    json.dumps(d, allow_nan=False)
    g = draw_profiles("gas", 1, seed=0)[0].as_dict()
    assert isinstance(g["uplink_bps"], float) and isinstance(g["distance_km"], float)
    json.dumps(g, allow_nan=False)


def test_profiles_frame():
    profiles = draw_profiles("gas", 4, seed=5)
    frame = profiles_frame(profiles)
    assert list(frame.index) == [0, 1, 2, 3]
    assert frame.loc[2, "flops_per_s"] == profiles[2].flops_per_s
    assert frame.loc[2, "uplink_mbps"] == pytest.approx(profiles[2].uplink_bps / 1e6)


# ---------------------------------------------------------------- timing


def test_duration_hand_value():
    p = DeviceProfile(partition_id=0, flops_per_s=2e9, uplink_bps=4e6)
    timing = DeviceTiming([p], seed=0)
    # 1e9 / 2e9 = 0.5 s compute; 8e6 / 4e6 = 2.0 s uplink; downlink inf -> 0
    assert timing.duration(0, 1e9, bits_up=8e6, bits_down=1e9) == 2.5


def test_duration_downlink_and_infinite_rates():
    p = DeviceProfile(partition_id=3, flops_per_s=1e9, uplink_bps=1e6, downlink_bps=2e6)
    timing = DeviceTiming([p], seed=0)
    assert timing.duration(3, 0.0, bits_up=1e6, bits_down=1e6) == 1.5
    free = DeviceTiming(draw_profiles("none", 1, seed=0), seed=0)
    assert free.duration(0, 5e9, bits_up=1e12, bits_down=1e12) == 1.0


def test_no_batch_parallel_flag():
    p = DeviceProfile(partition_id=0, flops_per_s=2e9, uplink_bps=4e6)
    timing = DeviceTiming([p], seed=0)
    assert not hasattr(timing, "batch_parallel")
    assert repr(timing) == "DeviceTiming(1 devices, seed=0)"
    with pytest.raises(TypeError):
        DeviceTiming([p], seed=0, batch_parallel=True)


def test_expected_duration_draw_none():
    profiles = draw_profiles("exponential", 2, seed=4)
    profiles.append(DeviceProfile(partition_id=2, flops_per_s=2e9, uplink_bps=4e6, straggler="exponential"))
    timing = DeviceTiming(profiles, seed=4)
    # draw=None: the straggler factor is the mean of Exp(1), 1.0
    assert timing.straggler_factor(0, None) == 1.0
    assert timing.duration(0, 5e9, draw=None) == 1.0
    # 1e9 / 2e9 * 1.0 + 8e6 / 4e6 = 2.5 s
    assert timing.duration(2, 1e9, bits_up=8e6, draw=None) == 2.5
    # a real draw differs from the expectation, and the expectation is stable
    assert timing.duration(0, 5e9, draw=0) != 1.0
    assert timing.duration(0, 5e9, draw=None) == 1.0
    # non-stragglers: None is the same as any draw
    free = DeviceTiming(draw_profiles("gas", 2, seed=4), seed=4)
    assert free.duration(1, 3e9, 1e6, draw=None) == free.duration(1, 3e9, 1e6, draw=7)
    # ZeroTiming accepts draw=None too
    from simulation.timing.durations import ZeroTiming

    assert ZeroTiming().duration(0, 1e9, draw=None) == 0.0
    with pytest.raises(ValueError):
        timing.straggler_factor(0, -1)


def test_exponential_straggler_reproducible_and_mean():
    profiles = draw_profiles("exponential", 3, seed=11)
    timing = DeviceTiming(profiles, seed=11)
    flops = 5e9  # nominal 1.0 s
    # same draw -> same duration, regardless of what was timed in between
    first = timing.duration(1, flops, draw=4)
    timing.duration(2, flops, draw=0)
    timing.duration(1, flops, draw=5)
    assert timing.duration(1, flops, draw=4) == first
    assert DeviceTiming(profiles, seed=11).duration(1, flops, draw=4) == first
    # different draws / clients / seeds differ
    assert timing.duration(1, flops, draw=5) != first
    assert timing.duration(2, flops, draw=4) != first
    assert DeviceTiming(profiles, seed=12).duration(1, flops, draw=4) != first
    # mean over many draws ~ flops / f = 1.0 s (Exp(1) has mean 1)
    samples = np.array([timing.duration(0, flops, draw=i) for i in range(20000)])
    assert samples.min() > 0
    assert samples.mean() == pytest.approx(1.0, rel=0.05)


def test_non_straggler_is_deterministic():
    timing = DeviceTiming(draw_profiles("none", 2, seed=0), seed=0)
    assert timing.duration(1, 1e9, draw=0) == timing.duration(1, 1e9, draw=99) == 0.2


def test_timing_errors():
    timing = DeviceTiming(draw_profiles("none", 2, seed=0), seed=0)
    with pytest.raises(ConfigError):
        timing.duration(5, 1e9)
    with pytest.raises(ValueError):
        timing.duration(0, -1.0)
    with pytest.raises(ConfigError):
        DeviceTiming([], seed=0)
    p = DeviceProfile(partition_id=0, flops_per_s=1e9)
    with pytest.raises(ConfigError):
        DeviceTiming([p, p], seed=0)


def test_ringsfl_testbed_profiles_and_their_lengths():
    """RingSFL's prototype: 2 PCs (2e10 FLOP/s) then Pis (2.5e9), 135 Mbit/s. On LeNet-5's 12 blocks
    the lengths 12·C_i/ΣC = 5.05, 5.05, 0.63, 0.63, 0.63 round (largest remainder) to 5, 5, 1, 1, 0;
    the last is raised to 1 with a block from the first of the longest: 4, 5, 1, 1, 1."""
    from simulation.timing.devices import draw_profiles
    from strategies.algorithms.ringsfl.schedule import propagation_lengths

    profiles = draw_profiles("ringsfl-testbed", 5, seed=3)
    assert [p.flops_per_s for p in profiles] == [2e10, 2e10, 2.5e9, 2.5e9, 2.5e9]
    assert all(p.uplink_bps == 135e6 and p.downlink_bps == math.inf for p in profiles)
    assert draw_profiles("ringsfl-testbed", 5, seed=3, downlink=True)[4].downlink_bps == 135e6
    assert propagation_lengths([p.flops_per_s for p in profiles], 12) == [4, 5, 1, 1, 1]
