"""The ``mtlflow`` command line.

Errors in user input end with one line ``mtlflow: error: ...`` on stderr and a non-zero exit code
(2 for unknown names, invalid parameters and unusable output paths, 3 for missing or corrupt data,
4 for NaN or infinite values, 5 for solver failures, 6 for an output directory another mtlflow
process is writing, 130 for Ctrl-C, 143 for SIGTERM); README "Bad input" lists them.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import types
import typing
from pathlib import Path
from typing import Any, Sequence

import yaml

from mtlflow.config.run import RunConfig, cli_flag, parse_hparams
from mtlflow.core.errors import InvalidParameterError, MtlflowError, Terminated
from mtlflow.core.seeding import seed_arg
from mtlflow.jobs.cache import cache_path, cached_data_dir, default_cache_dir


def parse_value(raw: str) -> Any:
    """A command-line value: int, float (``1e-3`` too), JSON, then YAML (``[a, b]``), else the string."""
    for convert in (int, float, json.loads):
        try:
            return convert(raw)
        except ValueError:
            pass
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def parse_assignments(items: Sequence[str] | None, what: str) -> dict[str, Any]:
    """``["a=1", "b=x"]`` -> ``{"a": 1, "b": "x"}`` with typed values (see :func:`parse_value`)."""
    out: dict[str, Any] = {}
    for item in items or []:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise InvalidParameterError(f"{what} {item!r} must look like KEY=VALUE")
        out[key.replace("-", "_")] = parse_value(raw) if raw else ""
    return out


def _csv(value: str | None) -> list[str] | None:
    if value is None:
        return None
    items = [v.strip() for v in value.split(",") if v.strip()]
    return items or None




def add_run_options(parser: argparse.ArgumentParser, only: Sequence[str] | None = None) -> None:
    """One flag per :class:`~mtlflow.config.run.RunConfig` field (``--batch-size`` is ``batch_size``), with
    the field's help; mapping fields are repeatable ``--<name>-option KEY=VALUE`` (``--hp`` for hparams).
    Every flag defaults to "not given", so the benchmark's recipe and then the field's default apply."""
    for f in dataclasses.fields(RunConfig):
        if only is not None and f.name not in only:
            continue
        hint = typing.get_type_hints(RunConfig)[f.name]
        optional = typing.get_origin(hint) in (typing.Union, types.UnionType)
        hint = next(k for k in typing.get_args(hint) if k is not type(None)) if optional else hint
        kind = typing.get_origin(hint) or hint
        flag, help_text = cli_flag(f.name), f.metadata["help"]
        if kind is dict:
            metavar = "[METHOD.]NAME=VALUE" if f.name == "hparams" else "KEY=VALUE"
            parser.add_argument(flag, dest=f.name, action="append", metavar=metavar,
                                help=help_text + " (repeatable)")
        elif kind is bool:
            parser.add_argument(flag, dest=f.name, action=argparse.BooleanOptionalAction, help=help_text)
        elif kind is list:
            parser.add_argument(flag, dest=f.name, metavar="A,B,...", help=help_text)
        else:
            convert = seed_arg if f.name == "seed" else kind
            parser.add_argument(flag, dest=f.name, type=convert, help=help_text)


def run_options(args: argparse.Namespace, only: Sequence[str] | None = None) -> dict[str, Any]:
    """The RunConfig fields given on the command line (mapping flags parsed into dicts)."""
    given = {}
    for f in dataclasses.fields(RunConfig):
        if (only is not None and f.name not in only) or getattr(args, f.name, None) is None:
            continue
        value = getattr(args, f.name)
        if typing.get_origin(typing.get_type_hints(RunConfig)[f.name]) is dict:
            value = parse_assignments(value, cli_flag(f.name))
        given[f.name] = value
    return given


# -- commands --------------------------------------------------------------------------------

def cmd_methods(args: argparse.Namespace) -> int:
    from mtlflow import methods

    rows = [methods.info(n) for n in methods.available()]
    # what the gradient engine computes for each method (Method.requires)
    needs = {r.name: methods.get(r.name).requires.value for r in rows}
    if args.json:
        print(json.dumps([{**r.__dict__, "requires": needs[r.name]} for r in rows], indent=2, default=str))
        return 0
    for r in rows:
        hp = ", ".join(f"{k}={v[0]!r}" for k, v in r.hparams.items()) or "-"
        print(f"{r.name:<12} {r.family:<22} {r.cost:<5} {r.paper}")
        print(f"{'':<12} equations: {r.equations}")
        print(f"{'':<12} needs: {needs[r.name]}; hyper-parameters: {hp}")
    return 0


def cmd_architectures(args: argparse.Namespace) -> int:
    from mtlflow.models.architectures import describe

    rows = describe()
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    for row in rows:
        print(f"{row['name']:<12} {row['description']}")
        for key, spec in row["options"].items():
            print(f"{'':<12} {key}={spec['default']!r}: {spec['help']}")
    return 0


def cmd_benchmarks(args: argparse.Namespace) -> int:
    from mtlflow import benchmarks

    for name in benchmarks.available():
        cls = benchmarks.get(name)
        bench = cls()
        print(f"{name:<12} tasks: {', '.join(bench.task_names)}")
        print(f"{'':<12} {cls.description}")
        opts = ", ".join(f"{k}={f.default!r}" for k, f in cls.config_fields.items())
        print(f"{'':<12} options: {opts or '-'}")
        if cls.train_defaults:
            print(f"{'':<12} paper recipe: {json.dumps(cls.train_defaults)}")
        if cls.cpu_smoke:
            print(f"{'':<12} CPU smoke: {json.dumps(cls.cpu_smoke)}")
    return 0


def _bench_config(args: argparse.Namespace) -> dict[str, Any]:
    config = parse_assignments(args.option, "--option")
    if getattr(args, "mnist_dir", None):
        config["mnist_dir"] = args.mnist_dir
    if getattr(args, "data_dir", None):
        config["data_dir"] = args.data_dir
    return config


def cmd_prepare(args: argparse.Namespace) -> int:
    from mtlflow import jobs

    manifest = jobs.prepare(args.benchmark, args.out, overwrite=args.overwrite, **_bench_config(args))
    print(json.dumps({"out": args.out, "content_hash": manifest["content_hash"]}))
    return 0


def _check_data_source(args: argparse.Namespace) -> None:
    """``--data DIR`` or ``--benchmark NAME`` (+ preparation options), never a silent mix of both."""
    if args.data is None and args.benchmark is None:
        raise InvalidParameterError("give --benchmark NAME (data prepared into the cache) or --data DIR")
    if args.data is None:
        return
    if not args.data.strip():
        raise InvalidParameterError("--data is empty; give a prepared data directory (from `mtlflow prepare`)")
    from mtlflow.benchmarks.base import read_manifest

    prepared = read_manifest(args.data)
    if args.benchmark is not None and args.benchmark != prepared.get("benchmark"):
        raise InvalidParameterError(f"--benchmark {args.benchmark} disagrees with --data {args.data}, which holds "
                                    f"{prepared.get('benchmark')!r} data; give only one of them")
    given = [flag for flag, value in (("--option", args.option), ("--mnist-dir", args.mnist_dir),
                                      ("--data-dir", args.data_dir)) if value]
    if given:
        raise InvalidParameterError(f"{', '.join(given)} only apply when data is prepared (--benchmark); "
                                    f"--data {args.data} is already prepared, so drop {' and '.join(given)}")


def cmd_train(args: argparse.Namespace) -> int:
    from mtlflow import benchmarks, jobs, methods
    from mtlflow.core.outputs import check_output_dir, stale_run_files

    _check_data_source(args)
    given = run_options(args)
    args.method = given.pop("method", RunConfig.method)
    args.seed = given.pop("seed", RunConfig.seed)
    args.tasks = given.pop("tasks", None)
    hparams = parse_hparams(given.pop("hparams", {}), [args.method]).get(args.method, {})
    overrides = given
    if args.dry_run:
        return _dry_run(args, hparams, overrides)
    if args.out is None:
        raise InvalidParameterError("give --out DIR, the run directory")
    from mtlflow.engine import distributed

    check_output_dir(args.out, "--out")
    if distributed.is_main_process():  # under torchrun rank 0 owns the run directory (see jobs.train)
        stale_run_files(args.out, args.resume, args.overwrite)
    if args.data is None:
        # reject bad input before preparing any data
        default_cache_dir()
        bench = benchmarks.build(args.benchmark, **_bench_config(args))
        selected = bench.select_tasks(jobs.parse_tasks(args.tasks, bench.task_names))
        methods.build(args.method, len(selected), **jobs.resolved_hparams(bench, args.method, hparams))
        jobs.train_config(bench.train_defaults, method=args.method, **overrides)
        if args.teleport:
            from mtlflow.teleport import check_benchmark

            check_benchmark(bench, [t.name for t in selected], args.teleport, overrides["teleport_options"])
    from mtlflow.ops.observability import resolve_pushgateway, training_exporters

    gateway = resolve_pushgateway(args.pushgateway)  # a malformed address is rejected before any data work
    if args.nproc not in (None, 1) and "RANK" not in os.environ:  # not yet under torchrun
        return subprocess.run(distributed.torchrun_command(args.nproc, args.argv)).returncode
    data_dir = Path(args.data) if args.data else cached_data_dir(args.benchmark, _bench_config(args))
    main_rank = distributed.is_main_process()  # under torchrun only rank 0 exports and prints
    with (training_exporters(gateway, args.metrics_port) if main_rank else contextlib.nullcontext([])) as callbacks:
        result = jobs.train(data_dir, args.out, method=args.method, seed=args.seed, hparams=hparams,
                            tasks=args.tasks, resume=args.resume, overwrite=args.overwrite,
                            progress=not args.no_progress, callbacks=callbacks, **overrides)
    final = result["final"]["test"]
    if main_rank:
        print(json.dumps({"run_dir": args.out, "test": final}))
    return 0


def _dry_run(args: argparse.Namespace, hparams: dict[str, Any], overrides: dict[str, Any]) -> int:
    """Print the resolved configuration, parameter counts and a memory estimate; prepare and train nothing."""
    from mtlflow import benchmarks, jobs
    from mtlflow.benchmarks.base import read_manifest
    from mtlflow.jobs.dryrun import describe_run, format_description

    data_dir = Path(args.data) if args.data is not None else None
    if data_dir is not None:
        manifest = read_manifest(data_dir)
        bench = benchmarks.build(manifest["benchmark"], **manifest.get("config", {}))
    else:
        bench = benchmarks.build(args.benchmark, **_bench_config(args))
        cached = cache_path(bench)
        data_dir = cached if (cached / "manifest.json").is_file() else None
    resolved = jobs.resolved_hparams(bench, args.method, hparams)
    config = jobs.train_config(bench.train_defaults, method=args.method, seed=args.seed, hparams=resolved,
                               tasks=jobs.parse_tasks(args.tasks, bench.task_names), **overrides)
    info = describe_run(bench, config, resolved, data_dir)
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
                             method_set=_csv(args.method_set), split=args.split,
                             paper_references=args.paper_references)
    from mtlflow.jobs.report import markdown_table

    print(markdown_table(summary), end="")
    print(f"report: {Path(args.out) / 'report.html'}")
    if gateway:
        export_summary(summary, gateway)
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from mtlflow.engine.rundir import check_run_consistent
    from mtlflow.ops.observability.run_report import render_report

    if (Path(args.path) / "run.json").is_file():  # a failed run has a report too, a mixed directory not
        check_run_consistent(Path(args.path), require_completed=False)

    print(f"report: {render_report(args.path, args.out)}")
    return 0


def cmd_pipeline(args: argparse.Namespace) -> int:
    from mtlflow.pipelines import runner

    if args.pipeline_command == "compile":
        if args.all:
            for path in runner.compile_all(args.out_dir):
                print(f"compiled {path.stem} pipeline to {path}")
            return 0
        name = runner.canonical_name(args.pipeline)
        out = args.out or str(Path(args.out_dir) / f"{name}.yaml")
        path = runner.compile_pipeline(out, pipeline=name)
        print(f"compiled {name} pipeline to {path}")
        return 0
    params = runner.load_params(args.params_file, parse_assignments(args.param, "--param"))
    if args.pipeline_command == "run":
        result = runner.run_local(params, workdir=args.workdir, pipeline=args.pipeline, storage_root=args.storage_root)
        print(f"{'report' if result.suffix == '.html' else 'result'}: {result}")
        return 0
    from mtlflow.ops import kfp_client

    if args.pipeline_command == "submit":
        info = kfp_client.submit(args.host, args.pipeline, params, experiment=args.experiment,
                                 run_name=args.run_name, namespace=args.namespace,
                                 enable_caching=False if args.no_cache else None,
                                 service_account=args.service_account)
    else:
        info = kfp_client.schedule(args.host, args.pipeline, args.cron, params, experiment=args.experiment,
                                   job_name=args.job_name, namespace=args.namespace,
                                   service_account=args.service_account)
    print(json.dumps(info))
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


def _hparams(args: argparse.Namespace, methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``--hp [METHOD.]NAME=VALUE`` of a command that runs ``methods``."""
    return parse_hparams(parse_assignments(args.hp, "--hp"), methods)


def cmd_toy(args: argparse.Namespace) -> int:
    from mtlflow.experiments.trajectories import resolve_methods, run_toy

    names = resolve_methods(args.methods)
    hparams = _hparams(args, names)
    teleport_options = parse_assignments(args.teleport_option, "--teleport-option")
    if args.teleport:
        from mtlflow.experiments.trajectories import toy_options
        from mtlflow.teleport import validate

        validate(args.teleport, teleport_options)
        toy_options(teleport_options)
    summary = run_toy(names, args.out, steps=args.steps, scale=args.scale, lr=args.lr, seed=args.seed,
                      hparams=hparams, progress=not args.no_progress, jobs=args.jobs, teleport=args.teleport,
                      teleport_options=teleport_options)
    failed = [m["method"] for m in summary["methods"] if m["status"] == "failed"]
    print(f"toy: wrote {Path(args.out) / 'toy.md'}, toy.json and toy.png")
    if failed:
        print(f"mtlflow: error: method(s) {', '.join(failed)} failed on the toy problem; see toy.md", file=sys.stderr)
        return 1
    return 0


def cmd_bench(args: argparse.Namespace) -> int:
    from mtlflow.experiments.bench import ENGINE_ROWS, SYNTHETIC, parse_task_counts, run_bench
    from mtlflow.experiments.trajectories import resolve_methods

    names = resolve_methods(args.methods)
    summary = run_bench(args.out, names, parse_task_counts(args.tasks),
                        benchmark=args.benchmark or SYNTHETIC, steps=args.steps, warmup=args.warmup,
                        batch_size=args.batch_size, width=args.width, image_size=args.image_size,
                        device=args.device, threads=args.threads,
                        engine_rows=ENGINE_ROWS if args.engine is None else (_csv(args.engine) or []),
                        grad_wrt=_csv(args.grad_wrt) or ["parameters"], progress=not args.no_progress,
                        hparams=_hparams(args, names), teleport=args.teleport,
                        teleport_options=parse_assignments(args.teleport_option, "--teleport-option"),
                        cost_epoch_steps=args.cost_epoch_steps, cost_epochs=args.cost_epochs)
    print(f"bench: wrote {Path(args.out) / 'bench.md'} and bench.json ({len(summary['methods'])} rows)")
    return 0


def _int_list(value: str, flag: str) -> list[int]:
    items = _csv(value) or []
    try:
        return [int(v) for v in items]
    except ValueError:
        raise InvalidParameterError(f"{flag} must be a comma-separated list of integers, got {value!r}") from None


def _seed_list(value: str) -> list[int]:
    """``--seeds 0,1,2``: distinct seeds, each of the one seed type (:func:`mtlflow.core.seeding.check_seed`)."""
    from mtlflow.core.seeding import check_seed

    seeds = [check_seed(s, "every --seeds entry") for s in _int_list(value, "--seeds")]
    if not seeds or len(set(seeds)) != len(seeds):
        raise InvalidParameterError(f"--seeds must list distinct seeds, got {value!r}")
    return seeds


def cmd_asmg_synthetic(args: argparse.Namespace) -> int:
    from mtlflow.experiments.asmg_synthetic import run_synthetic

    summary = run_synthetic(args.out, problems=_csv(args.problems) or [], sample_sizes=_int_list(args.n, "--n"),
                            seeds=_seed_list(args.seeds), methods=_csv(args.methods) or [],
                            dim=args.dim, iterations=args.iterations, beta=args.beta, update=args.update,
                            target=args.target, stop_at=args.stop_at, progress=not args.no_progress)
    print((Path(args.out) / "results.md").read_text(), end="")
    print(f"asmg-synthetic: wrote {Path(args.out) / 'convergence.png'}, results.md and results.json "
          f"({len(summary['runs'])} runs)")
    return 0


def cmd_hypercleaning(args: argparse.Namespace) -> int:
    from mtlflow.experiments.hypercleaning import run_table, table_hparams

    rows = _csv(args.methods) or []
    per_row = _hparams(args, [r for r in rows if r != "ls"])  # LS (no cleaning) has no hyper-parameters here
    table_hparams(rows, per_row)  # reject bad input before any data is prepared
    seeds = _seed_list(args.seeds)
    data_dir = Path(args.data) if args.data else cached_data_dir("hypercleaning", _bench_config(args))
    run_table(data_dir, args.out, methods=rows, seeds=seeds, epochs=args.epochs,
              hparams=per_row, progress=not args.no_progress)
    print((Path(args.out) / "table.md").read_text(), end="")
    return 0


#: the training options every run of `mtlflow ablate` shares
ABLATION_RUN_OPTIONS = ("epochs", "batch_size", "lr", "max_steps_per_epoch", "select", "device")


def cmd_ablate(args: argparse.Namespace) -> int:
    from mtlflow import benchmarks, jobs, methods
    from mtlflow.experiments.cost_ablation import run_ablation
    from mtlflow.teleport import validate
    from mtlflow.teleport.triggers import RULES

    if args.data is None and args.benchmark is None:
        raise InvalidParameterError("give --benchmark NAME (data prepared into the cache) or --data DIR")
    if args.trigger not in RULES:
        raise InvalidParameterError(f"--trigger must be one of {', '.join(RULES)}, got {args.trigger!r}")
    options = parse_assignments(args.teleport_option, "--teleport-option")
    validate("cost", options)
    hparams = _hparams(args, [args.method]).get(args.method, {})
    train_options = run_options(args, only=ABLATION_RUN_OPTIONS)
    seeds = _seed_list(args.seeds)
    if args.benchmark is not None:  # reject bad input before preparing any data
        bench = benchmarks.build(args.benchmark, **_bench_config(args))
        methods.build(args.method, len(bench.task_names), **jobs.resolved_hparams(bench, args.method, hparams))
        jobs.train_config(bench.train_defaults, method=args.method, **train_options)
    data_dir = Path(args.data) if args.data else cached_data_dir(args.benchmark, _bench_config(args))
    run_ablation(data_dir, args.out, method=args.method, hparams=hparams, seeds=seeds,
                 component_trigger=args.trigger, teleport_options=options, train_options=train_options,
                 progress=not args.no_progress)
    print((Path(args.out) / "ablation.md").read_text(), end="")
    return 0


def cmd_palora(args: argparse.Namespace) -> int:
    from mtlflow.jobs import palora

    if args.palora_command == "overhead":
        from mtlflow import benchmarks

        bench = benchmarks.build(args.benchmark, **_bench_config(args))
        report = palora.overhead_table(bench, _csv(args.tasks), args.rank, args.layers, args.factorization)
        print(json.dumps(report, default=str) if args.json else palora.overhead_markdown(report), end="\n" if args.json else "")
        return 0
    try:
        preference = [float(v) for v in _csv(args.preference) or []]
    except ValueError:
        raise InvalidParameterError(f"--preference must be comma-separated numbers, got {args.preference!r}") from None
    model_path = Path(args.run)
    print(json.dumps(palora.merge_saved_model(model_path / "model.pt" if model_path.is_dir() else model_path,
                                              preference, args.out)))
    return 0


def cmd_config(args: argparse.Namespace) -> int:
    from mtlflow.config.run import json_schema

    print(json.dumps(json_schema(), indent=2))
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    from mtlflow.jobs import stages

    params = stages.load_params(args.params)
    if args.stage == "prepare":
        stages.stage_prepare(params)
    elif args.stage == "train":
        stages.stage_train(params, args.method, args.seed)
    elif args.stage == "reference":
        stages.stage_reference(params, args.task, args.seed)
    elif args.stage == "evaluate":
        stages.stage_evaluate(params)
    elif args.stage == "experiment":
        stages.stage_experiment(params)
    else:
        stages.stage_aggregate(params)
    return 0


# -- parser ----------------------------------------------------------------------------------

class _OneLineParser(argparse.ArgumentParser):
    """argparse errors as one ``mtlflow: error:`` line (like every other error), not a usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"mtlflow: error: {self.prog}: {message}; see `{self.prog} --help`\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _OneLineParser(prog="mtlflow", description="Multi-task learning optimisation: "
                                     "methods, benchmarks, training, evaluation and Kubeflow pipelines.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("methods", help="list the registered methods with family, cost, paper, hyper-parameters")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_methods)

    p = sub.add_parser("architectures", help="list the model architectures (combine with any method: "
                       "`train --architecture NAME --architecture-option KEY=VALUE`)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_architectures)

    p = sub.add_parser("benchmarks", help="list the registered benchmarks and their options")
    p.set_defaults(func=cmd_benchmarks)

    def data_options(q: argparse.ArgumentParser) -> None:
        q.add_argument("--mnist-dir", help="MNIST IDX folder whose digits are added (multimnist)")
        q.add_argument("--data-dir", help="mounted dataset folder (celeba, nyuv2, cityscapes, office31, officehome)")
        q.add_argument("--option", action="append", metavar="KEY=VALUE",
                       help="benchmark preparation option (repeatable), e.g. n_train=2000")

    p = sub.add_parser("prepare", help="build a benchmark's data into a directory with a content hash")
    p.add_argument("--benchmark", required=True)
    p.add_argument("--out", required=True, help="new or empty directory (a prepared dataset is replaced only "
                   "with --overwrite; other content is never deleted)")
    p.add_argument("--overwrite", action="store_true", help="replace the prepared dataset already in --out")
    data_options(p)
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("train", help="train one method with one seed")
    p.add_argument("--benchmark", help="benchmark name; its data is prepared into the cache if needed")
    p.add_argument("--data", help="prepared data directory (from `mtlflow prepare`)")
    data_options(p)
    add_run_options(p)
    p.add_argument("--out", help="run directory (required unless --dry-run)")
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
    p.add_argument("--nproc", type=int, metavar="N", help="data-parallel training in N processes (runs "
                   "`torchrun --standalone --nproc_per_node N -m mtlflow train ...`; global batch = N x --batch-size)")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="evaluate a trained run on a split")
    p.add_argument("run_dir")
    p.add_argument("--data", required=True, help="the prepared data the run was trained on")
    p.add_argument("--split", default="test")
    p.add_argument("--out", help="output JSON (default RUN_DIR/evaluation.json)")
    p.add_argument("--confusion", action="store_true",
                   help="also write the confusion matrices of the classification tasks into the JSON")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("aggregate", help="compare runs: Δm%%, mean rank, hypervolume, Pareto plot, HTML")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--references", nargs="*", help="single-task reference run directories")
    p.add_argument("--paper-references", action=argparse.BooleanOptionalAction, default=None,
                   help="also report Δm%% against the papers' single-task values (default: when the benchmark "
                        "publishes them; --no-paper-references turns it off)")
    p.add_argument("--method-set", help="comma-separated methods over which the mean rank is computed")
    p.add_argument("--split", default="test")
    p.add_argument("--out", required=True)
    p.add_argument("--pushgateway", metavar="URL", help="push Δm%%, mean rank, hypervolume and Pareto membership "
                   "per method to this Prometheus Pushgateway (default $MTLFLOW_PUSHGATEWAY)")
    p.set_defaults(func=cmd_aggregate)

    p = sub.add_parser("report", help="render the HTML report of a finished run or an aggregate results directory")
    p.add_argument("path", help="run directory (from `mtlflow train --out`) or aggregate results directory")
    p.add_argument("--out", help="output HTML file (default PATH/report.html)")
    p.set_defaults(func=cmd_report)

    p = sub.add_parser("pipeline", help="Kubeflow pipelines: run locally, compile, submit, schedule")
    psub = p.add_subparsers(dest="pipeline_command", required=True, metavar="ACTION")
    pipeline_help = "benchmark_sweep (alias main), retrain or distributed_train (cluster only)"

    def pipeline_params(q: argparse.ArgumentParser, default: str) -> None:
        q.add_argument("--pipeline", default=default, help=f"{pipeline_help}; default {default}")
        q.add_argument("--params-file", "--params", dest="params_file", help="YAML file of pipeline parameters")
        q.add_argument("--param", action="append", metavar="KEY=VALUE", help="pipeline parameter (repeatable)")

    def cluster_target(q: argparse.ArgumentParser) -> None:
        q.add_argument("--host", required=True, help="KFP API URL, e.g. https://kubeflow.example.com/pipeline "
                       "(token from $MTLFLOW_KFP_TOKEN)")
        q.add_argument("--experiment", default="mtlflow", help="experiment name (created if missing)")
        q.add_argument("--namespace", help="Kubeflow profile namespace (multi-user deployments)")
        q.add_argument("--service-account", help="Kubernetes service account of the run's pods")

    q = psub.add_parser("run", help="run with kfp.local's SubprocessRunner")
    q.add_argument("--local", action="store_true", required=True, help="run on this machine (kfp.local)")
    pipeline_params(q, "main")
    q.add_argument("--workdir", default="runs/pipeline", help="where kfp.local writes artifacts")
    q.add_argument("--storage-root", help="DVC remote/cache, checkpoints, status records and model store "
                   "(default WORKDIR/storage; reuse it across retrain runs to keep the champion)")
    q = psub.add_parser("compile", help="write pipeline IR YAML (one pipeline, or --all)")
    q.add_argument("--pipeline", default="main", help=pipeline_help)
    q.add_argument("--all", action="store_true", help="every pipeline, as OUT_DIR/<name>.yaml")
    q.add_argument("--out", help="output file (default OUT_DIR/<name>.yaml)")
    q.add_argument("--out-dir", default="build", help="output directory (default build)")
    q = psub.add_parser("submit", help="validate, compile and start one run on a KFP cluster")
    pipeline_params(q, "retrain")
    cluster_target(q)
    q.add_argument("--run-name", help="display name of the run")
    q.add_argument("--no-cache", action="store_true", help="disable KFP caching for this run")
    q = psub.add_parser("schedule", help="create a recurring run (max 1 concurrent, no catch-up)")
    pipeline_params(q, "benchmark_sweep")
    cluster_target(q)
    q.add_argument("--cron", required=True, help="6-field KFP cron with seconds first, e.g. '0 0 3 * * *'")
    q.add_argument("--job-name", help="name of the recurring run")
    p.set_defaults(func=cmd_pipeline)

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

    p = sub.add_parser("toy", help="every method on CAGrad's toy problem from the 5 start points: plot + table")
    p.add_argument("--methods", default="all", help="'all' (default) or a comma-separated list")
    p.add_argument("--steps", type=int, default=35_000, help="Adam steps (35000 = Nash-MTL; FAMO uses 50000)")
    p.add_argument("--scale", type=float, default=0.1, help="multiplier of objective 1 (1.0 = CAGrad's original)")
    p.add_argument("--lr", type=float, default=1e-3, help="Adam learning rate (1e-3 as the reference scripts)")
    p.add_argument("--seed", type=seed_arg, default=0, help="seed of the methods' random generators (RLW, PCGrad)")
    p.add_argument("--hp", action="append", metavar="[METHOD.]NAME=VALUE", help="method hyper-parameter (repeatable)")
    p.add_argument("--jobs", type=int, default=1, help="methods run in parallel worker processes (1 thread each)")
    p.add_argument("--out", required=True, help="output directory (toy.json, toy.md, toy.png)")
    p.add_argument("--no-progress", action="store_true", help="no per-method progress lines")
    p.add_argument("--teleport", help="cost: also run every method + COST and plot them side by side "
                   "(cost-<method>.png, the COST paper's Fig. 6)")
    p.add_argument("--teleport-option", action="append", metavar="KEY=VALUE",
                   help="COST option for the toy runs (repeatable), e.g. radius=0.1")
    p.set_defaults(func=cmd_toy)

    p = sub.add_parser("bench", help="step time, memory, solver and engine time of every method; ratios to LS")
    p.add_argument("--methods", default="all", help="'all' (default) or a comma-separated list (LS is always added)")
    p.add_argument("--tasks", default="2,10,40", help="task counts K of the synthetic CelebA model")
    p.add_argument("--benchmark", help="time a registered benchmark's model and data instead of synthetic CelebA")
    p.add_argument("--steps", type=int, default=10, help="timed steps per method")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps before timing")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--width", type=int, default=64, help="channel width of the CelebA CNN (64 = full size)")
    p.add_argument("--image-size", type=int, default=64)
    p.add_argument("--device", default="cpu", help="cpu (default), cuda or auto")
    p.add_argument("--threads", type=int, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--engine", help="engine rows to time (default all: single, plain-loop, loop, batched, func, "
                   "autojac, autogram, representation); empty string for none")
    p.add_argument("--grad-wrt", help="parameters (default) and/or representation: also time every Gramian "
                   "method in representation mode")
    p.add_argument("--hp", action="append", metavar="[METHOD.]NAME=VALUE",
                   help="method hyper-parameter (repeatable), e.g. nashmtl.update_weights_every=10")
    p.add_argument("--out", required=True, help="output directory (bench.json, bench.md)")
    p.add_argument("--no-progress", action="store_true")
    p.add_argument("--teleport", help="cost: also time each method + COST per epoch (overhead over the method)")
    p.add_argument("--teleport-option", action="append", metavar="KEY=VALUE",
                   help="COST option of the overhead runs (repeatable; default: the default budget, trigger=always)")
    p.add_argument("--cost-epoch-steps", type=int, help="steps of a timed epoch (default: the benchmark's real "
                   "epoch at --batch-size; 40 on the synthetic model)")
    p.add_argument("--cost-epochs", type=int, default=2, help="timed epochs per variant (default 2, after 1 warm-up)")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("palora", help="PaLoRA tools: parameter overhead of the adapters; merge a trained front "
                       "model into the plain network of one preference")
    psub = p.add_subparsers(dest="palora_command", required=True, metavar="ACTION")
    q = psub.add_parser("overhead", help="adapter parameters per layer, mn + T·r(m+n) (PaLoRA Sec. 4.1)")
    q.add_argument("--benchmark", required=True)
    data_options(q)
    q.add_argument("--tasks", help="comma-separated subset of tasks (default: all)")
    q.add_argument("--rank", type=int, default=1, help="adapter rank r (default 1)")
    q.add_argument("--layers", default="trunk", help="trunk (default), all (heads too) or module names")
    q.add_argument("--factorization", default="matrix", help="Conv2d adapters: matrix (default) or kernel")
    q.add_argument("--json", action="store_true", help="machine-readable output")
    q = psub.add_parser("merge", help="write the plain network of one preference (adapters merged, Eq. 2)")
    q.add_argument("run", help="a PaLoRA run directory or its model.pt")
    q.add_argument("--preference", required=True, help="comma-separated λ, one per task, e.g. 0.3,0.7")
    q.add_argument("--out", required=True, help="output model file (loads like any run's model.pt)")
    p.set_defaults(func=cmd_palora)

    p = sub.add_parser("config", help="the run configuration: `config schema` prints its JSON schema (the `train` "
                       "flags, params.yaml's train.options and the pipelines' train_options are its fields)")
    p.add_argument("what", choices=["schema"], help="schema: the JSON schema of RunConfig")
    p.set_defaults(func=cmd_config)

    p = sub.add_parser("stage", help="run one DVC stage of dvc.yaml (reads params.yaml)")
    p.add_argument("stage", choices=["prepare", "train", "reference", "evaluate", "aggregate", "experiment"])
    p.add_argument("--method")
    p.add_argument("--task")
    p.add_argument("--seed", type=seed_arg, default=0)
    p.add_argument("--params", default="params.yaml")
    p.set_defaults(func=cmd_stage)

    p = sub.add_parser("asmg-synthetic", help="ASMG on the thesis' synthetic black-box problems (Eqs. 4.21-4.23): "
                       "convergence plot + table")
    p.add_argument("--problems", default="l1-ellipsoid,lhalf-ellipsoid,ellipsoid-rastrigin",
                   help="comma-separated: l1-ellipsoid, lhalf-ellipsoid, ellipsoid-rastrigin")
    p.add_argument("--n", default="10,50,100", help="sample sizes N per iteration (default 10,50,100)")
    p.add_argument("--seeds", default="0,1,2", help="seeds (start point and samples; default 0,1,2)")
    p.add_argument("--methods", default="asmg", help="asmg and/or asmg-ew (the λ = 1/m ablation)")
    p.add_argument("--dim", type=int, default=100, help="dimension d (default 100)")
    p.add_argument("--iterations", type=int, default=8000, help="iteration budget per run (default 8000)")
    p.add_argument("--beta", type=float, default=0.1, help="step size β (thesis: 0.1)")
    p.add_argument("--update", default="normalized", choices=["normalized", "raw"],
                   help="covariance/mean update: App. A.2.5 (default) or Eq. 4.14 as printed")
    p.add_argument("--target", type=float, default=1e-4, help="precision reported in the table (default 1e-4)")
    p.add_argument("--stop-at", type=float, default=1e-6, help="stop a run once ℰ <= this (default 1e-6)")
    p.add_argument("--out", required=True, help="output directory (convergence.png, results.md, results.json)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_asmg_synthetic)

    p = sub.add_parser("ablate", help="COST's ablations (Tables 4, 7, 8): components, trigger, adapter; Δm%% and "
                       "teleport telemetry per row")
    p.add_argument("what", choices=["cost"], help="what to ablate: cost")
    p.add_argument("--benchmark", help="benchmark name; its data is prepared into the cache if needed")
    p.add_argument("--data", help="prepared data directory (from `mtlflow prepare`)")
    data_options(p)
    p.add_argument("--method", default="fairgrad", help="base method of every COST row (default fairgrad, the paper's)")
    p.add_argument("--hp", action="append", metavar="[METHOD.]NAME=VALUE",
                   help="base method hyper-parameter (repeatable)")
    p.add_argument("--seeds", default="0", help="comma-separated seeds (default 0)")
    add_run_options(p, only=ABLATION_RUN_OPTIONS)
    p.add_argument("--trigger", default="dominated", help="trigger of the component rows (Table 4) and of the "
                   "adapter rows (Table 8): dominated (default, Eq. 3), weak, many-task, released")
    p.add_argument("--teleport-option", action="append", metavar="KEY=VALUE",
                   help="COST option applied to every COST row (repeatable), e.g. max_per_epoch=2")
    p.add_argument("--out", required=True, help="output directory (runs/, ablation.md, ablation.json, ablation.csv)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_ablate)

    p = sub.add_parser("hypercleaning", help="Table 3.2 of Ye's thesis: MOML, MoCo, FORUM (+ LS) on multi-task "
                       "data hyper-cleaning, mean ± std over seeds")
    p.add_argument("--data", help="prepared hypercleaning data (default: prepared into the cache)")
    data_options(p)
    p.add_argument("--methods", default="moml,moco,forum,ls", help="rows: moml, moco, forum, ls (no cleaning)")
    p.add_argument("--seeds", default="0,1,2", help="seeds (default 0,1,2: the thesis' 3 runs)")
    p.add_argument("--epochs", type=int, help="epochs per run (default: the benchmark recipe, 80)")
    p.add_argument("--hp", action="append", metavar="[METHOD.]NAME=VALUE",
                   help="hyper-parameter of every bi-level row, or of one row (moml., moco., forum.); repeatable")
    p.add_argument("--out", required=True, help="output directory (runs/, table.md, table.json)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_hypercleaning)
    return parser


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(signal.Signals(signum).name)


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    args.argv = list(sys.argv[1:] if argv is None else argv)  # `train --nproc N` relaunches itself under torchrun
    previous = signal.signal(signal.SIGTERM, _raise_terminated)  # eviction/preemption: unwind like Ctrl-C
    try:
        return int(args.func(args) or 0)
    except MtlflowError as exc:
        print(f"mtlflow: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except Terminated as exc:
        print(f"mtlflow: terminated by {exc}; checkpoints are intact, resume with the same command and --resume",
              file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("mtlflow: interrupted; resume with the same command and --resume", file=sys.stderr)
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
