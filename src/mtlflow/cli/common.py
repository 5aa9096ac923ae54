"""What the command groups share: value and KEY=VALUE parsing, the RunConfig flags, data-source flags."""

from __future__ import annotations

import argparse
import dataclasses
import json
import types
import typing
from collections.abc import Sequence
from typing import Any

import yaml

from mtlflow.benchmarks.base import read_manifest
from mtlflow.config.run import RunConfig, cli_flag, parse_hparams
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.seeding import check_seed, seed_arg


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


def csv_list(value: str | None) -> list[str] | None:
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


def method_hparams(args: argparse.Namespace, methods: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``--hp [METHOD.]NAME=VALUE`` of a command that runs ``methods``."""
    return parse_hparams(parse_assignments(args.hp, "--hp"), methods)


def bench_config(args: argparse.Namespace) -> dict[str, Any]:
    """The preparation options of the command line (``DataConfig.data_options``); ``--spec FILE`` is the
    ``spec`` option of the spec benchmark."""
    config = parse_assignments(args.data_option, "--data-option")
    if getattr(args, "spec", None):
        if args.benchmark != "spec":
            raise InvalidParameterError(f"--spec describes the data, so --benchmark {args.benchmark} does not apply; "
                                        "give only one of them")
        config["spec"] = args.spec
    if getattr(args, "mnist_dir", None):
        config["mnist_dir"] = args.mnist_dir
    if getattr(args, "data_dir", None):
        config["data_dir"] = args.data_dir
    return config


def check_data_source(args: argparse.Namespace) -> None:
    """``--data DIR`` or ``--benchmark NAME`` (+ preparation options), never a silent mix of both."""
    if args.data is None and args.benchmark is None:
        raise InvalidParameterError("give --benchmark NAME or --spec FILE (data prepared into the cache) or --data DIR")
    if args.data is None:
        return
    if not args.data.strip():
        raise InvalidParameterError("--data is empty; give a prepared data directory (from `mtlflow prepare`)")

    prepared = read_manifest(args.data)
    # --spec FILE sets --benchmark spec: the --spec check below names the flag the user gave
    if args.benchmark is not None and not args.spec and args.benchmark != prepared.get("benchmark"):
        raise InvalidParameterError(f"--benchmark {args.benchmark} disagrees with --data {args.data}, which holds "
                                    f"{prepared.get('benchmark')!r} data; give only one of them")
    given = [flag for flag, value in (("--data-option", args.data_option), ("--mnist-dir", args.mnist_dir),
                                      ("--data-dir", args.data_dir), ("--spec", args.spec)) if value]
    if given:
        raise InvalidParameterError(f"{', '.join(given)} {'applies' if len(given) == 1 else 'apply'} only where this "
                                    "command prepares the data (--benchmark NAME or --spec FILE without --data); "
                                    f"--data {args.data} is already prepared, so drop {' and '.join(given)}")


def int_list(value: str, flag: str) -> list[int]:
    items = csv_list(value) or []
    try:
        return [int(v) for v in items]
    except ValueError:
        raise InvalidParameterError(f"{flag} must be a comma-separated list of integers, got {value!r}") from None


def seed_list(value: str) -> list[int]:
    """``--seeds 0,1,2``: distinct seeds, each of the one seed type (:func:`mtlflow.core.seeding.check_seed`)."""
    seeds = [check_seed(s, "every --seeds entry") for s in int_list(value, "--seeds")]
    if not seeds or len(set(seeds)) != len(seeds):
        raise InvalidParameterError(f"--seeds must list distinct seeds, got {value!r}")
    return seeds


class OneLineParser(argparse.ArgumentParser):
    """argparse errors as one ``mtlflow: error:`` line (like every other error), not a usage block."""

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(2, f"mtlflow: error: {self.prog}: {message}; see `{self.prog} --help`\n")


class SpecFileAction(argparse.Action):
    """``--spec FILE`` also selects the spec benchmark (a different ``--benchmark`` is refused later)."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        setattr(namespace, self.dest, values)
        if getattr(namespace, "benchmark", None) is None:
            namespace.benchmark = "spec"


def add_data_options(q: argparse.ArgumentParser) -> None:
    """The flags that prepare a benchmark's data: --mnist-dir, --data-dir, --data-option KEY=VALUE
    (``DataConfig.data_options``)."""
    q.add_argument("--spec", action=SpecFileAction, metavar="FILE",
                   help="a task spec (YAML) describing your own data: source table, tasks, features, split, model "
                        "(docs: guides/your-data); the benchmark is then 'spec'")
    q.add_argument("--mnist-dir", help="MNIST IDX folder whose digits are added (multimnist)")
    q.add_argument("--data-dir", help="mounted dataset folder (celeba, nyuv2, cityscapes, office31, officehome)")
    q.add_argument("--data-option", action="append", metavar="KEY=VALUE",
                   help="benchmark preparation option (repeatable; data_options), e.g. n_train=2000")
