"""The ``mtlflow`` command line.

Errors in user input end with one line ``mtlflow: error: ...`` on stderr and a non-zero exit code
(2 for unknown names and invalid parameters, 3 for missing or corrupt data, 4 for NaN losses,
5 for solver failures).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any, Sequence

import yaml

from mtlflow.errors import InvalidParameterError, MtlflowError


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


def default_cache_dir() -> Path:
    return Path(os.environ.get("MTLFLOW_CACHE", Path.home() / ".cache" / "mtlflow"))


def cached_data_dir(benchmark: str, config: dict[str, Any]) -> Path:
    """Prepare ``benchmark`` with ``config`` into the cache once; reuse it afterwards."""
    from mtlflow import benchmarks, jobs
    from mtlflow.errors import DataError

    bench = benchmarks.build(benchmark, **config)
    key = hashlib.sha256(json.dumps(bench.config, sort_keys=True).encode()).hexdigest()[:12]
    path = default_cache_dir() / "data" / f"{benchmark}-{key}"
    try:
        jobs.load_prepared(path)
    except DataError:
        print(f"preparing {benchmark} data into {path}", file=sys.stderr)
        jobs.prepare(benchmark, path, **config)
    return path


# -- commands --------------------------------------------------------------------------------

def cmd_methods(args: argparse.Namespace) -> int:
    from mtlflow import methods

    rows = [methods.info(n) for n in methods.available()]
    if args.json:
        print(json.dumps([r.__dict__ for r in rows], indent=2, default=str))
        return 0
    for r in rows:
        hp = ", ".join(f"{k}={v[0]!r}" for k, v in r.hparams.items()) or "-"
        print(f"{r.name:<12} {r.family:<22} {r.cost:<5} {r.paper}")
        print(f"{'':<12} equations: {r.equations}")
        print(f"{'':<12} hyper-parameters: {hp}")
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
    return 0


def _bench_config(args: argparse.Namespace) -> dict[str, Any]:
    config = parse_assignments(args.option, "--option")
    if getattr(args, "mnist_dir", None):
        config["mnist_dir"] = args.mnist_dir
    return config


def cmd_prepare(args: argparse.Namespace) -> int:
    from mtlflow import jobs

    manifest = jobs.prepare(args.benchmark, args.out, **_bench_config(args))
    print(json.dumps({"out": args.out, "content_hash": manifest["content_hash"]}))
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from mtlflow import benchmarks, jobs, methods

    if args.data is None and args.benchmark is None:
        raise InvalidParameterError("give --benchmark NAME (data prepared into the cache) or --data DIR")
    hparams = parse_assignments(args.hp, "--hp")
    overrides = dict(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, optimizer=args.optimizer,
                     weight_decay=args.weight_decay, clip_grad_norm=args.clip_grad_norm,
                     select=args.select, max_steps_per_epoch=args.max_steps_per_epoch, device=args.device)
    if args.benchmark is not None:
        # reject bad input before preparing any data
        bench = benchmarks.build(args.benchmark, **_bench_config(args))
        selected = bench.select_tasks(_csv(args.tasks))
        methods.build(args.method, len(selected), **jobs.resolved_hparams(bench, args.method, hparams))
        jobs.train_config(bench.train_defaults, method=args.method, **overrides)
    data_dir = Path(args.data) if args.data else cached_data_dir(args.benchmark, _bench_config(args))
    result = jobs.train(data_dir, args.out, method=args.method, seed=args.seed, hparams=hparams,
                        tasks=_csv(args.tasks), resume=args.resume, progress=not args.no_progress, **overrides)
    final = result["final"]["test"]
    print(json.dumps({"run_dir": args.out, "test": final}))
    return 0


def cmd_evaluate(args: argparse.Namespace) -> int:
    from mtlflow import jobs

    result = jobs.evaluate(args.run_dir, args.data, split=args.split, out_file=args.out)
    print(json.dumps(result["metrics"]))
    return 0


def cmd_aggregate(args: argparse.Namespace) -> int:
    from mtlflow import jobs

    summary = jobs.aggregate(args.run_dirs, args.out, reference_dirs=args.references or (),
                             method_set=_csv(args.method_set), split=args.split)
    from mtlflow.report import markdown_table

    print(markdown_table(summary), end="")
    print(f"report: {Path(args.out) / 'report.html'}")
    return 0


def cmd_pipeline(args: argparse.Namespace) -> int:
    from pipelines import runner

    if args.pipeline_command == "compile":
        path = runner.compile_pipeline(args.out, pipeline=args.pipeline)
        print(f"compiled {args.pipeline} pipeline to {path}")
        return 0
    params = runner.load_params(args.params_file, parse_assignments(args.param, "--param"))
    report = runner.run_local(params, workdir=args.workdir, pipeline=args.pipeline)
    print(f"report: {report}")
    return 0


def cmd_stage(args: argparse.Namespace) -> int:
    from mtlflow import stages

    params = stages.load_params(args.params)
    if args.stage == "prepare":
        stages.stage_prepare(params)
    elif args.stage == "train":
        stages.stage_train(params, args.method, args.seed)
    elif args.stage == "reference":
        stages.stage_reference(params, args.task, args.seed)
    else:
        stages.stage_aggregate(params)
    return 0


# -- parser ----------------------------------------------------------------------------------

def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="mtlflow", description="Multi-task learning optimisation: "
                                     "methods, benchmarks, training, evaluation and Kubeflow pipelines.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    p = sub.add_parser("methods", help="list the registered methods with family, cost, paper, hyper-parameters")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_methods)

    p = sub.add_parser("benchmarks", help="list the registered benchmarks and their options")
    p.set_defaults(func=cmd_benchmarks)

    def data_options(q: argparse.ArgumentParser) -> None:
        q.add_argument("--mnist-dir", help="MNIST IDX folder whose digits are added (multimnist)")
        q.add_argument("--option", action="append", metavar="KEY=VALUE",
                       help="benchmark preparation option (repeatable), e.g. n_train=2000")

    p = sub.add_parser("prepare", help="build a benchmark's data into a directory with a content hash")
    p.add_argument("--benchmark", required=True)
    p.add_argument("--out", required=True)
    data_options(p)
    p.set_defaults(func=cmd_prepare)

    p = sub.add_parser("train", help="train one method with one seed")
    p.add_argument("--benchmark", help="benchmark name; its data is prepared into the cache if needed")
    p.add_argument("--data", help="prepared data directory (from `mtlflow prepare`)")
    data_options(p)
    p.add_argument("--method", default="ls")
    p.add_argument("--hp", action="append", metavar="KEY=VALUE", help="method hyper-parameter (repeatable)")
    p.add_argument("--tasks", help="comma-separated subset of tasks (one task = single-task reference)")
    p.add_argument("--epochs", type=int)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--optimizer", help="adam (default), adamw or sgd")
    p.add_argument("--weight-decay", type=float)
    p.add_argument("--clip-grad-norm", type=float, help="clip the global gradient norm after backward")
    p.add_argument("--select", help="final-metric rule: last (default) or last-k:K")
    p.add_argument("--max-steps-per-epoch", type=int)
    p.add_argument("--device", help="cpu (default) or cuda")
    p.add_argument("--out", required=True, help="run directory")
    p.add_argument("--resume", action="store_true", help="continue from the run's last checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_train)

    p = sub.add_parser("evaluate", help="evaluate a trained run on a split")
    p.add_argument("run_dir")
    p.add_argument("--data", required=True, help="the prepared data the run was trained on")
    p.add_argument("--split", default="test")
    p.add_argument("--out", help="output JSON (default RUN_DIR/evaluation.json)")
    p.set_defaults(func=cmd_evaluate)

    p = sub.add_parser("aggregate", help="compare runs: Δm%%, mean rank, hypervolume, Pareto plot, HTML")
    p.add_argument("run_dirs", nargs="+")
    p.add_argument("--references", nargs="*", help="single-task reference run directories")
    p.add_argument("--method-set", help="comma-separated methods over which the mean rank is computed")
    p.add_argument("--split", default="test")
    p.add_argument("--out", required=True)
    p.set_defaults(func=cmd_aggregate)

    p = sub.add_parser("pipeline", help="run the Kubeflow pipeline locally or compile it")
    psub = p.add_subparsers(dest="pipeline_command", required=True, metavar="ACTION")
    q = psub.add_parser("run", help="run with kfp.local's SubprocessRunner")
    q.add_argument("--local", action="store_true", required=True, help="run on this machine (kfp.local)")
    q.add_argument("--pipeline", default="main")
    q.add_argument("--params-file", help="YAML file of pipeline parameters")
    q.add_argument("--param", action="append", metavar="KEY=VALUE", help="pipeline parameter (repeatable)")
    q.add_argument("--workdir", default="runs/pipeline", help="where kfp.local writes artifacts")
    q = psub.add_parser("compile", help="write the pipeline IR YAML")
    q.add_argument("--pipeline", default="main")
    q.add_argument("--out", required=True)
    p.set_defaults(func=cmd_pipeline)

    p = sub.add_parser("stage", help="run one DVC stage of dvc.yaml (reads params.yaml)")
    p.add_argument("stage", choices=["prepare", "train", "reference", "aggregate"])
    p.add_argument("--method")
    p.add_argument("--task")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--params", default="params.yaml")
    p.set_defaults(func=cmd_stage)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except MtlflowError as exc:
        print(f"mtlflow: error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("mtlflow: interrupted; resume with the same command and --resume", file=sys.stderr)
        return 130


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
