"""Errors that reach the user as one line and a non-zero exit code.

Every error raised for bad input derives from :class:`MtlflowError`; the CLI prints
``mtlflow: error: <message>`` and exits with ``exit_code``. Messages name the problem and the fix.
"""

from __future__ import annotations


class MtlflowError(Exception):
    """Base class of user-facing errors."""

    exit_code = 1


class UsageError(MtlflowError):
    """Unknown names or invalid parameters (exit code 2, like argparse)."""

    exit_code = 2


class UnknownNameError(UsageError):
    """An unknown method, benchmark or other registered name."""

    def __init__(self, kind: str, name: str, valid: list[str]):
        self.kind, self.name, self.valid = kind, name, list(valid)
        super().__init__(f"unknown {kind} {name!r}; valid {kind}s: {', '.join(self.valid)}")


class InvalidParameterError(UsageError):
    """A hyper-parameter or configuration value outside its allowed range."""


class StorageError(MtlflowError):
    """The file system refused a write mid-command: full, over quota or read-only (exit code 2, like an
    unusable output path found before the command started)."""

    exit_code = 2


class OutputInUseError(MtlflowError):
    """An output directory is locked by another running mtlflow process (exit code 6)."""

    exit_code = 6


class DataError(MtlflowError):
    """Missing, corrupt or mismatched data (exit code 3)."""

    exit_code = 3


class NonFiniteLossError(MtlflowError):
    """A task loss became NaN or infinite during training (exit code 4)."""

    exit_code = 4


class SolverError(MtlflowError):
    """A numerical solver is missing or did not converge (exit code 5)."""

    exit_code = 5


class NonFiniteValueError(NonFiniteLossError, SolverError):
    """A NaN or infinite value reached a solver: the run diverged (e.g. the Gramian of finite gradients
    overflowed), so it exits 4 like a NaN loss; it is still a SolverError for code that catches those."""


class Terminated(KeyboardInterrupt):
    """SIGTERM (a Kubernetes eviction or preemption) raised in the main thread, so that it unwinds the
    same way as Ctrl-C: atomic writes are abandoned, ``run.json`` records "interrupted" and the last
    checkpoint stays intact. The CLI exits with 143 (128 + SIGTERM), like a shell."""

    exit_code = 143
