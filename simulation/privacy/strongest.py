"""The strongest known attacks of an honest-but-curious server, and the worst case over them.

``sflower attack`` runs, beside the learned decoder (:mod:`.inversion`) and
norm/direction scoring (:mod:`.label_leakage`), every attack below on what
the server legitimately holds (:class:`ServerHoldings`), each a function of
those holdings only, so that it can be pointed at any mode that changes them:

labels (U-shaped runs; scored against the clients' own record, ``tail-K.npys``):

* ``gradient-matching static`` / ``gradient-matching tracked``
  (:func:`simulation.privacy.matching.track_tail`): needs the tail's weights
  (sent or received by the server, or the run's seed's for the first) and the
  ``z`` it sent;
* ``update-counts`` (:mod:`.update_labels`): needs only the tails a client
  started from and uploaded; scored as a label histogram per client and round;
* ``kmeans`` / ``spectral`` (:mod:`.clustering`): needs only the gradient rows;
  scored with the Hungarian assignment (the ceiling) and with ``m`` known
  labelled rows (``known_labels``);

inputs (every run with received activations):

* ``white-box least squares`` or ``white-box rMLE`` (:mod:`.whitebox`): needs
  the client-side model ``[0, c1)`` the server holds (the aggregated head, or
  each client's head where the run saved them: ``model-clients.safetensors``);
* ``decoder`` (:mod:`.inversion`, the existing measurement).

An attack whose inputs the server does not hold gets a row with ``held:
false`` and the reason, never a weaker substitute. :func:`worst_case` names
the strongest label attack (accuracy against chance: the most frequent
label's share; attacks with different chances are ranked by their
normalised advantage over it) and the strongest inversion (PSNR).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch
from torch import nn

#: Known labelled rows the clustering attack is scored with (besides one per cluster).
KNOWN_COUNTS = (10, 20, 50, 100, 200)


@dataclass
class ServerHoldings:
    """What the server holds after a run, as the attacks read it.

    Attributes:
        num_classes: ``K``.
        tail_events: per client, the server's record of its tail (:func:`simulation.privacy.record.read_tail_events`),
            or None where none was recorded.
        initial_tail: the tail the run's seed builds (every party can), or None (not U-shaped).
        heads: per client the client-side model ``[0, c1)`` the server holds for it (key ``-1``: one shared by
            every client); empty where it holds none.
        heads_note: where the heads come from (or why none is held).
        activations: per client the activations it received ``[B, ...]``.
        input_shape: ``(C, H, W)`` of the inputs.
        bounds: the valid range of a normalised input, ``(lo, hi)``.
        act_clip: the run's ``act-clip`` (0: off), which the attacker knows from the configuration.
    """

    num_classes: int
    tail_events: dict[int, list[dict[str, Any]]] | None = None
    initial_tail: nn.Module | None = None
    heads: dict[int, nn.Module] = field(default_factory=dict)
    heads_note: str = ""
    activations: dict[int, torch.Tensor] = field(default_factory=dict)
    input_shape: tuple[int, ...] = ()
    bounds: tuple[float, float] | None = None
    act_clip: float = 0.0


def _row(attack: str, kind: str, held: bool, **extra: Any) -> dict[str, Any]:
    return {"attack": attack, "kind": kind, "held": held, **extra}


def _chance(labels: np.ndarray) -> float:
    return float(np.bincount(labels).max() / len(labels))


def _rounds(events: list[dict[str, Any]]) -> list[tuple[dict[str, torch.Tensor] | None, dict[str, torch.Tensor],
                                                         int, int, dict[str, Any]]]:
    """``(start weights or None (the seed's), uploaded weights, first row, rows, a forward config)`` per round
    of one client's events: a round ends with an upload."""
    out, start, first, rows, cfg = [], None, 0, 0, None
    for ev in events:
        if ev["kind"] == "sent":
            start = ev["weights"]
        elif ev["kind"] == "forward":
            rows += len(ev["g"])
            cfg = ev["config"]
        elif ev["kind"] == "uploaded":
            if rows and cfg is not None:
                out.append((start, ev["weights"], first, rows, cfg))
            start, first, rows = ev["weights"], first + rows, 0
    return out


def label_attacks(held: ServerHoldings, labels: dict[int, np.ndarray], seed: int = 0) -> list[dict[str, Any]]:
    """Every label attack on ``held``'s tail record, scored against ``labels`` (per client, the true labels of
    its tail rows in the recorded order: the evaluator's). Rows: ``attack``, ``accuracy``, ``chance``,
    ``samples`` (and attack-specific keys); ``held: false`` with ``reason`` where the server lacks an input."""
    from simulation.privacy.clustering import (cluster_rows, known_label_accuracy, matched_accuracy,
                                               one_per_cluster_accuracy)
    from simulation.privacy.matching import track_tail
    from simulation.privacy.update_labels import bag_accuracy, label_counts, last_bias_key

    if held.tail_events is None:
        reason = "the run recorded no tail weights or z (privacy/tails.safetensors): rerun with privacy-record=true"
        return [_row(a, "labels", False, reason=reason) for a in
                ("gradient-matching static", "gradient-matching tracked", "update-counts", "kmeans", "spectral")]
    pids = sorted(p for p in labels if p in held.tail_events)
    truth = np.concatenate([labels[p] for p in pids])
    chance, n = _chance(truth), int(len(truth))
    grads = np.concatenate([torch.cat([e["g"] for e in held.tail_events[p] if e["kind"] == "forward"]).numpy()
                            for p in pids])
    rows: list[dict[str, Any]] = []
    assert held.initial_tail is not None
    tracks = {p: track_tail(held.initial_tail, held.tail_events[p], held.num_classes) for p in pids}
    for name, attr in (("gradient-matching static", "static"), ("gradient-matching tracked", "tracked")):
        guess = np.concatenate([getattr(tracks[p], attr).numpy() for p in pids])
        extra = {}
        if attr == "tracked":
            errs = [e for p in pids for e in tracks[p].errors]
            extra = {"tracking_error": max(errs) if errs else None, "exact": all(t.exact for t in tracks.values())}
        rows.append(_row(name, "labels", True, accuracy=float((guess == truth).mean()), chance=chance, samples=n,
                         **extra))
    bags, uniform, weights = [], [], []
    bias = last_bias_key(dict(held.initial_tail.state_dict()), held.num_classes)
    for p in pids:
        for start, end, first, count, cfg in _rounds(held.tail_events[p]):
            start = start if start is not None else dict(held.initial_tail.state_dict())
            b = int(cfg.get("batch-size") or count)  # cfg: the request's optimiser; an absent key is none
            est = label_counts(start[bias], end[bias], lr=float(cfg["lr"]), batch_size=b, steps=max(count // b, 1),
                               momentum=float(cfg.get("momentum") or 0.0), weight_decay=float(cfg.get("weight-decay") or 0.0))
            bags.append(bag_accuracy(est, labels[p][first:first + count]))
            uniform.append(bag_accuracy(np.full(held.num_classes, count // held.num_classes), labels[p][first:first + count]))
            weights.append(count)
    if bias is None or not bags:
        rows.append(_row("update-counts", "labels", False, reason="no uploaded tail (or no output bias) to read"))
    else:
        rows.append(_row("update-counts", "labels", True, accuracy=float(np.average(bags, weights=weights)),
                         chance=float(np.average(uniform, weights=weights)), samples=int(sum(weights)),
                         scored="label histogram per client and round (chance: the uniform histogram's)"))
    for method in ("kmeans", "spectral"):
        clusters = cluster_rows(grads, held.num_classes, method, seed)
        known = {str(m): known_label_accuracy(clusters, truth, m, seed=seed) for m in KNOWN_COUNTS if m <= n}
        known["one per cluster"] = one_per_cluster_accuracy(clusters, truth, seed=seed)
        rows.append(_row(method, "labels", True, accuracy=matched_accuracy(clusters, truth), chance=chance, samples=n,
                         scored="clusters named by the Hungarian assignment", known_labels=known))
    return rows


def inversion_attacks(held: ServerHoldings, originals: dict[int, torch.Tensor], to_pixels: Any,
                      rmle_steps: int = 500) -> list[dict[str, Any]]:
    """The white-box inversion of ``held.activations`` through ``held.heads``, scored against ``originals``
    (per client, the normalised inputs ``[B, C, H, W]``); ``to_pixels`` maps normalised inputs to ``[0, 1]``.
    One row: ``attack`` (least squares where every head is affine, else rMLE), ``psnr``, ``ssim``, ``mse``,
    ``samples``, ``recon`` (the reconstructions, pixels; popped by the caller)."""
    from simulation.privacy.inversion import scores
    from simulation.privacy.whitebox import invert_affine, invert_rmle, is_affine

    if not held.heads:
        return [_row("white-box", "inputs", False, reason=held.heads_note or "the server holds no client-side model")]
    recon, orig, methods = [], [], set()
    for pid in sorted(originals):
        head = held.heads.get(pid, held.heads.get(-1))
        if head is None or pid not in held.activations:
            continue
        z = held.activations[pid]
        if is_affine(head, held.input_shape):
            methods.add("least squares")
            x = invert_affine(head, z, held.input_shape, clipped=held.act_clip > 0, bounds=held.bounds)
        else:
            methods.add("rMLE")
            x = invert_rmle(head, z, held.input_shape, steps=rmle_steps, clip=held.act_clip, bounds=held.bounds)
        recon.append(to_pixels(x))
        orig.append(to_pixels(originals[pid]))
    if not recon:
        return [_row("white-box", "inputs", False, reason="no client's head and activations are both held")]
    r, o = torch.cat(recon), torch.cat(orig)
    return [_row(f"white-box {' + '.join(sorted(methods))}", "inputs", True, samples=len(r), heads=held.heads_note,
                 recon=r, **scores(r, o))]


def advantage(row: dict[str, Any]) -> float:
    """A label attack's accuracy above its chance, normalised: ``(accuracy − chance) / (1 − chance)`` (1: every
    label; 0: no better than chance). Attacks scored against different chances compare by it."""
    return (row["accuracy"] - row["chance"]) / max(1.0 - row["chance"], 1e-12)


def worst_case(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The strongest label attack (the highest :func:`advantage` over chance) and the strongest inversion
    (highest PSNR) of ``rows``, each ``{"attack", "accuracy"|"psnr", ...}``, or None where no such attack was
    held; and ``not_held``: the attacks the server could not run, with their reasons."""
    labels = [r for r in rows if r["kind"] == "labels" and r["held"]]
    inputs = [r for r in rows if r["kind"] == "inputs" and r["held"]]
    best_l = max(labels, key=advantage, default=None)
    best_i = max(inputs, key=lambda r: r["psnr"], default=None)
    return {"labels": None if best_l is None else {**{k: best_l[k] for k in ("attack", "accuracy", "chance")},
                                                   "advantage": advantage(best_l)},
            "inputs": None if best_i is None else {k: best_i[k] for k in ("attack", "psnr", "ssim")},
            "not_held": {r["attack"]: r["reason"] for r in rows if not r["held"]}}


def headline_lines(report: dict[str, Any]) -> list[str]:
    """The lines ``sflower attack`` prints of ``report`` (``{"attacks": rows, "worst_case": ...}``)."""
    out = []
    for r in report["attacks"]:
        if not r["held"]:
            out.append(f"  {r['attack']}: not held by the server ({r['reason']})")
        elif r["kind"] == "label-auc":
            out.append(f"  {r['attack']}: AUC norm {r['norm_auc']:.3f}, direction {r['direction_auc']:.3f} (0.5 chance)")
        elif r["kind"] == "labels":
            extra = f", tracking error {r['tracking_error']:.2g}" if r.get("tracking_error") is not None else ""
            out.append(f"  {r['attack']}: label accuracy {r['accuracy']:.3f} (chance {r['chance']:.3f}){extra}")
        else:
            out.append(f"  {r['attack']}: PSNR {r['psnr']:.2f} dB, SSIM {r['ssim']:.3f}")
    w = report["worst_case"]
    lab = "labels: sent to the server (prefix split)" if report.get("prefix") else (
        "labels: no label attack held" if w["labels"] is None else
        f"labels {w['labels']['accuracy']:.3f} (chance {w['labels']['chance']:.3f}, {w['labels']['attack']})")
    inp = "inputs: none" if w["inputs"] is None else f"inputs PSNR {w['inputs']['psnr']:.2f} dB ({w['inputs']['attack']})"
    return [f"worst case over all attacks: {lab}; {inp}", *out]
