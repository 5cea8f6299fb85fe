"""The ZO memory claim (MU-SplitFed): one ZO client step peaks below a first-order
one on AlexNet's client part, which keeps no autograd graph."""

from benchmarks.memory import measure


def test_zo_step_peaks_below_first_order_on_alexnet():
    r = measure("alexnet", 2, batch=8, perturbations=(1,))
    assert r["first_order_peak_bytes"] > r["activation_bytes"]  # the graph keeps activations
    assert r["zo_p1_peak_bytes"] < r["first_order_peak_bytes"], r


def test_peak_is_the_peak_of_the_running_sum():
    """Checked on a known allocation sequence: not the sum of the allocations (7 MB),
    not the largest one (4 MB), but the most held at once (6 MB)."""
    import torch

    from benchmarks.memory import peak_bytes

    def allocations():
        a = torch.empty(1_000_000)  # 4 MB
        b = torch.empty(500_000)  # 2 MB: 6 MB held, the peak
        del a
        c = torch.empty(250_000)  # 1 MB: 3 MB held
        del b, c

    assert peak_bytes(allocations) == 6_000_000
