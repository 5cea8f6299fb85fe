"""One row per run and attack of docs/results/privacy-strongest/ from each run's privacy/attacks.json.

Usage: python docs/results/privacy-strongest/collect.py RUNS_DIR > docs/results/privacy-strongest/attacks.csv
       python docs/results/privacy-strongest/collect.py --markdown docs/results/privacy-strongest/attacks.csv
(the second prints the README's summary table from the results file).
"""

import csv
import json
import sys
from pathlib import Path

from simulation.privacy.strongest import worst_case

COLUMNS = ("variant", "attack", "kind", "held", "accuracy", "chance", "psnr", "ssim", "norm_auc", "direction_auc",
           "tracking_error", "known_10", "known_20", "known_50", "known_100", "known_200", "known_one per cluster", "samples", "reason")


#: The variants in the order of run.sh (others after them, by name).
ORDER = ("prefix", "prefix-decoder-e5", "u-none", "u-max-norm", "u-iso-1", "u-iso-4", "u-nopeek-100", "u-noise-0.03", "u-psl")


def rows(runs: Path):
    paths = runs.glob("*/privacy/attacks.json")
    rank = {name: i for i, name in enumerate(ORDER)}
    for path in sorted(paths, key=lambda p: (rank.get(p.parent.parent.name, len(ORDER)), p.parent.parent.name)):
        report = json.loads(path.read_text())
        variant = path.parent.parent.name
        for r in report["attacks"]:
            known = {f"known_{m}": v for m, v in (r.get("known_labels") or {}).items()}
            yield {"variant": variant, **{k: r.get(k, "") for k in COLUMNS if k != "variant"}, **known}
        w = worst_case(report["attacks"])  # recomputed: the ranking by advantage over chance
        yield {"variant": variant, "attack": "WORST CASE", "kind": "labels+inputs", "held": True,
               "accuracy": (w["labels"] or {}).get("accuracy", ""), "chance": (w["labels"] or {}).get("chance", ""),
               "psnr": (w["inputs"] or {}).get("psnr", ""), "ssim": (w["inputs"] or {}).get("ssim", ""),
               "reason": f"labels: {(w['labels'] or {}).get('attack', 'prefix split: sent')}; "
                         f"inputs: {(w['inputs'] or {}).get('attack', '')}"}


def markdown(path: Path) -> str:
    """The summary table: per variant, each attack's label accuracy or PSNR."""
    table = list(csv.DictReader(path.open()))
    variants = list(dict.fromkeys(r["variant"] for r in table))
    attacks = list(dict.fromkeys(r["attack"] for r in table if r["attack"] != "WORST CASE")) + ["WORST CASE"]

    def cell(v: str, a: str) -> str:
        r = next((r for r in table if r["variant"] == v and r["attack"] == a), None)
        if r is None:
            return "–"
        if r["held"] == "False":
            return "not held"
        if r["kind"] == "label-auc":
            return f"AUC {float(r['norm_auc']):.3f} / {float(r['direction_auc']):.3f}"
        parts = [f"{float(r['accuracy']):.3f}"] if r["accuracy"] else []
        parts += [f"{float(r['psnr']):.2f} dB"] if r["psnr"] else []
        return ", ".join(parts) or "–"

    lines = ["| attack | " + " | ".join(variants) + " |", "|---|" + "---|" * len(variants)]
    lines += [f"| {a} | " + " | ".join(cell(v, a) for v in variants) + " |" for a in attacks]
    known = [k for k in COLUMNS if k.startswith("known_")]
    lines += ["", "| clustering, variant | " + " | ".join(k[6:] + " known" for k in known) + " | all (Hungarian) |",
              "|---|" + "---|" * (len(known) + 1)]
    for r in table:
        if r["attack"] in ("kmeans", "spectral") and r["held"] == "True":
            lines.append(f"| {r['attack']}, {r['variant']} | " + " | ".join(r[k] or "–" for k in known)
                         + f" | {r['accuracy']} |")
    return "\n".join(lines)


if __name__ == "__main__":
    if sys.argv[1] == "--markdown":
        print(markdown(Path(sys.argv[2])))
        sys.exit(0)
    out = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    out.writeheader()
    for row in rows(Path(sys.argv[1])):
        out.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in row.items()})
