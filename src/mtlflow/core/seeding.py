"""Seeding and random-state capture, so that a resumed run continues exactly where it stopped."""

from __future__ import annotations

import argparse
import random
from typing import Any

import numpy as np
import torch

from mtlflow.core.errors import InvalidParameterError

#: seeds are 32-bit unsigned integers: NumPy's legacy seeding accepts no more, and one range for the
#: CLI, params files and pipelines means a seed accepted in one place is accepted everywhere
SEED_LIMIT = 2**32


def check_seed(value: object, what: str = "seed") -> int:
    """``value`` as a seed, 0 <= seed < 2**32; anything else is a one-line :class:`InvalidParameterError`."""
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value < SEED_LIMIT:
        raise InvalidParameterError(f"{what} must be an integer in [0, 2**32), got {value!r}")
    return value


def seed_arg(text: str) -> int:
    """argparse ``type`` of every ``--seed``: the same rule as :func:`check_seed`."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"must be an integer in [0, 2**32), got {text!r}") from None
    try:
        return check_seed(value)
    except Exception as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("seed ")) from None


def seed_everything(seed: int, deterministic: bool = True) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if deterministic:
        # warn_only: a few CUDA kernels have no deterministic version; the CPU path is deterministic.
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False


def capture_rng_state() -> dict[str, Any]:
    state: dict[str, Any] = {
        "python": random.getstate(),
        "numpy": np.random.get_state(),
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def restore_rng_state(state: dict[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def epoch_generator(seed: int, epoch: int) -> torch.Generator:
    """A generator for the data order of one epoch, derived from (seed, epoch) only.

    Deriving it instead of carrying one generator through the run makes resume exact without
    saving data-loader state.
    """
    gen = torch.Generator()
    gen.manual_seed((seed * 1_000_003 + epoch) % (2**63))
    return gen
