"""The ``mtlflow`` command line.

Errors in user input end with one line ``mtlflow: error: ...`` on stderr and a non-zero exit code
(2 for unknown names, invalid parameters and unusable output paths, 3 for missing or corrupt data,
4 for NaN or infinite values, 5 for solver failures, 6 for an output directory another mtlflow
process is writing, 130 for Ctrl-C, 141 when the reader of its output went away, 143 for SIGTERM);
docs/guides/cli.md ("Bad input") lists them.
"""

from __future__ import annotations

import os
import signal
import sys
import warnings
from collections.abc import Sequence
from typing import Any

from mtlflow.cli import baselines, catalog, experiments, pipelines, runs, specs, tuning
from mtlflow.cli.common import OneLineParser
from mtlflow.core.errors import MtlflowError, Terminated


def build_parser() -> OneLineParser:
    parser = OneLineParser(prog="mtlflow", description="Multi-task learning optimisation: "
                                    "methods, benchmarks, training, evaluation and Kubeflow pipelines.")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for group in (catalog, specs, runs, pipelines, experiments, tuning, baselines):
        group.register(sub)
    return parser


def _raise_terminated(signum: int, frame: Any) -> None:
    raise Terminated(signal.Signals(signum).name)


def _after_interruption(args: Any) -> str:
    """What to do after an interrupted command: --resume where the command has it (train), else start it again
    (prepare has no --resume to suggest)."""
    if hasattr(args, "resume"):
        return "checkpoints are intact, resume with the same command and --resume"
    return "start the same command again"


def main(argv: Sequence[str] | None = None) -> int:
    # torch_geometric scripts a module at import time and torch 2.14 deprecates that: a warning about a
    # dependency's internals, printed to every user of the molecule data, which no user can act on
    warnings.filterwarnings("ignore", message=r"`torch\.jit\.script` is deprecated", category=FutureWarning)
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
        print(f"mtlflow: terminated by {exc}; {_after_interruption(args)}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print(f"mtlflow: interrupted; {_after_interruption(args)}", file=sys.stderr)
        return 130
    except BrokenPipeError:  # `mtlflow ... | head`: the reader left; end quietly, as a shell tool does
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 141
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
