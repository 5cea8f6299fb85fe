"""Numerics modes: the ``numerics`` run-config key (``fast`` or ``portable``).

A run is deterministic from its seed on one machine in either mode. Across
machines, ``fast`` (the default) is not: PyTorch, MKL and oneDNN each pick
their kernels by the CPU's instruction set, float rounding differs between
those kernels, and long runs turn the rounding into points of accuracy
(zeroth-order runs most; docs/reproducibility.md shows it). ``portable`` pins every such choice to one that every x86-64
CPU can run, so that the same seed and configuration give the same
``metrics.csv`` (every column but ``wall_time_s``) on every such machine:

* ATen's CPU kernels at the baseline capability (``ATEN_CPU_CAPABILITY=default``);
* MKL's conditional numerical reproducibility (``MKL_CBWR=COMPATIBLE``),
  which makes MKL take the same code path on every CPU;
* oneDNN off (``torch.backends.mkldnn``) and NNPACK off: convolutions go
  through ATen's own im2col and MKL's GEMM;
* one intra-op thread (``torch.set_num_threads(1)``), so that no reduction
  is split by the core count.

What these cannot pin (docs/reproducibility.md names it; none of it is measured): the C
library's ``exp``/``log`` (glibc chooses FMA variants by the CPU at load
time), and the build of torch itself: the same torch version and the same
architecture (x86-64) are required; ARM machines take other kernels.

ATen and MKL read their variables once, before the first tensor operation
of a process, so ``portable`` needs them in the environment before the
process starts: ``sflower run``, ``sweep`` and ``deploy`` restart themselves with
them (:func:`restart`); elsewhere (``flwr run``, SuperNodes)
:func:`establish` checks them and stops with one line that names the
``export`` to give.
"""

from __future__ import annotations

import os
import platform
import sys
from collections.abc import Mapping
from typing import Any

from fl_app.run.errors import ConfigError

#: The values of the ``numerics`` key.
MODES = ("fast", "portable")

#: Environment variables that ``portable`` needs before the process's first tensor operation.
PORTABLE_ENV: dict[str, str] = {
    "ATEN_CPU_CAPABILITY": "default",
    "MKL_CBWR": "COMPATIBLE",
    "OMP_NUM_THREADS": "1",
    "MKL_NUM_THREADS": "1",
}

def check_mode(mode: str) -> None:
    """Raises ConfigError (one line) unless ``mode`` is one of :data:`MODES`."""
    if mode not in MODES:
        raise ConfigError(f"numerics must be one of {', '.join(MODES)}; got '{mode}'")


def export_line() -> str:
    """The shell line that sets :data:`PORTABLE_ENV` (for a SuperNode, ``flwr run`` or a notebook)."""
    return "export " + " ".join(f"{k}={v}" for k, v in PORTABLE_ENV.items())


def launch_env(mode: str, environ: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """The environment a process must start with for ``mode``; None when ``environ`` already is one.

    ``fast`` needs nothing (the machine's own choices). ``portable`` needs
    :data:`PORTABLE_ENV`; the user's own instruction-set limits
    (``MKL_ENABLE_INSTRUCTIONS``, ``ONEDNN_MAX_CPU_ISA``) are kept: they
    describe the machine, which portable mode must not depend on.
    """
    check_mode(mode)
    environ = dict(os.environ if environ is None else environ)
    if mode == "fast" or all(environ.get(k) == v for k, v in PORTABLE_ENV.items()):
        return None
    return {**environ, **PORTABLE_ENV}


def restart(mode: str, module: str, args: list[str]) -> None:
    """Replace this process by ``python -m module *args`` started with ``mode``'s environment, if it lacks it.

    Returns only when the environment already suits ``mode`` (always for ``fast``).
    """
    env = launch_env(mode)
    if env is None:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", module, *args], env)


def establish(mode: str) -> None:
    """Put this process in ``mode``'s numerics (idempotent; ``fast`` changes nothing).

    For ``portable``: one torch thread, oneDNN and NNPACK off, after
    checking that the process started with :data:`PORTABLE_ENV`.

    Raises:
        ConfigError: ``portable`` in a process whose ATen kernels or MKL were
            chosen without :data:`PORTABLE_ENV` (one line naming the export).
    """
    check_mode(mode)
    if mode == "fast":
        return
    import torch

    missing = [k for k, v in PORTABLE_ENV.items() if os.environ.get(k) != v]
    capability = torch.backends.cpu.get_cpu_capability()
    if missing or capability != "DEFAULT":
        raise ConfigError(f"numerics=portable needs the process started with {', '.join(missing) or 'ATEN_CPU_CAPABILITY'} "
                          f"set (ATen's kernels here: {capability}); sflower run and sweep do this themselves, "
                          f"elsewhere give: {export_line()}")
    torch.set_num_threads(1)
    torch.backends.mkldnn.enabled = False
    torch.backends.nnpack.set_flags(False)


def _cpu_model_and_flags() -> tuple[str, list[str]]:
    """The CPU's model name and instruction-set flags from /proc/cpuinfo (empty where there is none)."""
    model, flags = platform.processor(), []
    try:
        with open("/proc/cpuinfo") as fh:
            for line in fh:
                key, _, value = line.partition(":")
                key = key.strip()
                if key == "model name" and not model:
                    model = value.strip()
                elif key == "model name":
                    model = value.strip() or model
                elif key in ("flags", "Features") and not flags:
                    flags = value.split()
                if model and flags:
                    break
    except OSError:
        pass
    return model, flags


#: The instruction-set flags worth recording (the ones the kernels above choose by).
ISA_FLAGS = ("sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512_vnni",
             "avx512_bf16", "amx_tile", "asimd", "sve")


def machine_record(mode: str) -> dict[str, Any]:
    """What ``config.json`` and ``summary.json`` record of the machine and the numerics mode.

    Returns:
        ``mode``; ``cpu`` (model name), ``isa`` (the :data:`ISA_FLAGS` the CPU
        has), ``machine`` (architecture); ``threads`` (torch intra-op threads);
        ``aten_capability`` (the kernels ATen runs); ``torch``, ``mkl`` and
        ``onednn`` versions; ``mkldnn_enabled``; and the
        :data:`PORTABLE_ENV` variables as this process sees them.
    """
    import torch

    model, flags = _cpu_model_and_flags()
    config = torch.__config__.show()

    def version_after(marker: str) -> str:
        line = next((ln for ln in config.splitlines() if marker in ln), "")
        return line.split(marker, 1)[1].strip() if line else ""

    return {
        "mode": mode,
        "cpu": model,
        "machine": platform.machine(),
        "isa": [f for f in ISA_FLAGS if f in flags],
        "threads": torch.get_num_threads(),
        "aten_capability": torch.backends.cpu.get_cpu_capability(),
        "torch": torch.__version__,
        "mkl": version_after("Math Kernel Library Version").split(" for ")[0],
        "onednn": version_after("MKL-DNN").split(" (")[0],
        "mkldnn_enabled": bool(torch.backends.mkldnn.enabled),
        "env": {k: os.environ.get(k, "") for k in (*PORTABLE_ENV, "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")},
    }
