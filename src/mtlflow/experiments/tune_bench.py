"""The cost of ``mtlflow tune`` (issue 37's Cost targets), measured on a seeded synthetic table:

* **optuna share** -- the sampler's and pruner's share of a trial's wall time (``optuna_share`` of every study in
  the tune results; target <= 1 %);
* **halving vs grid** -- a multi-fidelity search (TPE + successive halving, budget a third of the grid's steps)
  against the exhaustive grid of the same learning rates (Optuna's GridSampler, no pruning): the chosen
  configurations retrained with fresh seeds and scored on test, the multi-fidelity choice within the grid
  choice's 95 % interval (or better) for <= 1/3 of the grid's optimizer steps;
* **tuned sweep** (``--sweep``, long) -- four methods with 20 trials each (and the single-task references) on a
  table of about 1,000 rows: its wall time (target <= 15 min on the idle 2-core machine), beside the machine's
  load average (``os.getloadavg``) while it ran.

Run ``python -m mtlflow.experiments.tune_bench --out DIR [--sweep] [--write-docs]``; ``--write-docs`` stores the
summary in ``docs/results/tune-bench.json`` and rewrites the table between the markers in
``docs/guides/tuning.md`` (tests/unit/experiments/test_tune_bench.py checks the page shows the stored summary).

The test score of a retrained run: :func:`mtlflow.metrics.selection.validation_score` (the tuning objective's
formula: the mean over tasks of the relative change of the primary metric's error) of its test metrics against
the untrained model's test metrics (the search seed, the method's defaults) -- after selection, so reading test
here selects nothing. Lower is better.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from mtlflow import jobs
from mtlflow.core import atomic
from mtlflow.engine.trainer import Trainer
from mtlflow.jobs.data import load_prepared
from mtlflow.jobs.tune import tune
from mtlflow.metrics.evaluation import evaluate_model
from mtlflow.metrics.intervals import mean_interval
from mtlflow.metrics.selection import validation_score

REPO_ROOT = Path(__file__).resolve().parents[3]
RESULTS = REPO_ROOT / "docs" / "results" / "tune-bench.json"
DOC = REPO_ROOT / "docs" / "guides" / "tuning.md"
BEGIN, END = "<!-- tune-bench:begin (python -m mtlflow.experiments.tune_bench --write-docs) -->", "<!-- tune-bench:end -->"
OPTUNA_SHARE_TARGET, STEPS_SHARE_TARGET, SWEEP_SECONDS_TARGET = 0.01, 1 / 3, 15 * 60
#: the grid: nine learning rates, a factor 10^(1/2) apart; weight decay not searched
GRID_LRS = [round(10 ** (-4 + i / 2), 10) for i in range(9)]
SWEEP_METHODS = ("ls", "uw", "dwa", "pcgrad")
#: the halving comparison's training budget: 9 epochs (rungs 1, 3 and 9 of successive halving)
HALVING_TRAIN = {"epochs": 9, "min_steps": 1}
RETRAIN_SEEDS = 3
#: the halving comparison's k-fold selection (the table's sparsest validation task has fewer than 100 labelled rows:
#: the rule's k-fold; 3 folds rather than the default 5 keep the exhaustive grid short)
FOLDS = 3


def synthetic_table(root: Path, rows: int, seed: int = 0) -> Path:
    """Prepare a seeded table of ``rows`` rows with a binary, a regression and a 3-class task that share two
    informative features among six (and 15 % of the binary labels missing); returns its data directory."""
    import pandas as pd  # noqa: PLC0415 -- heavy; banned at module level
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(rows, 6))
    signal = x[:, 0] + 0.5 * x[:, 1]
    frame = pd.DataFrame(x, columns=[f"f{i}" for i in range(6)])
    frame["churned"] = np.where(signal + 0.5 * rng.normal(size=rows) > 0, "yes", "no")
    frame.loc[rng.choice(rows, round(0.15 * rows), replace=False), "churned"] = None
    frame["spend"] = np.round(np.exp(0.5 * signal) + 0.3 * rng.normal(size=rows), 5)
    frame["plan"] = pd.cut(signal + 0.5 * rng.normal(size=rows), [-np.inf, -0.5, 0.5, np.inf],
                           labels=["basic", "plus", "pro"]).astype(str)
    root.mkdir(parents=True, exist_ok=True)
    frame.to_csv(root / "table.csv", index=False)
    tasks = [{"name": "churned", "type": "binary"}, {"name": "spend", "type": "regression"},
             {"name": "plan", "type": "multiclass"}]
    (root / "spec.yaml").write_text(yaml.safe_dump({"name": f"synthetic-{rows}", "source": {"table": "table.csv"},
                                                    "tasks": tasks}, sort_keys=False))
    if not (root / "data").is_dir():
        jobs.prepare("spec", root / "data", spec=str(root / "spec.yaml"))
    return root / "data"


def optuna_shares(result: Mapping[str, Any]) -> dict[str, float]:
    """Each study's Optuna share of its trials' wall time (from a tune result)."""
    return {name: s["spent"]["optuna_share"] for name, s in result["studies"].items()
            if s["spent"]["optuna_share"] is not None}


def retrained_test_scores(work: Path, data_dir: Path, result: Mapping[str, Any], study: str) -> list[float]:
    """The test score of each retrained run of ``study`` (module docstring; lower is better)."""
    bench, data = load_prepared(data_dir)
    summary = result["studies"][study]
    plan = jobs.plan_train(data_dir, method=summary["method"], seed=result["search_seed"],
                           hparams=summary["fixed_hparams"], tasks=summary["tasks"], **result["train_options"])
    trainer = Trainer(bench, data, plan.config, work / "unused", progress=False)
    untrained = evaluate_model(trainer.model, bench, data.splits["test"], trainer.tasks, trainer.task_index,
                               plan.config.eval_batch_size, trainer.device)
    primary = {t.name: t.primary for t in trainer.tasks}
    specs = {t.name: t.metric_specs() for t in trainer.tasks}
    scores = []
    for run_dir in summary["retrained"]:
        final = atomic.read_json(Path(run_dir) / "metrics.json", "run metrics")["final"]
        scores.append(float(validation_score(final["test"], untrained, primary, specs)))
    return scores


def _interval(values: Sequence[float]) -> dict[str, Any]:
    estimate = mean_interval(values)
    return {"mean": estimate.mean, "low": estimate.low, "high": estimate.high, "values": list(values)}


def halving_versus_grid(work: Path, data_dir: Path, seed: int = 0) -> dict[str, Any]:
    """The exhaustive grid of :data:`GRID_LRS` and a TPE + successive-halving search with a third of its steps,
    on LS; each choice retrained with :data:`RETRAIN_SEEDS` fresh seeds and scored on test."""
    space = {"*": {"lr": {"choices": GRID_LRS}, "weight_decay": None}}
    common = {"data_dir": data_dir, "seed": seed, "retrain_seeds": RETRAIN_SEEDS, "references": False,
              "search_spaces": space, "train_options": HALVING_TRAIN, "compare": False, "progress": False,
              "resume": True, "selection": "kfold", "folds": FOLDS}  # a killed benchmark continues its studies
    grid = tune(work / "grid", ["ls"], budget_trials=len(GRID_LRS), pruner="none", sampler="grid", **common)
    grid_steps = grid["studies"]["ls"]["spent"]["steps"]
    halving = tune(work / "halving", ["ls"], budget_steps=math.floor(grid_steps * STEPS_SHARE_TARGET),
                   pruner="successive-halving", startup_trials=3, **common)
    out: dict[str, Any] = {"grid_lrs": GRID_LRS, "selection": f"{FOLDS}-fold",
                           "train_options": HALVING_TRAIN}
    for name, result in (("grid", grid), ("halving", halving)):
        study = result["studies"]["ls"]
        out[name] = {"chosen_lr": study["chosen"]["train_options"]["lr"], "steps": study["spent"]["steps"],
                     "trials": study["spent"]["trials"], "pruned": study["spent"]["pruned"],
                     "test_score": _interval(retrained_test_scores(work, data_dir, result, "ls")),
                     "optuna_share": optuna_shares(result)}
    grid_score, halving_score = out["grid"]["test_score"], out["halving"]["test_score"]
    out["steps_share"] = out["halving"]["steps"] / grid_steps
    out["within_interval"] = bool(halving_score["mean"] <= grid_score["high"])  # within the interval, or better
    return out


def tuned_sweep(work: Path, data_dir: Path, seed: int = 0) -> dict[str, Any]:
    """:data:`SWEEP_METHODS` tuned with 20 trials each (and the references), retrained, compared: wall time and
    the load average while it ran."""
    load_before = os.getloadavg()
    started = time.perf_counter()
    result = tune(work / "sweep", list(SWEEP_METHODS), data_dir=data_dir, seed=seed, budget_trials=20,
                  progress=False)
    seconds = time.perf_counter() - started
    return {"methods": list(SWEEP_METHODS), "budget_trials": 20, "studies": list(result["studies"]),
            "selection": result["selection"]["mode"], "wall_seconds": seconds,
            "load_average_before": list(load_before), "load_average_after": list(os.getloadavg()),
            "cpus": os.cpu_count(), "optuna_share": optuna_shares(result)}


def run(work: Path, sweep: bool, seed: int = 0) -> dict[str, Any]:
    """Every measurement (the sweep only with ``sweep``) as one summary."""
    import optuna  # noqa: PLC0415 -- heavy; banned at module level
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    load = os.getloadavg()
    data_dir = synthetic_table(work / "table", 1000, seed)
    summary: dict[str, Any] = {"schema": 1, "started": started, "optuna": optuna.__version__, "rows": 1000,
                               "cpus": os.cpu_count(), "load_average_at_start": list(load),
                               "halving_versus_grid": halving_versus_grid(work, data_dir, seed)}
    if sweep:
        summary["tuned_sweep"] = tuned_sweep(work, data_dir, seed)
    return summary


def _pct(value: float) -> str:
    return f"{100 * value:.2f} %"


def render(summary: Mapping[str, Any]) -> str:
    """The markdown table of a summary (what the docs page shows between the markers)."""
    hv = summary["halving_versus_grid"]
    runs = {"grid": hv["grid"]["optuna_share"], "halving": hv["halving"]["optuna_share"],
            "sweep": (summary.get("tuned_sweep") or {}).get("optuna_share", {})}
    shares = [share for by_study in runs.values() for share in by_study.values()]
    worst = max(shares)
    g, h = hv["grid"]["test_score"], hv["halving"]["test_score"]
    load = ", ".join(f"{v:.1f}" for v in summary["load_average_at_start"])
    rows = [
        ("sampler + pruner share of a trial's time", f"{_pct(worst)} (largest of {len(shares)} studies)",
         f"<= {_pct(OPTUNA_SHARE_TARGET)}", worst <= OPTUNA_SHARE_TARGET),
        (f"successive halving vs the grid of {len(hv['grid_lrs'])} learning rates: steps",
         f"{hv['halving']['steps']} of {hv['grid']['steps']} ({hv['steps_share']:.2f}; halving: "
         f"{hv['halving']['trials']} trials, {hv['halving']['pruned']} pruned)", "<= 1/3",
         hv["steps_share"] <= STEPS_SHARE_TARGET),
        ("... the chosen configuration's test score (lower is better)",
         f"halving lr {hv['halving']['chosen_lr']:.3g}: {h['mean']:.4f} [{h['low']:.4f}, {h['high']:.4f}]; "
         f"grid lr {hv['grid']['chosen_lr']:.3g}: {g['mean']:.4f} [{g['low']:.4f}, {g['high']:.4f}]",
         "within the grid's interval (or better)", hv["within_interval"]),
    ]
    sweep = summary.get("tuned_sweep")
    if sweep is None:
        rows.append(("tuned sweep: 4 methods x 20 trials, 1,000 rows", "not measured (run with --sweep)",
                     "<= 15 min, idle 2 cores", None))
    else:
        busy = ", ".join(f"{v:.1f}" for v in sweep["load_average_before"])
        rows.append((f"tuned sweep: {len(sweep['methods'])} methods x {sweep['budget_trials']} trials "
                     f"(+ references), {summary['rows']:,} rows", f"{sweep['wall_seconds'] / 60:.1f} min "
                     f"(load average {busy} on {sweep['cpus']} cores)", "<= 15 min, idle 2 cores",
                     sweep["wall_seconds"] <= SWEEP_SECONDS_TARGET))
    verdict = {True: "met", False: "**missed**", None: "-"}
    lines = ["| measure | measured | target | |", "|---|---|---|---|"]
    lines += [f"| {m} | {v} | {t} | {verdict[ok]} |" for m, v, t, ok in rows]
    lines.append(f"\nMeasured {summary['started']} with Optuna {summary['optuna']}, {hv['selection']} selection, "
                 f"{RETRAIN_SEEDS} retrain seeds, load average {load} on {summary['cpus']} cores at the start.")
    return "\n".join(lines)


def doc_block(text: str) -> str:
    """The generated text between the markers of the docs page."""
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    return text[start:end].strip("\n")


def write_docs(summary: Mapping[str, Any], results: Path = RESULTS, doc: Path = DOC) -> None:
    atomic.write_json(results, summary)
    text = doc.read_text()
    start, end = text.index(BEGIN) + len(BEGIN), text.index(END)
    atomic.write_text(doc, text[:start] + "\n" + render(summary) + "\n" + text[end:])


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m mtlflow.experiments.tune_bench", description=__doc__.split(
        "\n\n")[0])
    parser.add_argument("--out", required=True, help="work directory (the table, the tuning runs, summary.json)")
    parser.add_argument("--sweep", action="store_true", help="also time the tuned sweep of 4 methods (long)")
    parser.add_argument("--write-docs", action="store_true", help="store the summary in docs/results/tune-bench.json "
                        "and rewrite the table in docs/guides/tuning.md")
    args = parser.parse_args(argv)
    work = Path(args.out)
    summary = run(work, args.sweep)
    atomic.write_json(work / "summary.json", summary)
    print(render(summary))
    if args.write_docs:
        write_docs(summary)
    print(json.dumps({"summary": str(work / "summary.json")}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
