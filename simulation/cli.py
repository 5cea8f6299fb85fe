"""The ``sflower`` command line.

``sflower run KEY=VALUE ...`` takes the run-config keys of
``pyproject.toml`` (see :mod:`fl_app.run.options`), an installed plugin's keys, plus
``engine=inprocess|ray``; ``sflower run resume=RUN_DIR`` continues a killed
run from its last checkpoint (``checkpoint-every=N``). ``sflower partition ... out=DIR`` writes each
partition's training files to its own directory (device-local data for a
deployment rehearsal) and ``DIR/partition.png``. ``sflower evaluate RUN_DIR``
evaluates a run's saved model. Bad input prints one line and exits with status 2.
"""

from __future__ import annotations

import argparse
import logging
import os
import subprocess
import sys
from pathlib import Path
from collections.abc import Sequence

from fl_app.run.config import CORE_KEYS, RunConfig, given_or_default, parse_key_values
from fl_app.run.errors import ConfigError
from fl_app.run.options import core_option
from fl_app.run.plugins import options_of

EXIT_CONFIG = 2
EXIT_FAILED = 1


def cmd_run(args: argparse.Namespace) -> int:
    """``sflower run``: plan (validate everything), then run on the chosen engine.

    ``resume=RUN_DIR`` continues a killed run from ``RUN_DIR/checkpoint.sfl``
    (written with ``checkpoint-every=N``) with the checkpoint's configuration;
    keys given beside it must equal the checkpoint's, except
    ``checkpoint-every``. Checkpoints and resume work on every engine.
    Unless ``--quiet``, a first line on stdout comes at once, then the
    seconds elapsed (:func:`~strategies.core.progress.start_waiting`: the
    imports and the planning take seconds), a line with the run and its
    directory once planned, and the progress bar (stderr).
    """
    if args.quiet:
        return _run(args)
    from strategies.core.progress import start_waiting, stop_waiting

    print("sflower run: starting (importing torch and flwr, loading the data)...", flush=True)
    start_waiting()  # the seconds elapsed, until the run's progress bar opens
    try:
        return _run(args)
    finally:
        stop_waiting()


def _run(args: argparse.Namespace) -> int:
    """:func:`cmd_run` after its first line."""
    from pathlib import Path

    from simulation.server_app import plan_run, resume_pairs
    from simulation.engine import run_inprocess
    from simulation.engine_options import pop_engine_options, split_engine
    from simulation.ray_engine import run_ray
    from strategies.core import checkpoint as ckpt
    from strategies.core.base import DivergedError, RunFailedError

    engine, pairs = split_engine(parse_key_values(args.pairs))
    engine_options = pop_engine_options(engine, pairs)  # ray-address, ray-cpus, ray-gpus, ray-idle
    resume = pairs.pop("resume", None)
    if resume is not None:
        pairs = resume_pairs(resume, pairs)
    cfg = RunConfig.from_mapping(pairs)
    vertical = _run_vertical(cfg, engine, args.quiet, None if resume is None else Path(resume) / ckpt.CHECKPOINT_FILE)
    if vertical is not None:
        return vertical
    plan = plan_run(cfg)
    if resume is not None:
        plan.resume_from = Path(resume) / ckpt.CHECKPOINT_FILE
    if not args.quiet:
        from strategies.core.progress import start_waiting, stop_waiting

        c = plan.cfg
        stop_waiting()  # its line is cleared; this one stays
        print(f"sflower run: {c.strategy} on {c.dataset}, {c.num_clients} clients ({c.concurrency} concurrent), "
              f"{c.global_iterations} global iterations, {engine} engine -> {plan.out_dir}; "
              f"{'resuming' if resume is not None else 'connecting the clients'}...", flush=True)
        start_waiting()
    try:
        if engine == "ray":
            summary = run_ray(plan, progress=not args.quiet, **engine_options)
        else:
            summary = run_inprocess(plan, progress=not args.quiet)
    except DivergedError as err:
        print(f"sflower: run diverged: {err}; metrics so far are in {plan.out_dir}", file=sys.stderr)
        return EXIT_FAILED
    except RunFailedError as err:
        print(f"sflower: run failed: {err}; metrics so far are in {plan.out_dir}", file=sys.stderr)
        return EXIT_FAILED
    print(f"{summary['strategy']}: final accuracy {summary['final_accuracy']:.4f} "
          f"(best {summary['best_accuracy']:.4f}) after {summary['global_iterations']} global iterations, "
          f"{summary['virtual_time_s']:.1f} virtual s, {summary['wall_time_s']:.1f} wall s -> {plan.out_dir}")
    return 0


def _run_vertical(cfg: RunConfig, engine: str, quiet: bool, resume_from: Path | None) -> int | None:
    """Run ``cfg`` (from the checkpoint ``resume_from``, if given) if its strategy is vertical
    (:mod:`simulation.vertical`): its exit status; None: it is not."""
    from fl_app.run.plugins import strategy_class
    from simulation.vertical import check_vertical, is_vertical, run_vertical
    from strategies.core.errors import RunFailedError

    cls = strategy_class(cfg.strategy)
    if not is_vertical(cls):
        return None
    if check_vertical(cfg) is None and not quiet:  # its one-line errors before the run's first line
        from strategies.core.progress import stop_waiting

        stop_waiting()
        print(f"sflower run: {cls.name} on {cfg.dataset}, label party: {cfg.label_party}", flush=True)
    try:
        s = run_vertical(cfg, cls, engine=engine, resume_from=resume_from)
    except RunFailedError as err:
        print(f"sflower: run failed: {err}", file=sys.stderr)
        return EXIT_FAILED
    if "pairwise_intersections" in s:  # vertical-psi=cardinality
        print(f"{s['strategy']}: PSI cardinality only ({s['psi_backend']}): the label party shares "
              f"{s['pairwise_intersections']} rows with each feature party; {s['psi_bytes']} bytes -> {s['output_dir']}")
        return 0
    print(f"{s['strategy']}: final accuracy {s['final_accuracy']:.4f} (best {s['best_accuracy']:.4f}) after "
          f"{s['global_iterations']} iterations; PSI ({s['psi_backend']}) {s['intersection']} shared rows, "
          f"{s['psi_bytes']} bytes; {s['virtual_time_s']:.2f} virtual s -> {s['output_dir']}")
    return 0


def cmd_partition(args: argparse.Namespace) -> int:
    """``sflower partition dataset=... num-clients=N partition=... out=DIR``: each partition to ``DIR/partition-K``.

    Takes the run-config keys that define the partitions
    (:data:`fl_app.learning.task.PARTITION_KEYS`: ``dataset``, ``data-dir``,
    ``num-clients``, ``partition``, ``alpha``, ``shards``, ``seed``,
    ``min-partition-size``, ``num-classes-per-partition``,
    ``class-assignment-mode``, ``partition-sizes``; defaults as in ``sflower
    run``) and ``out``. The partitions equal the simulation's for the same
    keys; ``DIR/partition.png`` shows them; see
    :func:`fl_app.learning.task.write_partition_dirs`.
    """
    from fl_app.learning.task import PARTITION_KEYS, partition_config, write_partition_dirs

    pairs = {k.replace("_", "-"): v for k, v in parse_key_values(args.pairs).items()}
    out = pairs.pop("out", "")
    if not out:
        raise ConfigError("partition needs out=DIR (each partition goes to DIR/partition-K)")
    unknown = sorted(set(pairs) - set(PARTITION_KEYS))
    if unknown:
        raise ConfigError(f"partition takes {', '.join(PARTITION_KEYS)} and out, not {', '.join(unknown)}")
    cfg = partition_config(pairs)
    dirs = write_partition_dirs(cfg, out)
    print(f"wrote {len(dirs)} partitions of {cfg.dataset} ({cfg.partition}) to {dirs[0].parent}/partition-0 .. "
          f"partition-{len(dirs) - 1}")
    return 0


#: The options of ``sflower evaluate`` besides the run directory: core keys, parsed and checked by their
#: :class:`~fl_app.run.options.Option` (``dataset`` and ``data-dir`` absent: the run's own).
EVALUATE_KEYS = ("dataset", "data-dir", "device")


def cmd_evaluate(args: argparse.Namespace) -> int:
    """``sflower evaluate RUN_DIR|FILE.safetensors [dataset=... data-dir=... device=...]``: a saved model's test accuracy.

    Loads ``RUN_DIR/model.safetensors`` (or the file given, e.g.
    ``RUN_DIR/model-best.safetensors``) and evaluates it on the run's test set,
    or on ``dataset``'s; see :func:`simulation.outputs.saved_model.evaluate_saved_model`.
    """
    from simulation.outputs.saved_model import evaluate_saved_model

    pairs = {k.replace("_", "-"): v for k, v in parse_key_values(args.pairs).items()}
    unknown = sorted(set(pairs) - set(EVALUATE_KEYS))
    if unknown:
        raise ConfigError(f"evaluate takes {', '.join(EVALUATE_KEYS)}, not {', '.join(unknown)}")
    for key, raw in pairs.items():
        pairs[key] = core_option(key).coerce(raw)
        core_option(key).validate(pairs[key])
    res = evaluate_saved_model(args.target, dataset=pairs.get("dataset"), data_dir=pairs.get("data-dir"),
                               device=given_or_default(pairs, "device"))
    meta = res["meta"]
    clients = f" (mean over {len(meta['clients'])} client models)" if meta.get("clients") else ""
    print(f"test_accuracy {res['test_accuracy']!r} test_loss {res['test_loss']!r}{clients} on {res['dataset']}'s "
          f"{res['test_examples']} test images; {meta['model']}, the {meta['which']} model of {meta['strategy']} at "
          f"global iteration {meta['global-iteration']} (the run recorded test_accuracy {meta['test-accuracy']!r})")
    return 0


def cmd_attack(args: argparse.Namespace) -> int:
    """``sflower attack RUN_DIR [aux=holdout|test epochs=N shadow-epochs=N seed=S data-dir=DIR]``: the model
    inversion of the activations the run's server received (:mod:`simulation.privacy.attack`)."""
    from simulation.privacy.attack import RESULT_JSON, run_attack

    pairs = {k.replace("_", "-"): v for k, v in parse_key_values(args.pairs).items()}
    res = run_attack(args.target, **pairs)
    print(f"inversion of {res['samples']} received activations ({res['strategy']}, cut {res['cut_layer']}, "
          f"{res['client_model']} client model, aux {res['aux']}): MSE {res['mse']:.4f}, PSNR {res['psnr']:.2f} dB "
          f"(floor {res['psnr_floor']:.2f}), SSIM {res['ssim']:.3f} -> {Path(args.target) / 'privacy' / RESULT_JSON}")
    if "labels" in res:
        lab = res["labels"]
        print(f"label inference on {lab['samples']} tail gradients (label-defence={lab['label_defence']}): "
              f"norm AUC {lab['norm_auc']:.3f}, direction AUC {lab['direction_auc']:.3f} (0.5 is chance) -> "
              f"{Path(args.target) / 'privacy' / 'labels.json'}")
    from simulation.privacy.strongest import headline_lines

    print("\n".join(headline_lines(res["strongest"])), f"-> {Path(args.target) / 'privacy' / 'attacks.json'}")
    return 0


def cmd_deploy(args: argparse.Namespace) -> int:
    """``sflower deploy nodes=N [options] [run-config keys]``: a loopback SuperLink/SuperNode deployment.

    ``sflower deploy bench [options]`` measures the split exchange against an
    echo ClientApp instead. See :mod:`simulation.deploy` and
    :mod:`benchmarks.deploy` (run as a child program, :func:`_run_benchmarks`).
    """
    from simulation.deploy.options import parse_deploy_args
    from simulation.deploy.processes import FLOWER_REQUIREMENT, DeployError, flower_binaries_missing
    from simulation.deploy.run import deploy

    missing = flower_binaries_missing()
    if missing:
        raise ConfigError(f"deploy needs Flower's {', '.join(missing)} (pip install '{FLOWER_REQUIREMENT}')")
    words = list(args.pairs)
    if words[:1] == ["bench"]:
        return _run_benchmarks(["deploy", *words[1:]])
    options = parse_deploy_args(parse_key_values(words))
    try:
        summary = deploy(options, quiet=args.quiet)
    except DeployError as err:
        print(f"sflower: deploy failed: {err}", file=sys.stderr)
        return EXIT_FAILED
    d = summary["deploy"]
    print(f"{summary['strategy']}: final accuracy {summary['final_accuracy']:.4f} after "
          f"{summary['global_iterations']} global iterations, {summary['exchanges']} exchanges, "
          f"{d['run_s']:.1f} s ({d['startup_s']:.1f} s to start {d['nodes']} SuperNodes) -> {d['run_dir']}")
    return 0


def cmd_strategies(args: argparse.Namespace) -> int:
    """``sflower strategies``: list the registered strategies."""
    from strategies.core.registry import get_strategy, strategy_names

    for name in strategy_names():
        cls = get_strategy(name)
        doc = (cls.__doc__ or "").strip().splitlines()[0]
        print(f"{name:16s} {doc}")
        if getattr(cls, "run_with", ""):
            print(f"    run with: {cls.run_with}")
        for opt in options_of(cls):
            source = f"; {opt.source}" if opt.source else ""
            print(f"    {opt.key + '=' + str(opt.default):28s} {opt.help} ({opt.kind()}{source})")
    return 0


def cmd_presets(args: argparse.Namespace) -> int:
    """``sflower presets``: each preset file and the keys it sets."""
    from fl_app.run.config import PRESET_DIR, preset_names, preset_values

    for name in preset_names():
        keys = " ".join(f"{k}={v}" for k, v in preset_values(name).items())
        print(f"{name:20s} {PRESET_DIR / (name + '.toml')}\n    {keys}")
    return 0


def cmd_keys(args: argparse.Namespace) -> int:
    """``sflower keys [--check]``: the files generated from the option declarations (:mod:`simulation.keys`)."""
    from simulation import keys

    if args.check:
        stale = keys.stale()
        for path in stale:
            print(f"stale: {path} (run sflower keys)")
        return 1 if stale else 0
    for path in keys.write():
        print(f"written: {path}")
    return 0


def cmd_sweep(args: argparse.Namespace) -> int:
    """``sflower sweep FILE.toml [output-dir=DIR]``: run missing runs, write results.csv."""
    from simulation.sweep import run_sweep

    extra = parse_key_values(args.pairs)
    out = extra.pop("output-dir", None)
    if extra:
        raise ConfigError(f"sweep takes only output-dir=DIR, got {', '.join(extra)}")
    table = run_sweep(args.file, out, progress=not args.quiet)
    print(f"{len(table)} runs collected")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """``sflower compare OUT --ours RUN... --theirs CSV...``: the side-by-side table and plot."""
    from simulation.compare import compare

    table = compare(args.ours, args.theirs, args.out_dir, metric=args.metric, widen=args.widen, title=args.title)
    print((Path(args.out_dir) / "compare.md").read_text())
    return 0 if len(table) else 1


def cmd_report(args: argparse.Namespace) -> int:
    """``sflower report DIR``: tables (95 % intervals, paired verdicts) and plots of a sweep;
    ``sflower report --pages [--check]``: the generated tables of README.md and docs/."""
    from simulation.outputs.report import report

    if args.pages:
        from simulation.pages import update_pages

        stale = update_pages(args.dir or ".", check=args.check)
        for page in stale:
            print(f"{'stale' if args.check else 'rewritten'}: {page}")
        return 1 if stale and args.check else 0
    if not args.dir:
        raise ConfigError("report needs a sweep directory (or --pages)")
    path = report(args.dir)
    print(path.read_text())
    print(f"written: {path}")
    return 0


def _run_benchmarks(argv: list[str]) -> int:
    """Run ``python -m benchmarks ARGV`` (:mod:`benchmarks.__main__`) with the checkout on its path; its exit status.

    The benchmarks are the floor above ``simulation`` and not part of the installed package, so
    ``sflower`` starts them as a child program instead of importing them (its output goes straight
    to the terminal; its errors are its own one-line messages).

    Raises:
        ConfigError: sflower was installed without its repository (no ``benchmarks/`` beside ``simulation/``).
    """
    root = Path(__file__).resolve().parents[1]
    if not (root / "benchmarks" / "__main__.py").is_file():
        raise ConfigError("the benchmarks live in the repository's benchmarks/ folder: run sflower bench from a "
                          "checkout (pip install -e .)")
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "benchmarks", *argv], env=env, check=False).returncode


def cmd_bench(args: argparse.Namespace) -> int:
    """``sflower bench``: the benchmarks (or those named), figures and ratios (:mod:`benchmarks.runner`)."""
    argv = [*args.only, *(["--quick"] if args.quick else [])]
    argv += [*(["--data-dir", args.data_dir] if args.data_dir else []), *(["--against", args.against] if args.against else [])]
    return _run_benchmarks(argv)


def build_parser() -> argparse.ArgumentParser:
    """The argparse parser of ``sflower``."""
    parser = argparse.ArgumentParser(prog="sflower", description="Split federated learning on Flower.")
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run one job", description="Keys: " + ", ".join(CORE_KEYS) + " (each strategy's own: sflower strategies), engine, "
                         "ray-address, ray-cpus, ray-gpus, ray-idle; or "
                         "resume=RUN_DIR to continue a run that wrote checkpoints (checkpoint-every=N)")
    run.add_argument("pairs", nargs="*", metavar="KEY=VALUE")
    run.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    run.set_defaults(func=cmd_run)
    sw = sub.add_parser("sweep", help="run a sweep file (resumes)")
    sw.add_argument("file")
    sw.add_argument("pairs", nargs="*", metavar="output-dir=DIR")
    sw.add_argument("-q", "--quiet", action="store_true", help="no progress bars")
    sw.set_defaults(func=cmd_sweep)
    rp = sub.add_parser("report", help="tables and plots of a sweep directory; --pages: the docs' generated tables")
    rp.add_argument("dir", nargs="?", default="", help="a sweep directory (with --pages: the repository root)")
    rp.add_argument("--pages", action="store_true",
                    help="regenerate every '<!-- sflower-report DIR -->' block of README.md and docs/*.md")
    rp.add_argument("--check", action="store_true", help="with --pages: write nothing, exit 1 if a block is stale")
    rp.set_defaults(func=cmd_report)
    cp = sub.add_parser("compare", help="sflower's runs beside another code's runs of the same configuration "
                                         "(per-iteration band table and plot)")
    cp.add_argument("out_dir", help="where compare.md and compare.png go")
    cp.add_argument("--ours", nargs="+", required=True, help="sflower run directories")
    cp.add_argument("--theirs", nargs="+", required=True,
                    help="CSV files with columns global_iteration and the metric (accuracy as a fraction)")
    cp.add_argument("--metric", default="test_accuracy")
    cp.add_argument("--widen", type=float, default=0.05, help="band widening on each side (default 0.05)")
    cp.add_argument("--title", default="")
    cp.set_defaults(func=cmd_compare)
    bn = sub.add_parser("bench", help="engine, throughput, scale, generation, memory, ring and liveness benchmarks; "
                                      "summary (only when named)")
    bn.add_argument("only", nargs="*", help="benchmarks to run (default: all)")
    bn.add_argument("--quick", action="store_true", help="smaller budgets")
    bn.add_argument("--data-dir", default=None, help="Fashion-MNIST directory (default ../shared/data/fashion-mnist)")
    bn.add_argument("--against", default=None, metavar="REV",
                    help="engine (its small run), throughput, ring (one round): also run git revision REV "
                         "(e.g. HEAD) side by side, alternately, and report the ratio; "
                         "generation: REV's statistics memory beside ours (default HEAD); "
                         "summary (required): REV's headline figures beside ours, in one table")
    bn.set_defaults(func=cmd_bench)
    pt = sub.add_parser("partition", help="write each partition's training files to DIR/partition-K, "
                                          "and DIR/partition.png",
                        description="Keys: dataset, data-dir, num-clients, partition, alpha, shards, seed, "
                                    "min-partition-size, num-classes-per-partition, class-assignment-mode, "
                                    "partition-sizes, out (required)")
    pt.add_argument("pairs", nargs="*", metavar="KEY=VALUE")
    pt.set_defaults(func=cmd_partition)
    dp = sub.add_parser("deploy", help="loopback deployment: SuperLink, N SuperNodes with own data, TLS, auth",
                        description="sflower deploy nodes=N [intruders=M tls=true auth=true fast=false "
                                    "isolation=subprocess run-dir=DIR timeout=S kill-node=K kill-after=S "
                                    "restart-after=S] [run-config KEY=VALUE ...]; sflower deploy bench [...]")
    dp.add_argument("pairs", nargs="*", metavar="KEY=VALUE")
    dp.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    dp.set_defaults(func=cmd_deploy)
    ev = sub.add_parser("evaluate", help="test accuracy of a run's saved model (model.safetensors)",
                        description="sflower evaluate RUN_DIR|FILE.safetensors [dataset=NAME data-dir=DIR "
                                    "device=auto|cpu|cuda]")
    ev.add_argument("target", metavar="RUN_DIR")
    ev.add_argument("pairs", nargs="*", metavar="KEY=VALUE")
    ev.set_defaults(func=cmd_evaluate)
    at = sub.add_parser("attack", help="model inversion of the activations a run's server received, and label "
                                       "inference on a U-shaped run's tail gradients, the strongest known attacks and the worst "
                                       "case over them (needs privacy-record=true; writes RUN_DIR/privacy/"
                                       "inversion.*, labels.json and attacks.json)",
                        description="sflower attack RUN_DIR [aux=holdout|test epochs=20 shadow-epochs=10 seed=0 "
                                    "data-dir=DIR]")
    at.add_argument("target", metavar="RUN_DIR")
    at.add_argument("pairs", nargs="*", metavar="KEY=VALUE")
    at.set_defaults(func=cmd_attack)
    st = sub.add_parser("strategies", help="list the strategies (built-in and plugins) and their options")
    st.set_defaults(func=cmd_strategies)
    ps = sub.add_parser("presets", help="list the presets (presets/NAME.toml) and their keys")
    ps.set_defaults(func=cmd_presets)
    ks = sub.add_parser("keys", help="rewrite (or --check) pyproject.toml's run-config table and the docs' key and "
                        "strategy references from the option declarations")
    ks.add_argument("--check", action="store_true", help="list the stale files and exit 1; change nothing")
    ks.set_defaults(func=cmd_keys)
    return parser


def _numerics_of(args: argparse.Namespace) -> str:
    """The ``numerics`` mode the command's runs ask for (``fast`` for commands that run nothing).

    Raises:
        ConfigError: a sweep whose runs mix modes (a process has one).
    """
    from fl_app.run.options import CORE_OPTIONS
    from fl_app.run.untrusted import read_json_table

    if args.command == "run":
        pairs = parse_key_values(args.pairs)
        if "resume" in pairs and "numerics" not in pairs:  # the run directory is untrusted: a checked value
            saved = Path(pairs["resume"]) / "config.json"
            config = read_json_table(saved).get("config", {}) if saved.is_file() else {}
            option = next(opt for opt in CORE_OPTIONS if opt.key == "numerics")
            mode = option.coerce(given_or_default(config, "numerics") if isinstance(config, dict) else "fast")
            try:
                option.validate(mode)
            except ConfigError as err:
                raise ConfigError(f"{saved}: {err}") from None
            return str(mode)
        return str(given_or_default(pairs, "numerics"))
    if args.command == "deploy" and args.pairs[:1] != ["bench"]:  # its SuperLink and SuperNodes inherit the environment
        return str(given_or_default(parse_key_values(list(args.pairs)), "numerics"))
    if args.command == "sweep":
        from simulation.sweep import expand, load_sweep, run_config

        modes = {str(given_or_default(run_config(run), "numerics")) for run in expand(load_sweep(args.file))}
        if len(modes) > 1:
            raise ConfigError(f"{args.file}: a sweep runs in one numerics mode; its runs ask for {', '.join(sorted(modes))}")
        return modes.pop() if modes else "fast"
    return "fast"


def _restart_for_numerics(args: argparse.Namespace, argv: Sequence[str] | None) -> None:
    """Restart this command with the environment its ``numerics`` mode needs, if it lacks it.

    ``numerics=portable`` pins variables that ATen and MKL read before the
    first tensor operation (:func:`fl_app.run.numerics.launch_env`), so the
    process is replaced by a fresh one with them set; it does not return then.
    Only the console script restarts (``argv`` None): a caller of :func:`main`
    in its own process gets :func:`~fl_app.run.numerics.establish`'s one-line error instead.
    """
    from fl_app.run.numerics import restart

    if argv is None:
        restart(_numerics_of(args), "simulation.cli", sys.argv[1:])


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``sflower`` console script."""
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    args = build_parser().parse_args(argv)
    try:
        _restart_for_numerics(args, argv)
        return int(args.func(args))
    except ConfigError as err:
        print(f"sflower: error: {err}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:
        print("sflower: interrupted; metrics written so far are kept", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
