"""Factored full-covariance storage and kernels behind GAS's per-label Gaussians.

:class:`strategies.algorithms.gas.generation.LabelGaussians` keeps, per label y, the weighted
mean mu_y and population covariance Sigma_y of GAS eqs. 11-12 (GAS paper,
section "Generative Activation-Aided Updates") and samples from
N(mu_y, Sigma_y + r*I). This module holds how one label's full covariance is
stored (:class:`LabelState`: an exact factored form), grown by low-rank
columns, folded into a Cholesky factor (:func:`compress`) and read back
(:func:`dense_factor`, :func:`scaled_pending`), and the blocked triangular
kernels that do it (:func:`block_bounds`, :func:`syrk_lower_`,
:func:`trmm_lower`, :func:`to_slabs`, :func:`from_slabs`).

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
  covariance is low rank, namely (from the flush-merge formula in
  strategies/algorithms/gas/generation.py's docstring, W_o, W_b, a, b, w, k as there)
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
touched at all. ``benchmarks/generation.py`` measures it against the
straightforward implementation.

Precision and memory: the mean and all weights are float64. The factor L and
the pending columns K are stored once, in ``factor_dtype`` (float32 by
default): ``LabelGaussians.mean()`` matches eq. 11 to float64 rounding, ``covariance()``
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
``python -m benchmarks.generation --memory`` for measured figures. Everything
lives on the CPU; pass a CPU ``torch.Generator`` for reproducible samples.
"""

from __future__ import annotations

import math

import torch

__all__ = [
    "WORK_DTYPE",
    "block_bounds",
    "syrk_lower_",
    "trmm_lower",
    "to_slabs",
    "from_slabs",
    "sym_from_lower",
    "LabelState",
    "scaled_pending",
    "dense_factor",
    "compress",
]

#: dtype of the means, variances, weights, column scales and compression scratch.
WORK_DTYPE = torch.float64


def block_bounds(dim: int, max_blocks: int = 8, min_block: int = 256) -> list[int]:
    """Row-block boundaries for the triangular products below (one block for small D)."""
    p = min(max_blocks, max(1, dim // min_block))
    return [round(dim * i / p) for i in range(p + 1)]


def syrk_lower_(G: torch.Tensor, Kt: torch.Tensor, beta: float, bounds: list[int], alpha: float = 1.0) -> None:
    """G <- beta*G + alpha * Kt^T Kt on the lower block triangle of G (row blocks ``bounds``).

    Only the blocks on or below the diagonal are written (about half the flops
    of a full product); blocks above the diagonal are left as they were and must
    not be read. With beta == 0, G's old contents are ignored (even NaN).
    """
    for r0, r1 in zip(bounds[:-1], bounds[1:]):
        G[r0:r1, :r1].addmm_(Kt[:, r0:r1].T, Kt[:, :r1], beta=beta, alpha=alpha)


def trmm_lower(mean: torch.Tensor, e: torch.Tensor, slabs: list[torch.Tensor], alpha: float,
                bounds: list[int]) -> torch.Tensor:
    """mean + alpha * e @ L^T for lower-triangular L stored as row slabs (see :func:`to_slabs`)."""
    out = torch.empty((e.shape[0], bounds[-1]), dtype=slabs[0].dtype)
    for (r0, r1), slab in zip(zip(bounds[:-1], bounds[1:]), slabs):
        torch.addmm(mean[r0:r1], e[:, :r1], slab.T, alpha=alpha, out=out[:, r0:r1])
    return out


def to_slabs(L: torch.Tensor, bounds: list[int], dtype: torch.dtype) -> list[torch.Tensor]:
    """Lower-triangular L [D, D] as row slabs ``L[r0:r1, :r1]`` (copies in ``dtype``).

    The slabs skip the zero blocks above the diagonal: with p row blocks they
    hold (p+1)/(2p) of D*D values (9/16 for the 8 blocks of large D).
    """
    return [L[r0:r1, :r1].to(dtype, copy=True) for r0, r1 in zip(bounds[:-1], bounds[1:])]


def from_slabs(slabs: list[torch.Tensor], bounds: list[int], dtype: torch.dtype) -> torch.Tensor:
    """The dense lower-triangular [D, D] matrix (zeros above the diagonal blocks) of row slabs."""
    D = bounds[-1]
    L = torch.zeros((D, D), dtype=dtype)
    for (r0, r1), slab in zip(zip(bounds[:-1], bounds[1:]), slabs):
        L[r0:r1, :r1] = slab
    return L


def sym_from_lower(G: torch.Tensor) -> torch.Tensor:
    """The symmetric [D, D] matrix whose lower triangle is that of G (upper triangle ignored)."""
    return torch.tril(G) + torch.tril(G, -1).T


class LabelState:
    """Statistics of one label: count, log total weight, float64 mean, and either the
    diagonal variances or the factored full covariance described in the module docstring."""

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


def scaled_pending(st: LabelState) -> torch.Tensor:
    """K^T with its scales applied: [j, D] float64 (a new tensor)."""
    return st.K[: st.j].to(WORK_DTYPE) * st.sc[: st.j, None]


def dense_factor(st: LabelState, bounds: list[int]) -> torch.Tensor:
    """The factor L as a dense [D, D] float64 tensor (a new tensor); ``bounds`` are its row slabs."""
    if st.L_full:
        return st.L[0].to(WORK_DTYPE, copy=True)
    return from_slabs(st.L, bounds, WORK_DTYPE)


def compress(st: LabelState, regulariser: float, bounds: list[int], factor_dtype: torch.dtype,
             keep_rows: int) -> None:
    """Fold the pending columns into the factor and refactor: exact, amortised.

    With G the covariance at the last compression, L L^T = G + r I (r =
    ``regulariser``), so G' + r I = c L L^T + K K^T + (1 - c) r I for the new
    G' = c G + K K^T: formed in float64 (lower block triangle of the row blocks
    ``bounds``, D = ``bounds[-1]``), factorised, and stored again in
    ``factor_dtype``. Neither G nor a float64 L outlives the call. Afterwards
    the pending buffer is dropped if it holds more than 1.5 * ``keep_rows``
    rows (``keep_rows``: what max_pending plus two flushes need).
    """
    D = bounds[-1]
    r = regulariser
    M = torch.empty((D, D), dtype=WORK_DTYPE)
    if st.L is None:
        Ks = scaled_pending(st)
        syrk_lower_(M, Ks, 0.0, bounds)
        M.diagonal().add_(r)
    else:
        Lf = dense_factor(st, bounds)
        if st.L_full:
            syrk_lower_(M, Lf.T, 0.0, bounds, alpha=st.c)
        else:  # c L L^T by row blocks; L[r0:r1, m] = 0 for m >= r1
            for r0, r1 in zip(bounds[:-1], bounds[1:]):
                torch.mm(Lf[r0:r1, :r1], Lf[:r1, :r1].T, out=M[r0:r1, :r1])
                M[r0:r1, :r1].mul_(st.c)
        del Lf
        Ks = scaled_pending(st)
        syrk_lower_(M, Ks, 1.0, bounds)
        M.diagonal().add_((1.0 - st.c) * r)
    del Ks
    st.L = None  # free the old factor before the new one is allocated
    L, info = torch.linalg.cholesky_ex(M)  # LAPACK potrf: reads the lower triangle only
    if int(info) != 0:  # numerically indefinite: exact-up-to-rounding fallback
        del L
        M.diagonal().sub_(r)
        evals, evecs = torch.linalg.eigh(sym_from_lower(M))
        del M
        st.L = [(evecs * torch.sqrt(evals.clamp_min(0.0) + r)).to(factor_dtype)]  # full
        st.L_full = True
    else:
        del M
        st.L = to_slabs(L, bounds, factor_dtype)
        st.L_full = False
    st.c = 1.0
    st.j = 0
    # The pending buffer is empty now; after the first compression (which
    # may need up to D columns) shrink it to what max_pending needs.
    if st.K.shape[0] > 1.5 * keep_rows:
        st.K = st.sc = None
