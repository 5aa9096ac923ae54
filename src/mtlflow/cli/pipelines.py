"""`mtlflow pipeline run | compile | submit | schedule`: the Kubeflow pipelines."""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
from pathlib import Path

from mtlflow.cli.common import (
    parse_assignments,
)


def cmd_pipeline(args: argparse.Namespace) -> int:
    from mtlflow.config.pipeline import pipeline_arguments
    from mtlflow.pipelines import runner

    if args.pipeline_command == "compile":
        from mtlflow.config.cluster import load_profile

        profile = load_profile(args.profile) if args.profile else None
        if args.all:
            for path in runner.compile_all(args.out_dir, profile=profile):
                print(f"compiled {path.stem} pipeline to {path}")
            return 0
        name = runner.canonical_name(args.pipeline)
        out = args.out or str(Path(args.out_dir) / f"{name}.yaml")
        path = runner.compile_pipeline(out, pipeline=name, profile=profile)
        print(f"compiled {name} pipeline to {path}")
        return 0
    params = runner.load_params(args.params_file, parse_assignments(args.param, "--param"))
    if args.pipeline_command == "run":  # a bad --workdir is said before any parameter is checked, as before
        from mtlflow.core.outputs import check_output_dir

        check_output_dir(args.workdir, "--workdir")
    params, budget_note = pipeline_arguments(runner.canonical_name(args.pipeline), params)  # the one budget rule
    if budget_note:
        print(budget_note, file=sys.stderr)
    if args.pipeline_command == "run":
        result = runner.run_local(params, workdir=args.workdir, pipeline=args.pipeline, storage_root=args.storage_root)
        results = result.parent / "results" / "results.json"
        if result.suffix == ".html" and results.is_file():  # a sweep: its verdict and table first
            from mtlflow.jobs.compare.summary import read_summary
            from mtlflow.jobs.report import headline_markdown

            print(headline_markdown(read_summary(results)))
        print(f"{'report' if result.suffix == '.html' else 'result'}: {result}")
        return 0
    print(json.dumps(_submit_or_schedule(args, params)))
    return 0


def _submit_or_schedule(args: argparse.Namespace, params: dict) -> dict:
    """`mtlflow pipeline submit | schedule`: the host (and cron) checked, the parameters validated and the
    pipeline compiled here, before :mod:`mtlflow.ops.kfp_client` sends the package."""
    from mtlflow.config.cluster import load_profile
    from mtlflow.config.pipeline import validate_cron
    from mtlflow.ops import kfp_client
    from mtlflow.pipelines import cluster, runner

    # the pipeline is compiled for the profile's cluster, and its pods run as the profile's account
    profile = load_profile(args.profile) if args.profile else None
    service_account = args.service_account or (profile.service_account if profile else None)
    kfp_client.check_host(args.host)
    cron = validate_cron(args.cron) if args.pipeline_command == "schedule" else None
    with (cluster.profile_applied(profile) if profile else contextlib.nullcontext(),
          tempfile.TemporaryDirectory(prefix=f"mtlflow-{args.pipeline_command}-") as tmp):
        runner.validate_params(args.pipeline, params)
        package = runner.compile_pipeline(Path(tmp) / f"{runner.canonical_name(args.pipeline)}.yaml",
                                          pipeline=args.pipeline)
        if cron is None:
            # a run started from a pipeline version cannot override caching: --no-cache is a version of its own
            package = kfp_client.with_caching(package, False) if args.no_cache else package
            return kfp_client.submit_package(args.host, package, params, experiment=args.experiment,
                                             run_name=args.run_name, namespace=args.namespace,
                                             service_account=service_account)
        return kfp_client.schedule_package(args.host, package, cron, params, experiment=args.experiment,
                                           job_name=args.job_name, namespace=args.namespace,
                                           service_account=service_account)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the pipeline commands."""
    p = sub.add_parser("pipeline", help="Kubeflow pipelines: run locally, compile, submit, schedule")
    psub = p.add_subparsers(dest="pipeline_command", required=True, metavar="ACTION")
    pipeline_help = "benchmark_sweep (alias main), retrain, tuned_sweep or distributed_train (cluster only)"

    def pipeline_params(q: argparse.ArgumentParser, default: str) -> None:
        q.add_argument("--pipeline", default=default, help=f"{pipeline_help}; default {default}")
        q.add_argument("--params-file", "--params", dest="params_file", help="YAML file of pipeline parameters")
        q.add_argument("--param", action="append", metavar="KEY=VALUE", help="pipeline parameter (repeatable)")

    def cluster_target(q: argparse.ArgumentParser) -> None:
        q.add_argument("--host", required=True, help="KFP API URL, e.g. https://kubeflow.example.com/pipeline "
                       "(token from $MTLFLOW_KFP_TOKEN)")
        q.add_argument("--experiment", default="mtlflow", help="experiment name (created if missing)")
        q.add_argument("--namespace", help="Kubeflow profile namespace (multi-user deployments)")
        q.add_argument("--service-account", help="Kubernetes service account of the run's pods (default: the "
                       "profile's, e.g. mtlflow-pipeline)")
        q.add_argument("--profile", metavar="FILE", help="cluster profile YAML the pipeline is compiled for, e.g. "
                       "k8s/overlays/prod/profile.yaml (docs/guides/kubeflow.md, Cluster profiles)")

    q = psub.add_parser("run", help="run with kfp.local's SubprocessRunner")
    q.add_argument("--local", action="store_true", required=True, help="run on this machine (kfp.local)")
    pipeline_params(q, "main")
    q.add_argument("--workdir", default="runs/pipeline", help="where kfp.local writes artifacts; outside the spec, its "
                   "table and the other data it is prepared from")
    q.add_argument("--storage-root", help="DVC remote/cache, checkpoints, status records and model store "
                   "(default WORKDIR/storage; reuse it across retrain runs to keep the champion)")
    q = psub.add_parser("compile", help="write pipeline IR YAML (one pipeline, or --all)")
    q.add_argument("--pipeline", default="main", help=pipeline_help)
    q.add_argument("--all", action="store_true", help="every pipeline, as OUT_DIR/<name>.yaml")
    q.add_argument("--out", help="output file (default OUT_DIR/<name>.yaml)")
    q.add_argument("--out-dir", default="build", help="output directory (default build)")
    q.add_argument("--profile", metavar="FILE", help="cluster profile YAML (node selector, tolerations, accelerator, "
                   "resources, UID/fsGroup, pull Secrets), e.g. k8s/overlays/prod/profile.yaml; default: NVIDIA "
                   "GPU Operator labels, UID 1000")
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
