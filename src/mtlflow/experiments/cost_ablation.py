"""``mtlflow ablate cost``: the COST paper's ablations on one benchmark (Tables 4, 7, 8; Fig. 8).

Rows (every COST row wraps the same base method, default FairGrad as in the paper):

* Table 4 -- components: full, w/o L_t, w/o L_g, w/o HTR (with the trigger ``component_trigger``);
* Table 7 -- trigger: dominated conflict (Eq. 3), weak conflict (Def. 1), many-task ⌈K/2⌉ (Eq. 4);
* Table 8 -- adapter: LoRA vs LoHa (OFT is wrong on Conv2d layers in peft 0.21 and is not run);

each beside the base method alone. Every row is trained for every seed (identical configurations are
trained once: the full row is also the LoRA row and the row of its trigger); single-task references
(LS, one task each, same epochs and seeds) give Δm% (Eq. 14). Completed runs under ``OUT/runs`` are
reused and interrupted ones resumed, so an interrupted ablation continues with the same command.

Per row the table reports Δm% (mean ± std over seeds, test split, the selection rule of the runs), each
task's primary metric, teleports per run, and the telemetry averages over all teleports of the row
(App. A.1 / Fig. 8): tasks in conflict with the mean gradient before → after, ‖g₀‖ (mean gradient)
before → after, the smallest cosine of a task gradient with g₀ and (weak trigger) between two task
gradients before → after, the largest change of a task loss on the trigger batch, σ (HTR), seconds per teleport,
and the mean epoch time. Writes ``ablation.md``, ``ablation.json`` and ``ablation.csv``.
"""

from __future__ import annotations

import csv
import io
import json
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtlflow import jobs, methods
from mtlflow.config.run import RunConfig
from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.jobs.cache import cached_data_dir
from mtlflow.metrics.scoring import delta_m
from mtlflow.teleport import validate
from mtlflow.teleport.options import CostOptions
from mtlflow.teleport.triggers import RULES

TABLES = {"table4": "Table 4: components", "table7": "Table 7: trigger condition", "table8": "Table 8: PEFT adapter"}


@dataclass(frozen=True)
class AblationRow:
    key: str
    table: str
    label: str
    options: Mapping[str, Any] | None  # None: the base method without COST


def ablation_rows(method: str, component_trigger: str = "dominated",
                  extra: Mapping[str, Any] | None = None) -> list[AblationRow]:
    """The rows of the three tables; ``extra`` options apply to every COST row."""
    extra = dict(extra or {})

    def cost(**options: Any) -> dict[str, Any]:
        return {**extra, **options}

    t = component_trigger
    rows = [AblationRow("base", "all", method, None)]
    rows += [AblationRow("full", "table4", f"{method} + COST (L_t, L_g, HTR)", cost(trigger=t)),
             AblationRow("no-lt", "table4", "w/o L_t", cost(trigger=t, use_invariance=False)),
             AblationRow("no-lg", "table4", "w/o L_g", cost(trigger=t, use_sharpness=False)),
             AblationRow("no-htr", "table4", "w/o HTR", cost(trigger=t, htr=False))]
    rows += [AblationRow(f"trigger-{rule}", "table7", f"{rule} trigger", cost(trigger=rule))
             for rule in ("dominated", "weak", "many-task")]
    rows += [AblationRow(f"adapter-{a}", "table8", a.replace("lora", "LoRA").replace("loha", "LoHa"),
                         cost(trigger=t, adapter=a)) for a in ("lora", "loha")]
    return rows


def _canonical(options: Mapping[str, Any] | None) -> str:
    if options is None:
        return "base"

    resolved = CostOptions.from_mapping(options).resolved().as_dict()
    return json.dumps(resolved, sort_keys=True)


def _completed(run: Path) -> bool:
    return (run / "run.json").is_file() and atomic.read_json(run / "run.json").get("status") == "completed"


def ablate(out_dir: str | Path, data_dir: str | Path | None = None, benchmark: str | None = None,
           data_options: Mapping[str, Any] | None = None, method: str = "fairgrad",
           hparams: Mapping[str, Any] | None = None, seeds: Sequence[int] = (0,),
           component_trigger: str = "dominated", teleport_options: Mapping[str, Any] | None = None,
           train_options: Mapping[str, Any] | None = None, progress: bool = True) -> dict[str, Any]:
    """:func:`run_ablation` on prepared data (``data_dir``) or on ``benchmark`` prepared into the cache with
    ``data_options``; the trigger, the COST options and the base method's run are checked before any data
    is prepared."""
    if component_trigger not in RULES:
        raise InvalidParameterError(f"--trigger must be one of {', '.join(RULES)}, got {component_trigger!r}")
    validate("cost", teleport_options)
    # every row trains the base method's run: its configuration is checked first
    jobs.plan_train(data_dir, benchmark, data_options, method, hparams=hparams, **dict(train_options or {}))
    data = Path(data_dir) if data_dir else cached_data_dir(benchmark, dict(data_options or {}))
    return run_ablation(data, out_dir, method=method, hparams=hparams, seeds=seeds,
                        component_trigger=component_trigger, teleport_options=teleport_options,
                        train_options=train_options, progress=progress)


def run_ablation(data_dir: str | Path, out_dir: str | Path, method: str = "fairgrad",
                 hparams: Mapping[str, Any] | None = None, seeds: Sequence[int] = (0,),
                 component_trigger: str = "dominated", teleport_options: Mapping[str, Any] | None = None,
                 train_options: Mapping[str, Any] | None = None, progress: bool = True) -> dict[str, Any]:
    """Train every row x seed (and the single-task references) on prepared data; write the tables."""
    bench, data = jobs.load_prepared(data_dir)
    if len(bench.task_names) < 2:
        raise InvalidParameterError(f"benchmark {bench.name!r} has one task; COST needs at least 2")
    if not seeds:
        raise InvalidParameterError("--seeds is empty; give at least one seed")
    train_options = dict(train_options or {})
    hp = jobs.resolved_hparams(bench, method, hparams)
    methods.build(method, len(bench.task_names), **hp)
    rows = ablation_rows(method, component_trigger, teleport_options)
    for row in rows:  # every configuration is validated (COST's options by RunConfig) before anything trains
        if row.options is not None:
            RunConfig.for_benchmark(bench.train_defaults, method=method, hparams=hp, teleport="cost",
                                    teleport_options=dict(row.options), **train_options)
    out = Path(out_dir)
    run_of: dict[str, str] = {}
    for row in rows:
        run_of.setdefault(_canonical(row.options), row.key)

    def train_once(run: Path, **kwargs: Any) -> None:
        if _completed(run):
            return
        if progress:
            print(f"ablate: training {run.name}", flush=True)
        jobs.train(data_dir, run, seed=kwargs.pop("seed"), resume=True, progress=False,
                   **kwargs, **train_options)

    references = []
    for task in bench.task_names:
        for seed in seeds:
            run = out / "runs" / f"stl-{task}-s{seed}"
            train_once(run, method="ls", seed=seed, tasks=[task])
            references.append(jobs.read_run(run))
    refs = jobs.build_references(references)
    results = []
    for row in rows:
        key = run_of[_canonical(row.options)]
        finals, deltas, telemetry = [], [], []
        for seed in seeds:
            run = out / "runs" / f"{key}-s{seed}"
            extra = {} if row.options is None else {"teleport": "cost", "teleport_options": dict(row.options)}
            train_once(run, method=method, seed=seed, hparams=hp, **extra)
            record = jobs.read_run(run)
            final = record["metrics"]["final"]["test"]
            finals.append(final)
            deltas.append(delta_m(final, refs["metrics"], record["metrics"]["metric_specs"]))
            telemetry.append(run_telemetry(record["metrics"]))
        results.append(summarise_row(row, key, finals, deltas, telemetry, record["metrics"]))
    table = {"schema": 1, "benchmark": bench.name, "data": str(data_dir), "data_hash": data.content_hash,
             "method": method, "hparams": hp, "seeds": list(seeds), "component_trigger": component_trigger,
             "teleport_options": dict(teleport_options or {}), "train_options": train_options,
             "tasks": bench.task_names, "references": refs["metrics"], "rows": results}
    out.mkdir(parents=True, exist_ok=True)
    atomic.write_json(out / "ablation.json", table)
    atomic.write_text(out / "ablation.md", ablation_markdown(table))
    atomic.write_text(out / "ablation.csv", ablation_csv(table))
    return table


def run_telemetry(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """Teleports, their events and the mean epoch time of one run's ``metrics.json``."""
    epochs = metrics["epochs"]
    events = [e for epoch in epochs for e in (epoch.get("cost") or {}).get("events", [])]
    return {"teleports": sum((epoch.get("cost") or {}).get("teleports", 0) for epoch in epochs),
            "events": events, "epoch_seconds": statistics.fmean(e["train_seconds"] for e in epochs)}


def _avg(values: Sequence[Any]) -> float | None:
    values = [float(v) for v in values if v is not None]
    return statistics.fmean(values) if values else None


def summarise_row(row: AblationRow, key: str, finals: list[dict], deltas: list[float], telemetry: list[dict],
                  metrics: Mapping[str, Any]) -> dict[str, Any]:
    events = [e for t in telemetry for e in t["events"]]
    primary = metrics["primary_metrics"]
    return {
        "key": row.key, "run_key": key, "table": row.table, "label": row.label,
        "options": None if row.options is None else dict(row.options),
        "delta_m": statistics.fmean(deltas), "delta_m_std": statistics.stdev(deltas) if len(deltas) > 1 else 0.0,
        "delta_m_per_seed": deltas,
        "primary": {t: statistics.fmean(f[t][primary[t]] for f in finals) for t in primary},
        "primary_metric": primary,
        "teleports_per_run": statistics.fmean(t["teleports"] for t in telemetry),
        "conflicting_before": _avg([e["conflicting_before"] for e in events]),
        "conflicting_after": _avg([e.get("conflicting_after") for e in events]),
        "grad_norm_before": _avg([e["mean_grad_norm_before"] for e in events]),
        "grad_norm_after": _avg([e.get("mean_grad_norm_after") for e in events]),
        "min_cosine_before": _avg([min(e["cosine_to_mean_before"].values()) for e in events]),
        "min_cosine_after": _avg([min(e["cosine_to_mean_after"].values()) for e in events if "cosine_to_mean_after" in e]),
        "min_pairwise_before": _avg([e.get("min_pairwise_cos_before") for e in events]),
        "min_pairwise_after": _avg([e.get("min_pairwise_cos_after") for e in events]),
        "loss_change_max_abs": _avg([e.get("loss_change_max_abs") for e in events]),
        "sigma": _avg([e["sigma"] for e in events]),
        "teleport_seconds": _avg([e["seconds"] for e in events]),
        "epoch_seconds": statistics.fmean(t["epoch_seconds"] for t in telemetry),
    }


def _fmt(value: Any, spec: str = ".3f") -> str:
    return "–" if value is None else format(value, spec)


def _arrow(row: Mapping[str, Any], before: str, after: str, spec: str) -> str:
    if row[before] is None:
        return "–"
    return f"{_fmt(row[before], spec)} → {_fmt(row[after], spec)}"


def ablation_markdown(table: Mapping[str, Any]) -> str:
    tasks = table["tasks"]
    rows = table["rows"]
    base = next(r for r in rows if r["key"] == "base")
    head = (["configuration", "Δm% ↓"] + [f"{t} {base['primary_metric'][t]}" for t in tasks]
            + ["teleports/run", "conflicting tasks before → after", "‖g₀‖ before → after", "min cos(g_i, g₀) before → after",
               "min cos(g_i, g_j) before → after", "max |ΔL_i| on trigger batch", "σ", "s/teleport", "epoch s"])
    lines = [f"# COST ablation: {table['benchmark']}, base method {table['method']}", "",
             f"Seeds {table['seeds']}; Δm% against single-task LS runs (test split); component rows use the "
             f"`{table['component_trigger']}` trigger; extra COST options {table['teleport_options'] or 'none'}; "
             f"training options {table['train_options'] or 'the benchmark recipe'}.", ""]
    for key, title in TABLES.items():
        lines += [f"## {title}", "", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for r in [base] + [r for r in rows if r["table"] == key]:
            cells = [r["label"] + ("" if r["key"] == r["run_key"] else f" (= {r['run_key']})"),
                     f"{r['delta_m']:.2f} ± {r['delta_m_std']:.2f}"]
            cells += [f"{100 * r['primary'][t]:.2f}" for t in tasks]
            cells += [_fmt(r["teleports_per_run"], ".1f"), _arrow(r, "conflicting_before", "conflicting_after", ".2f"),
                      _arrow(r, "grad_norm_before", "grad_norm_after", ".4f"),
                      _arrow(r, "min_cosine_before", "min_cosine_after", ".3f"),
                      _arrow(r, "min_pairwise_before", "min_pairwise_after", ".3f"),
                      _fmt(r["loss_change_max_abs"], ".4f"), _fmt(r["sigma"], ".3f"),
                      _fmt(r["teleport_seconds"], ".2f"), _fmt(r["epoch_seconds"], ".1f")]
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
    return "\n".join(lines)


def ablation_csv(table: Mapping[str, Any]) -> str:
    fields = ["table", "key", "run_key", "label", "delta_m", "delta_m_std", "teleports_per_run", "conflicting_before",
              "conflicting_after", "grad_norm_before", "grad_norm_after", "min_cosine_before", "min_cosine_after",
              "min_pairwise_before", "min_pairwise_after", "loss_change_max_abs", "sigma", "teleport_seconds", "epoch_seconds"]
    tasks = table["tasks"]
    buf = io.StringIO()
    writer = csv.writer(buf)
    writer.writerow(fields + [f"{t}_primary" for t in tasks])
    for r in table["rows"]:
        writer.writerow([r[f] for f in fields] + [r["primary"][t] for t in tasks])
    return buf.getvalue()
