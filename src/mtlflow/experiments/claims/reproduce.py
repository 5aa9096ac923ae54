"""Running a claim: :func:`reproduce` measures every seed (:func:`measure_seed`) then combines them
(:func:`combine_seeds`) into the result file (every seed's value, the mean and 95 % interval of
:mod:`mtlflow.metrics.intervals`, the verdict of :mod:`.verdict`, scale, date, hardware, command). The
``reproduce`` pipeline (``pipelines/reproduce.py``, :mod:`mtlflow.experiments.claim_pipeline`) runs the same two
steps with a task per seed, so both write the same file."""

from __future__ import annotations

import datetime as _dt
import hashlib
import json
import os
import platform
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.experiments.claims.catalog import get
from mtlflow.experiments.claims.model import SCALES, Claim, RunContext
from mtlflow.experiments.claims.verdict import judge

#: where `mtlflow reproduce` stores result files and the ledger reads them (relative to the repository root)
RESULTS_DIR = Path("docs/research/claims")
#: where the runs a claim trains are kept (finished ones are reused by a re-run)
WORK_DIR = Path("runs/claims")
RESULT_SCHEMA = 1


def hardware(device: str) -> dict[str, Any]:
    import torch  # noqa: PLC0415 (lazy: loads torch)

    info = {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "torch": torch.__version__, "torch_threads": torch.get_num_threads(),
            "device": device}
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(0)
    return info


def runs_digest(config: Mapping[str, Any], data_options: Mapping[str, Any] | None = None) -> str:
    """The name of the folder holding a configuration's runs: the hash of what the runs depend on (benchmark,
    data options, training options; the whole configuration for the other runners). A run inside is named
    by its method's label, and a label means one method setting in every claim, so claims on the same data
    and recipe share their runs (the LS and single-task runs are trained once)."""
    keys = ("benchmark", "data_options", "train")
    basis = {k: config[k] for k in keys if k in config} if "benchmark" in config and "train" in config else config
    text = json.dumps({**basis, "user_data_options": dict(data_options or {})}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def result_path(results_dir: str | Path, key: str, scale: str) -> Path:
    """``<claim>.json`` for the ledger's scale (ci), ``<claim>.<scale>.json`` for any other."""
    return Path(results_dir) / (f"{key}.json" if scale == "ci" else f"{key}.{scale}.json")


def resolve(key: str, scale: str = "ci", seeds: Sequence[int] | None = None,
            config_override: Mapping[str, Any] | None = None) -> tuple[Claim, dict[str, Any], list[int]]:
    """The claim ``key``, its configuration at ``scale`` (``config_override`` merged over it) and its seeds (the
    scale's, or ``seeds``; only the first for a claim without seeds); bad input is one line."""
    claim = get(key)
    if scale not in SCALES:
        raise InvalidParameterError(f"--scale must be one of {', '.join(SCALES)}, got {scale!r}")
    chosen = claim.scales[scale]
    seed_list = [int(s) for s in (chosen.seeds if seeds is None else seeds)]
    if not seed_list:
        raise InvalidParameterError("--seeds is empty; give at least one seed")
    if claim.no_seeds:  # a deterministic count: one value, whatever the seeds
        seed_list = seed_list[:1]
    unknown = sorted(set(config_override or {}) - set(chosen.config))
    if unknown:
        raise InvalidParameterError(f"--set {', '.join(unknown)}: not a setting of {key} at scale {scale}; valid: "
                                    f"{', '.join(chosen.config)}")
    return claim, {**dict(chosen.config), **dict(config_override or {})}, seed_list


def _context(config: Mapping[str, Any], scale: str, device: str, work_dir: str | Path | None,
             work_root: str | Path, progress: bool, data_options: Mapping[str, Any] | None) -> RunContext:
    # trained runs and bench scratch go to runs/ (git-ignored), never next to the result files
    work = Path(work_dir) if work_dir else Path(work_root) / f"{scale}-{runs_digest(config, data_options)}"
    return RunContext(work, device=device, progress=progress, data_options=dict(data_options or {}))


def measure_seed(key: str, scale: str, seed: int, device: str = "cpu", work_dir: str | Path | None = None,
                 work_root: str | Path = WORK_DIR, progress: bool = True,
                 config_override: Mapping[str, Any] | None = None,
                 data_options: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """One seed of claim ``key`` at ``scale`` (a task of the ``reproduce`` pipeline's loop): the runner's part
    for that seed with the wall and CPU seconds it took and the hardware it ran on. Runs go to ``work_dir``, by
    default ``<work_root>/<scale>-<runs_digest>``, where a finished run is reused."""
    claim, config, _ = resolve(key, scale, [seed], config_override)
    ctx = _context(config, scale, device, work_dir, work_root, progress, data_options)
    ctx.work_dir.mkdir(parents=True, exist_ok=True)
    started, cpu_started = time.perf_counter(), time.process_time()
    part = claim.runner.measure(config, int(seed), ctx)
    return {"claim": key, "scale": scale, "seed": int(seed), "part": part,
            "seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started,
            "hardware": hardware(device)}


def combine_seeds(key: str, scale: str, measured: Sequence[Mapping[str, Any]], device: str = "cpu",
                  work_dir: str | Path | None = None, work_root: str | Path = WORK_DIR, progress: bool = True,
                  config_override: Mapping[str, Any] | None = None, data_options: Mapping[str, Any] | None = None,
                  command: str | None = None) -> dict[str, Any]:
    """The result record of claim ``key`` (what :func:`reproduce` writes) from its seeds' :func:`measure_seed`
    outputs, in seed order; its seconds are the seeds' and the combination's together."""
    if not measured:
        raise InvalidParameterError(f"claim {key}: no seed was measured; give at least one seed")
    for item in measured:
        if item["claim"] != key or item["scale"] != scale:
            raise InvalidParameterError(f"a measured seed of {item['claim']} at scale {item['scale']} was given to "
                                        f"{key} at scale {scale}")
    claim, config, seed_list = resolve(key, scale, [m["seed"] for m in measured], config_override)
    ctx = _context(config, scale, device, work_dir, work_root, progress, data_options)
    started, cpu_started = time.perf_counter(), time.process_time()
    result = claim.runner.combine(config, [m["part"] for m in measured], ctx)
    seconds = sum(m["seconds"] for m in measured) + time.perf_counter() - started
    cpu_seconds = sum(m["cpu_seconds"] for m in measured) + time.process_time() - cpu_started
    return _record(claim, scale, config, seed_list, result, seconds, cpu_seconds, measured[0]["hardware"], command)


def _record(claim: Claim, scale: str, config: Mapping[str, Any], seed_list: Sequence[int],
            measured: Mapping[str, Any], seconds: float, cpu_seconds: float, hardware_info: Mapping[str, Any],
            command: str | None) -> dict[str, Any]:
    verdict = judge(claim, measured["values"], measured.get("baseline"))
    return {
        "schema": RESULT_SCHEMA, "claim": claim.key, "paper": claim.paper, "source": claim.source,
        "statement": claim.statement, "paper_text": claim.paper_text, "paper_value": claim.paper_value,
        "rule": claim.rule, "metric": claim.metric, "scale": scale,
        "scale_description": claim.scales[scale].description,
        "config": dict(config), "seeds": list(seed_list) if not claim.no_seeds else [],
        "values": [float(v) for v in measured["values"]],
        "baseline_values": [float(v) for v in measured.get("baseline", [])] or None,
        **verdict, "details": measured.get("details", {}),
        "date": _dt.datetime.now(_dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        # wall clock and this process's CPU time: on a shared machine the wall clock also counts the others
        "seconds": round(seconds, 1), "cpu_seconds": round(cpu_seconds, 1),
        "load_average": list(os.getloadavg()), "hardware": dict(hardware_info),
        "command": command or claim.command(scale),
    }


def reproduce(key: str, scale: str = "ci", results_dir: str | Path = RESULTS_DIR, device: str = "cpu",
              work_dir: str | Path | None = None, overwrite: bool = False, progress: bool = True,
              seeds: Sequence[int] | None = None, config_override: Mapping[str, Any] | None = None,
              data_options: Mapping[str, Any] | None = None, command: str | None = None) -> dict[str, Any]:
    """Run ``key`` at ``scale`` and write its result file (atomic); an existing one needs ``overwrite``.
    ``seeds`` and ``config_override`` (merged over the scale's configuration) shrink a run for a test. It runs
    :func:`measure_seed` per seed then :func:`combine_seeds`: the steps of the ``reproduce`` pipeline, so both
    write the same result."""
    _, _, seed_list = resolve(key, scale, seeds, config_override)
    target = result_path(results_dir, key, scale)
    if target.exists() and not overwrite:
        raise InvalidParameterError(f"{target} exists; pass --overwrite to replace it")
    options = {"device": device, "work_dir": work_dir, "progress": progress, "config_override": config_override,
               "data_options": data_options}
    measured = [measure_seed(key, scale, seed, **options) for seed in seed_list]
    record = combine_seeds(key, scale, measured, command=command, **options)
    atomic.write_json(target, record)
    return record

