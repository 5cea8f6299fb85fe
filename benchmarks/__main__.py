"""``python -m benchmarks``: the program that ``sflower bench`` and ``sflower deploy bench`` start in the checkout.

The benchmarks are the top floor, above ``simulation`` (``tests/test_architecture.py``): nothing in
``simulation`` imports them, so ``sflower`` runs them as this child program, with the checkout on its
``PYTHONPATH`` (:func:`simulation.cli.cmd_bench`). Its arguments are the ones ``sflower`` parsed:

* ``python -m benchmarks [NAME ...] [--quick] [--data-dir DIR] [--against REV] [--out DIR]``: :func:`benchmarks.runner.run_benchmarks`
  (no name: :data:`benchmarks.runner.DEFAULT_BENCHMARKS`);
* ``python -m benchmarks deploy [KEY=VALUE ...]``: :func:`benchmarks.deploy.run_bench`.

Exit status: 0, 1 (a benchmark's run or a deployment failed) or 2 (bad input), each failure one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from fl_app.run.config import parse_key_values
from fl_app.run.errors import ConfigError


def bench(argv: Sequence[str]) -> int:
    """``sflower bench``'s arguments: check the names, run the benchmarks.

    Raises:
        ConfigError: an unknown benchmark, or ``summary`` without ``--against``.
    """
    from benchmarks.runner import BENCHMARKS, DEFAULT_BENCHMARKS, run_benchmarks

    parser = argparse.ArgumentParser(prog="sflower bench")
    parser.add_argument("only", nargs="*")
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--data-dir", default=None)
    parser.add_argument("--against", default=None)
    parser.add_argument("--out", default=None, help="population: write results.json and table.md here")
    args = parser.parse_args(argv)
    names = args.only or list(DEFAULT_BENCHMARKS)
    unknown = [n for n in names if n not in BENCHMARKS]
    if unknown:
        raise ConfigError(f"unknown benchmark {unknown[0]!r}; choose from {', '.join(BENCHMARKS)}")
    if "summary" in names and args.against is None:
        raise ConfigError("bench summary needs --against REV (the revision to compare with)")
    try:
        run_benchmarks(names, quick=args.quick, data_dir=args.data_dir, against=args.against, out=args.out)
    except RuntimeError as err:  # a benchmark's run failed (its child's last error line)
        print(f"sflower: bench failed: {err}", file=sys.stderr)
        return 1
    return 0


def deploy_bench(argv: Sequence[str]) -> int:
    """``sflower deploy bench KEY=VALUE ...``: the exchange measured against an echo ClientApp."""
    from benchmarks.deploy import run_bench
    from simulation.deploy.processes import DeployError

    try:
        run_bench(parse_key_values(list(argv)))
    except DeployError as err:
        print(f"sflower: deploy bench failed: {err}", file=sys.stderr)
        return 1
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``sflower bench`` (or, after ``deploy``, ``sflower deploy bench``) with ``argv``."""
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        return deploy_bench(argv[1:]) if argv[:1] == ["deploy"] else bench(argv)
    except ConfigError as err:
        print(f"sflower: error: {err}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("sflower: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
