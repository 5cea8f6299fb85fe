"""Benchmark: GAS activation generation per server update (statistics + top-up).

Compares, on one stream of synthetic non-IID buffers, side by side:

(a)  straightforward full covariance, as GAS's reference code does it: keep
     Sigma_y (D x D) per label, merge each flush in by eqs. 11-12, and at every
     flush build ``MultivariateNormal(mu_y, Sigma_y + r I)`` (default argument
     validation, so a Cholesky for the check and one for the factor) for each
     label that needs generated activations, then sample.
(a') a tuned version of (a), for honesty: each label's Cholesky factor is
     cached until its statistics change, and samples are one matmul
     mean + e L^T instead of MultivariateNormal.sample.
(b)  ``LabelGaussians(covariance="full")``: factored, never refactorised per
     flush (see strategies/algorithms/gas/generation.py); same distribution.
(c)  ``LabelGaussians(covariance="diagonal")``.

Time per update = statistics update + sampling the top-up. (b) and (c) are
timed after ``warmup`` updates so the factors have their steady-state size
(every label already compressed at least once), over ``updates`` updates, so
the amortised cost of the compressions is included. (a) and (a') cost the same
at every flush whatever the history (D x D work per label), so they are timed
on a few flushes (``baseline_updates``, ``cached_updates``) once every label has
statistics. The machine may be shared: the load average is printed, and
``--threads 1`` avoids the stalls that two OpenMP threads suffer when another
process holds a core.

Memory (``run_memory``, ``--memory``): resident memory of the full-covariance statistics for 100 labels
at D = 4096, this tree against another revision's ``strategies/algorithms/gas/generation.py``, each in a
fresh subprocess.

Run: ``python -m benchmarks.generation`` from the repository's root.
"""

from __future__ import annotations

import math
import os
import sys
import time

import torch

from benchmarks.common import REPO_ROOT
from strategies.algorithms.gas.generation import LabelGaussians, log_progress_weight


# --------------------------------------------------------------------- data
class _Stream:
    """Deterministic non-IID buffers: each flush holds ``labels_per_buffer`` labels."""

    def __init__(self, dim, num_classes, buffer, labels_per_buffer, seed):
        self.dim, self.num_classes, self.buffer = dim, num_classes, buffer
        self.labels_per_buffer, self.seed = labels_per_buffer, seed
        g = torch.Generator().manual_seed(seed)
        # Label prototypes with some shared low-rank structure, like conv features.
        self.protos = torch.randn(num_classes, dim, generator=g) * 0.5
        self.mix = torch.randn(num_classes, 16, dim, generator=g) * 0.3

    def flush(self, i):
        """The i-th buffer (i >= 0): (activations float32 [buffer, dim], labels int64)."""
        g = torch.Generator().manual_seed(self.seed * 1_000_003 + i + 1)
        if i == 0:  # the first flush sees every label so that generation can start
            labels = torch.arange(self.buffer) % self.num_classes
        else:
            chosen = torch.randperm(self.num_classes, generator=g)[: self.labels_per_buffer]
            labels = chosen[torch.randint(0, len(chosen), (self.buffer,), generator=g)]
        z = torch.randn(self.buffer, 16, generator=g)
        x = self.protos[labels] + torch.einsum("nk,nkd->nd", z, self.mix[labels])
        x = torch.relu(x + torch.randn(self.buffer, self.dim, generator=g))
        return x, labels.to(torch.int64)


# ----------------------------------------------------------------- baseline
class _Straightforward:
    """Sigma_y kept explicitly; MultivariateNormal rebuilt at every flush."""

    def __init__(self, num_classes, dim, regulariser=1e-5, weighting="linear", cache=False):
        self.C, self.D, self.r, self.weighting, self.cache = num_classes, dim, regulariser, weighting, cache
        self.n = 0
        self.logw = [-math.inf] * num_classes
        self.mean = [None] * num_classes
        self.cov = [None] * num_classes
        self.tril = [None] * num_classes  # cached factor (cache=True)

    def update(self, x, labels):
        self.n += 1
        log_s = log_progress_weight(self.n, self.weighting)
        x = x.reshape(x.shape[0], self.D).to(torch.float64)
        for y in torch.unique(labels).tolist():
            xb = x[labels == y]
            k = xb.shape[0]
            mu_b = xb.mean(0)
            dev = xb - mu_b
            cov_b = dev.T @ dev / k
            log_wb = log_s + math.log(k)
            if self.mean[y] is None:
                self.mean[y], self.cov[y], self.logw[y] = mu_b, cov_b, log_wb
            else:
                hi, lo = max(self.logw[y], log_wb), min(self.logw[y], log_wb)
                logw = hi + math.log1p(math.exp(lo - hi))
                a = math.exp(self.logw[y] - logw)
                b = 1.0 - a
                delta = self.mean[y] - mu_b
                self.mean[y] = a * self.mean[y] + b * mu_b
                cov = self.cov[y].mul_(a).add_(cov_b, alpha=b)
                cov.addr_(delta, delta, alpha=a * b)
                self.logw[y] = logw
            self.tril[y] = None

    def generate(self, labels_present, per_label, generator):
        counts = torch.bincount(labels_present, minlength=self.C).tolist()
        acts, labs = [], []
        eye = torch.eye(self.D, dtype=torch.float64)
        for y in range(self.C):
            need = per_label - counts[y]
            if need <= 0:
                continue
            if self.cache:  # tuned: cached factor, one matmul, no MultivariateNormal
                if self.tril[y] is None:
                    self.tril[y] = torch.linalg.cholesky(self.cov[y] + self.r * eye)
                eps = torch.randn((need, self.D), generator=generator, dtype=torch.float64)
                acts.append(torch.addmm(self.mean[y], eps, self.tril[y].T).to(torch.float32))
                labs.append(torch.full((need,), y, dtype=torch.int64))
                continue
            else:
                mvn = torch.distributions.MultivariateNormal(
                    self.mean[y], covariance_matrix=self.cov[y] + self.r * eye
                )
            # torch's sampler draws from the global RNG; seed it from `generator`
            # so the baseline is reproducible too (cost negligible).
            torch.manual_seed(int(torch.randint(0, 2**62, (1,), generator=generator)))
            acts.append(mvn.sample((need,)).to(torch.float32))
            labs.append(torch.full((need,), y, dtype=torch.int64))
        if not acts:
            return torch.empty(0, self.D), torch.empty(0, dtype=torch.int64)
        return torch.cat(acts), torch.cat(labs)


# --------------------------------------------------------------- reference
def _server_step_time(batch, num_classes, repeats=3):
    """One SGD step of GAS's AlexNet server part (conv128, conv256, conv256,
    pool(3,2)-relu, fc1024, fc512, fc) on a [batch, 64, 7, 7] input."""
    nn = torch.nn
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(64, 128, 3, padding=1), nn.ReLU(),
        nn.Conv2d(128, 256, 3, padding=1), nn.ReLU(),
        nn.Conv2d(256, 256, 3, padding=1), nn.MaxPool2d(3, 2), nn.ReLU(),
        nn.Flatten(), nn.Linear(256 * 3 * 3, 1024), nn.ReLU(),
        nn.Linear(1024, 512), nn.ReLU(), nn.Linear(512, num_classes),
    )
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-4)
    x = torch.randn(batch, 64, 7, 7)
    y = torch.randint(0, num_classes, (batch,))
    best = math.inf
    for i in range(repeats + 1):
        t0 = time.perf_counter()
        opt.zero_grad()
        torch.nn.functional.cross_entropy(model(x), y).backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 10.0)
        opt.step()
        if i:
            best = min(best, time.perf_counter() - t0)
    return best


# --------------------------------------------------------------------- run
def _loadavg():
    try:
        return os.getloadavg()[0]
    except OSError:  # not available on this platform
        return float("nan")


def _time_ours(stream, covariance, warmup, updates, per_label, seed, on_update=None):
    """Warm up (statistics only), then time update + top-up over ``updates`` flushes."""
    lg = LabelGaussians(stream.num_classes, stream.dim, covariance=covariance)
    gen = torch.Generator().manual_seed(seed)
    for i in range(warmup):
        x, y = stream.flush(i)
        lg.update(x, y)
        if on_update is not None:
            on_update(i, x, y, lg)
    compressions0 = lg.num_compressions
    total, n_gen = 0.0, 0
    for i in range(warmup, warmup + updates):
        x, y = stream.flush(i)
        t0 = time.perf_counter()
        lg.update(x, y)
        ga, _ = lg.generate(y, per_label, gen)
        total += time.perf_counter() - t0
        n_gen += ga.shape[0]
        if on_update is not None:
            on_update(i, x, y, lg)
    widths = []
    if covariance == "full":
        widths = [(stream.dim if lg._states[c].L is not None else 0) + lg.pending_columns(c)
                  for c in range(stream.num_classes)]
    return {
        "per_update_s": total / updates,
        "generated_per_update": n_gen / updates,
        "compressions_in_window": lg.num_compressions - compressions0,
        "factor_widths_end": widths,
        "lg": lg,
    }


def _time_baseline(stream, cache, baseline_updates, per_label, seed):
    base = _Straightforward(stream.num_classes, stream.dim, cache=cache)
    gen = torch.Generator().manual_seed(seed)
    total = 0.0
    i = 0
    timed = 0
    while timed < baseline_updates:
        x, y = stream.flush(i)
        ready = all(m is not None for m in base.mean)
        t0 = time.perf_counter()
        base.update(x, y)
        if all(m is not None for m in base.mean):
            base.generate(y, per_label, gen)
        dt = time.perf_counter() - t0
        if ready:  # every label already had statistics: a steady-state flush
            total += dt
            timed += 1
        i += 1
    return total / baseline_updates, base, i


def run(
    dim=3136,
    num_classes=10,
    buffer=320,
    per_label=32,
    updates=50,
    seed=0,
    *,
    warmup=150,
    baseline_updates=2,
    cached_updates=2,
    labels_per_buffer=4,
    server_step=True,
    threads=None,
) -> dict:
    """Time one server update's generation work for (a), (a'), (b), (c).

    Returns seconds per update for each, the ratios, and a check that (b)'s
    distribution equals the straightforward one on the same data. ``threads``
    sets torch's intra-op threads for the run (default: leave as is).
    """
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _run(dim, num_classes, buffer, per_label, updates, seed, warmup,
                    baseline_updates, cached_updates, labels_per_buffer, server_step)
    finally:
        torch.set_num_threads(old_threads)


def _run(dim, num_classes, buffer, per_label, updates, seed, warmup, baseline_updates,
         cached_updates, labels_per_buffer, server_step):
    stream = _Stream(dim, num_classes, buffer, labels_per_buffer, seed)
    res = {"dim": dim, "num_classes": num_classes, "buffer": buffer, "per_label": per_label,
           "labels_per_buffer": labels_per_buffer, "warmup": warmup, "updates": updates,
           "baseline_updates": baseline_updates, "threads": torch.get_num_threads(),
           "loadavg_start": _loadavg()}

    t_a, base, n_base = _time_baseline(stream, False, baseline_updates, per_label, seed)
    res["straightforward_s"] = t_a

    # Same data, same eqs.: (b)'s sampled mean/covariance must equal (a)'s Sigma + rI,
    # for every label after (a)'s flushes, and for label 0 at the end, after
    # many compressions (tracked by a statistics-only copy of (a)).
    eye = torch.eye(dim, dtype=torch.float64)
    ref0 = _Straightforward(num_classes, dim)
    diffs = {"mean": 0.0, "cov": 0.0}

    def compare(lg, ref, labels):
        for c in labels:
            diffs["mean"] = max(diffs["mean"], float((lg.mean(c) - ref.mean[c]).abs().max()))
            target = ref.cov[c] + 1e-5 * eye
            rel = float((lg.covariance(c) - target).abs().max() / target.abs().max())
            diffs["cov"] = max(diffs["cov"], rel)

    def on_update(i, x, y, lg):
        keep = y == 0
        ref0.update(x[keep], y[keep])
        if i + 1 == n_base:
            compare(lg, base, range(num_classes))

    ours = _time_ours(stream, "full", warmup, updates, per_label, seed, on_update=on_update)
    del base
    compare(ours["lg"], ref0, [0])
    res["label0_compressed"] = ours["lg"]._states[0].L is not None
    del ours["lg"], ref0
    res["max_abs_mean_diff_vs_a"] = diffs["mean"]
    res["max_rel_cov_diff_vs_a"] = diffs["cov"]
    res["ours_full_s"] = ours["per_update_s"]
    res["generated_per_update"] = ours["generated_per_update"]
    res["compressions_in_window"] = ours["compressions_in_window"]
    res["factor_widths_end"] = ours["factor_widths_end"]

    diag = _time_ours(stream, "diagonal", warmup, updates, per_label, seed)
    res["ours_diagonal_s"] = diag["per_update_s"]
    del diag

    t_cached, base, _ = _time_baseline(stream, True, cached_updates, per_label, seed)
    del base
    res["cached_cholesky_s"] = t_cached

    if server_step:
        res["server_step_s"] = _server_step_time(buffer + int(round(res["generated_per_update"])),
                                                 num_classes)
    res["loadavg_end"] = _loadavg()
    res["ratio_a_over_b"] = t_a / res["ours_full_s"]
    res["ratio_cached_over_b"] = t_cached / res["ours_full_s"]
    return res


# ------------------------------------------------------------------- memory
_MEMORY_CHILD = r"""
import importlib.util, json, sys, time
import torch
src, labels, dim, per_label, flush = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4]), int(sys.argv[5])
if src == "-":
    from strategies.algorithms.gas.generation import LabelGaussians
else:  # another revision's generation.py
    spec = importlib.util.spec_from_file_location("generation_other", src)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    LabelGaussians = mod.LabelGaussians
def rss_mb(key="VmRSS:"):  # VmHWM: this image's peak (ru_maxrss can carry the parent's over exec)
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(key):
                return int(line.split()[1]) / 1024
lg = LabelGaussians(labels, dim)
g = torch.Generator().manual_seed(0)
x = torch.empty(flush, dim)
base = rss_mb()
t0 = time.perf_counter()
seen = 0
i = 0
while seen < per_label * labels:
    y = (torch.arange(flush) + i * flush) % labels
    torch.randn(flush, dim, generator=g, out=x).relu_()
    lg.update(x, y)
    seen += flush
    i += 1
end = rss_mb()
held = lg.memory_bytes() / 2**20 if hasattr(lg, "memory_bytes") else None
print(json.dumps({"rss_baseline_mb": base, "rss_end_mb": end,
                  "peak_rss_mb": rss_mb("VmHWM:"),
                  "held_mb": held, "compressions": lg.num_compressions, "flushes": i,
                  "seconds": time.perf_counter() - t0}))
"""


def _memory_child(src: str, labels: int, dim: int, per_label: int, flush: int) -> dict:
    import json
    import subprocess

    root = str(REPO_ROOT)
    env = dict(os.environ, PYTHONPATH=root)
    proc = subprocess.run([sys.executable, "-c", _MEMORY_CHILD, src, str(labels), str(dim), str(per_label),
                           str(flush)], cwd=root, env=env, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["killed (out of memory?)"])[-1]
        return {"error": f"exit {proc.returncode}: {tail}"}
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    out["growth_mb"] = out["rss_end_mb"] - out["rss_baseline_mb"]
    out["peak_growth_mb"] = out["peak_rss_mb"] - out["rss_baseline_mb"]
    return out


def _old_source(rev: str | None, dest_dir: str) -> str | None:
    """GAS's ``generation.py`` of git revision ``rev`` (``strategies/algorithms/gas/`` now,
    ``strategies/`` in older revisions), written under ``dest_dir`` (None if unavailable)."""
    import subprocess

    if not rev:
        return None
    root = str(REPO_ROOT)
    for where in ("strategies/algorithms/gas/generation.py", "strategies/generation.py"):  # now, before the layout
        proc = subprocess.run(["git", "-C", root, "show", f"{rev}:{where}"], capture_output=True, text=True,
                              check=False)
        if proc.returncode == 0:
            break
    else:
        return None
    path = os.path.join(dest_dir, "generation_old.py")
    with open(path, "w") as fh:
        fh.write(proc.stdout)
    return path


def run_memory(dim=4096, labels=100, seen_per_label=400, steady_labels=3, flush=320, against="HEAD",
               quick=False) -> dict:
    """Resident memory of the full-covariance statistics, each case in a fresh subprocess.

    RSS, not tracemalloc (torch's allocations bypass it), measured after the
    imports and the flush buffer, so the growth is the statistics' own.
    Two cases, for the working tree ("new") and for ``against``'s
    ``strategies/algorithms/gas/generation.py`` ("old", skipped when not a git checkout):

    * ``labels`` labels at D = ``dim`` after ``seen_per_label`` activations
      each, in flushes of ``flush`` (no label compressed yet: with CIFAR-100
      at C=10, E=20, B=32 a label sees about 64 activations per global
      iteration);
    * ``steady_labels`` labels after enough activations (about D + D/2 each,
      in flushes of 32 per label) that every label holds a compressed factor
      and a refilled pending buffer, about the most a label ever holds;
      ``projected_100_labels_mb`` = 100 times the per-label growth plus the
      transient peak of a compression.
    """
    import tempfile

    if quick:
        seen_per_label, steady_labels, labels = 100, 1, min(labels, 20)
    res: dict = {"dim": dim, "labels": labels, "seen_per_label": seen_per_label,
                 "steady_labels": steady_labels, "flush": flush}
    with tempfile.TemporaryDirectory(prefix="sflower-genmem-") as tmp:
        sides = [("new", "-")]
        old = _old_source(against, tmp)
        if old is not None:
            sides.insert(0, ("old", old))
        for side, src in sides:
            early = _memory_child(src, labels, dim, seen_per_label, flush)
            # ~D + 1 columns trigger the first compression, the rest refill the
            # pending buffer to just under max_pending = D/2 (one column per
            # activation plus one per flush that holds the label)
            steady = _memory_child(src, steady_labels, dim, dim + dim // 2 - dim // 16, 32 * steady_labels)
            if "error" not in steady:
                per_label = steady["growth_mb"] / steady_labels
                steady["per_label_mb"] = per_label
                steady["projected_100_labels_mb"] = 100 * per_label + max(0.0, steady["peak_growth_mb"]
                                                                          - steady["growth_mb"])
            res[side] = {"early": early, "steady": steady}
    return res


def bench_generation_cost(quick: bool = False, against: str | None = None) -> dict:
    """Straightforward vs. incremental-factor sampling of generated activations (per server update),
    and the resident memory of the statistics for 100 labels at D=4096, ``against`` (default
    ``HEAD``) vs. the working tree (see :func:`run_memory`)."""
    kwargs = {"updates": 6, "warmup": 20, "baseline_updates": 1} if quick else {}
    out = run(**kwargs)
    out["memory"] = run_memory(against=against or "HEAD", quick=quick)
    return out


def _main(argv=None):
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    ap.add_argument("--updates", type=int, default=50)
    ap.add_argument("--warmup", type=int, default=150)
    ap.add_argument("--dim", type=int, default=3136)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--memory", action="store_true",
                    help="only the memory benchmark: 100 labels at D=4096, old (HEAD) vs new")
    args = ap.parse_args(argv)
    if args.memory:
        import json

        print(json.dumps(run_memory(), indent=2))
        return
    t0 = time.perf_counter()
    r = run(dim=args.dim, updates=args.updates, warmup=args.warmup, seed=args.seed,
            threads=args.threads)
    print(f"GAS generation per server update: D={r['dim']}, {r['num_classes']} labels, "
          f"buffer {r['buffer']} with {r['labels_per_buffer']} labels, top-up to "
          f"{r['per_label']}/label (~{r['generated_per_update']:.0f} generated), "
          f"{r['threads']} threads, load average {r['loadavg_start']:.1f} -> "
          f"{r['loadavg_end']:.1f}")
    rows = [
        ("(a)  straightforward full: MVN rebuilt per flush", r["straightforward_s"]),
        ("(a') tuned: cached Cholesky, matmul sampling", r["cached_cholesky_s"]),
        ("(b)  ours full (factored, amortised compressions)", r["ours_full_s"]),
        ("(c)  ours diagonal", r["ours_diagonal_s"]),
    ]
    if "server_step_s" in r:
        rows.append(("     ref: one AlexNet server SGD step (batch %d)"
                     % (r["buffer"] + round(r["generated_per_update"])), r["server_step_s"]))
    print(f"  {'per server update':<52s} {'time':>10s}")
    for name, t in rows:
        print(f"  {name:<52s} {t * 1e3:7.1f} ms")
    print(f"  ratio (a)/(b)  = {r['ratio_a_over_b']:.1f}x")
    print(f"  ratio (a')/(b) = {r['ratio_cached_over_b']:.1f}x")
    print(f"  (b) timed over {r['updates']} updates after {r['warmup']} warm-up updates, "
          f"{r['compressions_in_window']} compressions in the window; factor widths at end "
          f"{min(r['factor_widths_end'])}..{max(r['factor_widths_end'])} (D + pending)")
    print(f"  (b) vs (a) on the same data: max |mean diff| = {r['max_abs_mean_diff_vs_a']:.1e}, "
          f"max rel. covariance diff = {r['max_rel_cov_diff_vs_a']:.1e}")
    print(f"  total bench time {time.perf_counter() - t0:.0f} s")


if __name__ == "__main__":
    _main()
