"""Where tensors live: the ``device`` run-config key (``auto``, ``cpu``, ``cuda`` or ``cuda:N``).

The server side (server-side models, server steps, generated activations,
evaluation) runs on the run's device; each node runs its client-side work on
its own: ``device`` in its ``node_config`` when given (a SuperNode started
with ``--node-config 'device="cuda"'``), else the run's key, resolved on the
node (``auto`` picks a GPU only where the node sees one; a Ray actor sees the
GPUs of its ``client-resources-num-gpus`` share).

Messages always carry CPU arrays: :mod:`fl_app.protocol` encodes with
``.cpu()`` and decodes to CPU tensors, which the receiving side moves with
:func:`to_device`. On the CPU every move is a no-op, so CPU runs give the same
numbers as before the key existed.
"""

from __future__ import annotations

import functools
import os

import torch

from fl_app.run.errors import ConfigError

#: The values ``device`` accepts besides ``cuda:N``.
DEVICE_CHOICES = ("auto", "cpu", "cuda")


def check_device_name(name: str) -> None:
    """Check the spelling of a ``device`` value (not whether the device exists).

    Raises:
        ConfigError: not ``auto``, ``cpu``, ``cuda`` or ``cuda:N``.
    """
    base, _, index = str(name).partition(":")
    if base not in DEVICE_CHOICES or (index and (base != "cuda" or not index.isdigit())):
        raise ConfigError(f"device must be auto, cpu, cuda or cuda:N; got '{name}'")


@functools.lru_cache(maxsize=8)
def resolve_device(name: str) -> torch.device:
    """The torch device of a ``device`` value on this machine.

    ``auto`` is ``cuda`` where ``torch.cuda.is_available()``, else ``cpu``.

    Raises:
        ConfigError: a bad value, or ``cuda`` on a machine without a usable
            GPU (e.g. ``"device=cuda but torch sees no GPU (torch 2.13.0+cpu);
            use device=cpu or auto"``).
    """
    check_device_name(name)
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise ConfigError(f"device={name} but torch sees no GPU (torch {torch.__version__}); "
                              "use device=cpu or auto")
        index = int(name.partition(":")[2] or 0)
        if index >= torch.cuda.device_count():
            raise ConfigError(f"device={name} but torch sees {torch.cuda.device_count()} GPU(s)")
    device = torch.device(name)
    if device.type == "cuda":
        deterministic_gpu()
    return device


def deterministic_gpu() -> None:
    """Ask PyTorch for reproducible GPU arithmetic where it offers it.

    cuDNN picks deterministic convolution algorithms and stops benchmarking
    (which may pick different ones per run), and cuBLAS gets the fixed
    workspace its deterministic mode needs (``CUBLAS_WORKSPACE_CONFIG``, set
    only when absent, before the first cuBLAS call). Operations without a
    deterministic GPU kernel (e.g. some scatter/index backward passes) stay
    as they are: runs then repeat only up to float rounding (docs: performance, "GPUs").
    """
    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.deterministic = True
    torch.backends.cudnn.benchmark = False


def to_device(tensor: torch.Tensor, device: torch.device) -> torch.Tensor:
    """``tensor`` on ``device`` (the same tensor object when it is already there)."""
    return tensor if tensor.device == device else tensor.to(device, non_blocking=False)


def model_device(model: torch.nn.Module) -> torch.device:
    """The device of a model's first parameter or buffer (CPU for a model without any)."""
    for t in model.parameters():
        return t.device
    for t in model.buffers():
        return t.device
    return torch.device("cpu")
