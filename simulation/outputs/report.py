"""``sflower report DIR``: the tables (means with 95 % intervals, paired verdicts) and plots of a sweep.

Writes into DIR:

* ``report.md``: one row per configuration (the sweep's grid keys except
  ``seed``) with final and best accuracy as the mean over seeds ± the
  half-width of its 95 % confidence interval (Student t, :mod:`simulation.stats`),
  time to the target accuracy, and the paper's number when the sweep file
  gives one. A run that diverged is counted in ``seeds`` as diverged
  (``"3 (1 diverged)"``) and left out of the final accuracy, which it never
  reached; its best accuracy counts. Then one row per ranked pair: the
  paired difference of final accuracy over the seeds both completed, its
  interval, the paired tests and the verdict, beside the paper's order
  (:func:`pairs_table`);
* ``curves.png``: mean test accuracy against global iteration and against
  virtual time, all configurations on shared axes;
* ``profiles.png``: the device profiles (compute speed against uplink rate);
* for attacked sweeps (``[meta] attack``), the inversion's PSNR and SSIM
  columns, ``privacy.png`` and ``cut-layer.png``
  (:mod:`simulation.outputs.privacy_report`).

A directory that holds only ``results.csv`` (and ``sweep.json``), as the
published results under ``docs/results/`` do, gets its report.md from them:
the tables are rebuilt, the plots already there are linked, none is drawn.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from fl_app.run.config import given_or_default
from fl_app.run.errors import ConfigError
from fl_app.run.untrusted import read_json_table
from simulation.outputs.privacy_report import (attacked, plot_cut_layer, plot_label_leakage, plot_privacy,
                                               privacy_columns)
from simulation.stats import Paired, mean_ci, paired
from simulation.outputs.results import collect, expand, run_name


def _sweep_meta(out: Path) -> tuple[list[str], dict[str, Any], list[str]]:
    """(grid keys except seed, meta table, run names in sweep order) of a sweep directory."""
    path = out / "sweep.json"
    if path.exists():
        spec = read_json_table(path)  # a sweep directory is untrusted input: bounded, checked
        if not all(isinstance(spec.get(k, {}), dict) for k in ("grid", "meta", "base", "variants")) or \
                not all(isinstance(v, list) for v in spec.get("grid", {}).values()):
            raise ConfigError(f"{path}: not a sweep description (grid, meta, base and variants must be tables)")
        keys = list(spec.get("grid", {}))
        try:
            order = [run_name(r, keys) for r in expand(spec)]
        except (KeyError, TypeError, ValueError) as err:
            raise ConfigError(f"{path}: not a sweep description ({type(err).__name__})") from None
        return [k for k in keys if k != "seed"], spec.get("meta", {}), order
    return ["strategy"], {}, []


def _fmt(values: pd.Series, scale: float = 100.0) -> str:
    """``mean ± half-width of the 95 % interval`` of ``values`` in percent (``mean`` alone for one value)."""
    mean, half = mean_ci(values.astype(float).tolist())
    if math.isnan(mean):
        return "–"
    if math.isnan(half):
        return f"{scale * mean:.2f}"
    return f"{scale * mean:.2f} ± {scale * half:.2f}"


def markdown_table(frame: pd.DataFrame) -> str:
    """A GitHub-markdown table of a DataFrame (all cells as strings), by ``DataFrame.to_markdown``."""
    return frame.astype(str).to_markdown(index=False, tablefmt="github", disable_numparse=True)


#: The accuracy columns of :func:`summarize`.
FINAL, BEST = "final acc. (%, 95% CI)", "best acc. (%, 95% CI)"


def _diverged(group: pd.DataFrame) -> pd.Series:
    """Which runs of ``group`` diverged (``status`` starts with ``diverged``)."""
    return group.get("status", pd.Series("", index=group.index)).astype(str).str.startswith("diverged")


def _label(keys: list[str], values: tuple) -> str:
    """A configuration's name in the tables: its grid values joined by ``/`` in grid order (``v2/contiguous``)."""
    return "/".join(str(v) for v in values)


def _compared_key(keys: list[str]) -> str:
    """The grid key whose values a table ranks: ``variant``, else ``strategy``, else the first grid key."""
    return next((k for k in ("variant", "strategy") if k in keys), keys[0])


def _context(keys: list[str], values: tuple) -> str:
    """What a configuration shares with those it is ranked against: its grid values but the compared one."""
    compared = _compared_key(keys)
    return "/".join(str(v) for k, v in zip(keys, values) if k != compared)


def summarize(table: pd.DataFrame, keys: list[str], paper: dict[str, Any] | None = None,
              show_bytes: bool = False) -> pd.DataFrame:
    """Mean ± 95 % interval over seeds of each configuration (accuracies in %); time and global
    iterations to the target accuracy averaged over the seeds that reached it; with ``show_bytes``
    (the sweep's ``[meta] show-bytes``), the mean MB sent up and down (``bytes_up``/``bytes_down``, 10^6 bytes).

    A run whose ``status`` starts with ``diverged`` stopped before its last global
    iteration: ``seeds`` says how many did (``"3 (1 diverged)"``), the final
    accuracy is over the other runs (``–`` when none is left), and the best
    accuracy over all of them.
    """
    keys = [k for k in keys if k in table.columns] or ["strategy"]
    out = []
    for values, group in table.groupby(keys, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        row = dict(zip(keys, values))
        diverged = _diverged(group)
        row["seeds"] = f"{len(group)} ({int(diverged.sum())} diverged)" if diverged.any() else len(group)
        row[FINAL] = _fmt(group.loc[~diverged, "final_accuracy"])
        row[BEST] = _fmt(group["best_accuracy"])
        tt, it = group["time_to_target_s"], group["iterations_to_target"]
        reached = f" ({int(tt.notna().sum())}/{len(group)} seeds)" if tt.notna().sum() < len(group) else ""
        row["time to target (virtual s)"] = "–" if tt.isna().all() else f"{tt.mean():.1f}{reached}"
        row["global iterations to target"] = "–" if it.isna().all() else f"{it.mean():.1f}{reached}"
        if show_bytes:
            row["MB up"] = f"{group['bytes_up'].mean() / 1e6:.1f}"
            row["MB down"] = f"{group['bytes_down'].mean() / 1e6:.1f}"
        if attacked(table):
            row.update(privacy_columns(group))
        if paper:
            key = _paper_key(paper, keys, values)
            row["paper (%)"] = paper[key] if key else "–"
        out.append(row)
    return pd.DataFrame(out)


def _paper_key(paper: dict[str, Any], keys: list[str], values: tuple) -> str | None:
    """The key of ``[meta.paper]`` that names this configuration: its grid values joined by ``/`` in any
    order (``v2/contiguous``), or its variant or strategy alone."""
    row = dict(zip(keys, values))
    parts = sorted(str(v) for v in values)
    single = str(row.get("variant", row.get("strategy")) or "")
    return next((k for k in paper if sorted(k.split("/")) == parts), None) or (single if single in paper else None)


def _paper_value(paper: dict[str, Any], key: str | None) -> float | None:
    value = paper.get(key) if key else None
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else None


@dataclass(frozen=True)
class Config:
    """One configuration of a table, as :func:`ranked_pairs` sees it.

    Attributes:
        context: the grid values it shares with those it is ranked against (:func:`_context`).
        value: its value of the compared key (its variant or strategy).
        paper: the paper's figure for it (None: the paper gives none).
    """

    context: str
    value: str
    paper: float | None = None


def ranked_pairs(configs: dict[str, Config], meta: dict[str, Any], key: str = "pairs") -> list[tuple[str, str]]:
    """The pairs a table ranks, by label: within each context (``contiguous``, ``label-sorted``, ...),
    the neighbours in the paper's order (highest first), then the sweep file's ``[meta] pairs``
    (``[["gas", "gas-nogen"]]``: by the compared key's values, or by labels), without repeats.
    ``key="compare"``: only the pairs of ``[meta] compare``, which no paper ranks."""
    pairs: list[tuple[str, str]] = []
    for context in dict.fromkeys(c.context for c in configs.values()):
        here = {lb: c for lb, c in configs.items() if c.context == context}
        if key == "pairs":
            ranked = sorted((lb for lb, c in here.items() if c.paper is not None),
                            key=lambda lb: -here[lb].paper)
            pairs += [(ranked[i], ranked[i + 1]) for i in range(len(ranked) - 1)
                      if here[ranked[i]].paper != here[ranked[i + 1]].paper]
        by_value = {c.value: lb for lb, c in here.items()}
        for a, b in meta.get(key, []) or []:
            la, lb_ = by_value.get(str(a), str(a) if str(a) in here else None), by_value.get(str(b), str(b) if str(b) in here else None)
            if la and lb_ and (la, lb_) not in pairs and (lb_, la) not in pairs:
                pairs.append((la, lb_))
    return pairs


#: The verdict of a ``[meta] compare`` pair: no paper states its order.
NO_CLAIM = "–"


def comparisons(table: pd.DataFrame, keys: list[str], meta: dict[str, Any],
                metric: str = "final_accuracy") -> list[tuple[Paired, str]]:
    """Each ranked pair's paired comparison of ``metric`` over the seeds both completed, with the
    verdict beside the paper's order (``holds``, ``reversed``, ``not distinguishable``, ``not established``).
    A pair of ``[meta] pairs`` whose paper figures are missing is taken as the paper's statement
    "first above second". The pairs of ``[meta] compare`` come last, with the verdict :data:`NO_CLAIM`:
    nobody's order to hold or reverse (sflower's own comparisons, a codec against float32)."""
    keys = [k for k in keys if k in table.columns] or ["strategy"]
    if "seed" not in table.columns:
        return []
    per: dict[str, dict[int, float]] = {}
    configs = _configs(table, keys, meta)
    for values, group in table.groupby(keys, sort=False):
        done = group.loc[~_diverged(group)]
        per[_label(keys, values if isinstance(values, tuple) else (values,))] = dict(
            zip(done["seed"].astype(int), done[metric].astype(float)))
    out = []
    for a, b in ranked_pairs(configs, meta):
        p = paired(a, b, per[a], per[b])
        pa, pb = configs[a].paper, configs[b].paper
        # a pair without the paper's figures is one of [meta] pairs: the paper states "a above b" in words
        out.append((p, p.against(pa, pb) if pa is not None and pb is not None else p.against(1.0, 0.0)))
    done = {(p.a, p.b) for p, _ in out}
    for a, b in ranked_pairs(configs, meta, "compare"):
        if (a, b) not in done and (b, a) not in done:
            out.append((paired(a, b, per[a], per[b]), NO_CLAIM))
    return out


def _configs(table: pd.DataFrame, keys: list[str], meta: dict[str, Any]) -> dict[str, Config]:
    """Every configuration of ``table`` by label, with its context, compared value and paper figure."""
    paper = meta.get("paper", {}) or {}
    compared = _compared_key(keys)
    out = {}
    for values, _ in table.groupby(keys, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        out[_label(keys, values)] = Config(_context(keys, values), str(dict(zip(keys, values))[compared]),
                                           _paper_value(paper, _paper_key(paper, keys, values)))
    return out


def _p(value: float) -> str:
    return "–" if math.isnan(value) else f"{value:.3f}"


def pairs_table(table: pd.DataFrame, keys: list[str], meta: dict[str, Any]) -> pd.DataFrame:
    """One row per ranked pair: the paired difference of final accuracy (points) with its 95 % interval,
    the paired t-test's and (n ≥ 6) Wilcoxon's p-values, our verdict and, beside the paper's
    order, ``holds``, ``reversed`` or ``not distinguishable``."""
    keys = [k for k in keys if k in table.columns] or ["strategy"]
    configs = _configs(table, keys, meta)
    rows = []
    for p, verdict in comparisons(table, keys, meta):
        pa, pb = configs[p.a].paper, configs[p.b].paper
        rows.append({
            "pair (A vs B)": f"{p.a} vs {p.b}", "seeds": p.n,
            "A − B (points)": "–" if math.isnan(p.diff) else f"{100 * p.diff:+.2f}",
            "95% CI": "–" if math.isnan(p.low) else f"[{100 * p.low:+.2f}, {100 * p.high:+.2f}]",
            "t-test p": _p(p.t_p), "Wilcoxon p": _p(p.wilcoxon_p), "ours": p.ours,
            "paper": NO_CLAIM if verdict == NO_CLAIM else f"{p.a} above (stated)" if pa is None or pb is None
            else f"{pa:g} vs {pb:g}",
            "verdict": verdict,
        })
    frame = pd.DataFrame(rows)
    if rows and (frame["verdict"] == NO_CLAIM).all():  # only sflower's own comparisons: no paper to hold to
        frame = frame.drop(columns=["paper", "verdict"])
    return frame


def _mean_curves(out: Path, table: pd.DataFrame, keys: list[str], column: str) -> list[tuple[str, pd.DataFrame]]:
    """Per configuration: ``column`` and virtual time averaged over seeds, by global iteration."""
    keys = [k for k in keys if k in table.columns] or ["strategy"]
    curves = []
    for values, group in table.groupby(keys, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        frames = [pd.read_csv(out / r / "metrics.csv") for r in group["run"]]
        merged = pd.concat(frames)
        if column not in merged.columns:
            continue
        curve = merged.groupby("global_iteration")[[column, "virtual_time_s"]].mean()
        curves.append((", ".join(str(v) for v in values), curve))
    return curves


def plot_curves(out: Path, table: pd.DataFrame, keys: list[str], column: str = "test_accuracy",
                name: str = "curves.png", ylabel: str = "test accuracy (mean over seeds)",
                logy: bool = False) -> Path | None:
    """Mean curves of ``column`` for every configuration, against global iteration and virtual time."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = _mean_curves(out, table, keys, column)
    if not curves:
        return None
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5), sharey=True)
    for i, (label, curve) in enumerate(curves):
        style = ("-", "--", ":")[i // 10 % 3]  # the colour cycle has 10 colours: past them, another line style
        axes[0].plot(curve.index, curve[column], marker=".", linestyle=style, label=label)
        axes[1].plot(curve["virtual_time_s"], curve[column], marker=".", linestyle=style, label=label)
    axes[0].set_xlabel("global iteration")
    axes[1].set_xlabel("virtual time (s)")
    axes[0].set_ylabel(ylabel)
    for ax in axes:
        ax.grid(alpha=0.3)
        if logy:
            ax.set_yscale("log")
    axes[1].legend(fontsize=8)
    fig.tight_layout()
    path = out / name
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_bytes(out: Path, table: pd.DataFrame, keys: list[str]) -> Path:
    """Final accuracy (mean, 95 % interval over seeds) against the MB a run sent (up plus down), one point per
    configuration, one colour per strategy: what a codec trades. Written to ``out/bytes.png``."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    keys = [k for k in keys if k in table.columns] or ["strategy"]
    done = table[~_diverged(table)]
    fig, ax = plt.subplots(figsize=(8, 5))
    colours: dict[str, Any] = {}
    for values, group in done.groupby(keys, sort=False):
        values = values if isinstance(values, tuple) else (values,)
        strategy = str(group["strategy"].iloc[0])
        colour = colours.setdefault(strategy, f"C{len(colours)}")
        mean, half = mean_ci((100 * group["final_accuracy"]).astype(float).tolist())
        mb = (group["bytes_up"] + group["bytes_down"]).mean() / 1e6
        ax.errorbar(mb, mean, yerr=None if math.isnan(half) else half, fmt="o", color=colour, capsize=3,
                    label=strategy if strategy not in ax.get_legend_handles_labels()[1] else None)
        ax.annotate(_label(keys, values), (mb, mean), fontsize=7, xytext=(4, 2), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_xlabel("MB sent per run, up + down (log scale)")
    ax.set_ylabel("final test accuracy (%, mean and 95% interval)")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    path = out / "bytes.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def plot_profiles(out: Path, run_dir: Path) -> Path | None:
    """Compute speed (GFLOP/s) against uplink rate (Mbit/s) of a run's devices."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    profiles = read_json_table(run_dir / "config.json").get("device_profiles", [])
    try:
        rates = [float(p["uplink_bps"]) for p in profiles]
        speeds = [float(p["flops_per_s"]) for p in profiles]
        ids = [str(p["partition_id"]) for p in profiles]
    except (KeyError, TypeError, ValueError):
        raise ConfigError(f"{run_dir / 'config.json'}: device_profiles are not sflower's") from None
    if not profiles or all(math.isinf(r) for r in rates):
        return None
    fig, ax = plt.subplots(figsize=(5, 4))
    ax.scatter([f / 1e9 for f in speeds], [r / 1e6 for r in rates])
    for i, f, r in zip(ids, speeds, rates):
        ax.annotate(i, (f / 1e9, r / 1e6), fontsize=7)
    ax.set_xlabel("compute speed (GFLOP/s)")
    ax.set_ylabel("uplink rate (Mbit/s)")
    ax.grid(alpha=0.3)
    fig.tight_layout()
    path = out / "profiles.png"
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def load_results(out: Path) -> tuple[pd.DataFrame, list[str], dict[str, Any]]:
    """A sweep directory's results table (collected from its runs, else read from ``results.csv``),
    in sweep order, with its grid keys (less ``seed``) and ``[meta]``.

    Raises:
        ConfigError: not a directory, or no finished runs.
    """
    if not out.is_dir():
        raise ConfigError(f"'{out}' is not a directory")
    keys, meta, order = _sweep_meta(out)
    if any(out.glob("*/summary.json")):
        table = collect(out, target=float(given_or_default(meta, "target-accuracy")))
    elif (out / "results.csv").is_file():
        table = pd.read_csv(out / "results.csv")
    else:
        table = pd.DataFrame()
    if table.empty:
        raise ConfigError(f"no finished runs under '{out}'")
    if order:
        rank = {name: i for i, name in enumerate(order)}
        table = table.sort_values("run", key=lambda col: col.map(lambda r: rank.get(r, len(rank))), kind="stable")
    return table, keys, meta


def tables(table: pd.DataFrame, keys: list[str], meta: dict[str, Any]) -> str:
    """The tables of a report, as markdown: the numerics line, the configurations, and the ranked pairs."""
    modes = sorted(set(table["numerics"].dropna().astype(str))) if "numerics" in table.columns else []
    lines = [f"Numerics: {', '.join(modes) or 'fast'} (docs/reproducibility.md). Accuracies: mean over seeds "
             "± half-width of the 95% confidence interval (Student t); diverged runs are counted in `seeds` "
             "and left out of the final accuracy.", ""]
    lines += [markdown_table(summarize(table, keys, meta.get("paper"), bool(meta.get("show-bytes")))), ""]
    pairs = pairs_table(table, keys, meta)
    if not pairs.empty:
        lines += ["Paired differences of final accuracy over the seeds both runs completed; "
                  "\"A above B\" only where the 95% interval excludes 0.", "",
                  markdown_table(pairs), ""]
    return "\n".join(lines)


def report(out_dir: str | Path) -> Path:
    """Write report.md, curves.png and profiles.png for a sweep directory.

    Raises:
        ConfigError: the directory holds no finished runs.
    """
    out = Path(out_dir)
    table, keys, meta = load_results(out)
    if any(out.glob("*/summary.json")):
        plot_curves(out, table, keys)
        plot_curves(out, table, keys, "grad_dissimilarity", "dissimilarity.png",
                    "gradient dissimilarity (GAS Fig. 2)", logy=True)
        plot_profiles(out, out / table["run"].iloc[0])
        if attacked(table):
            plot_privacy(out, table, keys, _label)
            plot_label_leakage(out, table, keys, _label)
            plot_cut_layer(out, table, keys)
    if meta.get("show-bytes"):
        plot_bytes(out, table, keys)
    path = out / "report.md"
    path.write_text(render(out, table, keys, meta))
    return path


#: The plots a report links when its directory holds them, with their captions.
PLOTS = (("curves.png", "curves"), ("dissimilarity.png", "gradient dissimilarity"),
         ("bytes.png", "accuracy against bytes"), ("privacy.png", "accuracy against inversion PSNR"),
         ("label-leakage.png", "accuracy against label inference AUC"),
         ("cut-layer.png", "inversion PSNR against the cut layer"), ("profiles.png", "device profiles"))


def render(out: Path, table: pd.DataFrame, keys: list[str], meta: dict[str, Any]) -> str:
    """The text of ``report.md``: title, budget, the configurations' table, the pairs' table, and
    links to the plots that ``out`` holds."""
    lines = [f"# {meta.get('description', out.name)}", ""]
    if meta.get("budget"):
        lines += [f"Budget: {meta['budget']}", ""]
    lines += [tables(table, keys, meta)]
    lines += [f"![{caption}]({name})" for name, caption in PLOTS if (out / name).is_file()]
    return "\n".join(lines) + "\n"
