"""`mtlflow tune`: tuned, budget-fair comparisons (:mod:`mtlflow.jobs.tune`)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import yaml

from mtlflow.cli.common import add_data_options, add_run_options, bench_config, check_data_source, csv_list, run_options
from mtlflow.config.run import parse_hparams
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.seeding import seed_arg

#: RunConfig options `tune` takes for every trial and retrained run (the tuned settings come from the search)
TRAIN_FLAGS = ("epochs", "min_steps", "min_steps_per_epoch", "patience", "batch_size", "optimizer", "momentum",
               "method_lr", "clip_grad_norm", "select", "eval_batch_size", "max_steps_per_epoch", "device", "threads",
               "hparams", "architecture", "architecture_options", "scheduler", "scheduler_options")


def _params_file(path: str | None) -> dict[str, Any]:
    """``--params FILE``: ``search_space: {'*' | METHOD: {SETTING: range | null}}`` (YAML)."""
    if path is None:
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise InvalidParameterError(f"--params {path}: cannot read it ({exc}); give a YAML file") from None
    unknown = sorted(set(data) - {"search_space"}) if isinstance(data, dict) else ["(not a mapping)"]
    if unknown:
        raise InvalidParameterError(f"--params {path}: unknown key(s) {', '.join(unknown)}; valid: search_space")
    return data


def cmd_tune(args: argparse.Namespace) -> int:
    from mtlflow.jobs.tune import tune  # noqa: PLC0415 -- `mtlflow --help` loads no trainer, jobs or methods

    check_data_source(args)
    methods = csv_list(args.methods) or ["ls"]
    given = run_options(args, TRAIN_FLAGS)
    hparams = parse_hparams(given.pop("hparams", {}), methods)
    result = tune(args.out, methods, data_dir=args.data, benchmark=args.benchmark if args.data is None else None,
                  data_options=bench_config(args) if args.data is None else None, tasks=csv_list(args.tasks),
                  budget_trials=args.budget_trials, budget_steps=args.budget_steps, seed=args.seed,
                  retrain_seeds=args.retrain_seeds, references=args.references,
                  search_spaces=_params_file(args.params).get("search_space"), hparams=hparams, train_options=given,
                  pruner=args.pruner, startup_trials=args.startup_trials, resume=args.resume, worker=args.worker,
                  compare=not args.no_compare, progress=not args.no_progress, selection=args.selection,
                  folds=args.folds)
    if args.worker:
        print(json.dumps(result))
        return 0
    for name, study in result["studies"].items():
        spent = study["spent"]
        print(f"{name}: chosen {json.dumps({**study['chosen']['train_options'], **study['chosen']['hparams']})} "
              f"(validation score {study['best_value']:.4g}); {spent['steps']} of {spent['budget_steps']} steps, "
              f"{spent['trials']} trials, {spent['pruned']} pruned, {spent['wall_seconds']:.1f} s", file=sys.stderr)
    for warning in result["warnings"]:
        print(f"mtlflow: warning: {warning}", file=sys.stderr)
    print(f"dashboard: {result['storage']['dashboard']}", file=sys.stderr)
    print(json.dumps({"out": args.out, "result": str(Path(args.out) / "tune.json"),
                      "comparison": result.get("comparison")}))
    return 0


def cmd_tune_report(args: argparse.Namespace) -> int:
    from mtlflow.jobs.tune_report import write_tune_report  # noqa: PLC0415 -- as cmd_tune

    print(json.dumps(write_tune_report(args.dir)))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the tune and tune-report commands."""
    r = sub.add_parser("tune-report", help="re-render a finished tuning run's report (tune-report.html, "
                                           "tune-results.md) from its tune.json and comparisons")
    r.add_argument("dir", help="the tuning run's work directory (`mtlflow tune --out`)")
    r.set_defaults(func=cmd_tune_report)
    p = sub.add_parser("tune", help="tune every method (and LS, and single-task references) under one budget, "
                                    "retrain the chosen configurations with fresh seeds and compare them")
    p.add_argument("--benchmark", help="benchmark name; its data is prepared into the cache if needed")
    p.add_argument("--data", help="prepared data directory (from `mtlflow prepare`)")
    add_data_options(p)
    p.add_argument("--out", required=True, help="the tuning run's work directory (the study journal, the trial and "
                   "retrained runs, tune.json)")
    p.add_argument("--methods", default="ls", help="comma-separated methods to tune (LS is always tuned: the baseline)")
    p.add_argument("--tasks", help="comma-separated task subset (default: every task)")
    p.add_argument("--budget-trials", type=int, default=20, help="budget of each study in whole trials (default 20): "
                   "the optimizer steps of that many unpruned trials")
    p.add_argument("--budget-steps", type=int, help="budget of each study in optimizer steps (instead of "
                   "--budget-trials)")
    p.add_argument("--seed", type=seed_arg, default=0, help="the search seed: of every trial's training and of the "
                   "sampler; the chosen configurations are retrained with seeds SEED+1 ... SEED+N")
    p.add_argument("--retrain-seeds", type=int, default=3, help="fresh seeds per chosen configuration (default 3)")
    p.add_argument("--references", action=argparse.BooleanOptionalAction, default=None,
                   help="tune single-task LS references too (default: when there is more than one task)")
    p.add_argument("--params", metavar="FILE", help="YAML with search_space: {'*' or METHOD: {SETTING: {scale, low, "
                   "high} | {choices: [...]} | null}} replacing the declared ranges (null: not searched)")
    p.add_argument("--pruner", default="successive-halving", choices=("successive-halving", "hyperband", "none"),
                   help="pruner over epochs on the validation score (default successive-halving)")
    p.add_argument("--selection", default="auto", choices=("auto", "kfold", "holdout"),
                   help="how configurations are ranked: on the validation split (holdout) or by k-fold "
                   "cross-validation over train + val (kfold); auto (default): k-fold where the task with the fewest "
                   "labelled validation rows has fewer than 100; the test split is never used")
    p.add_argument("--folds", type=int, default=5, help="folds of k-fold selection (default 5)")
    p.add_argument("--startup-trials", type=int, default=10, help="random trials before TPE models the history")
    p.add_argument("--resume", action="store_true", help="continue a killed tuning run in --out (same request)")
    p.add_argument("--worker", action="store_true", help="join the tuning run in --out as one more process that runs "
                   "trials only (the first process retrains and compares)")
    p.add_argument("--no-compare", action="store_true", help="retrain but do not aggregate the retrained runs")
    p.add_argument("--no-progress", action="store_true", help="no line per trial on stderr")
    add_run_options(p, TRAIN_FLAGS)
    p.set_defaults(func=cmd_tune)
