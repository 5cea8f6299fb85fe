"""Portable numerics on one machine, under simulated machine diversity (issue 33).

Each configuration (a zeroth-order run, GAS, a first-order synchronous split)
runs under three instruction-set settings of this machine, in fast mode and in
portable mode, each in a fresh process:

* ``native``: nothing set (ATen's best kernels, MKL's and oneDNN's own dispatch);
* ``sse``: ``ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=SSE4_2 ONEDNN_MAX_CPU_ISA=SSE41``,
  a machine without AVX;
* ``avx``: ``ATEN_CPU_CAPABILITY=default MKL_ENABLE_INSTRUCTIONS=AVX ONEDNN_MAX_CPU_ISA=AVX``,
  a machine with AVX but without AVX2.

Portable mode pins ATen's capability (it overrides ``ATEN_CPU_CAPABILITY``) and
MKL's code path (``MKL_CBWR=COMPATIBLE``) and turns oneDNN off; it leaves
``MKL_ENABLE_INSTRUCTIONS`` and ``ONEDNN_MAX_CPU_ISA`` as the "machine" sets them.
A run's fingerprint is its metrics.csv without ``wall_time_s``
(:func:`simulation.fingerprints.fingerprint`); the table gives its digest and
final accuracy per setting.

Run from the repository root (about 15 minutes on 2 cores)::

    python docs/results/portable-numerics/identity.py docs/results/portable-numerics
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pandas as pd

from fl_app.run.numerics import PORTABLE_ENV
from simulation.fingerprints import fingerprint

SETTINGS = {
    "native": {},
    "sse": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "SSE4_2", "ONEDNN_MAX_CPU_ISA": "SSE41"},
    "avx": {"ATEN_CPU_CAPABILITY": "default", "MKL_ENABLE_INSTRUCTIONS": "AVX", "ONEDNN_MAX_CPU_ISA": "AVX"},
}
FMNIST = ["dataset=fashion-mnist", "data-dir=../shared/data/fashion-mnist"]
CONFIGS = {
    "zo (ZO-SplitFed)": [*FMNIST, "strategy=splitfed-v1", "client-optimizer=zo", "server-optimizer=zo", "lr=0.004",
                         "model=lenet5", "cut-layer=3", "num-clients=10", "concurrency=5", "partition=iid",
                         "heterogeneity=exponential", "global-iterations=30", "local-iterations=1", "momentum=0",
                         "weight-decay=0", "perturbations=8", "zo-clip=0", "eval-every=10", "eval-samples=2000"],
    "gas": [*FMNIST, "strategy=gas", "model=lenet5", "cut-layer=3", "num-clients=10", "concurrency=5",
            "global-iterations=3", "local-iterations=10", "eval-samples=2000"],
    "sync (SplitFed-V1)": [*FMNIST, "strategy=splitfed-v1", "model=lenet5", "cut-layer=3", "num-clients=10",
                           "concurrency=5", "global-iterations=3", "local-iterations=10", "eval-samples=2000"],
}


def run(config: list[str], mode: str, setting: dict[str, str], out: Path) -> tuple[str, float]:
    env = {k: v for k, v in os.environ.items() if k not in (*PORTABLE_ENV, "MKL_ENABLE_INSTRUCTIONS",
                                                            "ONEDNN_MAX_CPU_ISA")}
    env.update(setting)
    cmd = [sys.executable, "-m", "simulation.cli", "run", "-q", *config, f"numerics={mode}", f"output-dir={out}"]
    subprocess.run(cmd, env=env, check=True, capture_output=True)
    text = fingerprint(out / "metrics.csv")
    final = float(pd.read_csv(out / "metrics.csv")["test_accuracy"].iloc[-1])
    return hashlib.sha256(text.encode()).hexdigest()[:12], final


def main(dest: str) -> None:
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in CONFIGS.items():
            for mode in ("fast", "portable"):
                for label, setting in SETTINGS.items():
                    digest, final = run(config, mode, setting, Path(tmp) / f"{len(rows)}")
                    rows.append({"configuration": name, "mode": mode, "setting": label, "digest": digest,
                                 "final accuracy": final})
                    print(rows[-1], flush=True)
    table = pd.DataFrame(rows)
    verdict = (table.groupby(["configuration", "mode"], sort=False)["digest"].nunique()
               .map(lambda n: "identical" if n == 1 else f"{n} different").rename("across settings").reset_index())
    Path(dest).mkdir(parents=True, exist_ok=True)
    table.to_csv(Path(dest) / "identity.csv", index=False)
    (Path(dest) / "identity.md").write_text(
        "Fingerprints (metrics.csv without wall_time_s, SHA-256 prefix) of each configuration under three "
        "instruction-set settings, by numerics mode (docs/results/portable-numerics/identity.py).\n\n"
        + table.to_markdown(index=False) + "\n\n" + verdict.to_markdown(index=False) + "\n")
    print(verdict.to_string(index=False))


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "docs/results/portable-numerics")
