"""The multi-seed trade-off of docs/results/privacy-tradeoff/ from the runs of run.sh.

Usage:
  python docs/results/privacy-tradeoff/collect.py RUNS_DIR > docs/results/privacy-tradeoff/tradeoff.csv
  python docs/results/privacy-tradeoff/collect.py --summary docs/results/privacy-tradeoff/tradeoff.csv
    (writes summary.csv, summary.md, accuracy-vs-labels.png and accuracy-vs-psnr.png beside tradeoff.csv,
    and puts summary.md into the generated blocks of README.md and docs/results/privacy.md)

`tradeoff.csv` has one row per seed, run and attack (the rows of privacy-strongest/collect.py, whose parsing
this reuses, with the seed and the run's final test accuracy). The summary takes, per run, the worst-case
label accuracy over gradient matching (static, tracked) and clustering (k-means, spectral), and the
worst-case PSNR over the decoder and the white-box least squares; then per variant the mean over seeds and
the half-width of the 95 % Student-t interval.
"""

import csv
import importlib.util
import json
import math
import sys
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
_spec = importlib.util.spec_from_file_location("strongest_collect", HERE.parent / "privacy-strongest" / "collect.py")
strongest = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(strongest)

COLUMNS = ("seed", *strongest.COLUMNS, "test_accuracy")
LABEL_ATTACKS = ("gradient-matching static", "gradient-matching tracked", "kmeans", "spectral")
INPUT_ATTACKS = ("decoder", "white-box least squares")
#: run.sh's variants, in its order, and the run each is compared with.
ORDER = ("u-none", "u-hidden", "u-max-norm", "u-marvell-1", "u-iso-1", "u-nopeek-100", "u-noise-0.03",
         "u-hidden+max-norm", "u-max-norm+noise-0.03", "prefix", "prefix-hidden", "u-marvell-0.25", "u-marvell-4",
         "u-marvell-1-perturbed", "u-iso-1-perturbed")
BASELINE = {v: ("prefix" if v.startswith("prefix") else "u-none") for v in ORDER}
SENT = "sent (prefix split)"
BEGIN, END = "<!-- tt: collect.py --summary tradeoff.csv -->\n", "<!-- end tt -->"
BEGIN_RESULTS_PAGE = "<!-- tt: privacy-tradeoff/collect.py --summary privacy-tradeoff/tradeoff.csv -->\n"


def pages(out: Path) -> list[tuple[Path, str]]:
    """The pages that show summary.md in a generated block, with the block's opening line."""
    found = [(out / "README.md", BEGIN), (out.parent / "privacy.md", BEGIN_RESULTS_PAGE)]
    return [(p, b) for p, b in found if p.is_file() and b in p.read_text()]


def collect(runs: Path):
    """Every row of every seed's runs: privacy-strongest's rows, with the seed and the test accuracy."""
    for seed_dir in sorted(runs.glob("seed-*"), key=lambda p: int(p.name.split("-")[1])):
        seed = int(seed_dir.name.split("-")[1])
        acc = {p.parent.name: json.loads(p.read_text())["final_accuracy"] for p in seed_dir.glob("*/summary.json")}
        for row in strongest.rows(seed_dir):
            yield {"seed": seed, **row, "test_accuracy": acc.get(row["variant"], "")}


def t_interval(xs: list[float]) -> tuple[float, float]:
    """Mean and half-width of the 95 % Student-t interval (nan with fewer than two values)."""
    from scipy.stats import t

    n = len(xs)
    mean = sum(xs) / n
    if n < 2:
        return mean, math.nan
    sd = math.sqrt(sum((x - mean) ** 2 for x in xs) / (n - 1))
    return mean, t.ppf(0.975, n - 1) * sd / math.sqrt(n)


def per_run(table: list[dict]) -> dict[tuple[str, int], dict]:
    """(variant, seed) -> test accuracy, each attack's score, and the worst cases with the attack attaining them."""
    runs: dict[tuple[str, int], dict] = {}
    for r in table:
        run = runs.setdefault((r["variant"], int(r["seed"])), {"variant": r["variant"], "seed": int(r["seed"]),
                                                                "prefix": r["variant"].startswith("prefix")})
        if r["test_accuracy"]:
            run["accuracy"] = float(r["test_accuracy"])
        if r["held"] != "True":
            continue
        if r["attack"] in LABEL_ATTACKS and r["accuracy"]:
            run[r["attack"]] = float(r["accuracy"])
            run["chance"] = float(r["chance"])
        if r["attack"] in INPUT_ATTACKS and r["psnr"]:
            run[r["attack"]] = float(r["psnr"])
    for run in runs.values():
        labels = {a: run[a] for a in LABEL_ATTACKS if a in run}
        inputs = {a: run[a] for a in INPUT_ATTACKS if a in run}
        if run["prefix"]:  # the server holds the labels by construction
            run["labels"], run["labels_by"] = 1.0, SENT
        elif labels:
            run["labels"] = max(labels.values())
            run["labels_by"] = " = ".join(a for a in labels if labels[a] == run["labels"])  # ties named together
        if inputs:
            run["psnr"] = max(inputs.values())
            run["psnr_by"] = " = ".join(a for a in inputs if inputs[a] == run["psnr"])
    return runs


def fmt(mean: float, half: float, digits: int) -> str:
    return f"{mean:.{digits}f}" + ("" if math.isnan(half) else f" ± {half:.{digits}f}")


def by_what(names: list[str]) -> str:
    """Each attack with the number of seeds at which it attained the worst case (ties count for each)."""
    counts = Counter(a for n in names for a in n.split(" = "))
    return ", ".join(f"{a} ({n}/{len(names)})" for a, n in counts.most_common())


#: decimals of summary.csv's means and half-widths
CSV_DIGITS = {"accuracy": 4, "labels": 4, "psnr": 2}


def summary(runs: dict) -> list[dict]:
    out = []
    variants = [v for v in ORDER if any(k[0] == v for k in runs)] + sorted({k[0] for k in runs} - set(ORDER))
    for v in variants:
        rs = [runs[k] for k in sorted(k for k in runs if k[0] == v)]
        row = {"variant": v, "seeds": len(rs), "seed_list": " ".join(str(r["seed"]) for r in rs)}
        for key in ("accuracy", "labels", "psnr"):  # unrounded: the tables round once, summary.csv on writing
            xs = [r[key] for r in rs if key in r]
            m, h = t_interval(xs) if xs else (math.nan, math.nan)
            row[f"{key}_mean"], row[f"{key}_ci95"] = float(m), ("" if math.isnan(h) else float(h))
        row["labels_by"] = by_what([r["labels_by"] for r in rs if "labels_by" in r])
        row["psnr_by"] = by_what([r["psnr_by"] for r in rs if "psnr_by" in r])
        out.append(row)
    return out


def paired(runs: dict, a: str, b: str, key: str) -> tuple[int, float, float] | None:
    """n, mean and 95 % half-width of ``a - b`` in ``key`` over the seeds both have."""
    seeds = sorted(s for (v, s) in runs if v == a and (b, s) in runs and key in runs[(a, s)] and key in runs[(b, s)])
    if not seeds:
        return None
    m, h = t_interval([runs[(a, s)][key] - runs[(b, s)][key] for s in seeds])
    return len(seeds), m, h


def verdict(n: int, m: float, h: float, lower_is_defence: bool = True) -> str:
    if math.isnan(h):
        return "one seed"
    if m - h <= 0 <= m + h:
        return "nothing"
    return ("lowers" if m < 0 else "raises") if lower_is_defence else ("below" if m < 0 else "above")


def markdown(rows: list[dict], runs: dict) -> str:
    lines = ["| variant | seeds | test accuracy | worst-case label accuracy | attained by | worst-case PSNR (dB) | attained by |",
             "|---|---|---|---|---|---|---|"]
    for r in rows:
        ci = lambda k, d: fmt(r[f"{k}_mean"], math.nan if r[f"{k}_ci95"] == "" else r[f"{k}_ci95"], d)  # noqa: E731
        lines.append(f"| {r['variant']} | {r['seeds']} | {ci('accuracy', 3)} | {ci('labels', 3)} | {r['labels_by']} "
                     f"| {ci('psnr', 2)} | {r['psnr_by']} |")
    lines += ["", "Accuracy, hidden against not hidden (paired by seed: the same data order; the hidden run's "
              "client-side initial weights come from the clients' own seed):", "",
              "| pair (A − B) | seeds | A − B, test accuracy | 95 % interval | |", "|---|---|---|---|---|"]
    for a, b in (("u-hidden", "u-none"), ("prefix-hidden", "prefix"), ("u-hidden+max-norm", "u-max-norm")):
        p = paired(runs, a, b, "accuracy")
        if p is None:
            continue
        n, m, h = p
        what = "–" if math.isnan(h) else ("not distinguishable" if m - h <= 0 <= m + h else ("A above B" if m > 0 else "A below B"))
        lines.append(f"| {a} − {b} | {n} | {m:+.4f} | " + ("–" if math.isnan(h) else f"[{m - h:+.4f}, {m + h:+.4f}]")
                     + f" | {what} |")
    attacks = [*LABEL_ATTACKS, *INPUT_ATTACKS]
    chance = [x["chance"] for x in runs.values() if "chance" in x]
    lines += ["", f"Each attack's score (label accuracy, chance {min(chance):.3f}–{max(chance):.3f} by seed; PSNR in "
              "dB), mean over seeds ± 95 % half-width "
              "(\"–\": not run, or the server holds the labels):", "",
              "| variant | seeds | " + " | ".join(attacks) + " |", "|---|---|" + "---|" * len(attacks)]
    for r in rows:
        rs = [x for (v, _), x in sorted(runs.items()) if v == r["variant"]]
        cells = []
        for a in attacks:
            xs = [x[a] for x in rs if a in x]
            cells.append(fmt(*t_interval(xs), 2 if a in INPUT_ATTACKS else 3) if xs else "–")
        lines.append(f"| {r['variant']} | {r['seeds']} | " + " | ".join(cells) + " |")
    lines += ["", "What each defence changes, attack by attack: the mean over seeds of the defended run's score minus "
              "its baseline's (U-shaped: `u-none`; prefix: `prefix`) at the same seed, with its 95 % interval; "
              "**nothing**: the interval covers 0 (no change distinguishable from the seed spread; for the test "
              "accuracy: no cost distinguishable); a variant at one seed: **nothing** where its score lies inside "
              "the baseline's range over the baseline's seeds; label accuracy as a fraction, PSNR in dB; a wider interval at "
              "fewer seeds makes **nothing** easier to reach.", "",
              "| defence (vs baseline) | test accuracy | " + " | ".join(attacks) + " |",
              "|---|---|" + "---|" * len(attacks)]
    for v in [r["variant"] for r in rows]:
        b = BASELINE.get(v)
        if b is None or b == v:
            continue
        cells = []
        for key in ("accuracy", *attacks):
            p = paired(runs, v, b, key)
            if p is None:
                cells.append("–")
                continue
            n, m, h = p
            d = 2 if key in INPUT_ATTACKS else 3
            iv = " (1 seed)" if math.isnan(h) else f" [{m - h:+.{d}f}, {m + h:+.{d}f}]"
            word = verdict(n, m, h, lower_is_defence=key != "accuracy")
            if n == 1:  # one seed: inside the baseline's range over all its seeds, or not
                seed = next(s for (v_, s) in runs if v_ == v and key in runs[(v_, s)] and (b, s) in runs)
                value = runs[(v, seed)][key]
                base = [r[key] for (v_, _), r in runs.items() if v_ == b and key in r]
                lo, hi = min(base), max(base)
                word = "nothing" if lo <= value <= hi else (
                    ("lowers" if value < lo else "raises") if key != "accuracy" else ("below" if value < lo else "above"))
            cells.append(f"{m:+.{d}f}{iv} **{word}**" if word == "nothing" else f"{m:+.{d}f}{iv} {word}")
        lines.append(f"| {v} (vs {b}) | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], x: str, xlabel: str, path: Path, skip_prefix: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(10, 5.5))
    markers = "osD^v<>pPX*hH8d"
    colours = plt.get_cmap("tab20").colors  # one colour and one marker per variant (tab10 repeats after 10)
    for i, r in enumerate(rows):
        if skip_prefix and r["variant"].startswith("prefix"):
            continue
        err = lambda k: 0 if r[f"{k}_ci95"] == "" else r[f"{k}_ci95"]  # noqa: E731
        ax.errorbar(r[f"{x}_mean"], r["accuracy_mean"], xerr=err(x), yerr=err("accuracy"), fmt=markers[i % len(markers)],
                    color=colours[i % len(colours)], capsize=3, label=f"{r['variant']} ({r['seeds']} seeds)")
    if x == "labels":
        ax.axvline(0.110, color="grey", ls=":", lw=1, label="chance (about 0.11)")
    ax.set_xlabel(xlabel, fontsize=9)
    ax.set_ylabel("final test accuracy")
    ax.set_title("mnist-5k, LeNet-5, SplitFed-V1: mean and 95 % t-interval over seeds")
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(path, dpi=120, metadata={"Software": None})
    plt.close(fig)


def write_summary(path: Path, out: Path | None = None, plots: bool = True) -> str:
    """Write summary.csv, summary.md and (``plots``) the two plots of ``path`` into ``out`` (default: beside it)."""
    out = out or path.parent
    table = list(csv.DictReader(path.open()))
    runs = per_run(table)
    rows = summary(runs)
    with (out / "summary.csv").open("w") as f:
        w = csv.DictWriter(f, fieldnames=list(rows[0]), lineterminator="\n")
        w.writeheader()
        w.writerows({k: (round(v, CSV_DIGITS.get(k.split("_")[0], 4)) if isinstance(v, float) else v)
                     for k, v in row.items()} for row in rows)
    text = markdown(rows, runs) + "\n"
    (out / "summary.md").write_text(text)
    if plots:
        plot(rows, "labels", "worst-case label accuracy (gradient matching static/tracked, k-means, spectral; "
             "chance about 0.11)", out / "accuracy-vs-labels.png", skip_prefix=True)
        plot(rows, "psnr", "worst-case inversion PSNR, dB (decoder, white-box least squares)",
             out / "accuracy-vs-psnr.png", skip_prefix=False)
    return text


if __name__ == "__main__":
    if sys.argv[1] == "--summary":
        text = write_summary(Path(sys.argv[2]))
        for page, begin in pages(Path(sys.argv[2]).parent):  # each page's block is summary.md
            head, rest = page.read_text().split(begin, 1)
            page.write_text(head + begin + text + END + rest.split(END, 1)[1])
        print(text, end="")
        sys.exit(0)
    out = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    out.writeheader()
    for row in collect(Path(sys.argv[1])):
        out.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in row.items()})
