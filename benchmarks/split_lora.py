"""The split LoRA step against the unsplit one, side by side in one process (``python -m benchmarks.split_lora``).

MiniLM-L6 with LoRA (``model=minilm-l6``, r = 8 on query, key, value and the
attention output), batch 32 of SST-2 training sentences padded to 64 tokens
(the issue's setting) or to their longest (``--padding batch``), cut after
layer 2 (``cut-layer=3``), AdamW, one thread. Each repetition times, in
alternating order, one unsplit step (forward, loss, backward, step on the whole
model) and one split step (client forward, the activation detached as if sent,
server forward, loss, backward, the activation gradient back, client
backward, a step on each side), under the same dropout masks, and checks that both
give the same loss. Prints
the median wall time of each, their ratio and the bytes that cross the cut.
Not a timed test: this machine is shared and noisy, so compare only within one run.
``--plot METRICS_CSV OUT_PNG`` instead draws a run's accuracy against wall time
(the how-to's figure, ``docs/results/split-lora/accuracy-wall.png``).

Imports: any floor (``benchmarks`` is the top one).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time

import numpy as np
import torch

from fl_app.data import load_dataset
from fl_app.run.errors import ConfigError
from fl_app.models import build_model, fixed_rng, split_model


def _steps(data, cut: int, batch: int) -> tuple:
    """Fresh unsplit and split models with identical weights, their optimisers, and the two step functions."""
    whole = build_model("minilm-l6", data.input_shape, data.num_classes, seed=0)
    twin = build_model("minilm-l6", data.input_shape, data.num_classes, seed=0)
    client, server = split_model(twin, cut)
    opt_whole = torch.optim.AdamW(whole.parameters(), lr=1e-3)
    opt_client = torch.optim.AdamW(client.parameters(), lr=1e-3)
    opt_server = torch.optim.AdamW(server.parameters(), lr=1e-3)

    def unsplit(x: torch.Tensor, y: torch.Tensor) -> float:
        opt_whole.zero_grad()
        loss = torch.nn.functional.cross_entropy(whole(x), y)
        loss.backward()
        opt_whole.step()
        return float(loss.detach())

    def split(x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
        opt_client.zero_grad()
        opt_server.zero_grad()
        act = client(x)
        sent = act.detach().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(server(sent), y)
        loss.backward()
        act.backward(sent.grad)
        opt_client.step()
        opt_server.step()
        return float(loss.detach()), 2 * sent.numel() * sent.element_size()

    return unsplit, split


def plot_wall(metrics_csv: str, out_png: str, target: float = 0.82, minutes: float = 15.0) -> None:
    """Test accuracy against wall-clock minutes of a run's ``metrics.csv``, with the target and the time budget.

    Args:
        metrics_csv: a run's ``metrics.csv`` (columns ``wall_time_s``, ``test_accuracy``).
        out_png: where the figure goes.
        target: the accuracy line drawn (0.82 on SST-2 dev).
        minutes: the wall-time budget line drawn.
    """
    import csv

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    with open(metrics_csv, newline="") as fh:
        rows = list(csv.DictReader(fh))
    t = [float(r["wall_time_s"]) / 60 for r in rows]
    acc = [float(r["test_accuracy"]) for r in rows]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    ax.plot(t, acc, "o-", label="SplitFed-V1, 4 clients, cut after layer 2")
    ax.axhline(target, color="grey", ls="--", lw=1, label=f"{target:.2f}")
    ax.axvline(minutes, color="grey", ls=":", lw=1, label=f"{minutes:g} min")
    ax.set_xlabel("wall time (min, shared 2-core CPU)")
    ax.set_ylabel("SST-2 dev accuracy")
    ax.set_title("MiniLM-L6 + LoRA (r = 8), split fine-tuning")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_ylim(top=max(acc + [target]) + 0.02)
    ax.grid(alpha=0.3)
    fig.tight_layout()
    fig.savefig(out_png, dpi=120)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; returns the exit status (2 with one line on bad input)."""
    ap = argparse.ArgumentParser(prog="python -m benchmarks.split_lora", description=__doc__.splitlines()[0])
    ap.add_argument("--data-dir", default="../shared/data")
    ap.add_argument("--reps", type=int, default=10)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--cut", type=int, default=3)
    ap.add_argument("--padding", choices=("max", "batch"), default="max")
    ap.add_argument("--plot", nargs=2, metavar=("METRICS_CSV", "OUT_PNG"),
                    help="only plot a run's accuracy against wall time (no benchmark)")
    args = ap.parse_args(argv)
    if args.plot:
        try:
            plot_wall(*args.plot)
        except (OSError, KeyError, ValueError) as err:
            print(f"split_lora: cannot plot {args.plot[0]}: {err}", file=sys.stderr)
            return 2
        return 0
    torch.set_num_threads(1)
    try:
        data = load_dataset("sst2", args.data_dir)
        unsplit, split = _steps(data, args.cut, args.batch)
    except ConfigError as err:
        print(f"split_lora: {err}", file=sys.stderr)
        return 2
    import dataclasses

    data = dataclasses.replace(data, padding=args.padding)
    rng = np.random.default_rng(0)
    times: dict[str, list[float]] = {"unsplit": [], "split": []}
    crossed = 0
    for rep in range(args.reps + 1):  # the first repetition warms up and is not counted
        x, y = data.train_batch(rng.choice(len(data.y_train), args.batch, replace=False))
        order = ("unsplit", "split") if rep % 2 == 0 else ("split", "unsplit")
        losses = {}
        for kind in order:
            t0 = time.perf_counter()
            with fixed_rng(rep):  # the same dropout masks on both sides
                if kind == "unsplit":
                    losses[kind] = unsplit(x, y)
                else:
                    losses[kind], crossed = split(x, y)
            if rep:
                times[kind].append(time.perf_counter() - t0)
        if abs(losses["split"] - losses["unsplit"]) > 1e-5:
            print(f"split_lora: losses differ at repetition {rep}: {losses}", file=sys.stderr)
            return 1
    med = {k: statistics.median(v) for k, v in times.items()}
    print(f"minilm-l6 LoRA r=8, batch {args.batch}, padding {args.padding}, cut-layer={args.cut}, 1 thread, "
          f"{args.reps} repetitions")
    print(f"unsplit step: median {med['unsplit']:.3f} s (min {min(times['unsplit']):.3f})")
    print(f"split step:   median {med['split']:.3f} s (min {min(times['split']):.3f})")
    print(f"ratio split/unsplit: {med['split'] / med['unsplit']:.3f} (of minima "
          f"{min(times['split']) / min(times['unsplit']):.3f})")
    print(f"bytes across the cut per step (activations up + gradients down, float32): {crossed / 2**20:.2f} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main())
