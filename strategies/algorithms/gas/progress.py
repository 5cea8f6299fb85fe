"""GAS: the training progress n(A) of each activation and its weight s(n) in eqs. 11-12.

The weight families (:func:`progress_weight`) are the paper's; which n an
activation gets is :class:`TrainingProgress`'s.

The GAS paper ("Dynamic Weighted Update") defines n as "the total number of
iterations n = tE + e" and notes that "each activation has a different
training progress". Three counts are offered (``progress=...``):

* ``flushes`` (the default): the activation buffer's flush counter; every
  activation of one flush shares it (:class:`~strategies.algorithms.gas.generation.LabelGaussians`
  counts it itself).
* ``iterations``: the paper's n = tE + e, t the global iteration of the client
  model the activation's client trains from, e = 1..E its local iteration.
* ``uploads``: the GAS authors' ``weight_count`` (``GAS_main.py``): a client
  starts from ``total_weight_count`` (1 at first) and counts its uploads; each
  global iteration adds the number of activation flushes so far to
  ``total_weight_count``.
"""

from __future__ import annotations

import math

import torch

from fl_app.run.options import Option
from fl_app.run.errors import ConfigError

WEIGHTINGS = ("linear", "exponential", "polynomial")

#: b in the paper's exponential weighting s(n) = a * exp(b * n) (a = 1). The
#: paper names the family but not a and b; a cancels out of eqs. 11-12.
EXPONENTIAL_RATE = 0.1
#: b in the paper's polynomial weighting s(n) = a * n**b (a = 1).
POLYNOMIAL_POWER = 2.0


def check_weighting(kind: str) -> None:
    """Raises ConfigError for an unknown weighting family (see :data:`WEIGHTINGS`)."""
    if kind not in WEIGHTINGS:
        raise ConfigError(
            f"unknown GAS weighting {kind!r}; choose one of {', '.join(WEIGHTINGS)}"
        )


def check_progress(n: int) -> int:
    """``n`` itself; raises ValueError unless it is an integer >= 1."""
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"training progress n must be an integer >= 1, got {n!r}")
    return n


def log_progress_weight(n: int, kind: str = "linear") -> float:
    """log s(n); used internally so that exponential weights never overflow."""
    check_weighting(kind)
    n = check_progress(n)
    if kind == "linear":
        return math.log(n)
    if kind == "exponential":
        return EXPONENTIAL_RATE * n
    return POLYNOMIAL_POWER * math.log(n)


def progress_weight(n: int, kind: str = "linear") -> float:
    """s(n): the weight of the activations that arrive at the n-th statistics update.

    ``n >= 1`` is the training progress (here: the flush counter). The paper
    uses the increasing weighting s(n) = n in its experiments and names two
    other families, s(n) = a*exp(b*n) and s(n) = a*n**b, without values for a
    and b. Here a = 1 (a scale cancels out of eqs. 11-12) and:

    * ``"linear"``: s(n) = n (the paper's default);
    * ``"exponential"``: s(n) = exp(EXPONENTIAL_RATE * n) = exp(0.1 n);
    * ``"polynomial"``: s(n) = n ** POLYNOMIAL_POWER = n**2.

    Returns ``math.inf`` where the float overflows (exponential, n > ~7000);
    :class:`LabelGaussians` works with log-weights and is unaffected.
    """
    check_weighting(kind)
    n = check_progress(n)
    if kind == "linear":
        return float(n)
    if kind == "polynomial":
        return float(n) ** POLYNOMIAL_POWER
    try:
        return math.exp(EXPONENTIAL_RATE * n)
    except OverflowError:
        return math.inf


#: The ``progress`` option's values.
PROGRESS_COUNTS = ("flushes", "iterations", "uploads")
#: The ``progress`` option (GAS).
PROGRESS_OPTION = Option("progress", "flushes", "training progress n(A) that s(n) weighs: the activation buffer's "
                         "flush counter (flushes), the paper's n = tE + e of each activation (iterations), or the "
                         "GAS authors' per-client upload counter (uploads)", PROGRESS_COUNTS,
                         source="GAS eqs. 11-12")


class TrainingProgress:
    """The progress n(A) of GAS's activations under one of :data:`PROGRESS_COUNTS`.

    Args:
        mode: ``flushes``, ``iterations`` or ``uploads``.

    Raises:
        ValueError: an unknown mode.
    """

    def __init__(self, mode: str) -> None:
        if mode not in PROGRESS_COUNTS:
            raise ValueError(f"unknown progress count {mode!r}; choose one of {', '.join(PROGRESS_COUNTS)}")
        self.mode = mode
        #: ``iterations``: the global iteration t each client's model comes from
        self.start_iteration: dict[int, int] = {}
        #: ``uploads``: each client's ``weight_count``, the running ``total_weight_count`` and the flushes so far
        self.upload_count: dict[int, int] = {}
        self.upload_total = 1
        self.flushes = 0

    def launch(self, pid: int, global_iteration: int) -> None:
        """Client ``pid`` starts a local round from the model of ``global_iteration``."""
        self.start_iteration[pid] = global_iteration
        self.upload_count[pid] = self.upload_total

    def activation(self, pid: int, local_iteration: int, local_steps: int) -> int:
        """n of the activation batch ``pid`` just uploaded in its ``local_iteration`` (1..E of
        ``local_steps``); 0 under ``flushes`` (the flush counter applies at the flush)."""
        if self.mode == "iterations":
            return self.start_iteration[pid] * local_steps + local_iteration
        if self.mode == "uploads":
            n = self.upload_count[pid]
            self.upload_count[pid] = n + 1
            return n
        return 0

    def flushed(self, batches: list[tuple[int, int]]) -> torch.Tensor | None:
        """The activation buffer was flushed: per-activation progress of its ``(rows, n)`` batches, int64
        ``[Σ rows]``, or None under ``flushes`` (the Gaussians count flushes themselves)."""
        self.flushes += 1
        if self.mode == "flushes":
            return None
        return torch.cat([torch.full((rows,), n, dtype=torch.int64) for rows, n in batches])

    def aggregated(self) -> None:
        """A global iteration ended (the model buffer was averaged)."""
        self.upload_total += self.flushes

    def forget(self, pid: int) -> None:
        """Client ``pid`` failed: its local round is dropped."""
        self.start_iteration.pop(pid, None)
        self.upload_count.pop(pid, None)
