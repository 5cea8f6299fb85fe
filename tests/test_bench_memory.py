"""The ZO memory claim (MU-SplitFed): one ZO client step peaks below a first-order
one on AlexNet's client part, which keeps no autograd graph."""

from simulation.bench_memory import measure


def test_zo_step_peaks_below_first_order_on_alexnet():
    r = measure("alexnet", 2, batch=8, perturbations=(1,))
    assert r["first_order_peak_bytes"] > r["activation_bytes"]  # the graph keeps activations
    assert r["zo_p1_peak_bytes"] < r["first_order_peak_bytes"], r
