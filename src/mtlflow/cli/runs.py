"""`mtlflow prepare | train | evaluate | aggregate | report | data | stage`: one run's life and its data."""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

from mtlflow.cli.common import (
    add_data_options,
    add_run_options,
    bench_config,
    check_data_source,
    csv_list,
    run_options,
)
from mtlflow.config.run import RunConfig, parse_hparams
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.seeding import seed_arg
from mtlflow.jobs.cache import cache_path


def cmd_prepare(args: argparse.Namespace) -> int:
    from mtlflow import jobs

    if args.benchmark is None:
        raise InvalidParameterError("give --benchmark NAME or --spec FILE: the data to prepare")
    manifest = jobs.prepare(args.benchmark, args.out, overwrite=args.overwrite, **bench_config(args))
    print(json.dumps({"out": args.out, "content_hash": manifest["content_hash"]}))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from mtlflow import jobs
    from mtlflow.engine import distributed
    from mtlflow.jobs import katib_metrics  # noqa: PLC0415 (loads torch: `mtlflow --help` stays light)
    from mtlflow.ops.observability import resolve_pushgateway, training_exporters

    check_data_source(args)
    request = train_request(args)
    if args.dry_run:
        return _dry_run(args, request)
    if args.out is None:
        raise InvalidParameterError("give --out DIR, the run directory")
    gateway = resolve_pushgateway(args.pushgateway)  # a malformed address is rejected before any data work
    if args.data is None and args.spec:  # a registered benchmark is checked when it is built
        check_source_before_preparing(jobs.plan_train(**request).bench)
    if args.nproc not in (None, 1) and "RANK" not in os.environ:  # not yet under torchrun: check, then relaunch
        jobs.plan_train(**request)
        return subprocess.run(distributed.torchrun_command(args.nproc, args.argv)).returncode
    main_rank = distributed.is_main_process()  # under torchrun only rank 0 exports and prints
    exporters = training_exporters(gateway, args.metrics_port, pipeline_run=args.pipeline_run or "")
    katib = katib_metrics.callbacks(args.katib_metrics) if main_rank else []  # a bad file is refused before training
    with (exporters if main_rank else contextlib.nullcontext([])) as callbacks:
        result = jobs.train(out_dir=args.out, resume=args.resume, overwrite=args.overwrite,
                            progress=not args.no_progress, callbacks=[*callbacks, *katib], **request)
    if main_rank:
        print(json.dumps({"run_dir": args.out, "test": result["final"]["test"]}))
        outcome = result["training"]  # on stderr: stdout stays one JSON line
        print(f"training: {outcome['epochs_run']} epoch(s), {outcome['optimizer_steps']} optimizer steps, best "
              f"validation epoch {outcome['best_epoch']}{', stopped early' if outcome['stopped_early'] else ''}; "
              f"{outcome['convergence']}", file=sys.stderr)
    return 0


def check_source_before_preparing(bench: Any) -> None:
    """A spec's table, labels, split, features (and for a table, the factory's model): checked before training
    prepares it into the cache, so that a refused spec gets its one line without "preparing ... into" first.
    (A table read once more when the cache already holds it: small next to the training.)"""
    check_source = getattr(bench, "check_source", None)
    if check_source is not None:
        check_source()


def train_request(args: argparse.Namespace) -> dict[str, Any]:
    """The arguments of :func:`mtlflow.jobs.plan_train` / :func:`mtlflow.jobs.train` that `train` was given."""
    given = run_options(args)
    method = given.pop("method", RunConfig.method)
    return {"data_dir": args.data, "benchmark": args.benchmark, "data_options": bench_config(args), "method": method,
            "hparams": parse_hparams(given.pop("hparams", {}), [method]).get(method, {}), **given}


def _dry_run(args: argparse.Namespace, request: dict[str, Any]) -> int:
    """Print the resolved configuration, parameter counts and a memory estimate; prepare and train nothing."""
    from mtlflow import jobs
    from mtlflow.jobs.dryrun import describe_run, format_description

    plan = jobs.plan_train(**request)
    data_dir = plan.data_dir or cache_path(plan.bench)
    info = describe_run(plan.bench, plan.config, plan.config.hparams,
                        data_dir if (data_dir / "manifest.json").is_file() else None)
    print(format_description(info))
    print(json.dumps(info, indent=2, default=str))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from mtlflow import jobs

    result = jobs.evaluate(args.run_dir, args.data, split=args.split, out_file=args.out, confusion=args.confusion)
    print(json.dumps(result["metrics"]))
    return 0


def cmd_aggregate(args: argparse.Namespace) -> int:
    from mtlflow import jobs
    from mtlflow.ops.observability import export_summary, resolve_pushgateway

    gateway = resolve_pushgateway(args.pushgateway)
    summary = jobs.aggregate(args.run_dirs, args.out, reference_dirs=args.references or (),
                             method_set=csv_list(args.method_set), split=args.split,
                             paper_references=args.paper_references)
    from mtlflow.jobs.report import markdown_table

    print(markdown_table(summary), end="")
    print(f"report: {Path(args.out) / 'report.html'}")
    if gateway:
        from mtlflow.jobs.compare.summary import to_json

        export_summary(to_json(summary), gateway)  # the exporter (ops, below jobs) reads results.json's form
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from mtlflow.core.outputs import check_output_path
    from mtlflow.engine.rundir import check_run_consistent
    from mtlflow.jobs.run_report import render_report

    path = Path(args.path)
    # report writes one HTML file: never onto another file of the run or results it reads
    check_output_path(args.out or path / "report.html", "--out", "file",
                      [("the input file", p) for p in (path.iterdir() if path.is_dir() else ())
                       if p.name != "report.html"])
    if (Path(args.path) / "run.json").is_file():  # a failed run has a report too, a mixed directory not
        check_run_consistent(Path(args.path), require_completed=False)

    print(f"report: {render_report(args.path, args.out)}")
    return 0


def cmd_data(args: argparse.Namespace) -> int:
    from mtlflow.benchmarks.base import read_manifest
    from mtlflow.ops import dvc as dvc_io

    remote = dvc_io.resolve_remote(args.remote)
    if remote is None:
        raise InvalidParameterError(f"no DVC remote: give --remote URL or set ${dvc_io.REMOTE_ENV}")
    if args.data_command == "push":
        read_manifest(args.data)  # only prepared datasets are versioned
        print(json.dumps({"data": args.data, "git_revision": dvc_io.git_revision(),
                          **dvc_io.push_dataset(args.data, remote)}))
    else:
        out = dvc_io.pull_dataset(args.version, remote, args.out, cache_dir=args.cache_dir)
        print(json.dumps({"out": str(out), "dvc_hash": args.version, "dvc_remote": remote,
                          "content_hash": read_manifest(out)["content_hash"]}))
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    from mtlflow.jobs import stages

    params = stages.load_params(args.params)
    if args.stage == "status":
        status = stages.stage_status(params)
        print(json.dumps(status))
        for stage, reasons in status.items():
            print(f"{stage}: {'; '.join(map(str, reasons))}", file=sys.stderr)
        if not status:
            print("everything is up to date: dvc repro runs only the source stage, which re-reads the data's "
                  "inputs", file=sys.stderr)
    elif args.stage == "source":
        stages.stage_source(params)
    elif args.stage == "prepare":
        stages.stage_prepare(params)
    elif args.stage == "train":
        stages.stage_train(params, args.method, args.seed)
    elif args.stage == "reference":
        stages.stage_reference(params, args.task, args.seed)
    elif args.stage == "evaluate":
        stages.stage_evaluate(params)
    elif args.stage == "experiment":
        stages.stage_experiment(params)
    elif args.stage == "tune":
        stages.stage_tune(params)
    elif args.stage == "baselines":
        stages.stage_baselines(params)
    else:
        stages.stage_aggregate(params)
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the prepare, train, evaluate, aggregate, report, data, stage commands."""
    p = sub.add_parser("prepare", help="build a benchmark's data (or your own, --spec FILE) into a directory with a "
                                       "content hash")
    p.add_argument("--benchmark", help="benchmark name (see `mtlflow benchmarks`); or give --spec FILE")
    p.add_argument("--out", required=True, help="new or empty directory, outside the files it is prepared from (a "
                   "prepared dataset is replaced only with --overwrite; other content is never deleted)")
    p.add_argument("--overwrite", action="store_true", help="replace the prepared dataset already in --out; refused "
                   "when --out also holds files that prepare did not write (its manifest lists those it did)")
    add_data_options(p)
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("train", help="train one method with one seed")
    p.add_argument("--benchmark", help="benchmark name; its data is prepared into the cache if needed")
    p.add_argument("--data", help="prepared data directory (from `mtlflow prepare`)")
    add_data_options(p)
    add_run_options(p)
    p.add_argument("--out", help="run directory (required unless --dry-run), outside the data: not --data, "
                   "inside it or containing it")
    p.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    p.add_argument("--overwrite", action="store_true", help="replace the run already in --out (its result files "
                   "are deleted before training starts)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--dry-run", action="store_true",
                   help="print the resolved config, parameter counts and a memory estimate; train nothing")
    p.add_argument("--pushgateway", metavar="URL", help="push epoch telemetry to this Prometheus Pushgateway "
                   "(default $MTLFLOW_PUSHGATEWAY; a failed push only logs one warning)")
    p.add_argument("--metrics-port", type=int, metavar="PORT", help="serve Prometheus /metrics on this port "
                   "while training")
    p.add_argument("--pipeline-run", metavar="NAME", help="the pipeline run this training belongs to: added to "
                   "the Pushgateway grouping key, so that the pipeline's exit handler deletes the group when the "
                   "run ends (set by the distributed pipeline's TrainJob)")
    p.add_argument("--katib-metrics", metavar="SCORER_JSON", help="print the validation score against this tuning "
                   "study's scorer and the per-task val metrics as name=value lines after every epoch, for Katib's "
                   "StdOut metrics collector (set by the Katib launcher's trials)")
    p.add_argument("--nproc", type=int, metavar="N", help="data-parallel training in N processes (runs "
                   "`torchrun --standalone --nproc_per_node N -m mtlflow train ...`; global batch = N x --batch-size)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="evaluate a trained run on a split")
    p.add_argument("run_dir")
    p.add_argument("--data", required=True, help="the prepared data the run was trained on")
    p.add_argument("--split", default="test")
    p.add_argument("--out", help="output JSON file (default RUN_DIR/evaluation.json); never another file of the "
                   "run or a path inside --data")
    p.add_argument("--confusion", action="store_true",
                   help="also write the confusion matrices of the classification tasks into the JSON")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("aggregate", help="compare runs: Δm%%, mean rank, hypervolume, Pareto plot, HTML")
    p.add_argument("run_dirs", nargs="+", help="the sweep's run directories, and any `mtlflow baseline` directories "
                                               "(rows beside the methods, in no score)")
    p.add_argument("--references", nargs="*", help="single-task reference run directories")
    p.add_argument("--paper-references", action=argparse.BooleanOptionalAction, default=None,
                   help="also report Δm%% against the papers' single-task values (default: when the benchmark "
                        "publishes them; --no-paper-references turns it off)")
    p.add_argument("--method-set", help="comma-separated methods over which the mean rank is computed")
    p.add_argument("--split", default="test")
    p.add_argument("--out", required=True, help="output directory (results.json/.md/.csv, pareto.png, curves.png, "
                   "report.html), outside every run and reference directory")
    p.add_argument("--pushgateway", metavar="URL", help="push Δm%%, mean rank, hypervolume and Pareto membership "
                   "per method to this Prometheus Pushgateway (default $MTLFLOW_PUSHGATEWAY)")
    p.set_defaults(func=cmd_aggregate)

    p = sub.add_parser("report", help="render the HTML report of a finished run or an aggregate results directory")
    p.add_argument("path", help="run directory (from `mtlflow train --out`) or aggregate results directory")
    p.add_argument("--out", help="output HTML file (default PATH/report.html); never another file of PATH")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("data", help="version prepared datasets with DVC: push to / pull from a remote")
    dsub = p.add_subparsers(dest="data_command", required=True, metavar="ACTION")
    q = dsub.add_parser("push", help="upload a prepared dataset; prints its DVC hash (the data version)")
    q.add_argument("--data", required=True, help="prepared data directory")
    q.add_argument("--remote", help="DVC remote URL (default $MTLFLOW_DVC_REMOTE)")
    q = dsub.add_parser("pull", help="fetch a data version into a new directory and verify it")
    q.add_argument("version", help="DVC hash '<md5>.dir' (dvc_hash in the dataset metadata)")
    q.add_argument("--out", required=True)
    q.add_argument("--remote", help="DVC remote URL (default $MTLFLOW_DVC_REMOTE)")
    q.add_argument("--cache-dir", help="DVC cache kept between pulls (default: a temporary one)")
    p.set_defaults(func=cmd_data)

    p = sub.add_parser("stage", help="run one DVC stage of dvc.yaml (reads params.yaml); `stage status`: what "
                                     "dvc repro would run, the source stage's data inputs included")
    p.add_argument("stage", choices=["source", "prepare", "train", "reference", "evaluate", "aggregate", "experiment",
                                     "tune", "baselines", "status"])
    p.add_argument("--method")
    p.add_argument("--task")
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--params", default="params.yaml")
    p.set_defaults(func=cmd_stage)
