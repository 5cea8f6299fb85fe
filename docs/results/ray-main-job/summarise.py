"""Ray ÷ in-process for the main job, from run.sh's runs.csv: per round and the median over rounds.

Usage: python docs/results/ray-main-job/summarise.py OUT/runs.csv > OUT/summary.md
"""

import sys

import pandas as pd


def main(path: str) -> None:
    """Print a markdown table: each engine's run and command seconds per round, its ratio to the
    in-process run of the same round, the medians, and whether every run's final metrics are equal."""
    runs = pd.read_csv(path)
    base = runs[runs.engine == "inprocess"].set_index("round")
    rows = []
    for engine, group in runs.groupby("engine", sort=False):
        g = group.set_index("round")
        run_ratio = g.wall_time_s / base.wall_time_s
        cmd_ratio = g.command_s / base.command_s
        rows.append({"engine": engine, "runs": len(g),
                     "run s (each)": " / ".join(f"{v:.1f}" for v in g.wall_time_s),
                     "run s ÷ in-process (each)": " / ".join(f"{v:.2f}" for v in run_ratio),
                     "run s ÷ in-process (median)": f"{run_ratio.median():.2f}",
                     "server compute s ÷ in-process (median)":
                         f"{(g.server_compute_s / base.server_compute_s).median():.2f}",
                     "command s ÷ in-process (median)": f"{cmd_ratio.median():.2f}"})
    print(pd.DataFrame(rows).to_markdown(index=False))
    same = runs[["final_accuracy", "final_loss"]].drop_duplicates()
    print(f"\nfinal accuracy and loss equal in every run: {'yes' if len(same) == 1 else 'no'}"
          f" ({runs.final_accuracy.iloc[0]}, {runs.final_loss.iloc[0]})")


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: summarise.py RUNS_CSV")
    main(sys.argv[1])
