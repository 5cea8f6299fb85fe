"""Per-label Gaussian activation statistics for GAS (generative activation-aided updates).

GAS (its paper, section "Generative Activation-Aided Updates")
keeps, for every label y, a Gaussian N(mu_y, Sigma_y) over the (flattened)
activations the server has received, and tops the activation buffer up with
samples from it so that the server step sees every label.

Statistics (eqs. 11-12 and Technical Appendix B)
------------------------------------------------
Every activation A carries the weight s(n(A)), where n(A) is its training
progress. As in GAS's reference code the statistics are updated once per
buffer flush, so n is the flush counter (1, 2, ...) and all activations of
the n-th flush share the weight s(n). With S_N the sum of all weights seen::

    mu_N    = (1/S_N) * sum_A s(n(A)) * A                                  (11)
    Sigma_N = (1/S_N) * sum_A s(n(A)) * (A - mu_N)(A - mu_N)^T             (12)

i.e. the *population* weighted mean and covariance (divided by the total
weight S_N, not by S_N - 1 or any other "unbiased" correction). The paper
writes them as one-activation-at-a-time recursions; folding a whole flush at
once is algebraically identical. For a label with old total weight W_o, old
statistics (mu_o, Sigma_o) and a flush of k activations of weight w = s(n)
(W_b = k*w, batch mean mu_b, batch population covariance Sigma_b)::

    W = W_o + W_b,   a = W_o / W,   b = W_b / W
    mu    = a*mu_o + b*mu_b
    Sigma = a*Sigma_o + b*Sigma_b + a*b*(mu_o - mu_b)(mu_o - mu_b)^T

which is exactly what applying eqs. 11-12 to the k activations in turn gives.

Sampling distribution
---------------------
Samples are drawn from N(mu_y, Sigma_y + r*I) with r the regulariser (1e-5 by
default, as in GAS's reference code). ``covariance()`` returns that sampled
covariance, Sigma_y + r*I (full) or diag(Sigma_y) + r (diagonal); pass
``regularised=False`` for Sigma_y of eq. 12 itself. Diagonal mode keeps only
the per-dimension variances (the diagonal of the full-mode result) and samples
independent coordinates, as GAS's reference code does for ResNet.

Full covariance is stored per label in an exact factored form that is updated
by low-rank columns and refactorised only every ``max_pending`` columns;
``strategies/algorithms/gas/gaussian_factors.py`` explains it, its cost, precision and memory.
Everything lives on the CPU; pass a CPU ``torch.Generator`` for reproducible samples.
"""

from __future__ import annotations

import math

import torch

from fl_app.run.errors import ConfigError
from strategies.algorithms.gas.gaussian_factors import (
    WORK_DTYPE,
    LabelState,
    block_bounds,
    compress,
    dense_factor,
    scaled_pending,
    trmm_lower,
)
from strategies.algorithms.gas.progress import (
    EXPONENTIAL_RATE,
    POLYNOMIAL_POWER,
    WEIGHTINGS,
    check_progress,
    check_weighting,
    log_progress_weight,
    progress_weight,
)

__all__ = [
    "WEIGHTINGS",
    "COVARIANCES",
    "EXPONENTIAL_RATE",
    "POLYNOMIAL_POWER",
    "progress_weight",
    "log_progress_weight",
    "LabelGaussians",
    "generation_flops",
]

COVARIANCES = ("full", "diagonal")


def generation_flops(dim: int, covariance: str, folded: int, generated: int) -> float:
    """FLOPs of one flush of GAS's generation, for the virtual clock's server compute (``server-speed``).

    A cost model of the algorithm (GAS eqs. 11-12 and the draws), not a count of this implementation's
    kernels: with ``full`` covariance each of the ``folded`` activations enters ``Sigma_y`` as one
    outer product (``2·D²``: eq. 12's rank-one term) and each of the ``generated`` draws is a
    ``D × D`` factor times a standard normal vector (``2·D²``); with ``diagonal`` covariance, ``4·D``
    and ``3·D``. The periodic refactorisations (:func:`strategies.algorithms.gas.gaussian_factors.compress`,
    about ``(4/3)·D²`` per folded column amortised) are left out.

    Args:
        dim: the flattened activation size D.
        covariance: ``"full"`` or ``"diagonal"``.
        folded: activations folded into the statistics at this flush.
        generated: activations drawn at this flush.

    Returns:
        FLOPs (float).
    """
    d = float(dim)
    if covariance == "diagonal":
        return 4.0 * d * folded + 3.0 * d * generated
    return 2.0 * d * d * (folded + generated)


class LabelGaussians:
    """Per-label running Gaussian N(mu_y, Sigma_y) over flattened activations, GAS eqs. 11-12.

    Parameters
    ----------
    num_classes, dim:
        Number of labels and flattened activation size D.
    covariance:
        ``"full"`` or ``"diagonal"``.
    regulariser:
        r >= 0; samples come from N(mu_y, Sigma_y + r*I).
    weighting:
        One of :data:`WEIGHTINGS`; see :func:`progress_weight`.
    max_pending:
        Full mode only: how many new covariance columns a label may hold
        before they are folded into its Cholesky factor (default ``dim // 2``).
        A performance knob; the distribution does not depend on it.
    factor_dtype:
        Full mode only: storage dtype of the factor L and the pending columns
        K (``torch.float32``, the default, or ``torch.float64``). The mean is
        float64 regardless; ``covariance()`` is exact to this dtype's rounding.

    After updates 1..n, ``mean(y)`` and ``covariance(y, regularised=False)``
    are the weighted mean and population covariance (eqs. 11-12) of every
    activation of label y seen so far, an activation of update j having
    weight s(j).
    """

    def __init__(
        self,
        num_classes: int,
        dim: int,
        covariance: str = "full",
        regulariser: float = 1e-5,
        weighting: str = "linear",
        *,
        max_pending: int | None = None,
        factor_dtype: torch.dtype = torch.float32,
    ) -> None:
        if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < 1:
            raise ConfigError(f"GAS generation needs num_classes >= 1, got {num_classes!r}")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ConfigError(f"GAS generation needs an activation size >= 1, got {dim!r}")
        if covariance not in COVARIANCES:
            raise ConfigError(
                f"unknown GAS covariance {covariance!r}; choose one of {', '.join(COVARIANCES)}"
            )
        check_weighting(weighting)
        try:
            regulariser = float(regulariser)
        except (TypeError, ValueError):
            raise ConfigError(f"GAS regulariser must be a number, got {regulariser!r}") from None
        if not math.isfinite(regulariser) or regulariser < 0:
            raise ConfigError(f"GAS regulariser must be finite and >= 0, got {regulariser!r}")
        if factor_dtype not in (torch.float32, torch.float64):
            raise ConfigError(f"factor_dtype must be torch.float32 or torch.float64, got {factor_dtype!r}")
        if max_pending is None:
            max_pending = max(1, dim // 2)
        if isinstance(max_pending, bool) or not isinstance(max_pending, int) or max_pending < 1:
            raise ConfigError(f"max_pending must be an integer >= 1, got {max_pending!r}")
        self.num_classes = num_classes
        self.dim = dim
        self.covariance_kind = covariance
        self.regulariser = regulariser
        self.weighting = weighting
        self.max_pending = max_pending
        self.factor_dtype = factor_dtype
        self._bounds = block_bounds(dim)
        self._max_rows = 0  # the most columns one flush has added to a label
        self.num_updates = 0  # the progress n of the last update
        self.num_compressions = 0
        self._states = [LabelState() for _ in range(num_classes)]

    # ------------------------------------------------------------------ state
    @property
    def diagonal(self) -> bool:
        """Whether only per-dimension variances are kept."""
        return self.covariance_kind == "diagonal"

    def _state(self, label: int) -> LabelState:
        label = int(label)
        if not 0 <= label < self.num_classes:
            raise ValueError(f"label {label} out of range [0, {self.num_classes})")
        return self._states[label]

    def _stats(self, label: int) -> LabelState:
        st = self._state(label)
        if st.count == 0:
            raise RuntimeError(f"no activation statistics for label {int(label)} yet")
        return st

    def has_stats(self, label: int) -> bool:
        """Whether ``label`` has received any activations."""
        return self._state(label).count > 0

    def ready(self) -> bool:
        """True once every label has statistics (GAS generates only then)."""
        return all(st.count > 0 for st in self._states)

    def count(self, label: int) -> int:
        """Number of activations of ``label`` seen so far."""
        return self._state(label).count

    def total_weight(self, label: int) -> float:
        """S_N of eq. 11 for ``label`` (may be ``inf`` for huge exponential weights)."""
        logw = self._state(label).logw
        try:
            return math.exp(logw)
        except OverflowError:
            return math.inf

    def pending_columns(self, label: int) -> int:
        """Full mode: columns of K not yet folded into the factor L."""
        return self._state(label).j

    def memory_bytes(self) -> int:
        """Bytes held by the statistics' tensors (all labels; allocated capacity, not just use).

        Labels that have received nothing hold nothing. Full mode, per label:
        the factor's row slabs (about 9/16 of D*D values in ``factor_dtype``
        for large D; none before the first compression) plus the pending
        columns' buffer (at most about max_pending + 2 * flush rows columns of
        D values in ``factor_dtype``) plus the float64 mean.
        """
        total = 0
        for st in self._states:
            for t in (st.mean, st.var, st.K, st.sc, *(st.L or ())):
                if t is not None:
                    total += t.element_size() * t.nelement()
        return total

    # ----------------------------------------------------------------- update
    def update(
        self, activations: torch.Tensor, labels: torch.Tensor, *, progress: int | torch.Tensor | None = None
    ) -> None:
        """Fold one buffer flush into the statistics (eqs. 11-12).

        ``activations``: float [N, D] or [N, ...] (flattened to D); ``labels``:
        integer [N]. ``progress`` is the training progress n(A):

        * None: the update counter n + 1 (the flush counter); every
          activation of this flush gets the weight s(n);
        * an int n: every activation gets s(n), and the counter becomes n;
        * an integer tensor [N] (every value >= 1): activation i gets
          s(progress[i]), the paper's per-activation progress (GAS §"Dynamic
          Weighted Update": "each activation has a different training
          progress"); the counter becomes the largest. The flush is folded
          per label as the weighted batch of eqs. 11-12, which equals
          applying them to the activations one at a time.

        Raises:
            TypeError, ValueError: malformed activations, labels or progress.
        """
        if not isinstance(activations, torch.Tensor) or not isinstance(labels, torch.Tensor):
            raise TypeError("activations and labels must be torch tensors")
        if activations.dim() < 1:
            raise ValueError("activations must have a leading batch dimension")
        per_sample = math.prod(activations.shape[1:])
        if per_sample != self.dim:
            raise ValueError(
                f"activations flatten to {per_sample} values per sample, expected {self.dim}"
            )
        x = activations.detach().reshape(activations.shape[0], self.dim)
        labels = labels.detach().reshape(-1)
        if labels.shape[0] != x.shape[0]:
            raise ValueError(f"{x.shape[0]} activations but {labels.shape[0]} labels")
        if labels.is_floating_point() or labels.is_complex():
            raise ValueError("labels must be an integer tensor")
        labels = labels.to("cpu", torch.int64)
        if labels.numel() and (int(labels.min()) < 0 or int(labels.max()) >= self.num_classes):
            raise ValueError(f"labels must lie in [0, {self.num_classes})")
        if isinstance(progress, torch.Tensor):
            per_row = progress.detach().to("cpu").reshape(-1)
            if per_row.is_floating_point() or per_row.is_complex() or per_row.shape[0] != x.shape[0]:
                raise ValueError(f"progress must be an integer tensor of {x.shape[0]} values")
            if per_row.numel() and int(per_row.min()) < 1:
                raise ValueError("training progress n must be >= 1")
            n = max(self.num_updates, int(per_row.max())) if per_row.numel() else self.num_updates
            log_s: float | torch.Tensor = self._log_weights(per_row)
        else:
            n = self.num_updates + 1 if progress is None else check_progress(progress)
            log_s = log_progress_weight(n, self.weighting)
        self.num_updates = n
        if labels.numel() == 0:
            return
        # One stable sort groups the flush by label (ascending).
        order = torch.argsort(labels, stable=True)
        x = x.to("cpu")[order].to(WORK_DTYPE)
        if isinstance(log_s, torch.Tensor):
            log_s = log_s[order]
        counts = torch.bincount(labels, minlength=self.num_classes).tolist()
        start = 0
        for y, k in enumerate(counts):
            if k:
                rows = log_s[start : start + k] if isinstance(log_s, torch.Tensor) else log_s
                self._fold(self._states[y], x[start : start + k], rows)
                start += k

    def _log_weights(self, progress: torch.Tensor) -> torch.Tensor:
        """log s(n) per row of an integer progress tensor, float64 [N]."""
        logs = {int(n): log_progress_weight(int(n), self.weighting) for n in progress.unique().tolist()}
        return torch.tensor([logs[int(n)] for n in progress.tolist()], dtype=WORK_DTYPE)

    def _fold(self, st: LabelState, xb: torch.Tensor, log_s: float | torch.Tensor) -> None:
        """Fold the rows ``xb`` [k, D] of one label, of log-weight ``log_s`` each (a float: all equal;
        a float64 [k] tensor: one per row), into ``st`` (eqs. 11-12)."""
        k = xb.shape[0]
        if isinstance(log_s, torch.Tensor):  # per-row weights: p_i = w_i / W_b
            log_wb = float(torch.logsumexp(log_s, dim=0))
            p = torch.exp(log_s - log_wb).to(xb.dtype)
            mu_b = p @ xb
            dev = xb - mu_b
        else:
            p = None
            mu_b = xb.mean(dim=0)
            dev = xb - mu_b  # [k, D]
            log_wb = log_s + math.log(k)
        if st.count == 0:
            a, b = 0.0, 1.0
            logw = log_wb
            st.mean = mu_b
        else:
            hi, lo = max(st.logw, log_wb), min(st.logw, log_wb)
            logw = hi + math.log1p(math.exp(lo - hi))  # log(W_old + W_b)
            a = math.exp(st.logw - logw)  # W_old / W
            b = -math.expm1(st.logw - logw)  # W_b / W = 1 - a, accurately
            delta = st.mean - mu_b
            st.mean = st.mean - b * delta  # = a*mu_old + b*mu_b      (eq. 11)
        if self.diagonal:
            var_b = dev.square().mean(dim=0) if p is None else p @ dev.square()
            if st.count == 0:
                st.var = var_b
            else:  # diagonal of eq. 12 for the merged set
                st.var = a * st.var + b * var_b + (a * b) * delta.square()
        else:
            # eq. 12 as a low-rank update: Sigma = a*Sigma_old
            #   + sum_i (w/W) dev_i dev_i^T + a*b*delta delta^T, w/W = b/k.
            if st.count > 0:
                st.c *= a
                if st.j:
                    st.sc[: st.j].mul_(math.sqrt(a))
                if k > 1:  # a single activation has dev == 0
                    self._append(st, dev, math.sqrt(b / k) if p is None else torch.sqrt(b * p))
                self._append(st, delta.unsqueeze(0), math.sqrt(a * b))
            elif k > 1:
                self._append(st, dev, math.sqrt(1.0 / k) if p is None else torch.sqrt(p))
            # before the first compression K may grow to D columns (K K^T
            # then has full rank anyway); this keeps runs that never get
            # there bit-identical to the earlier two-copy storage.
            limit = self.dim if st.L is None else self.max_pending
            if st.j > limit:
                compress(st, self.regulariser, self._bounds, self.factor_dtype,
                         self.max_pending + 2 * self._max_rows)
                self.num_compressions += 1
        st.count += k
        st.logw = logw

    def _append(self, st: LabelState, rows: torch.Tensor, scale: float | torch.Tensor) -> None:
        m = rows.shape[0]
        need = st.j + m
        self._max_rows = max(self._max_rows, m)
        if st.K is None or need > st.K.shape[0]:
            old = 0 if st.K is None else st.K.shape[0]
            # grow geometrically, but not far past what a compression lets accumulate
            limit = self.dim if st.L is None else self.max_pending
            cap = max(need, min(max(2 * old, 64), limit + 2 * self._max_rows))
            K = torch.empty((cap, self.dim), dtype=self.factor_dtype)
            sc = torch.empty(cap, dtype=WORK_DTYPE)
            if st.j:
                K[: st.j] = st.K[: st.j]
                sc[: st.j] = st.sc[: st.j]
            st.K, st.sc = K, sc
        st.K[st.j : need] = rows
        st.sc[st.j : need] = scale
        st.j = need

    # ------------------------------------------------------------- read-outs
    def mean(self, label: int) -> torch.Tensor:
        """mu_y of eq. 11, float64 [D] (a copy)."""
        return self._stats(label).mean.clone()

    def covariance(self, label: int, *, regularised: bool = True) -> torch.Tensor:
        """The sampled covariance Sigma_y + r*I (float64 [D, D]), or diag(Sigma_y) + r
        ([D]) in diagonal mode. ``regularised=False`` gives Sigma_y of eq. 12."""
        st = self._stats(label)
        r = self.regulariser if regularised else 0.0
        if self.diagonal:
            return st.var + r
        if st.L is not None:  # c G = c (L L^T - r I)
            Lf = dense_factor(st, self._bounds)
            S = (Lf @ Lf.T).mul_(st.c)
            del Lf
            S.diagonal().sub_(st.c * self.regulariser)
        else:
            S = torch.zeros((self.dim, self.dim), dtype=WORK_DTYPE)
        if st.j:
            Ks = scaled_pending(st)
            S.addmm_(Ks.T, Ks)
        if r:
            S.diagonal().add_(r)
        return S

    def sampling_factor(self, label: int) -> tuple[torch.Tensor, float]:
        """Full mode: (F [D, m], iso) with F F^T + iso*I == covariance(label).

        Samples are mu + F e + sqrt(iso) e' with e, e' standard normal; F is
        [sqrt(c) L, K] (see the module docstring). For tests and diagnostics.
        """
        if self.diagonal:
            raise RuntimeError("sampling_factor() is for full covariance mode")
        st = self._stats(label)
        parts = []
        if st.L is not None:
            parts.append(dense_factor(st, self._bounds).mul_(math.sqrt(st.c)))
        if st.j:
            parts.append(scaled_pending(st).T)
        F = torch.cat(parts, dim=1) if parts else torch.zeros((self.dim, 0), dtype=WORK_DTYPE)
        return F, max(0.0, 1.0 - st.c) * self.regulariser

    # --------------------------------------------------------------- sampling
    def sample(self, label: int, n: int, generator: torch.Generator) -> torch.Tensor:
        """n draws from N(mu_y, Sigma_y + r*I) as float32 [n, D]."""
        st = self._stats(label)
        n = int(n)
        if n < 0:
            raise ValueError(f"cannot draw {n} samples")
        D = self.dim
        if n == 0:
            return torch.empty((0, D), dtype=torch.float32)
        if self.diagonal:
            eps = torch.randn((n, D), generator=generator, dtype=WORK_DTYPE)
            out = eps.mul_(torch.sqrt(st.var + self.regulariser)).add_(st.mean)
            return out.to(torch.float32)
        dt = self.factor_dtype
        d_l = D if st.L is not None else 0
        eps = torch.randn((n, d_l + st.j + D), generator=generator, dtype=dt)
        mean = st.mean.to(dt)
        if st.L is not None:  # mean + sqrt(c) L e1, computed as e1^T L^T
            if st.L_full:
                out = torch.addmm(mean, eps[:, :D], st.L[0].T, alpha=math.sqrt(st.c))
            else:
                out = trmm_lower(mean, eps[:, :D], st.L, math.sqrt(st.c), self._bounds)
        else:
            out = mean.expand(n, D).clone()
        if st.j:  # K e2 with K = (Kt * sc)^T
            e2 = eps[:, d_l : d_l + st.j] * st.sc[: st.j].to(dt)
            out.addmm_(e2, st.K[: st.j])
        iso = max(0.0, 1.0 - st.c) * self.regulariser
        if iso > 0:
            out.add_(eps[:, d_l + st.j :], alpha=math.sqrt(iso))
        return out.to(torch.float32)

    def generate(
        self, labels_present: torch.Tensor, per_label: int, generator: torch.Generator
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """GAS top-up of a buffer whose labels are ``labels_present``.

        Label y gets max(0, per_label - count_y) generated activations, so each
        label ends with at least ``per_label`` (an absent label gets
        ``per_label``). Returns (activations float32 [M, D], labels int64 [M])
        in ascending label order. Raises RuntimeError unless :meth:`ready`.
        """
        if not self.ready():
            missing = [y for y, st in enumerate(self._states) if st.count == 0]
            raise RuntimeError(f"GAS generation needs statistics for every label; missing {missing}")
        per_label = int(per_label)
        if per_label < 0:
            raise ValueError(f"per_label must be >= 0, got {per_label}")
        present = torch.as_tensor(labels_present).reshape(-1)
        if present.is_floating_point() or present.is_complex():
            raise ValueError("labels_present must be an integer tensor")
        present = present.to("cpu", torch.int64)
        if present.numel() and (int(present.min()) < 0 or int(present.max()) >= self.num_classes):
            raise ValueError(f"labels must lie in [0, {self.num_classes})")
        counts = torch.bincount(present, minlength=self.num_classes).tolist()
        acts, labs = [], []
        for y in range(self.num_classes):
            need = per_label - counts[y]
            if need > 0:
                acts.append(self.sample(y, need, generator))
                labs.append(torch.full((need,), y, dtype=torch.int64))
        if not acts:
            return torch.empty((0, self.dim), dtype=torch.float32), torch.empty(0, dtype=torch.int64)
        return torch.cat(acts), torch.cat(labs)
