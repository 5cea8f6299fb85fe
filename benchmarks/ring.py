"""RingSFL's relay path against a one-process oracle doing the same arithmetic (issue 11, "Speed").

A ring step costs ``2N`` hops per client batch, so the relay path is the
hot path. This benchmark times one RingSFL round (LeNet-5, MNIST, 5 clients,
lengths 8:1:1:1:1, RingSFL v2, B = 64, plain SGD at lr 0.02) side by side in
one process:

* ``oracle``: :func:`ring_oracle`, every node's model in one process; each
  client's batch runs through its ring path in one autograd graph, the
  weighted gradients are accumulated and every node steps once per step
  (eqs. 4-7). The same batches as the engines (the same seeded sampler),
  one torch thread (as the ClientApp pins).
* ``inprocess``: the real strategy and ClientApp on the in-process engine
  (:func:`simulation.engine.run_inprocess`): every hop is a message relayed
  through the ServerApp, all state in ``context.state``; the nodes keep
  live models and forward graphs as a cache of it (:mod:`fl_app.client.live`).
* ``inprocess-rebuild``: the same with that cache off: every message
  rebuilds its model from the stored weights and every backward recomputes
  its forward pass, as under Ray. It must end bit for bit where
  ``inprocess`` does.
* ``ray``: the same on Flower's Ray simulation engine
  (:func:`simulation.ray_engine.run_ray`).

The time of a round is the strategy's ``run_round`` (training and the eq. 6
average; no handshake, evaluation or engine start-up). The paper's round is
2 local epochs, ``2 × 12000 / 64 = 375`` steps (:data:`FULL_STEPS`); the full
benchmark runs that many on the oracle and in-process, and 20 on Ray (about
ten exchanges in a row per step, each waiting on Ray's polling), whose ratio
is per step.

The oracle adds each node's gradients up in the order the engine's node
received them (:func:`ring_oracle`'s ``order``; float sums depend on their
order, and this unstable setting amplifies the last bit over hundreds of
steps), and then its blended models equal the in-process engine's bit for
bit; their averages (eq. 6, computed another way) agree to ``allclose``. So
the two did the same work. The Ray engine is bit-identical to the in-process
engine (``tests/test_engines.py``).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from flwr.app import ConfigRecord
from torch import nn

from benchmarks.common import MNIST_DIR

#: Steps of the paper's round: 2 local epochs of 12,000 images (MNIST / 5) at B = 64.
FULL_STEPS = int(2 * 12000 / 64)
#: Tolerance of the oracle-equals-engine check (the average of eq. 6 is computed another way).
ATOL, RTOL = 1e-6, 0.0


def ring_oracle(task: Any, ring: Sequence[int], paths: Sequence[Sequence[tuple[int, int, int]]],
                counts: Sequence[Sequence[int]], lr: float, batch: int, steps: int = 1,
                order: Sequence[Sequence[Sequence[int]]] | None = None,
                ) -> tuple[list[dict[str, torch.Tensor]], dict[str, torch.Tensor], list[float]]:
    """``steps`` RingSFL steps of every client in one process (eqs. 4-7).

    Each node ``j`` starts from a copy of the global model. In each step,
    client ``i``'s next batch (the seeded sampler of its partition, as on the
    nodes) runs through ``paths[i]`` (``(node, start, end)`` hops) in one
    autograd graph; the gradient of its mean cross-entropy, times
    ``a_i = D_i/ΣD``, is added to the blocks it crossed; then node ``j`` steps
    block ``b`` by ``lr · N · counts[j][b] · Σ a_i g_i`` (``counts`` all 1
    for v1).

    Args:
        order: ``order[step][j]``, the origins whose gradients node ``j`` adds
            up, in the order it adds them (default: ascending). Float sums
            depend on their order; a run that is long and unstable enough
            amplifies that last bit, so the benchmark passes the order in
            which the engine's nodes received their work.

    Returns:
        the blended models (state dicts by ring position), their plain
        average (eq. 6) and the losses of every batch.
    """
    from fl_app.learning.training import load_batch, sample_batch

    n = len(ring)
    names = task.build_model().names
    models = [task.build_model() for _ in ring]
    data = [task.num_examples(p) for p in ring]
    samplers = [ConfigRecord() for _ in ring]
    block_of = {k: names.index(k.split(".")[1]) for k, _ in models[0].named_parameters()}
    losses: list[float] = []
    for step in range(steps):
        # node j -> origin i -> parameter name -> a_i · g
        parts: list[dict[int, dict[str, torch.Tensor]]] = [{} for _ in ring]
        for i, pid in enumerate(ring):
            x, y = load_batch(task, pid, sample_batch(task, pid, samplers[i], batch), step)
            h, params = x, []
            for j, a, b in paths[i]:
                segment = models[j].segment(a, b)
                h = segment(h)
                params += [(j, k, p) for k, p in segment.named_parameters()]
            loss = nn.functional.cross_entropy(h, y)
            losses.append(float(loss.detach()))
            grads = torch.autograd.grad(loss, [p for _, _, p in params])
            for (j, k, _), g in zip(params, grads):
                parts[j].setdefault(i, {})[k] = data[i] / sum(data) * g
        with torch.no_grad():
            for j, m in enumerate(models):
                acc: dict[str, torch.Tensor] = {}
                for i in (order[step][j] if order is not None else sorted(parts[j])):
                    for k, g in parts[j].get(i, {}).items():  # a range without parameters adds nothing
                        acc[k] = acc[k] + g if k in acc else g
                for k, p in m.named_parameters():
                    if k in acc:
                        p.add_(acc[k], alpha=-(lr * n * counts[j][block_of[k]]))
    blended = [{k: v.detach().clone() for k, v in m.state_dict().items()} for m in models]
    average = {k: sum(s[k] for s in blended) / n for k in blended[0]}
    return blended, average, losses


def ring_config(steps: int, data_dir: str | Path, output_dir: str | Path, version: int = 2,
                **overrides: Any) -> dict[str, Any]:
    """The run configuration of the benchmark: one round of ``steps`` ring steps (issue 11's setting)."""
    values = dict(strategy="ringsfl", dataset="mnist", data_dir=str(data_dir), model="lenet5", num_clients=5,
                  concurrency=5, partition="iid", ring_lengths="8:1:1:1:1", ring_version=version,
                  global_iterations=1, local_iterations=steps, batch_size=64, lr=0.02, momentum=0.0,
                  weight_decay=0.0, clip_norm=0.0, eval_every=0, eval_samples=1000, seed=0,
                  output_dir=str(output_dir))
    values.update(overrides)
    return {k.replace("_", "-"): v for k, v in values.items()}


def _timed_strategy(cls: type) -> type:
    """``cls`` recording each instance, the wall seconds of each ``run_round``, and when each
    RingSFL step starts (its first forward is sent); evaluations use ``eval-samples`` images
    (they are not timed; the final one would otherwise take the whole test set)."""

    class Timed(cls):  # type: ignore[misc, valid-type]
        instances: list[Any] = []

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            self.round_seconds: list[float] = []
            #: perf_counter() when each step of the last round started, and when the round ended
            self.step_starts: list[float] = []
            self.round_end = 0.0
            #: (tag, partition id) of every RingSFL forward and backward request of the last round
            self.sends: list[tuple[tuple, int]] = []
            Timed.instances.append(self)

        def run_round(self, *args: Any) -> None:
            self.step_starts, self.sends = [], []
            t0 = time.perf_counter()
            super().run_round(*args)
            self.round_end = time.perf_counter()
            self.round_seconds.append(self.round_end - t0)

        def send(self, pid: int, request: Any) -> Any:
            tag = request.tag
            if isinstance(tag, tuple) and len(tag) == 4 and tag[0] == "fwd" and tag[2:] == (0, 0):
                self.step_starts.append(time.perf_counter())
            if isinstance(tag, tuple) and len(tag) == 4 and tag[0] in ("fwd", "bwd"):
                self.sends.append((tag, pid))
            return super().send(pid, request)

        def accumulation_order(self) -> list[list[list[int]]]:
            """``[step][ring position]``: the origins whose gradients each node added up, in order.

            A node runs its requests in the order they were sent; the ones that
            accumulate are the backward passes and the forward passes that end
            a path (they compute the loss and back-propagate at once).
            """
            n, steps = len(self.ring), self.cfg.local_iterations
            out: list[list[list[int]]] = [[[] for _ in range(n)] for _ in range(steps)]
            position = {pid: j for j, pid in enumerate(self.ring)}
            for (kind, step, origin, hop), pid in self.sends:
                if kind == "bwd" or hop == n - 1:
                    out[step][position[pid]].append(origin)
            return out

        def steady_step_seconds(self) -> float:
            """Seconds per step after the first (which also loads models and warms up), or per step."""
            if len(self.step_starts) >= 2:
                return (self.round_end - self.step_starts[1]) / (len(self.step_starts) - 1)
            return self.round_seconds[-1] / max(len(self.step_starts), 1)

        def evaluate_global(self, full: bool = True) -> Any:
            return super().evaluate_global(full=False)

    return Timed


def time_engine(engine: str, cfg: dict[str, Any], live: bool = True) -> tuple[float, Any]:
    """Run ``cfg`` on ``engine`` (``inprocess`` or ``ray``); the seconds of its one round and the strategy.

    ``live=False`` turns off the in-process nodes' live models and graphs
    (:mod:`fl_app.client.live`): every message rebuilds its model and every backward
    recomputes its forward pass, as under Ray.
    """
    from fl_app.client import live as live_objects
    from fl_app.run.config import RunConfig
    from simulation.server_app import plan_run
    from simulation.engine import run_inprocess
    from simulation.ray_engine import run_ray

    plan = plan_run(RunConfig.from_mapping(cfg))
    timed = _timed_strategy(plan.strategy_cls)
    plan = dataclasses.replace(plan, strategy_cls=timed)
    saved, live_objects.ENABLED = live_objects.ENABLED, live
    try:
        (run_inprocess if engine == "inprocess" else run_ray)(plan, progress=False)
    finally:
        live_objects.ENABLED = saved
    (strategy,) = timed.instances
    return strategy.round_seconds[0], strategy


def time_oracle(cfg: dict[str, Any], order: Sequence[Sequence[Sequence[int]]] | None = None,
                ) -> tuple[float, tuple[Any, ...]]:
    """Run :func:`ring_oracle` on the setting of ``cfg`` (summing in ``order``) with one torch thread;
    its seconds and results."""
    from fl_app.run.config import RunConfig
    from fl_app.learning.task import load_task
    from strategies.algorithms.ringsfl.schedule import overlap_counts, parse_lengths, ring_path

    rc = RunConfig.from_mapping(cfg)
    task = load_task(rc)
    lengths = list(parse_lengths(rc.ring_lengths))
    ring = list(range(rc.num_clients))
    paths = [ring_path(lengths, i) for i in ring]
    counts = overlap_counts(lengths) if rc.ring_version == 2 else [[1] * sum(lengths) for _ in ring]
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        t0 = time.perf_counter()
        out = ring_oracle(task, ring, paths, counts, rc.lr, rc.batch_size, rc.local_iterations, order)
        return time.perf_counter() - t0, out
    finally:
        torch.set_num_threads(old)


def max_abs_diff(strategy: Any, blended: Sequence[dict[str, torch.Tensor]], average: dict[str, torch.Tensor]) -> float:
    """Largest absolute difference between the engine's blended models and their average and the oracle's."""
    diff = 0.0
    for pos, pid in enumerate(strategy.ring):
        for k, v in blended[pos].items():
            diff = max(diff, float((strategy.blended[pid][k] - v).abs().max()))
    for k, v in strategy.model.state_dict().items():
        diff = max(diff, float((v - average[k]).abs().max()))
    return diff


def same_weights(strategy: Any, blended: Sequence[dict[str, torch.Tensor]], average: dict[str, torch.Tensor]) -> bool:
    """Whether the engine's blended models and their average are ``allclose`` to the oracle's
    (:data:`ATOL`, :data:`RTOL`)."""
    pairs = [(strategy.blended[pid][k], v) for pos, pid in enumerate(strategy.ring) for k, v in blended[pos].items()]
    pairs += [(v, average[k]) for k, v in strategy.model.state_dict().items()]
    return all(torch.allclose(a, b, atol=ATOL, rtol=RTOL) for a, b in pairs)


#: Child-script code timing one ring round (:func:`time_engine`) in the tree it runs in (``benchmarks/ring.py``;
#: in older revisions the bench package under ``simulation`` or ``bench_ring.py``); the configuration is argv[1] as JSON.
_RING_CHILD = r"""
import json, pathlib, sys, simulation
if (pathlib.Path(simulation.__file__).parent.parent / "benchmarks" / "ring.py").exists():
    from benchmarks import ring
elif (pathlib.Path(simulation.__file__).parent / "bench" / "ring.py").exists():  # before benchmarks/ left the package
    from simulation.bench import ring
else:  # a revision before issue 22
    from simulation import bench_ring as ring
seconds, strategy = ring.time_engine("inprocess", json.loads(sys.argv[1]))
print(json.dumps({"seconds": seconds, "exchanges": strategy.dispatcher.exchanges,
                  "train_loss": strategy.train_loss}))
"""


def ring_against(tmp: Path, against: str, steps: int, data_dir: str | Path, repeats: int = 3) -> dict[str, Any]:
    """One in-process RingSFL v2 round of ``steps`` steps for git revision ``against`` (old) and this checkout
    (new), alternately, each in a fresh interpreter (:func:`~benchmarks.common.side_by_side`).

    The figure per side is the fastest round (seconds); ``round_new_over_old``
    their ratio (below 1: the new code is faster). ``same_results``: every
    run gave the same training loss and exchange count.

    Raises:
        ConfigError: ``against`` is not a commit of this checkout.
        RuntimeError: a run failed (its last error line).
    """
    import json

    from benchmarks.common import run_in_tree, side_by_side

    runs = side_by_side(against, tmp / "ring-against", repeats, lambda src, out: run_in_tree(
        src, ["-c", _RING_CHILD, json.dumps(ring_config(steps, data_dir, out))], "ring round"))
    out: dict[str, Any] = {"against": against, "steps": steps, "repeats": repeats}
    for side, rs in runs.items():
        out[side] = {"round_s": min(r["seconds"] for r in rs), "runs_s": [r["seconds"] for r in rs]}
    out["round_new_over_old"] = out["new"]["round_s"] / out["old"]["round_s"]
    out["same_results"] = len({(json.dumps(r["train_loss"]), r["exchanges"])
                               for rs in runs.values() for r in rs}) == 1
    return out


def run(tmp: Path, quick: bool = False, data_dir: str | Path | None = None, *, steps: int | None = None,
        ray_steps: int | None = None, repeats: int | None = None, ray: bool = True,
        baseline: bool = True) -> dict[str, Any]:
    """Time the oracle and the engines on one round; print a table; return the figures.

    The oracle and the in-process engine run alternately ``repeats`` times
    on the same steps (this machine is shared and noisy); each figure is the
    fastest of its repeats, and the ratio is of those (the ratio of every
    alternate pair is listed too). The Ray engine runs once, on fewer steps
    (``ray_steps``); its ratio is per step.

    Args:
        tmp: a scratch directory for the runs' outputs.
        quick: 20 steps and 3 on Ray; else :data:`FULL_STEPS` (the paper's
            round) and 20 on Ray. The Ray figure is per step after its first
            step (which starts the actors and loads the data in each).
        data_dir: the MNIST IDX directory (default :data:`MNIST_DIR`).
        steps, ray_steps: override those numbers; repeats: alternate runs (default 2).
        ray: also time the Ray engine.
        baseline: also time the in-process engine without its nodes' live
            models and graphs (``inprocess-rebuild``: every message rebuilds
            its model and every backward recomputes, as under Ray).

    Raises:
        RuntimeError: the in-process engine's weights differ from the oracle's,
            or the two in-process variants differ from each other at all.
    """
    steps = steps or (20 if quick else FULL_STEPS)
    ray_steps = ray_steps or (3 if quick else 20)
    repeats = repeats or 2
    data = Path(data_dir) if data_dir else MNIST_DIR
    cfg = ring_config(steps, data, tmp / "ring-inprocess")
    times: dict[str, list[float]] = {"oracle": [], "inprocess": [], "inprocess-rebuild": []}
    result = strategies = None
    for _ in range(repeats):
        t, s_in = time_engine("inprocess", cfg)
        times["inprocess"].append(t)
        t, result = time_oracle(cfg, s_in.accumulation_order())  # the engine's nodes' order of sums
        times["oracle"].append(t)
        if baseline:
            t, s_rebuild = time_engine("inprocess", cfg, live=False)
            times["inprocess-rebuild"].append(t)
            strategies = (s_in, s_rebuild)
    blended, average, _ = result
    diff = max_abs_diff(s_in, blended, average)
    same = same_weights(s_in, blended, average)
    identical = all(torch.equal(s_in.blended[pid][k], blended[pos][k])
                    for pos, pid in enumerate(s_in.ring) for k in blended[pos])
    oracle = min(times["oracle"])
    out: dict[str, Any] = {
        "setting": f"lenet5 mnist, 5 clients, 8:1:1:1:1, v2, B=64, {steps} steps (the full round: {FULL_STEPS})",
        "oracle": {"steps": steps, "seconds": oracle, "s_per_step": oracle / steps, "runs": times["oracle"]},
    }
    for name in ("inprocess", "inprocess-rebuild"):
        if times[name]:
            best = min(times[name])
            out[name] = {"steps": steps, "seconds": best, "s_per_step": best / steps, "runs": times[name],
                         "ratio_to_oracle": best / oracle,
                         "pair_ratios": [e / o for e, o in zip(times[name], times["oracle"])],
                         "exchanges": s_in.dispatcher.exchanges}
    out["oracle_equals_inprocess"] = same
    out["blended_bit_identical"] = identical
    out["max_abs_diff"] = diff
    if strategies is not None:
        a, b = strategies
        out["rebuild_bit_identical"] = all(torch.equal(a.blended[p][k], b.blended[p][k]) for p in a.blended
                                           for k in a.blended[p]) and a.train_loss == b.train_loss
    if ray:
        t_ray, s_ray = time_engine("ray", ring_config(ray_steps, data, tmp / "ring-ray"))
        per_step = s_ray.steady_step_seconds()
        out["ray"] = {"steps": ray_steps, "seconds": t_ray, "s_per_step": per_step,
                      "first_step_s": s_ray.step_starts[1] - s_ray.step_starts[0] if ray_steps > 1 else t_ray,
                      "exchanges": s_ray.dispatcher.exchanges, "ratio_to_oracle": per_step / (oracle / steps)}
    print(f"ring: {out['setting']}; fastest of {repeats} alternate runs")
    print(f"{'':<18} {'steps':>6} {'seconds':>9} {'ms/step':>9} {'ratio':>8}   ratio of each alternate pair")
    for name in ("oracle", "inprocess", "inprocess-rebuild", "ray"):
        if name in out:
            r = out[name]
            ratio = f"{r['ratio_to_oracle']:.2f}x" if "ratio_to_oracle" in r else "1.00x"
            pairs = " ".join(f"{v:.2f}" for v in r.get("pair_ratios", []))
            if name == "ray":
                pairs = f"(ms/step and ratio after its first step, which took {r['first_step_s']:.1f} s)"
            print(f"{name:<18} {r['steps']:>6} {r['seconds']:>9.2f} {1e3 * r['s_per_step']:>9.2f} {ratio:>8}   {pairs}")
    print(f"oracle == inprocess (allclose atol={ATOL:g} rtol={RTOL:g}): {same}; max |diff| {diff:.2e}; "
          f"blended models bit for bit: {identical}"
          + (f"; inprocess == inprocess-rebuild bit for bit: {out['rebuild_bit_identical']}"
             if "rebuild_bit_identical" in out else ""), flush=True)
    if not same:
        raise RuntimeError(f"the in-process engine's weights differ from the oracle's (max |diff| {diff:.2e})")
    if out.get("rebuild_bit_identical") is False:
        raise RuntimeError("the in-process engine's live models changed a number")
    return out
