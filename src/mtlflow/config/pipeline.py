"""Expansion and validation of pipeline sweeps (used by the plan components, compile and submit).

Kept free of kfp so that invalid parameters are rejected before anything is compiled or submitted.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.seeding import check_seed


def from_struct(value: Any) -> Any:
    """Undo the float conversion of protobuf structs: integral floats in dicts/lists become ints.

    Pipeline parameters of type dict or list travel as ``google.protobuf.Struct``, which stores every
    number as a double, so ``seeds=[0]`` arrives as ``[0.0]``. Float hyper-parameters are converted
    back by :class:`mtlflow.core.hparams.HParam`.
    """
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, list):
        return [from_struct(v) for v in value]
    if isinstance(value, dict):
        return {k: from_struct(v) for k, v in value.items()}
    return value


def validate_sweep(methods: Sequence[str], seeds: Sequence[int], method_hparams: Mapping[str, Any] | None = None,
                   epochs: int | None = None, n_tasks: int = 2) -> None:
    """Reject unknown methods, empty lists, bad seeds, bad epochs and invalid hyper-parameters."""
    from mtlflow import methods as registry

    if not methods:
        raise InvalidParameterError("the method list is empty; give at least one method")
    if not seeds:
        raise InvalidParameterError("the seed list is empty; give at least one seed")
    for name, values in (("methods", methods), ("seeds", seeds)):
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise InvalidParameterError(f"{name} must be a list, got {values!r}; write e.g. [{values}]")
        repeated = sorted({repr(v) for v in values if list(values).count(v) > 1})
        if repeated:  # a repeated run would be counted as one more seed with zero spread
            raise InvalidParameterError(f"{name} lists {', '.join(repeated)} more than once; give each once")
    for seed in seeds:
        check_seed(seed, "every seed")
    if epochs is not None and (not isinstance(epochs, int) or epochs < 1):
        raise InvalidParameterError(f"epochs must be a positive integer, got {epochs!r}")
    hparams = dict(method_hparams or {})
    stray = sorted(set(hparams) - set(methods))
    if stray:
        raise InvalidParameterError(f"method_hparams names methods not in the sweep: {', '.join(stray)}")
    for name in methods:
        registry.build(name, n_tasks, **hparams.get(name, {}))


def canonical_hparams(method: str, hparams: Mapping[str, Any]) -> dict[str, Any]:
    """Hyper-parameters with the types their method declares (``alpha: 2`` -> ``2.0``), so a run is
    labelled ``fairgrad(alpha=2.0)`` whether it came through a struct, the CLI or params.yaml."""
    from mtlflow import methods as registry

    declared = registry.get(method).hparams
    return {k: declared[k].coerce(method, k, v) if k in declared else v for k, v in hparams.items()}


def plan_runs(methods: Sequence[str], seeds: Sequence[int],
              method_hparams: Mapping[str, Any] | None = None) -> list[str]:
    seeds, method_hparams = from_struct(list(seeds)), from_struct(dict(method_hparams or {}))
    validate_sweep(methods, seeds, method_hparams)
    hparams = dict(method_hparams or {})
    return [json.dumps({"method": m, "seed": int(s), "hparams": canonical_hparams(m, hparams.get(m, {}))},
                       sort_keys=True) for m in methods for s in seeds]


def plan_references(tasks: Sequence[str], seeds: Sequence[int]) -> list[str]:
    seeds = from_struct(list(seeds))
    if not tasks:
        raise InvalidParameterError("the benchmark has no tasks to train references for")
    if not seeds:
        raise InvalidParameterError("reference_seeds is empty; Δm% needs at least one single-task run per task")
    return [json.dumps({"method": "ls", "seed": int(s), "hparams": {}, "tasks": [t]}, sort_keys=True)
            for t in tasks for s in seeds]


def plan_run(method: str, seed: int, hparams: Mapping[str, Any] | None = None) -> str:
    """The spec of one run (the ``retrain`` pipeline): ``{"method", "seed", "hparams"}``."""
    return plan_runs([method], [from_struct(seed)], {method: from_struct(dict(hparams or {}))} if hparams else {})[0]


def run_key(run_spec: str, data_hash: str, epochs: int, train_options: Mapping[str, Any], run_id: str = "") -> str:
    """Directory name of a run under the checkpoint root: readable prefix + hash of everything that
    determines the result (spec, data version, epochs, training options; not the device) and of the
    pipeline run's id ``run_id``.

    A retried or preempted task of the same pipeline run computes the same key and resumes from the
    checkpoint there; another pipeline run (``run_id`` differs) never picks up its checkpoint.
    """
    import hashlib

    spec = json.loads(run_spec)
    options = {k: v for k, v in from_struct(dict(train_options)).items() if k != "device"}
    identity = {"spec": spec, "data": data_hash, "epochs": int(epochs), "options": options}
    if run_id:
        identity["run"] = run_id
    digest = hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]
    tasks = "-".join(spec.get("tasks") or [])
    prefix = f"{spec['method']}-s{spec['seed']}" + (f"-{tasks}" if tasks else "")
    return f"{prefix}-{digest}"


#: KFP recurring runs use the 6-field cron format of robfig/cron: second minute hour day month weekday.
CRON_FIELDS = ("second", "minute", "hour", "day-of-month", "month", "day-of-week")


def validate_cron(expression: str) -> str:
    """Check the field count of a KFP cron expression (6 fields, seconds first)."""
    fields = str(expression).split()
    if len(fields) != len(CRON_FIELDS):
        hint = f"; prepend the seconds: '0 {expression.strip()}'" if len(fields) == 5 else ""
        raise InvalidParameterError(f"cron {expression!r} has {len(fields)} fields but KFP needs 6 "
                                    f"({' '.join(CRON_FIELDS)}), e.g. '0 0 3 * * *' for 03:00 daily{hint}")
    return " ".join(fields)
