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

Why full covariance is cheap here
---------------------------------
The straightforward implementation keeps Sigma_y and, at every flush, builds
``MultivariateNormal(mu_y, Sigma_y + r*I)`` -- a D^3/3 Cholesky (twice, with
argument validation) per label, D = 3136 for AlexNet's 64x7x7 cut. Instead we
keep, per label, an exact *factored* form that is never refactorised from
scratch at a flush::

    Sigma_y + r*I = c * L L^T + K K^T + (1 - c) * r * I

* L (D x D, lower triangular) is the Cholesky factor of G + r*I, where G is
  Sigma_y as it was at the last "compression"; c (0 < c <= 1) is the factor by
  which that old part has been down-weighted since (c = 0 before the first
  compression, when there is no L). G itself is not stored: L L^T - r*I
  gives it back when needed.
* K (D x j) holds the columns added since: a flush's contribution to the
  covariance is low rank, namely (from the merge formula above)
  ``Sigma = a*Sigma_o + sum_i (w/W)(x_i - mu_b)(x_i - mu_b)^T
  + a*b*(mu_o - mu_b)(mu_o - mu_b)^T``, so a flush only rescales the old
  columns by sqrt(a), multiplies c by a, and appends the k+1 columns
  sqrt(w/W)(x_i - mu_b) and sqrt(a*b)(mu_o - mu_b). No D x D work.
* Sampling is z = mu + sqrt(c) L e1 + K e2 + sqrt((1-c) r) e3 with independent
  standard normal e1, e2, e3, whose covariance is c(G + rI) + KK^T + (1-c)rI
  = Sigma_y + r*I: exactly the target distribution, for O(D(D+j)) per sample.
* When K has more than ``max_pending`` columns (default D/2; before the first
  compression, more than D), it is folded
  in: L <- chol(c L L^T + K K^T + (1 - c) r I) = chol(G' + r*I) for the new
  G' = c*G + K K^T, formed and factorised in float64; c <- 1, K <- []. This
  costs about two D^3/3 products per ``max_pending`` absorbed columns instead
  of one Cholesky per label per flush, and is exact up to the rounding of the
  stored factors. If rounding makes G' + r*I numerically indefinite (only
  possible when r is tiny relative to ||Sigma||), L falls back to
  V sqrt(max(lambda, 0) + r) from an eigendecomposition of G'.
* The products that meet a triangle (K K^T into G's lower triangle, e1 L^T)
  are done by row blocks that skip the zero half, like BLAS syrk/trmm.

Every column enters the covariance once (about D^2 flops), so the per-flush
cost is O(D^2 * new columns) plus the sampling, with one Cholesky every
``max_pending`` columns; labels that received nothing in a flush are not
touched at all. ``simulation/bench/generation.py`` measures it against the
straightforward implementation.

Precision and memory: the mean and all weights are float64. The factor L and
the pending columns K are stored once, in ``factor_dtype`` (float32 by
default): ``mean()`` matches eq. 11 to float64 rounding, ``covariance()``
(computed in float64 from the stored factors) matches eq. 12 to float32
rounding (relative ~1e-7, well below r = 1e-5 for activations of order 1),
and the samples (float32 either way) come from that covariance. Pass
``factor_dtype=torch.float64`` for float64 statistics throughout. L is kept
as the row slabs L[r0:r1, :r1] of its lower triangle (9/16 of D*D for large
D). In full mode a label that has received activations holds, in
``factor_dtype``, up to about D + 2*batch pending columns of D values before
its first compression, then the slabs and up to about max_pending + 2*batch
pending columns; a label never seen holds nothing. With float32 that is at
most about 4.3*D*D bytes: 42 MB for D = 3136 and 72 MB for D = 4096 (it was
up to 18*D*D bytes, 177 MB at D = 3136, with float64 G and K kept beside the
float32 copies). A compression
needs about 2*8*D*D bytes of float64 scratch for one label at a time.
Exact full covariance needs at least D*(D+1)/2 numbers per label once the
label has seen more than D activations (34 MB in float32 at D = 4096), so 100
such labels cannot fit in 2 GB with exact sampling; see
``python -m simulation.bench.generation --memory`` for measured figures. Everything
lives on the CPU; pass a CPU ``torch.Generator`` for reproducible samples.
"""

from __future__ import annotations

import math

import torch

from fl_app.errors import ConfigError

__all__ = [
    "WEIGHTINGS",
    "COVARIANCES",
    "EXPONENTIAL_RATE",
    "POLYNOMIAL_POWER",
    "progress_weight",
    "log_progress_weight",
    "LabelGaussians",
]

WEIGHTINGS = ("linear", "exponential", "polynomial")
COVARIANCES = ("full", "diagonal")

#: b in the paper's exponential weighting s(n) = a * exp(b * n) (a = 1). The
#: paper names the family but not a and b; a cancels out of eqs. 11-12.
EXPONENTIAL_RATE = 0.1
#: b in the paper's polynomial weighting s(n) = a * n**b (a = 1).
POLYNOMIAL_POWER = 2.0

_DTYPE = torch.float64


def _check_weighting(kind: str) -> None:
    if kind not in WEIGHTINGS:
        raise ConfigError(
            f"unknown GAS weighting {kind!r}; choose one of {', '.join(WEIGHTINGS)}"
        )


def _check_progress(n: int) -> int:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ValueError(f"training progress n must be an integer >= 1, got {n!r}")
    return n


def log_progress_weight(n: int, kind: str = "linear") -> float:
    """log s(n); used internally so that exponential weights never overflow."""
    _check_weighting(kind)
    n = _check_progress(n)
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
    _check_weighting(kind)
    n = _check_progress(n)
    if kind == "linear":
        return float(n)
    if kind == "polynomial":
        return float(n) ** POLYNOMIAL_POWER
    try:
        return math.exp(EXPONENTIAL_RATE * n)
    except OverflowError:
        return math.inf


def _block_bounds(dim: int, max_blocks: int = 8, min_block: int = 256) -> list[int]:
    """Row-block boundaries for the triangular products below (one block for small D)."""
    p = min(max_blocks, max(1, dim // min_block))
    return [round(dim * i / p) for i in range(p + 1)]


def _syrk_lower_(G: torch.Tensor, Kt: torch.Tensor, beta: float, bounds: list[int], alpha: float = 1.0) -> None:
    """G <- beta*G + alpha * Kt^T Kt on the lower block triangle of G (row blocks ``bounds``).

    Only the blocks on or below the diagonal are written (about half the flops
    of a full product); blocks above the diagonal are left as they were and must
    not be read. With beta == 0, G's old contents are ignored (even NaN).
    """
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        G[r0:r1, :r1].addmm_(Kt[:, r0:r1].T, Kt[:, :r1], beta=beta, alpha=alpha)


def _trmm_lower(mean: torch.Tensor, e: torch.Tensor, slabs: list[torch.Tensor], alpha: float,
                bounds: list[int]) -> torch.Tensor:
    """mean + alpha * e @ L^T for lower-triangular L stored as row slabs (see :func:`_to_slabs`)."""
    out = torch.empty((e.shape[0], bounds[-1]), dtype=slabs[0].dtype)
    for (r0, r1), slab in zip(zip(bounds[:-1], bounds[1:]), slabs):
        torch.addmm(mean[r0:r1], e[:, :r1], slab.T, alpha=alpha, out=out[:, r0:r1])
    return out


def _to_slabs(L: torch.Tensor, bounds: list[int], dtype: torch.dtype) -> list[torch.Tensor]:
    """Lower-triangular L [D, D] as row slabs ``L[r0:r1, :r1]`` (copies in ``dtype``).

    The slabs skip the zero blocks above the diagonal: with p row blocks they
    hold (p+1)/(2p) of D*D values (9/16 for the 8 blocks of large D).
    """
    return [L[r0:r1, :r1].to(dtype, copy=True) for r0, r1 in zip(bounds[:-1], bounds[1:])]


def _from_slabs(slabs: list[torch.Tensor], bounds: list[int], dtype: torch.dtype) -> torch.Tensor:
    """The dense lower-triangular [D, D] matrix (zeros above the diagonal blocks) of row slabs."""
    D = bounds[-1]
    L = torch.zeros((D, D), dtype=dtype)
    for (r0, r1), slab in zip(zip(bounds[:-1], bounds[1:]), slabs):
        L[r0:r1, :r1] = slab
    return L


def _sym_from_lower(G: torch.Tensor) -> torch.Tensor:
    return torch.tril(G) + torch.tril(G, -1).T


class _LabelState:
    """Statistics of one label. See the module docstring for the representation."""

    __slots__ = ("count", "logw", "mean", "var", "L", "L_full", "c", "K", "sc", "j")

    def __init__(self) -> None:
        self.count = 0  # activations seen
        self.logw = -math.inf  # log of the total weight S
        self.mean: torch.Tensor | None = None  # [D] float64
        self.var: torch.Tensor | None = None  # [D] float64 (diagonal mode)
        # chol(G + r I), G = Sigma at the last compression, in factor_dtype: the
        # row slabs L[r0:r1, :r1] of the lower triangle, or [L] (a full [D, D]
        # factor) after the eigh fallback. G itself is not kept.
        self.L: list[torch.Tensor] | None = None
        self.L_full = False  # L is a full (eigh fallback) rather than triangular factor
        self.c = 0.0  # weight of the compressed part
        self.K: torch.Tensor | None = None  # [cap, D] pending columns, as rows (factor_dtype)
        self.sc: torch.Tensor | None = None  # [cap] per-column scale (float64)
        self.j = 0  # number of pending columns in use


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
        _check_weighting(weighting)
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
        self._bounds = _block_bounds(dim)
        self._max_rows = 0  # the most columns one flush has added to a label
        self.num_updates = 0  # the progress n of the last update
        self.num_compressions = 0
        self._states = [_LabelState() for _ in range(num_classes)]

    # ------------------------------------------------------------------ state
    @property
    def diagonal(self) -> bool:
        """Whether only per-dimension variances are kept."""
        return self.covariance_kind == "diagonal"

    def _state(self, label: int) -> _LabelState:
        label = int(label)
        if not 0 <= label < self.num_classes:
            raise ValueError(f"label {label} out of range [0, {self.num_classes})")
        return self._states[label]

    def _stats(self, label: int) -> _LabelState:
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
        self, activations: torch.Tensor, labels: torch.Tensor, *, progress: int | None = None
    ) -> None:
        """Fold one buffer flush into the statistics (eqs. 11-12).

        ``activations``: float [N, D] or [N, ...] (flattened to D); ``labels``:
        integer [N]. The update counter n becomes ``progress`` if given (the
        paper's per-activation progress, when the caller tracks it), else
        n + 1; every activation of this flush gets the weight s(n).
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
        n = self.num_updates + 1 if progress is None else _check_progress(progress)
        self.num_updates = n
        if labels.numel() == 0:
            return
        log_s = log_progress_weight(n, self.weighting)
        # One stable sort groups the flush by label (ascending).
        order = torch.argsort(labels, stable=True)
        x = x.to("cpu")[order].to(_DTYPE)
        counts = torch.bincount(labels, minlength=self.num_classes).tolist()
        start = 0
        for y, k in enumerate(counts):
            if k:
                self._fold(self._states[y], x[start : start + k], log_s)
                start += k

    def _fold(self, st: _LabelState, xb: torch.Tensor, log_s: float) -> None:
        k = xb.shape[0]
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
            var_b = dev.square().mean(dim=0)
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
                    self._append(st, dev, math.sqrt(b / k))
                self._append(st, delta.unsqueeze(0), math.sqrt(a * b))
            elif k > 1:
                self._append(st, dev, math.sqrt(1.0 / k))
            # before the first compression K may grow to D columns (K K^T
            # then has full rank anyway); this keeps runs that never get
            # there bit-identical to the earlier two-copy storage.
            limit = self.dim if st.L is None else self.max_pending
            if st.j > limit:
                self._compress(st)
        st.count += k
        st.logw = logw

    def _append(self, st: _LabelState, rows: torch.Tensor, scale: float) -> None:
        m = rows.shape[0]
        need = st.j + m
        self._max_rows = max(self._max_rows, m)
        if st.K is None or need > st.K.shape[0]:
            old = 0 if st.K is None else st.K.shape[0]
            # grow geometrically, but not far past what a compression lets accumulate
            limit = self.dim if st.L is None else self.max_pending
            cap = max(need, min(max(2 * old, 64), limit + 2 * self._max_rows))
            K = torch.empty((cap, self.dim), dtype=self.factor_dtype)
            sc = torch.empty(cap, dtype=_DTYPE)
            if st.j:
                K[: st.j] = st.K[: st.j]
                sc[: st.j] = st.sc[: st.j]
            st.K, st.sc = K, sc
        st.K[st.j : need] = rows
        st.sc[st.j : need] = scale
        st.j = need

    def _pending(self, st: _LabelState) -> torch.Tensor:
        """K^T with its scales applied: [j, D] float64 (a new tensor)."""
        return st.K[: st.j].to(_DTYPE) * st.sc[: st.j, None]

    def _factor(self, st: _LabelState) -> torch.Tensor:
        """The factor L as a dense [D, D] float64 tensor (a new tensor)."""
        if st.L_full:
            return st.L[0].to(_DTYPE, copy=True)
        return _from_slabs(st.L, self._bounds, _DTYPE)

    def _compress(self, st: _LabelState) -> None:
        """Fold the pending columns into the factor and refactor: exact, amortised.

        With G the covariance at the last compression, L L^T = G + r I, so
        G' + r I = c L L^T + K K^T + (1 - c) r I for the new G' = c G + K K^T:
        formed in float64 (lower block triangle), factorised, and stored again
        in ``factor_dtype``. Neither G nor a float64 L outlives the call.
        """
        D = self.dim
        r = self.regulariser
        M = torch.empty((D, D), dtype=_DTYPE)
        if st.L is None:
            Ks = self._pending(st)
            _syrk_lower_(M, Ks, 0.0, self._bounds)
            M.diagonal().add_(r)
        else:
            Lf = self._factor(st)
            if st.L_full:
                _syrk_lower_(M, Lf.T, 0.0, self._bounds, alpha=st.c)
            else:  # c L L^T by row blocks; L[r0:r1, m] = 0 for m >= r1
                for r0, r1 in zip(self._bounds[:-1], self._bounds[1:]):
                    torch.mm(Lf[r0:r1, :r1], Lf[:r1, :r1].T, out=M[r0:r1, :r1])
                    M[r0:r1, :r1].mul_(st.c)
            del Lf
            Ks = self._pending(st)
            _syrk_lower_(M, Ks, 1.0, self._bounds)
            M.diagonal().add_((1.0 - st.c) * r)
        del Ks
        st.L = None  # free the old factor before the new one is allocated
        L, info = torch.linalg.cholesky_ex(M)  # LAPACK potrf: reads the lower triangle only
        if int(info) != 0:  # numerically indefinite: exact-up-to-rounding fallback
            del L
            M.diagonal().sub_(r)
            evals, evecs = torch.linalg.eigh(_sym_from_lower(M))
            del M
            st.L = [(evecs * torch.sqrt(evals.clamp_min(0.0) + r)).to(self.factor_dtype)]  # full
            st.L_full = True
        else:
            del M
            st.L = _to_slabs(L, self._bounds, self.factor_dtype)
            st.L_full = False
        st.c = 1.0
        st.j = 0
        # The pending buffer is empty now; after the first compression (which
        # may need up to D columns) shrink it to what max_pending needs.
        target = self.max_pending + 2 * self._max_rows
        if st.K.shape[0] > 1.5 * target:
            st.K = st.sc = None
        self.num_compressions += 1

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
            Lf = self._factor(st)
            S = (Lf @ Lf.T).mul_(st.c)
            del Lf
            S.diagonal().sub_(st.c * self.regulariser)
        else:
            S = torch.zeros((self.dim, self.dim), dtype=_DTYPE)
        if st.j:
            Ks = self._pending(st)
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
            parts.append(self._factor(st).mul_(math.sqrt(st.c)))
        if st.j:
            parts.append(self._pending(st).T)
        F = torch.cat(parts, dim=1) if parts else torch.zeros((self.dim, 0), dtype=_DTYPE)
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
            eps = torch.randn((n, D), generator=generator, dtype=_DTYPE)
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
                out = _trmm_lower(mean, eps[:, :D], st.L, math.sqrt(st.c), self._bounds)
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
