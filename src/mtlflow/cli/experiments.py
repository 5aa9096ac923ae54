"""`mtlflow toy | bench | asmg-synthetic | hypercleaning | ablate | palora | reproduce`: the papers' experiments."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from mtlflow.cli.common import (
    add_data_options,
    add_run_options,
    bench_config,
    check_data_source,
    csv_list,
    int_list,
    method_hparams,
    parse_assignments,
    run_options,
    seed_list,
)
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.outputs import check_output_dir, check_output_path
from mtlflow.core.seeding import seed_arg
from mtlflow.metrics.intervals import format_estimate


def cmd_toy(args: argparse.Namespace) -> int:
    from mtlflow.experiments.trajectories import resolve_methods, run_toy

    check_output_dir(args.out, "--out")
    names = resolve_methods(args.methods)
    summary = run_toy(names, args.out, steps=args.steps, scale=args.scale, lr=args.lr, seed=args.seed,
                      hparams=method_hparams(args, names), progress=not args.no_progress, jobs=args.jobs,
                      teleport=args.teleport,
                      teleport_options=parse_assignments(args.teleport_option, "--teleport-option"))
    failed = [m["method"] for m in summary["methods"] if m["status"] == "failed"]
    print(f"toy: wrote {Path(args.out) / 'toy.md'}, toy.json and toy.png")
    if failed:
        print(f"mtlflow: error: method(s) {', '.join(failed)} failed on the toy problem; see toy.md", file=sys.stderr)
        return 1
    return 0


def pick(value: int | None, default: int) -> int:
    """An option's value, or the default of the bench mode when it was not given."""
    return default if value is None else value


def cmd_bench(args: argparse.Namespace) -> int:
    from mtlflow.experiments.bench import ENGINE_ROWS, SYNTHETIC, parse_task_counts, run_bench
    from mtlflow.experiments.trajectories import resolve_methods

    check_output_dir(args.out, "--out")
    if args.spec_data:
        from mtlflow.experiments.spec_data_bench import run_spec_data_bench

        run_spec_data_bench(args.out, rows=args.rows, columns=args.columns,
                            batch_size=pick(args.batch_size, 256), steps=pick(args.steps, 1000),
                            warmup=pick(args.warmup, 50), threads=args.threads)
        print(f"bench: wrote {Path(args.out) / 'spec_data.md'} and spec_data.json")
        return 0
    names = resolve_methods(args.methods)
    summary = run_bench(args.out, names, parse_task_counts(args.tasks),
                        benchmark=args.benchmark or SYNTHETIC, steps=pick(args.steps, 10),
                        warmup=pick(args.warmup, 2), batch_size=pick(args.batch_size, 32), width=args.width, image_size=args.image_size,
                        device=args.device, threads=args.threads,
                        engine_rows=ENGINE_ROWS if args.engine is None else (csv_list(args.engine) or []),
                        grad_wrt=csv_list(args.grad_wrt) or ["parameters"], progress=not args.no_progress,
                        hparams=method_hparams(args, names), teleport=args.teleport,
                        teleport_options=parse_assignments(args.teleport_option, "--teleport-option"),
                        cost_epoch_steps=args.cost_epoch_steps, cost_epochs=args.cost_epochs)
    print(f"bench: wrote {Path(args.out) / 'bench.md'} and bench.json ({len(summary['methods'])} rows)")
    return 0


def cmd_asmg_synthetic(args: argparse.Namespace) -> int:
    from mtlflow.experiments.asmg_synthetic import run_synthetic

    check_output_dir(args.out, "--out")
    summary = run_synthetic(args.out, problems=csv_list(args.problems) or [], sample_sizes=int_list(args.n, "--n"),
                            seeds=seed_list(args.seeds), methods=csv_list(args.methods) or [],
                            dim=args.dim, iterations=args.iterations, beta=args.beta, update=args.update,
                            target=args.target, stop_at=args.stop_at, progress=not args.no_progress)
    print((Path(args.out) / "results.md").read_text(), end="")
    print(f"asmg-synthetic: wrote {Path(args.out) / 'convergence.png'}, results.md and results.json "
          f"({len(summary['runs'])} runs)")
    return 0


def cmd_hypercleaning(args: argparse.Namespace) -> int:
    from mtlflow.experiments.hypercleaning import hypercleaning_table

    check_output_dir(args.out, "--out", [("--data", args.data)])
    rows = csv_list(args.methods) or []
    # LS (no cleaning) has no hyper-parameters here
    hypercleaning_table(args.out, args.data, bench_config(args), methods=rows, seeds=seed_list(args.seeds),
                        epochs=args.epochs, hparams=method_hparams(args, [r for r in rows if r != "ls"]),
                        progress=not args.no_progress)
    print((Path(args.out) / "table.md").read_text(), end="")
    return 0


#: the training options every run of `mtlflow ablate` shares
ABLATION_RUN_OPTIONS = ("epochs", "batch_size", "lr", "max_steps_per_epoch", "select", "device")


def cmd_ablate(args: argparse.Namespace) -> int:
    from mtlflow.experiments.cost_ablation import ablate

    check_data_source(args)
    check_output_dir(args.out, "--out", [("--data", args.data)])
    ablate(args.out, args.data, args.benchmark, bench_config(args), method=args.method,
           hparams=method_hparams(args, [args.method]).get(args.method, {}), seeds=seed_list(args.seeds),
           component_trigger=args.trigger,
           teleport_options=parse_assignments(args.teleport_option, "--teleport-option"),
           train_options=run_options(args, only=ABLATION_RUN_OPTIONS), progress=not args.no_progress)
    print((Path(args.out) / "ablation.md").read_text(), end="")
    return 0


def cmd_palora(args: argparse.Namespace) -> int:
    from mtlflow.jobs import palora

    if args.palora_command == "overhead":
        from mtlflow import benchmarks

        bench = benchmarks.build(args.benchmark, **bench_config(args))
        report = palora.overhead_table(bench, csv_list(args.tasks), args.rank, args.layers, args.factorization)
        print(json.dumps(report, default=str) if args.json else palora.overhead_markdown(report), end="\n" if args.json else "")
        return 0
    try:
        preference = [float(v) for v in csv_list(args.preference) or []]
    except ValueError:
        raise InvalidParameterError(f"--preference must be comma-separated numbers, got {args.preference!r}") from None
    model_path = Path(args.run)
    model_file = model_path / "model.pt" if model_path.is_dir() else model_path
    check_output_path(args.out, "--out", "file", [("the run's model", model_file)])
    print(json.dumps(palora.merge_saved_model(model_file, preference, args.out)))
    return 0


def cmd_reproduce(args: argparse.Namespace) -> int:
    from mtlflow.experiments import claims

    if args.pipeline and (args.ledger or args.list):
        raise InvalidParameterError("--pipeline runs one CLAIM; --ledger and --list take no pipeline")
    if args.list:
        for claim in claims.CLAIMS.values():
            print(f"{claim.key:<28} {claim.paper}, {claim.source}: {claim.statement}")
        return 0
    pipeline_flags = [flag for flag, value in (("--local", args.local), ("--compile", args.compile),
                                               ("--host", args.host)) if value]
    if (pipeline_flags or args.profile) and not args.pipeline:
        raise InvalidParameterError(f"{(pipeline_flags or ['--profile'])[0]} belongs to --pipeline; add --pipeline")
    if args.ledger:
        if args.claim:
            raise InvalidParameterError("--ledger renders the stored results; give no CLAIM with it")
        check_output_path(args.ledger_path, "--ledger-path", "file")
        path = claims.write_ledger(args.out, args.ledger_path)
        print(f"reproduce: wrote {path} from {args.out}")
        return 0
    if not args.claim:
        raise InvalidParameterError("give a CLAIM (see `mtlflow reproduce --list`) or --ledger")
    claims.get(args.claim)  # an unknown claim is named before the output folder is checked
    if args.spec:
        raise InvalidParameterError("--spec does not apply: a claim runs its paper's benchmark")
    if args.pipeline:
        return reproduce_pipeline(args, pipeline_flags)
    check_output_dir(args.out, "--out")
    record = claims.reproduce(args.claim, args.scale, args.out, device=args.device, overwrite=args.overwrite,
                              progress=not args.no_progress, seeds=seed_list(args.seeds) if args.seeds else None,
                              config_override=parse_assignments(args.set, "--set"),
                              data_options=bench_config(args), command="mtlflow " + " ".join(args.argv))
    estimate = format_estimate(record["estimate"], digits=4)
    print(f"reproduce: {args.claim} ({args.scale}): {estimate} over {record['estimate']['n']} value(s); paper "
          f"{record['paper_text']}; {record['verdict']} ({record['seconds']:.0f} s); wrote "
          f"{claims.result_path(args.out, args.claim, args.scale)}")
    return 0


def reproduce_pipeline(args: argparse.Namespace, targets: list[str]) -> int:
    """`mtlflow reproduce CLAIM --pipeline`: the claim's seeds as tasks of the ``reproduce`` pipeline, run here
    (--local: the result file is written to --out as `mtlflow reproduce` writes it), compiled (--compile FILE)
    or submitted (--host URL)."""
    from mtlflow.core import atomic
    from mtlflow.experiments import claims
    from mtlflow.pipelines import reproduce as pipeline

    if len(targets) != 1:
        raise InvalidParameterError("--pipeline needs exactly one of --local, --compile FILE and --host URL, got "
                                    f"{', '.join(targets) or 'none'}")
    if args.device not in pipeline.DEVICES:
        raise InvalidParameterError(f"--device must be one of {', '.join(pipeline.DEVICES)} with --pipeline (a "
                                    f"compile-time setting), got {args.device!r}")
    seeds = seed_list(args.seeds) if args.seeds else None
    settings = parse_assignments(args.set, "--set")
    claims.resolve(args.claim, args.scale, seeds, settings)
    params = pipeline.parameters(args.claim, args.scale, seeds, settings, bench_config(args),
                                 "mtlflow " + " ".join(args.argv))
    if args.local:
        target = claims.result_path(args.out, args.claim, args.scale)
        check_output_dir(args.out, "--out")
        check_output_dir(args.workdir, "--workdir", [("--out", args.out)])
        if target.exists() and not args.overwrite:
            raise InvalidParameterError(f"{target} exists; pass --overwrite to replace it")
        record = pipeline.run_local(params, args.workdir, device=args.device)
        atomic.write_json(target, record)
        print(f"reproduce: {args.claim} ({args.scale}) as a pipeline: "
              f"{format_estimate(record['estimate'], digits=4)} over {record['estimate']['n']} value(s); "
              f"{record['verdict']}; wrote {target} (kfp.local artifacts under {args.workdir})")
        return 0
    from mtlflow.config.cluster import load_profile

    profile = load_profile(args.profile) if args.profile else None
    if args.compile:
        check_output_path(args.compile, "--compile", "file")
        path = pipeline.compile_reproduce(args.compile, params, device=args.device, profile=profile)
        print(f"compiled the reproduce pipeline of {args.claim} ({args.scale}, {args.device}) to {path}")
        return 0
    import tempfile

    from mtlflow.ops import kfp_client

    with tempfile.TemporaryDirectory(prefix="mtlflow-submit-") as tmp:
        package = pipeline.compile_reproduce(Path(tmp) / "reproduce.yaml", params, device=args.device,
                                             profile=profile)
        info = kfp_client.submit_package(args.host, package, params, experiment=args.experiment,
                                         run_name=args.run_name, namespace=args.namespace,
                                         service_account=args.service_account or
                                         (profile.service_account if profile else None))
    print(json.dumps(info))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the toy, bench, palora, asmg-synthetic, ablate, hypercleaning, reproduce commands."""
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
    p.add_argument("--steps", type=int, help="timed steps per method (default 10; --spec-data: 1000)")
    p.add_argument("--warmup", type=int, help="untimed steps before timing (default 2; --spec-data: 50)")
    p.add_argument("--batch-size", type=int, help="default 32; --spec-data: 256")
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
    p.add_argument("--spec-data", action="store_true",
                   help="instead: the your-data path on a synthetic --rows x --columns table (prepare time and peak "
                        "memory; training samples/s against a hand-written loop); writes spec_data.md/.json")
    p.add_argument("--rows", type=int, default=1_000_000, help="--spec-data: table rows (default 1,000,000)")
    p.add_argument("--columns", type=int, default=50, help="--spec-data: table columns (default 50)")
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
    add_data_options(q)
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
    add_data_options(p)
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
    add_data_options(p)
    p.add_argument("--methods", default="moml,moco,forum,ls", help="rows: moml, moco, forum, ls (no cleaning)")
    p.add_argument("--seeds", default="0,1,2", help="seeds (default 0,1,2: the thesis' 3 runs)")
    p.add_argument("--epochs", type=int, help="epochs per run (default: the benchmark recipe, 80)")
    p.add_argument("--hp", action="append", metavar="[METHOD.]NAME=VALUE",
                   help="hyper-parameter of every bi-level row, or of one row (moml., moco., forum.); repeatable")
    p.add_argument("--out", required=True, help="output directory (runs/, table.md, table.json)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=cmd_hypercleaning)

    p = sub.add_parser("reproduce", help="run one seed paper's claim at paper or ci scale and store its result "
                       "(mean, 95 %% interval, verdict); --ledger regenerates docs/research/claims.md")
    p.add_argument("claim", nargs="?", help="claim key (`mtlflow reproduce --list`)")
    p.add_argument("--scale", default="ci", choices=["paper", "ci"], help="ci (default: minutes on a CPU) or paper")
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--out", default="docs/research/claims", help="results folder (default docs/research/claims)")
    p.add_argument("--overwrite", action="store_true", help="replace the claim's existing result file")
    p.add_argument("--seeds", help="comma-separated seeds instead of the scale's (a quick check)")
    p.add_argument("--set", action="append", metavar="KEY=VALUE",
                   help="override one setting of the scale's configuration (repeatable), e.g. steps=2000")
    add_data_options(p)
    p.add_argument("--ledger", action="store_true", help="regenerate the ledger from the result files in --out")
    p.add_argument("--ledger-path", default="docs/research/claims.md", help="where --ledger writes")
    p.add_argument("--list", action="store_true", help="list the registered claims")
    p.add_argument("--no-progress", action="store_true")
    g = p.add_argument_group("as a Kubeflow pipeline (one task per seed, then the result file)")
    g.add_argument("--pipeline", action="store_true", help="run the claim as the reproduce pipeline; with one of "
                   "--local, --compile FILE, --host URL (--device is then a compile-time setting: cuda gives every "
                   "seed task a GPU)")
    g.add_argument("--local", action="store_true", help="run it here with kfp.local and write the result file to "
                   "--out")
    g.add_argument("--workdir", default="runs/reproduce-pipeline", help="--local: kfp.local's artifacts and the "
                   "seeds' runs (reused by a re-run; default runs/reproduce-pipeline)")
    g.add_argument("--compile", metavar="FILE", help="write the pipeline's IR YAML, this claim's settings as its "
                   "parameters' defaults")
    g.add_argument("--profile", metavar="FILE", help="cluster profile YAML the pipeline is compiled for, e.g. "
                   "k8s/overlays/prod/profile.yaml (docs/guides/kubeflow.md, Cluster profiles)")
    g.add_argument("--host", help="submit one run to this KFP API URL (token from $MTLFLOW_KFP_TOKEN)")
    g.add_argument("--experiment", default="mtlflow", help="--host: experiment name (created if missing)")
    g.add_argument("--namespace", help="--host: Kubeflow profile namespace (multi-user deployments)")
    g.add_argument("--service-account", help="--host: service account of the run's pods (default: the profile's)")
    g.add_argument("--run-name", help="--host: display name of the run")
    p.set_defaults(func=cmd_reproduce)
