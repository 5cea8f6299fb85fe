"""One row per run and attack of docs/results/privacy-strongest/ from each run's privacy/attacks.json.

Usage: python docs/results/privacy-strongest/collect.py RUNS_DIR > docs/results/privacy-strongest/attacks.csv
"""

import csv
import json
import sys
from pathlib import Path

COLUMNS = ("variant", "attack", "kind", "held", "accuracy", "chance", "psnr", "ssim", "norm_auc", "direction_auc",
           "tracking_error", "known_10", "known_20", "known_50", "known_100", "known_200", "known_one per cluster", "samples", "reason")


def rows(runs: Path):
    for path in sorted(runs.glob("*/privacy/attacks.json")):
        report = json.loads(path.read_text())
        variant = path.parent.parent.name
        for r in report["attacks"]:
            known = {f"known_{m}": v for m, v in (r.get("known_labels") or {}).items()}
            yield {"variant": variant, **{k: r.get(k, "") for k in COLUMNS if k != "variant"}, **known}
        w = report["worst_case"]
        yield {"variant": variant, "attack": "WORST CASE", "kind": "labels+inputs", "held": True,
               "accuracy": (w["labels"] or {}).get("accuracy", ""), "chance": (w["labels"] or {}).get("chance", ""),
               "psnr": (w["inputs"] or {}).get("psnr", ""), "ssim": (w["inputs"] or {}).get("ssim", ""),
               "reason": f"labels: {(w['labels'] or {}).get('attack', 'prefix split: sent')}; "
                         f"inputs: {(w['inputs'] or {}).get('attack', '')}"}


if __name__ == "__main__":
    out = csv.DictWriter(sys.stdout, fieldnames=COLUMNS, extrasaction="ignore", lineterminator="\n")
    out.writeheader()
    for row in rows(Path(sys.argv[1])):
        out.writerow({k: (f"{v:.4f}" if isinstance(v, float) else v) for k, v in row.items()})
