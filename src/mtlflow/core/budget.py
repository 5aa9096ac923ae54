"""THE training-budget rule of every entry point -- ``mtlflow train`` (its flags over a benchmark's or a spec's
recipe), a spec's ``train:`` section over the spec defaults, the pipelines' ``epochs`` and ``train_options``
(``--param``, a parameter file) over the sweep's default budget, and ``params.yaml`` -- in one place
(docs/guides/training.md, "One budget rule").

A default rule that would change a value the user gave yields to it: an explicit ``epochs`` is the most epochs a
run trains, so a default ``min_steps`` (which the trainer reaches by raising the epochs: ``epochs: 20`` became 56)
is dropped; an explicit ``batch_size`` drops a default ``min_steps_per_epoch`` (which would shrink it). A rule the
user gives too applies. Every other default is kept, key by key.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

#: THE budget rule of every entry point (``mtlflow train``, a spec's recipe, the pipelines' parameters and
#: ``--param``, ``params.yaml``): a default rule that would change a value the user gave yields to it. An explicit
#: ``epochs`` is the most epochs a run trains: a default ``min_steps`` (a recipe's, a spec's, the sweep's
#: DEFAULT_BUDGET) would raise it (``--epochs 20`` becoming 56), so it is dropped; an explicit ``batch_size``
#: drops a default ``min_steps_per_epoch`` (which would shrink it). Both rules apply when the user gives them too.
YIELDING_RULES = (("epochs", "min_steps"), ("batch_size", "min_steps_per_epoch"))


def layered_budget(defaults: Mapping[str, Any], given: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """``defaults`` overridden key by key by ``given``, under :data:`YIELDING_RULES`; returns the options and
    the default rules dropped (``["min_steps"]`` when ``epochs`` was given without ``min_steps``)."""
    values = dict(defaults)
    dropped = [rule for asked, rule in YIELDING_RULES if asked in given and rule not in given and rule in values]
    for rule in dropped:
        del values[rule]
    values.update(given)
    return values, dropped
