"""RingSFL's schedule: propagation lengths, each client's path round the ring, overlap counts, failures.

Source: the RingSFL paper (Shen et al.), Sec. 3.3 (eq. 3, the lengths),
Algorithm 2 (the paths) and eq. 7 (the overlap counts); see
:mod:`strategies.algorithms.ringsfl.strategy` for the strategy. Pure functions of the lengths,
plus :class:`RingSchedule`, everything one ring round needs to know before
it starts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from fl_app.run.config import RunConfig
from fl_app.run.errors import ConfigError
from fl_app.learning.task import Task

#: Seed stream of the injected failures (``drop-per-round``).
STREAM_RING_DROP = 37


def parse_lengths(text: str) -> tuple[int, ...]:
    """``"8:1:1:1:1"`` -> ``(8, 1, 1, 1, 1)``; ``""`` -> ``()``.

    Raises:
        ConfigError: an entry is not an integer >= 1.
    """
    text = text.strip()
    if not text:
        return ()
    out = []
    for part in text.split(":"):
        try:
            value = int(part.strip())
        except ValueError:
            raise ConfigError(f"ring-lengths='{text}': '{part}' is not an integer (write e.g. 8:1:1:1:1)") from None
        if value < 1:
            raise ConfigError(f"ring-lengths='{text}': every propagation length must be >= 1")
        out.append(value)
    return tuple(out)


def propagation_lengths(shares: Sequence[float], total: int) -> list[int]:
    """RingSFL's propagation lengths ``L_i = C_i / ΣC · W`` (Sec. 3.3, eq. 3), as integers.

    ``share_i / Σ share · total`` rounded by largest remainder (ties to the
    lower index), then every length raised to at least 1, each unit taken
    from the longest (lowest index among equals); so ``Σ L_i = total``.

    Args:
        shares: ``N`` positive weights, e.g. compute speeds ``C_i`` in FLOP/s
            or the hand lengths of the clients left in a ring.
        total: the block count ``W``.

    Returns:
        ``N`` integers ``>= 1`` summing to ``total``; e.g. speeds 2:1:1 on
        ``W = 12`` give ``[6, 3, 3]``, 1:1:1 on 10 give ``[4, 3, 3]``.

    Raises:
        ConfigError: no shares, a share that is not positive and finite, or
            more shares than blocks.
    """
    n = len(shares)
    if n == 0:
        raise ConfigError("a ring needs at least one client")
    if n > total:
        raise ConfigError(f"a ring of {n} clients needs at least {n} model blocks, the model has {total}")
    if not all(s > 0 and math.isfinite(s) for s in shares):
        raise ConfigError(f"propagation-length shares must be positive and finite, got {list(shares)}")
    s_total = float(sum(shares))
    ideal = [float(s) / s_total * total for s in shares]
    lengths = [int(math.floor(x)) for x in ideal]
    order = sorted(range(n), key=lambda i: (-(ideal[i] - lengths[i]), i))
    for i in order[:total - sum(lengths)]:
        lengths[i] += 1
    for i in range(n):
        while lengths[i] < 1:
            donor = min(range(n), key=lambda j: (-lengths[j], j))
            lengths[donor] -= 1
            lengths[i] += 1
    return lengths


def ring_path(lengths: Sequence[int], origin: int) -> list[tuple[int, int, int]]:
    """The path of the client at ring position ``origin`` (Algorithm 2, lines 1-6).

    Its batch visits positions ``origin, origin+1, …`` (mod ``N``); position
    ``j`` runs blocks ``[l, l + L_j)`` of its own model, where ``l`` is the sum
    of the lengths of the positions visited before (``l_stop + 1``).

    Returns:
        ``N`` hops ``(position, start, end)``: block ranges, ``end``
        exclusive, covering ``[0, Σ L)`` in order.
    """
    n = len(lengths)
    out, start = [], 0
    for k in range(n):
        j = (origin + k) % n
        out.append((j, start, start + lengths[j]))
        start += lengths[j]
    return out


def overlap_counts(lengths: Sequence[int]) -> list[list[int]]:
    """``|U_{j,(b)}|``: how many client paths cross block ``b`` of node ``j``'s model (eq. 7).

    Fig. 5 (2 clients, lengths 2:4 on 6 blocks): node 0 ``[1, 1, 0, 0, 1, 1]``,
    node 1 ``[1, 1, 2, 2, 1, 1]`` (its blocks 2-3 overlap). Every block has
    ``N`` crossings over all nodes together.

    Returns:
        ``N`` lists of ``W = Σ L`` non-negative integers, by ring position.
    """
    n, total = len(lengths), int(sum(lengths))
    counts = [[0] * total for _ in range(n)]
    for origin in range(n):
        for j, a, b in ring_path(lengths, origin):
            for block in range(a, b):
                counts[j][block] += 1
    return counts


def ring_lengths(ring: Sequence[int], hand: Sequence[int], total: int,
                 compute_shares: Callable[[Sequence[int]], list[float]]) -> list[int]:
    """``L`` for a ring (partition ids in ring order): the hand lengths ``hand`` (one per client of the
    run, by partition id), rescaled over the members when the ring has lost some
    (:func:`propagation_lengths`), or, without hand lengths, from ``compute_shares(ring)`` (speeds ``C_i``)."""
    if hand:
        if len(ring) == len(hand):
            return list(hand)
        return propagation_lengths([hand[p] for p in ring], total)
    return propagation_lengths(compute_shares(ring), total)


def injected_failures(seed: int, drop: int, iteration: int, members: Sequence[int], steps: int,
                      ) -> tuple[list[int], int]:
    """``drop-per-round``: the members that fail this round and the step at which they do.

    Drawn from ``(seed, STREAM_RING_DROP, iteration)``; at least one member is left.

    Returns:
        ``(failing partition ids ascending, step index in [0, steps))``, or ``([], -1)`` when none fail.
    """
    k = min(drop, len(members) - 1)
    if k <= 0:
        return [], -1
    rng = np.random.default_rng([seed, STREAM_RING_DROP, iteration])
    chosen = sorted(int(members[i]) for i in rng.choice(len(members), size=k, replace=False))
    return chosen, int(rng.integers(0, steps))


@dataclass(frozen=True)
class RingSchedule:
    """One round's ring: its members, lengths, paths, aggregation weights and per-block rate multipliers.

    Attributes:
        ring: partition ids in ring order.
        lengths: ``L_j`` by ring position.
        paths: per origin position, its hops ``(position, start, end)`` (:func:`ring_path`).
        weights: ``a_i = D_i / ΣD`` by ring position.
        lr_scale: per ring position, each block's learning-rate multiplier: its overlap count
            ``max(|U_{j,(b)}|, 1)`` in v2 (eq. 7), empty (all 1) in v1.
    """

    ring: tuple[int, ...]
    lengths: tuple[int, ...]
    paths: tuple[tuple[tuple[int, int, int], ...], ...]
    weights: tuple[float, ...]
    lr_scale: tuple[tuple[float, ...], ...]

    @classmethod
    def build(cls, ring: Sequence[int], lengths: Sequence[int], examples: Sequence[int], version: int,
              ) -> RingSchedule:
        """The schedule of ``ring`` with ``lengths``; ``examples``: ``D_i`` by ring position; ``version``: 1 or 2."""
        n = len(ring)
        paths = tuple(tuple(ring_path(lengths, i)) for i in range(n))
        weights = tuple(d / sum(examples) for d in examples)  # a_i = D_i / ΣD
        scale = overlap_counts(lengths) if version == 2 else None
        lr_scale = tuple(tuple(float(max(s, 1)) for s in scale[j]) if scale is not None else () for j in range(n))
        return cls(tuple(ring), tuple(lengths), paths, weights, lr_scale)

    @property
    def size(self) -> int:
        """``N``, the ring's member count."""
        return len(self.ring)


def check_ring(cfg: RunConfig, task: Task) -> None:
    """RingSFL's checks of a configuration: lengths, ring size, failures and optimiser against the model's ``W`` blocks.

    Raises:
        ConfigError: more clients than blocks; hand lengths not one per
            client or not summing to ``W``; ``drop-per-round`` leaving no
            client; an optimiser other than SGD.
    """
    total = len(task.profiles)
    n = cfg.num_clients
    if n > total:
        raise ConfigError(f"ringsfl: {n} clients need at least {n} model blocks; {task.model_name} has {total}")
    hand = parse_lengths(cfg.ring_lengths)
    if hand and len(hand) != n:
        raise ConfigError(f"ring-lengths='{cfg.ring_lengths}' has {len(hand)} entries for {n} clients")
    if hand and sum(hand) != total:
        raise ConfigError(f"ring-lengths='{cfg.ring_lengths}' sums to {sum(hand)}; {task.model_name} has "
                          f"{total} blocks")
    if cfg.drop_per_round >= n:
        raise ConfigError(f"drop-per-round={cfg.drop_per_round} leaves no client of {n} in the ring")
    if cfg.get("optimizer") != "sgd":
        raise ConfigError(f"ringsfl trains with SGD (eqs. 4-7), not optimizer={cfg.get('optimizer')}")
