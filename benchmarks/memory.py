"""Peak client memory of one client step: zeroth-order against first-order (MU-SplitFed).

MU-SplitFed (its paper, Sec. 1-2) adopts ZO optimisation on
the client to save memory: a ZO step needs forward passes only, so no
autograd graph (saved activations) is kept. This benchmark measures it on
CPU for the same model, cut and batch:

* first-order: forward of blocks ``[0, cut)`` with autograd, backward of an
  activation gradient, clipped SGD step (momentum 0.9), as ``train.backward``;
* ZO: ``h`` and ``P`` pairs ``h(w ± μu_p)`` (:func:`fl_app.learning.zo.perturbed_outputs`,
  as ``train.zo_forward``), then the SPSA estimate from the seeds and the same
  step (as ``train.zo_update``).

The peak is the maximum of the running sum of the raw allocation and free
records of :class:`torch.profiler.profile` (``profile_memory=True``), in
time order, over one step after a warm-up step (so optimizer buffers exist
in both); the first-order step includes decoding the received gradient. On a GPU, ``torch.cuda.max_memory_allocated`` would be the
figure; none is used here. Units: bytes.
"""

from __future__ import annotations

import gc
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerActivity, profile

from fl_app.run.config import RunConfig
from fl_app.learning.task import load_task
from fl_app.learning.training import clip_and_step, make_sgd
from fl_app.learning.zo import direction, num_parameters, perturbed_outputs, shapes_of, spsa_gradient

#: (model, cut) pairs measured by default.
CASES = (("alexnet", 2), ("lenet5", 3))


def peak_bytes(fn: Callable[[], None]) -> int:
    """Peak rise of torch CPU memory while ``fn`` runs, in bytes.

    ``fn`` runs under :class:`torch.profiler.profile` with
    ``profile_memory=True``, which keeps one raw ``[memory]`` record per
    allocation (+bytes) and per free (-bytes) through c10's CPU allocator. The
    peak is the maximum of their running sum in time order. The per-operator
    figures are not used: ``cpu_memory_usage`` repeats nested operators, and
    ``self_cpu_memory_usage`` nets out buffers freed inside one operator (such
    as oneDNN's convolution buffers). Memory outside c10 (NumPy, Python) is not
    seen.
    """
    from torch.autograd import DeviceType

    gc.collect()
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        fn()
    records = sorted((e.start_ns(), e.nbytes()) for e in prof.profiler.kineto_results.events()
                     if e.name() == "[memory]" and e.device_type() == DeviceType.CPU)
    running = peak = 0
    for _, nbytes in records:
        running += nbytes
        peak = max(peak, running)
    return int(peak)


def measure(model: str, cut: int, batch: int = 32, perturbations: tuple[int, ...] = (1, 4)) -> dict[str, Any]:
    """Peak bytes of one first-order and one ZO client step (per ``P``) on 1x28x28 inputs.

    Returns:
        ``param_bytes``, ``activation_bytes`` (one output batch of the client
        part), ``first_order_peak_bytes``, and per P ``zo_p{P}_peak_bytes`` and
        ``zo_p{P}_ratio`` (ZO / first-order).
    """
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        task = load_task(RunConfig.from_mapping({"model": model, "cut-layer": cut}))
        client = task.build_model().segment(0, cut)
        x = torch.randn(batch, *task.data.input_shape, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            out = client(x)
        grad = torch.randn_like(out).numpy()
        opt = make_sgd(client, 0.01, 0.9, 5e-4)

        def first_order() -> None:
            client(x).backward(torch.from_numpy(grad.copy()))  # the received gradient, decoded
            clip_and_step(client, opt, 10.0)

        def zo(p: int) -> None:
            seeds = list(range(p))
            perturbed_outputs(client, x, seeds, 1e-3)
            grads = spsa_gradient([0.1] * p, (direction(shapes_of(client), s) for s in seeds), 1e-3,
                                  num_parameters(client))
            for param, g in zip(client.parameters(), grads):
                param.grad = g
            clip_and_step(client, opt, 10.0)

        first_order()
        zo(1)  # warm-up: momentum buffers exist in both measurements
        result: dict[str, Any] = {
            "model": model, "cut": cut, "batch": batch,
            "param_bytes": sum(p.numel() * p.element_size() for p in client.parameters()),
            "activation_bytes": out.numel() * out.element_size(),
            "first_order_peak_bytes": peak_bytes(first_order),
        }
        for p in perturbations:
            result[f"zo_p{p}_peak_bytes"] = peak_bytes(lambda: zo(p))
            result[f"zo_p{p}_ratio"] = result[f"zo_p{p}_peak_bytes"] / result["first_order_peak_bytes"]
        return result
    finally:
        torch.set_num_threads(old)


def run(quick: bool = False) -> dict[str, Any]:
    """Every case of :data:`CASES` (batch 8 with ``quick``, else 32); prints one line each."""
    out = {}
    for model, cut in CASES:
        r = measure(model, cut, batch=8 if quick else 32)
        out[f"{model}-cut{cut}"] = r
        print(f"{model} cut {cut}, batch {r['batch']}: params {r['param_bytes']} B, activations "
              f"{r['activation_bytes']} B; peak first-order {r['first_order_peak_bytes']} B, "
              f"ZO P=1 {r['zo_p1_peak_bytes']} B ({r['zo_p1_ratio']:.2f}x), "
              f"ZO P=4 {r['zo_p4_peak_bytes']} B ({r['zo_p4_ratio']:.2f}x)", flush=True)
    return out
