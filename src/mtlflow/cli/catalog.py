"""`mtlflow methods | architectures | benchmarks | config`: what the registries and the run configuration hold.

The listings include the installed plug-ins; "from" says which distribution each entry comes from ("mtlflow"
for the built-ins)."""

from __future__ import annotations

import argparse
import json


def cmd_methods(args: argparse.Namespace) -> int:
    from mtlflow import methods

    rows = [methods.info(n) for n in methods.available()]
    # what the gradient engine computes for each method (Method.requires)
    needs = {r.name: methods.get(r.name).requires.value for r in rows}
    if args.json:
        print(json.dumps([{**r.__dict__, "requires": needs[r.name], "from": methods.origin(r.name)} for r in rows],
                         indent=2, default=str))
        return 0
    for r in rows:
        hp = ", ".join(f"{k}={v[0]!r}" for k, v in r.hparams.items()) or "-"
        print(f"{r.name:<12} {r.family:<22} {r.cost:<5} {r.paper}")
        print(f"{'':<12} equations: {r.equations}")
        print(f"{'':<12} needs: {needs[r.name]}; hyper-parameters: {hp}")
        space = ", ".join(f"{k} {v['range']}" for k, v in r.search.items())
        print(f"{'':<12} tuned over: {space}")
        print(f"{'':<12} from: {methods.origin(r.name)}")
    return 0


def cmd_architectures(args: argparse.Namespace) -> int:
    from mtlflow.models.architectures import describe

    rows = describe()
    if args.json:
        print(json.dumps(rows, indent=2, default=str))
        return 0
    for row in rows:
        print(f"{row['name']:<12} {row['description']}")
        print(f"{'':<12} from: {row['from']}")
        for key, spec in row["options"].items():
            print(f"{'':<12} {key}={spec['default']!r}: {spec['help']}")
    return 0


def cmd_benchmarks(args: argparse.Namespace) -> int:
    from mtlflow import benchmarks

    for name in benchmarks.available():
        cls = benchmarks.get(name)
        print(f"{name:<12} tasks: {cls.tasks_from or ', '.join(cls().task_names)}")
        print(f"{'':<12} {cls.description}")
        print(f"{'':<12} from: {benchmarks.origin(name)}")
        opts = ", ".join(f"{k}={f.default!r}" for k, f in cls.config_fields.items())
        print(f"{'':<12} options: {opts or '-'}")
        if cls.train_defaults:
            print(f"{'':<12} paper recipe: {json.dumps(cls.train_defaults)}")
        if cls.cpu_smoke:
            print(f"{'':<12} CPU smoke: {json.dumps(cls.cpu_smoke)}")
    return 0


#: the configuration models (`mtlflow config schema --of NAME`)
CONFIG_MODELS = ("run", "data", "sweep", "retrain", "distributed_train", "tuned_sweep", "spec")


def cmd_config(args: argparse.Namespace) -> int:
    from mtlflow.benchmarks._spec.schema import spec_json_schema
    from mtlflow.config.data import DataConfig
    from mtlflow.config.pipeline import DistributedTrainConfig, RetrainConfig, SweepConfig, TunedSweepConfig
    from mtlflow.config.run import RunConfig

    models = {"run": RunConfig, "data": DataConfig, "sweep": SweepConfig, "retrain": RetrainConfig,
              "distributed_train": DistributedTrainConfig, "tuned_sweep": TunedSweepConfig}
    print(json.dumps(spec_json_schema() if args.of == "spec" else models[args.of].json_schema(), indent=2))
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add the methods, architectures, benchmarks, config commands."""
    p = sub.add_parser("methods", help="list the registered methods with family, cost, paper, hyper-parameters")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_methods)

    p = sub.add_parser("architectures", help="list the model architectures (combine with any method: "
                       "`train --architecture NAME --architecture-option KEY=VALUE`)")
    p.add_argument("--json", action="store_true", help="machine-readable output")
    p.set_defaults(func=cmd_architectures)

    p = sub.add_parser("benchmarks", help="list the registered benchmarks and their options")
    p.set_defaults(func=cmd_benchmarks)

    p = sub.add_parser("config", help="the configuration models: `config schema` prints the JSON schema of RunConfig "
                       "(the `train` flags and every train_options are its fields); --of data / sweep / retrain / "
                       "distributed_train / tuned_sweep: of the data and the pipelines' parameters (params.yaml is a "
                       "sweep); --of spec: of a task spec file (your own data)")
    p.add_argument("what", choices=["schema"], help="schema: the JSON schema")
    p.add_argument("--of", choices=CONFIG_MODELS, default="run", help="which model (default: run)")
    p.set_defaults(func=cmd_config)
