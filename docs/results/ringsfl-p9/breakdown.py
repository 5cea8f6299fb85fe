"""Where one RingSFL v2 round's time goes (the figures of README.md in this folder).

    python docs/results/ringsfl-p9/breakdown.py compute     # one graph per batch vs one backward per hop
    python docs/results/ringsfl-p9/breakdown.py flower      # Flower's own objects per exchange
    py-spy record -r 200 -f raw -o p9.raw -- python -m simulation.cli run <the round's command>
    python docs/results/ringsfl-p9/breakdown.py profile p9.raw   # seconds by handler, compute apart

Run from the repository root with OMP_NUM_THREADS=1. ``compute`` times the authors' LeNet on one
step of 5 batches (B = 64, lengths 8:1:1:1:1): each client's batch through its ring path in one
autograd graph (the authors' way), against one backward pass per hop (as on separate nodes);
times in ms per step, alternating, 6 x 100 steps each, minimum and median.
"""

from __future__ import annotations

import re
import sys
import time
from collections import Counter


def compute() -> None:
    """Print ms per ring step (5 batches of B = 64) and s per 374-step round, one graph vs one backward per hop."""
    import torch
    from torch import nn

    from fl_app.models.lenet import lenet5_ringsfl

    torch.set_num_threads(1)
    torch.manual_seed(0)
    layers = [m for _, m in lenet5_ringsfl((1, 28, 28), 10)]
    lens = [8, 1, 1, 1, 1]

    def path(origin: int) -> list[nn.Module]:
        out, start = [], 0
        for k in range(5):
            j = (origin + k) % 5
            out.append(nn.Sequential(*layers[start:start + lens[j]]))
            start += lens[j]
        return out

    paths = [path(i) for i in range(5)]
    x, y = torch.randn(64, 1, 28, 28), torch.randint(0, 10, (64,))

    def one_graph() -> None:
        for segments in paths:
            h = x
            for s in segments:
                h = s(h)
            nn.functional.cross_entropy(h, y).backward()

    def per_hop() -> None:
        for segments in paths:
            h, ins, outs = x, [], []
            for i, s in enumerate(segments):
                inp = h.detach().requires_grad_(i > 0)
                h = s(inp)
                ins.append(inp)
                outs.append(h)
            nn.functional.cross_entropy(h, y).backward()
            g = ins[-1].grad
            for i in range(len(segments) - 2, -1, -1):
                outs[i].backward(g)
                g = ins[i].grad

    times: dict[str, list[float]] = {"one graph per batch": [], "one backward per hop": []}
    for _ in range(6):
        for name, f in zip(times, (one_graph, per_hop)):
            t0 = time.perf_counter()
            for _ in range(100):
                f()
            times[name].append((time.perf_counter() - t0) * 10)
    for name, v in times.items():
        v.sort()
        print(f"{name}: {v[0]:.1f} ms per step (median {v[3]:.1f}); x 374 steps = {v[0] * 0.374:.1f} s")


def flower() -> None:
    """Print µs per exchange (request and reply Message with one 64x120 float32 Array each) and s per 18,700."""
    import numpy as np
    from flwr.app import Array, ArrayRecord, ConfigRecord, Message, RecordDict
    from flwr.common.constant import SType
    from flwr.supercore.task_identity import TaskIdentity

    TaskIdentity.run_id, TaskIdentity.node_id, TaskIdentity.task_id = 1, 1, 1
    data = np.zeros((64, 120), np.float32).tobytes()
    config = ConfigRecord({"a": 1, "b": 2, "c": "x", "d": 1.0, "e": True, "f": 3, "g": 4, "h": "y"})

    def exchange() -> None:
        request = ArrayRecord()
        request["x"] = Array(dtype="float32", shape=(64, 120), stype=SType.NUMPY, data=data)
        msg = Message(RecordDict({"activations": request, "config": config}), 5, "train.forward")
        msg.metadata.__dict__["_message_id"] = "m"
        reply = ArrayRecord()
        reply["x"] = Array(dtype="float32", shape=(64, 120), stype=SType.NUMPY, data=data)
        Message(RecordDict({"activations": reply, "info": ConfigRecord({"loss": 1.0})}), reply_to=msg)

    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(5000):
            exchange()
        best = min(best, (time.perf_counter() - t0) / 5000 * 1e6)
    print(f"Flower's objects of one exchange (request and reply): {best:.1f} us; x 18,700 = {best * 0.0187:.2f} s")


def profile(raw: str, rate: float = 200.0) -> None:
    """Seconds inside ``run_round`` by ClientApp handler (or the strategy), compute apart, and the
    deepest sflower frame of the rest."""
    by_part: Counter[tuple[str, bool]] = Counter()
    frames_out: Counter[str] = Counter()
    for line in open(raw):
        stack, n = line.rsplit(" ", 1)
        frames = stack.split(";")
        if not any("run_round" in f for f in frames):
            continue
        comp = any("_engine_run_backward" in f or "Module._call_impl" in f for f in frames)
        part = next((h for h in ("train_forward", "train_backward", "train_step", "ClientApp.__call__")
                     if any(h in f for f in frames)), "strategy")
        by_part[(part, comp)] += int(n)
        if not comp:
            own = next((f for f in reversed(frames) if re.search(r"\((strategies|fl_app|simulation)/", f)), "?")
            frames_out[re.sub(r":\d+\)", ")", own)] += int(n)
    total = sum(by_part.values()) / rate
    print(f"sampled in run_round: {total:.2f} s")
    for (part, comp), n in sorted(by_part.items()):
        print(f"  {part:20s} {'compute' if comp else 'other':8s} {n / rate:6.2f} s")
    print("other time by deepest sflower function:")
    for name, n in frames_out.most_common(25):
        print(f"  {n / rate:6.2f} s  {name}")


if __name__ == "__main__":
    {"compute": compute, "flower": flower, "profile": lambda: profile(sys.argv[2])}[sys.argv[1]]()
