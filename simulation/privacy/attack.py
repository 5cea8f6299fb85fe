"""``sflower attack RUN_DIR``: model inversion of the activations a run's server received, as a measurement.

After a run with ``privacy-record=true`` (and, for its auxiliary data,
``aux-holdout=N``), the attack plays the honest-but-curious server
(:mod:`simulation.privacy.inversion` for the method):

1. its auxiliary data: the run's held-out slice (``aux-holdout``), which no
   client's partition contains (``aux=test``: the test set instead, which
   the server holds for its evaluation anyway);
2. its client-side model: the final one the strategy uploaded
   (``model.safetensors``, blocks ``[0, cut)``) where the strategy uploads
   client-side models; otherwise (PSL, EPSL, GAPSL: ``uploads_models`` false)
   a shadow model trained through its own final server-side model;
3. a decoder trained on the auxiliary data through that model (defence-aware:
   the run's ``act-clip`` and ``act-noise`` are applied in training);
4. reconstructions of the last activations it received from each client
   (``RUN_DIR/privacy/received.npz``).

In a U-shaped run (``cut-layers=c1,c2``) the server holds only the middle: a
shadow model (where nothing is uploaded) is trained with a shadow of the
tail, and the attack also reads the labels off the gradients the clients'
tails returned (:func:`simulation.privacy.label_leakage.attack_run`: norm and
direction scoring, ``RUN_DIR/privacy/labels.json``).

Then the strongest known attacks (:mod:`simulation.privacy.strongest`): label
inference by gradient matching (static and tracked), from the tail updates,
and by clustering; white-box inversion through the client-side model the
server holds. Their rows and the worst case over every attack, the decoder
and norm/direction scoring included, go to ``RUN_DIR/privacy/attacks.json``.

The scorer, not the server, then reads the clients' ground truth
(``RUN_DIR/privacy/evaluator/client-K.npz``), checks that each received batch
is the batch the client sent (equal, or within the uplink codec's error), and
writes ``RUN_DIR/privacy/inversion.json`` and ``inversion.csv`` (MSE, PSNR,
SSIM; the floor: the PSNR of the auxiliary mean image) and
``inversion.png`` (originals above reconstructions).
"""

from __future__ import annotations

import csv
import json
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from fl_app.run.config import RunConfig
from fl_app.run.options import Option
from fl_app.run.errors import ConfigError
from fl_app.privacy.activations import EVALUATOR_DIR, PRIVACY_DIR, read_tail_truth, tail_truth_path
from fl_app.learning.task import load_task
from fl_app.run.untrusted import read_json_table, read_npz, run_dir_config
from simulation.privacy.label_leakage import attack_run
from simulation.outputs.saved_model import load_saved_model
from simulation.privacy.inversion import save_grid, scores, to_pixels, train_decoder, train_shadow
from simulation.privacy.record import RECEIVED_FILE, read_tail_events
from simulation.privacy.strongest import ServerHoldings, inversion_attacks, label_attacks, worst_case
from strategies.core.registry import get_strategy

#: The keys of ``sflower attack``, declared and parsed as run-config keys are
#: (:class:`~fl_app.run.options.Option`: :meth:`~fl_app.run.options.Option.coerce`, :meth:`~fl_app.run.options.Option.validate`).
ATTACK_OPTIONS: tuple[Option, ...] = (
    Option("aux", "holdout", "the attacker's auxiliary images: `holdout` (its own, disjoint from training) or `test`",
           choices=("holdout", "test")),
    Option("epochs", 20, "epochs of the learned decoder (activations to images)", at_least=0),
    Option("shadow-epochs", 10, "epochs of the shadow client-side model, where the server holds none", at_least=0),
    Option("seed", 0, "seed of the decoder's and shadow's initial weights and of the sample drawn", at_least=0),
    Option("data-dir", "", "the dataset's directory, where the run's is not this machine's (the user's wins)"),
)
#: The attack keys' defaults, by key.
ATTACK_KEYS: dict[str, Any] = {opt.key: opt.default for opt in ATTACK_OPTIONS}
_ATTACK_OPTIONS = {opt.key: opt for opt in ATTACK_OPTIONS}
#: The result files, under ``RUN_DIR/privacy/``.
RESULT_JSON, RESULT_CSV, RESULT_PNG = "inversion.json", "inversion.csv", "inversion.png"
#: Every attack's row and the worst case over them, under ``RUN_DIR/privacy/``.
STRONGEST_JSON = "attacks.json"
#: The scored columns, in ``inversion.csv``'s order.
COLUMNS = ("strategy", "cut_layer", "seed", "nopeek_alpha", "act_clip", "act_noise", "client_model", "aux",
           "samples", "mse", "psnr", "ssim", "psnr_floor", "test_accuracy")


def attack_options(pairs: dict[str, Any]) -> dict[str, Any]:
    """The attack's keys from ``KEY=VALUE`` pairs, each parsed and checked by its :data:`ATTACK_OPTIONS` entry.

    Raises:
        ConfigError: an unknown key, a value of the wrong type or out of range (one line).
    """
    unknown = sorted(set(pairs) - set(_ATTACK_OPTIONS))
    if unknown:
        raise ConfigError(f"attack takes {', '.join(_ATTACK_OPTIONS)}, not {', '.join(unknown)}")
    out = dict(ATTACK_KEYS)
    for key, raw in pairs.items():
        opt = _ATTACK_OPTIONS[key]
        out[key] = opt.coerce(raw)
        opt.validate(out[key])
    return out


#: Recorded keys the attack never uses (it opens no session): reset to their defaults.
UNUSED_KEYS = ("session-certificate", "session-key", "session-ca")


def _run_config(run_dir: Path, data_dir: str) -> RunConfig:
    """The run's configuration from ``config.json``, checked as untrusted input
    (:func:`fl_app.run.untrusted.run_dir_config`); ``data_dir``: the user's ``data-dir``, which wins."""
    path = run_dir / "config.json"
    if not path.is_file():
        raise ConfigError(f"{run_dir}: no config.json (not a run directory)")
    user = {"data-dir": data_dir} if data_dir else {}
    values = run_dir_config(read_json_table(path).get("config"), str(path), user, ignore=UNUSED_KEYS)
    return RunConfig.from_mapping({**values, **user})


def _pairs(run_dir: Path, cfg: RunConfig) -> tuple[list[int], torch.Tensor, torch.Tensor, list[int]]:
    """``(matched pids, received activations, the evaluator's originals, unmatched pids)``."""
    path = run_dir / PRIVACY_DIR / RECEIVED_FILE
    if not path.is_file():
        raise ConfigError(f"{run_dir}: no {PRIVACY_DIR}/{RECEIVED_FILE} (run with privacy-record=true "
                          "output-dir=RUN_DIR, on a strategy whose clients send activations)")
    received = read_npz(path)
    lossless = cfg.lossless_up
    pids, xs, origs, unmatched = [], [], [], []
    try:
        for name in sorted(received.files, key=lambda n: (len(n), n)):
            if not name.startswith("x-") or not name[2:].isdigit():
                continue
            pid, got = int(name[2:]), received[name]
            truth = run_dir / PRIVACY_DIR / EVALUATOR_DIR / f"client-{pid}.npz"
            sent = read_npz(truth) if truth.is_file() else None
            tol = 0.0 if lossless else 0.1 * float(np.abs(got).max() or 1.0)
            if sent is None or sent["acts"].shape != got.shape or float(np.abs(sent["acts"] - got).max()) > tol:
                unmatched.append(pid)
                continue
            pids.append(pid)
            xs.append(torch.from_numpy(got))
            origs.append(torch.from_numpy(sent["x"]))
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as err:
        raise ConfigError(f"{run_dir}: unreadable privacy record ({type(err).__name__})") from None
    if not pids:
        raise ConfigError(f"{run_dir}: no received batch matches a client's record")
    return pids, torch.cat(xs), torch.cat(origs), unmatched


def _aux(task: Any, which: str) -> tuple[torch.Tensor, torch.Tensor]:
    if which == "test":
        batches = list(task.data.test_batches(1000))
        return torch.cat([b[0] for b in batches]), torch.cat([b[1] for b in batches])
    if task.holdout is None:
        raise ConfigError("attack: the run held out no auxiliary data (aux-holdout=0); run with aux-holdout=N, "
                          "or give aux=test")
    return task.data.train_batch(task.holdout)


def run_attack(run_dir: str | Path, **options: Any) -> dict[str, Any]:
    """Run the inversion attack on ``run_dir`` and write its result files (see the module docstring).

    Args:
        run_dir: a completed run's directory.
        options: :data:`ATTACK_KEYS` (``aux``, ``epochs``, ``shadow-epochs``, ``seed``, ``data-dir``).

    Returns:
        The row written to ``inversion.json`` (:data:`COLUMNS` and more).

    Raises:
        ConfigError: a missing file, or a run without recorded activations or auxiliary data (one line).
    """
    run_dir, opts = Path(run_dir), attack_options({k: v for k, v in options.items()})
    cfg = _run_config(run_dir, str(opts["data-dir"]))
    task = load_task(cfg)
    saved = load_saved_model(run_dir)
    cut, n_blocks = int(cfg.cut_layer), len(saved.model.blocks)
    cuts = cfg.cuts
    pids, received, originals, unmatched = _pairs(run_dir, cfg)
    x_aux, y_aux = _aux(task, opts["aux"])
    gen = torch.Generator().manual_seed(int(opts["seed"]))
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(int(opts["seed"]))  # the decoder's and the shadow's initial weights
        # the server holds no client-side model where the strategy keeps it or the run hides it (hide-client-models)
        uploads = bool(getattr(get_strategy(cfg.strategy), "uploads_models", True)) and not cfg.get("hide-client-models")
        if uploads:
            client = saved.model.segment(0, cut)
        else:  # U-shaped: the server holds the middle [c1, c2) only, and shadows the tail too
            end = cuts[1] if cuts else n_blocks
            tail = task.build_segment(end, n_blocks) if cuts else None
            client = train_shadow(task.build_segment(0, cut), saved.model.segment(cut, end), x_aux, y_aux,
                                  int(opts["shadow-epochs"]), gen, tail=tail)
        clip, sigma = float(cfg.get("act-clip")), float(cfg.get("act-noise"))
        decoder = train_decoder(client, x_aux, int(opts["epochs"]), gen, clip=clip, noise_std=sigma * clip)
        with torch.no_grad():
            recon = decoder(received)
    mean, std = task.data.mean, task.data.std
    recon_px, orig_px = to_pixels(recon, mean, std), to_pixels(originals, mean, std)
    floor = to_pixels(x_aux, mean, std).mean(dim=0, keepdim=True).expand_as(orig_px)
    summary = read_json_table(run_dir / "summary.json") if (run_dir / "summary.json").is_file() else {}
    accuracy = summary.get("final_accuracy")
    if accuracy is not None and (isinstance(accuracy, bool) or not isinstance(accuracy, (int, float))):
        raise ConfigError(f"{run_dir / 'summary.json'}: final_accuracy is not a number")
    row = {"strategy": cfg.strategy, "cut_layer": cut, "seed": int(cfg.seed),
           "nopeek_alpha": float(cfg.get("nopeek-alpha")), "act_clip": clip, "act_noise": sigma,
           "client_model": "uploaded" if uploads else "shadow", "aux": f"{opts['aux']}:{len(x_aux)}",
           "samples": int(len(received)), **scores(recon_px, orig_px),
           "psnr_floor": scores(floor, orig_px)["psnr"], "test_accuracy": accuracy}
    out = run_dir / PRIVACY_DIR
    record = {**row, "clients": pids, "unmatched_clients": unmatched, "epochs": int(opts["epochs"]),
              "shadow_epochs": int(opts["shadow-epochs"]) if not uploads else 0, "attack_seed": int(opts["seed"])}
    (out / RESULT_JSON).write_text(json.dumps(record, indent=2) + "\n")
    with open(out / RESULT_CSV, "w", newline="") as fh:
        writer = csv.DictWriter(fh, fieldnames=COLUMNS)
        writer.writeheader()
        writer.writerow({k: row[k] for k in COLUMNS})
    save_grid(orig_px, recon_px, str(out / RESULT_PNG))
    if cuts:  # U-shaped: the labels stayed on the clients; what their tails' gradients reveal of them
        record["labels"] = attack_run(run_dir)
    sizes = [len(read_npz(run_dir / PRIVACY_DIR / RECEIVED_FILE)[f"x-{p}"]) for p in pids]
    acts, origs = dict(zip(pids, received.split(sizes))), dict(zip(pids, originals.split(sizes)))
    held = server_holdings(run_dir, cfg, task, saved, acts)
    record["strongest"] = strongest_report(run_dir, held, origs, record, lambda x: to_pixels(x, mean, std),
                                           int(opts["seed"]), prefix=not cuts)
    if cuts:
        record["strongest"]["attacks"].append({"attack": "norm/direction scoring", "kind": "label-auc", "held": True,
                                               "norm_auc": record["labels"]["norm_auc"],
                                               "direction_auc": record["labels"]["direction_auc"]})
        (run_dir / PRIVACY_DIR / STRONGEST_JSON).write_text(json.dumps(record["strongest"], indent=2) + "\n")
    return record


def server_holdings(run_dir: Path, cfg: RunConfig, task: Any, saved: Any,
                    activations: dict[int, torch.Tensor]) -> ServerHoldings:
    """What the server of the run in ``run_dir`` holds (:class:`~simulation.privacy.strongest.ServerHoldings`):
    its record of the tails (U-shaped), the run's seed's tail, the client-side model ``[0, c1)`` it holds
    (each client's from ``model-clients.safetensors`` where the run saved them, else the aggregated one where
    the strategy uploads client-side models), the activations it received."""
    cuts = cfg.cuts
    n_blocks = len(saved.model.blocks)
    c1 = cuts[0] if cuts else int(cfg.cut_layer)
    mean, std = task.data.mean, task.data.std
    lo = min((0.0 - m) / s for m, s in zip(mean, std))
    hi = max((1.0 - m) / s for m, s in zip(mean, std))
    heads: dict[int, torch.nn.Module] = {}
    if cfg.get("hide-client-models"):  # the saved client-side weights are NaN: the best guess is the public seed's
        heads = {-1: task.build_segment(0, c1)}
        note = "the public seed's initial head: the run hid the client-side models (hide-client-models)"
    elif saved.client_models:
        heads = {int(p): m.segment(0, c1) for p, m in saved.client_models.items()}
        note = "each client's head as the server received it (model-clients.safetensors)"
    elif bool(getattr(get_strategy(cfg.strategy), "uploads_models", True)):
        heads = {-1: saved.model.segment(0, c1)}
        note = "the aggregated client-side model the server holds (model.safetensors)"
    else:
        note = f"{cfg.strategy} uploads no client-side model and the run saved none (model-clients.safetensors)"
    return ServerHoldings(
        num_classes=int(saved.meta["num-classes"]),
        tail_events=read_tail_events(run_dir) if cuts else None,
        initial_tail=task.build_segment(cuts[1], n_blocks) if cuts else None,
        heads=heads, heads_note=note, activations=activations, input_shape=tuple(task.data.input_shape),
        bounds=(lo, hi), act_clip=float(cfg.get("act-clip")))


def _tail_labels(run_dir: Path, held: ServerHoldings) -> dict[int, np.ndarray]:
    """Per client, the evaluator's labels of the tail rows the server recorded (``tail-K.npys``), where the
    recorded gradients are the ones the client sent (shape, and values to 1e-5 of the largest)."""
    out = {}
    for pid, events in sorted((held.tail_events or {}).items()):
        path = tail_truth_path(run_dir, pid)
        if not path.is_file():
            continue
        sent_g, sent_y = read_tail_truth(path)
        got = torch.cat([e["g"] for e in events if e["kind"] == "forward"]).numpy()
        if sent_g.shape == got.shape and float(np.abs(sent_g - got).max()) <= 1e-5 * float(np.abs(got).max() or 1):
            out[pid] = sent_y
    return out


def strongest_report(run_dir: Path, held: ServerHoldings, originals: dict[int, torch.Tensor],
                     decoder: dict[str, Any], pixels: Any, seed: int, prefix: bool) -> dict[str, Any]:
    """Every attack of :mod:`simulation.privacy.strongest` on ``held`` with the decoder's and (U-shaped) norm and
    direction scoring's rows, the worst case over them; written to ``RUN_DIR/privacy/attacks.json`` (and the
    white-box reconstructions to ``whitebox.png``)."""
    rows = [{"attack": "decoder", "kind": "inputs", "held": True, "psnr": decoder["psnr"], "ssim": decoder["ssim"],
             "mse": decoder["mse"], "samples": decoder["samples"], "client_model": decoder["client_model"]}]
    for row in inversion_attacks(held, originals, pixels):
        recon = row.pop("recon", None)
        if recon is not None:
            save_grid(torch.cat([pixels(originals[p]) for p in sorted(originals)]), recon,
                      str(run_dir / PRIVACY_DIR / "whitebox.png"))
        rows.append(row)
    if not prefix:
        labels = _tail_labels(run_dir, held)
        if held.tail_events is not None and not labels:
            rows.append({"attack": "gradient matching", "kind": "labels", "held": False,
                         "reason": "no recorded tail row matches a client's record (unscorable)"})
        else:
            rows.extend(label_attacks(held, labels, seed))
    report = {"prefix": prefix, "attacks": rows}
    report["worst_case"] = worst_case(rows)
    (run_dir / PRIVACY_DIR / STRONGEST_JSON).write_text(json.dumps(report, indent=2) + "\n")
    return report
