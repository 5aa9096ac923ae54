"""The tuning report of ``mtlflow tune``: ``<out>/tune-report.html`` and ``<out>/tune-results.md``.

What it shows (issue 37, "The report"):

* the verdict box and table of the **tuned** comparison (``comparison/results.json``: every method at its chosen
  configuration, retrained with fresh seeds, against tuned LS and the sweep's baselines) beside the **defaults**
  table (``defaults-comparison/results.json``: every method at its defaults, the same retrain seeds, the same tuned
  single-task references, so a Δm% difference between the tables is the method's own change);
* each method's chosen configuration and its **tuning gain**, tuned minus defaults, paired over the seeds both
  tables share (seed s of one against seed s of the other: the same initialisation and batch order): Δm% and each
  task's primary metric, the mean of the per-seed differences with its 95 % interval
  (:func:`mtlflow.metrics.intervals.mean_interval`) and a verdict;
* the budget each study spent (steps, trials, pruned, wall time) and, per study, the optimisation history (the
  validation score of every trial, the best so far) and the parameter importance (Optuna's fANOVA with a fixed
  seed) as one figure.

Everything is read from the run's public outputs (``tune.json``, the two ``results.json``, the study journal), so
``render(out)`` re-renders a finished run.
"""

from __future__ import annotations

import base64
import math
import textwrap
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from mtlflow import jobs
from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.jobs import baselines, report, tune_study
from mtlflow.jobs.compare.summary import MethodRow, Summary, read_summary
from mtlflow.metrics.intervals import Estimate, format_estimate, mean_interval, verdict

HTML_NAME, MARKDOWN_NAME = "tune-report.html", "tune-results.md"
#: where the methods' runs at their defaults and their comparison live in the work directory
DEFAULTS_DIR, DEFAULTS_COMPARISON = "defaults", "defaults-comparison"
BASELINES_DIR = "baselines"
#: fANOVA's random forest seed: the same trials give the same importances
IMPORTANCE_SEED = 0


def fit_baselines(data_dir: str | Path, out: Path) -> list[str]:
    """Every baseline that fits the data (:func:`mtlflow.jobs.baselines.applicable_kinds`), into
    ``<out>/baselines/<kind>`` (cached by the data's hash; a directory already holding it is reused)."""
    return [baselines.baseline(data_dir, kind, out / BASELINES_DIR / kind)["out"]
            for kind in baselines.applicable_kinds(data_dir)]


def compare_defaults(runs: Mapping[str, Sequence[str]], references: Sequence[str], baseline_dirs: Sequence[str],
                     out: Path) -> dict[str, Any]:
    """Compare the methods' runs at their defaults (study -> run directories) against the tuned references and the
    baselines into ``<out>/defaults-comparison``; returns what ``tune.json`` records of it."""
    jobs.aggregate([d for dirs in runs.values() for d in dirs], out / DEFAULTS_COMPARISON, reference_dirs=references,
                   baseline_dirs=baseline_dirs)
    return {"dir": DEFAULTS_COMPARISON, "results": f"{DEFAULTS_COMPARISON}/results.json",
            "report": f"{DEFAULTS_COMPARISON}/report.html", "runs": {k: list(v) for k, v in runs.items()},
            "references": "the tuned single-task references (the tuned table's), so that a Δm% gain is the method's "
                          "own change"}


@dataclass(frozen=True)
class Gain:
    """One method's tuning gain: tuned minus defaults over the shared seeds, per statistic (``Δm%`` and each
    task's primary metric) the paired estimate and its verdict for the tuned configuration."""

    seeds: tuple[int, ...]
    estimates: dict[str, Estimate]
    verdicts: dict[str, str]


def row_of(summary: Summary, run_dirs: Sequence[str]) -> tuple[str, MethodRow]:
    """The comparison row whose runs are ``run_dirs`` (a tuned row's label carries its chosen hyper-parameters)."""
    wanted = {str(Path(d)) for d in run_dirs}
    for label, row in summary.methods.items():
        if {str(Path(d)) for d in row.runs} == wanted:
            return label, row
    raise KeyError(f"no row of the comparison holds the runs {sorted(wanted)}")


def _per_seed_metric(summary: Summary, row: MethodRow, task: str) -> list[float]:
    """Each seed's primary metric of ``task`` (the inverse of :func:`mtlflow.metrics.task.metric_error`)."""
    spec, i = summary.primary_spec(task), summary.tasks.index(task)
    errors = [seed[i] for seed in row.primary_errors_per_seed]
    if not spec["higher_is_better"]:
        return errors
    return [1.0 - e if spec["unit_interval"] else -e for e in errors]


def tuning_gain(tuned: Summary, tuned_row: MethodRow, defaults: Summary, default_row: MethodRow) -> Gain:
    """Tuned minus defaults, paired over the seeds both rows have: Δm% (when both tables have it; lower is better)
    and each task's primary metric (in its own direction)."""
    seeds = tuple(s for s in tuned_row.seeds if s in default_row.seeds)
    if not seeds:
        raise ValueError(f"{tuned_row.method} at its defaults and tuned share no seed; retrain both with the same ones")

    def paired(first: Sequence[float], first_seeds: Sequence[int], second: Sequence[float],
               second_seeds: Sequence[int]) -> Estimate:
        a, b = dict(zip(first_seeds, first, strict=True)), dict(zip(second_seeds, second, strict=True))
        return mean_interval([a[s] - b[s] for s in seeds])

    estimates, verdicts = {}, {}
    if tuned_row.delta_m is not None and default_row.delta_m is not None:
        estimates["Δm%"] = paired(tuned_row.delta_m.per_seed, tuned_row.seeds, default_row.delta_m.per_seed,
                                  default_row.seeds)
        verdicts["Δm%"] = verdict(estimates["Δm%"].low, estimates["Δm%"].high, lower_is_better=True)
    for task in tuned.tasks:
        key = f"{task} {tuned.primary_metrics[task]}"
        estimates[key] = paired(_per_seed_metric(tuned, tuned_row, task), tuned_row.seeds,
                                _per_seed_metric(defaults, default_row, task), default_row.seeds)
        verdicts[key] = verdict(estimates[key].low, estimates[key].high,
                                lower_is_better=not tuned.primary_spec(task)["higher_is_better"])
    return Gain(seeds, estimates, verdicts)


@dataclass(frozen=True)
class TuneReport:
    """A finished tuning run's report data: ``tune.json``, the tuned and the defaults comparison."""

    result: dict[str, Any]
    tuned: Summary
    defaults: Summary | None

    def method_studies(self) -> list[str]:
        return [name for name, study in self.result["studies"].items() if study["kind"] == "method"]

    def gains(self) -> dict[str, tuple[str, Gain]]:
        """Per method study: its tuned row's label and its tuning gain (none without the defaults table)."""
        if self.defaults is None:
            return {}
        out = {}
        for name in self.method_studies():
            label, tuned_row = row_of(self.tuned, self.result["studies"][name]["retrained"])
            _, default_row = row_of(self.defaults, self.result["defaults"]["runs"][name])
            out[name] = (label, tuning_gain(self.tuned, tuned_row, self.defaults, default_row))
        return out


def load(out: str | Path) -> TuneReport:
    """The report data of the tuning run in ``out`` (its comparison must exist: ``tune`` with ``compare``)."""
    out = Path(out)
    result = atomic.read_json(out / "tune.json", "tuning result")
    if "comparison" not in result:
        raise InvalidParameterError(f"the tuning run in {out} retrained nothing (--retrain-seeds 0 or --no-compare): "
                                    "there is no comparison to report; resume it with --retrain-seeds N")
    defaults = read_summary(out / result["defaults"]["results"]) if "defaults" in result else None
    return TuneReport(result, read_summary(out / result["comparison"]["results"]), defaults)


def _chosen(study: Mapping[str, Any]) -> str:
    values = {**study["chosen"]["train_options"], **study["chosen"]["hparams"]}
    return ", ".join(f"{k}={v:.3g}" if isinstance(v, float) else f"{k}={v}" for k, v in sorted(values.items()))


def gain_table(data: TuneReport) -> dict[str, Any] | None:
    """Per method: its chosen configuration and tuning gain per statistic (``mean [low, high]: verdict``)."""
    gains = data.gains()
    if not gains:
        return None
    keys = list(next(iter(gains.values()))[1].estimates)
    rows = []
    for name, (_, gain) in gains.items():
        cells = [f"{format_estimate(gain.estimates[k], 2 if k == 'Δm%' else 4, signed=True)}: {gain.verdicts[k]}"
                 for k in keys]
        rows.append([name, _chosen(data.result["studies"][name]), str(len(gain.seeds)), *cells])
    return {"header": ["method", "chosen configuration", "paired seeds", *(f"gain in {k}" for k in keys)],
            "rows": rows}


def budget_table(data: TuneReport, wall_time: bool) -> dict[str, Any]:
    """Per study the budget spent; ``wall_time`` adds the machine's seconds (left out of the docs' table)."""
    header = ["study", "steps (of budget)", "trials", "complete", "pruned", "diverged", "best validation score"]
    rows = []
    for name, study in data.result["studies"].items():
        spent = study["spent"]
        row = [name, f"{spent['steps']} ({spent['budget_steps']})", str(spent["trials"]), str(spent["complete"]),
               str(spent["pruned"]), str(spent["diverged"]), f"{study['best_value']:.4g}"]
        rows.append(row + ([f"{spent['wall_seconds']:.1f}"] if wall_time else []))
    return {"header": header + (["wall s"] if wall_time else []), "rows": rows}


def _results_table(summary: Summary) -> dict[str, Any]:
    """A comparison's results table without the step time (the machine's, not the result's)."""
    header, rows = report.table_rows(summary)
    keep = [i for i, name in enumerate(header) if name != report.STEP_TIME_COLUMN]
    return {"header": [header[i] for i in keep], "rows": [[r[i] for i in keep] for r in rows]}


def _context(data: TuneReport, wall_time: bool) -> dict[str, Any]:
    result = data.result
    return {"result": result, "box": report.verdict_box(data.tuned), "tuned": _results_table(data.tuned),
            "defaults": _results_table(data.defaults) if data.defaults is not None else None,
            "gains": gain_table(data), "budget": budget_table(data, wall_time),
            "selection": result["selection"]["mode"], "warnings": result["warnings"], "title": data.tuned.dataset}


def markdown(data: TuneReport, wall_time: bool = True) -> str:
    """``tune-results.md``: the tuned verdict and table, the defaults table, the gains and the budget (without the
    wall time: the table ``tools/tuned_table.py`` copies into the docs)."""
    env = _environment()
    return env.get_template("tune-results.md.j2").render(**_context(data, wall_time)).strip() + "\n"


def _environment():
    """The comparison report's Jinja2 set-up and templates (one look for both reports), with its Markdown filter."""
    env = report._environment()  # the report's own loader, autoescape and strictness, shared on purpose
    env.filters["markdown"] = lambda table: report._markdown(table["header"], table["rows"])
    return env


def importances(out: Path, names: Sequence[str]) -> dict[str, dict[str, float] | str]:
    """Per study the fANOVA importance of each searched parameter over its completed trials (seeded), or why
    there is none (fewer than two completed trials with a finite score, or one configuration only)."""
    import optuna
    from optuna.importance import FanovaImportanceEvaluator, get_param_importances
    from optuna.trial import TrialState

    optuna.logging.set_verbosity(optuna.logging.WARNING)  # fANOVA's scratch studies are no news
    storage = tune_study.storage(out)
    found: dict[str, dict[str, float] | str] = {}
    for name in names:
        study = optuna.load_study(study_name=name, storage=storage)
        complete = [t for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
                    if t.value is not None and math.isfinite(t.value)]
        if len(complete) < 2 or len({tuple(sorted(t.params.items())) for t in complete}) < 2:
            found[name] = f"{len(complete)} completed trial(s) with a finite score: too few configurations to weigh"
            continue
        scored = optuna.create_study(direction="minimize")
        scored.add_trials(complete)  # the finite-score trials only: fANOVA cannot fit an infinite (diverged) value
        found[name] = {k: float(v) for k, v in
                       get_param_importances(scored, evaluator=FanovaImportanceEvaluator(seed=IMPORTANCE_SEED)).items()}
    return found


def history_plot(result: Mapping[str, Any], weights: Mapping[str, dict[str, float] | str]) -> bytes:
    """One row per study: the validation score of every completed trial by number with the best so far, each
    pruned trial (grey) at the last score it reported, a trial without a finite score (diverged, failed) as a cross
    along the top; and the parameters' importance."""
    plt = report._pyplot()
    from matplotlib.ticker import MaxNLocator

    studies = result["studies"]
    fig, axes = plt.subplots(len(studies), 2, figsize=(10, 2.4 * len(studies)), squeeze=False,
                             gridspec_kw={"width_ratios": [3, 2]})
    for (name, study), (left, right) in zip(studies.items(), axes, strict=True):
        scored = {kind: [(t["number"], t["value"]) for t in study["trials"]
                         if (t["state"] == "complete") == (kind == "complete") and isinstance(t["value"], float)]
                  for kind in ("complete", "pruned")}
        if scored["complete"]:
            numbers, values = zip(*scored["complete"], strict=True)
            left.plot(numbers, values, "o", color="#4477aa", label="trial")
            best = [min(values[: i + 1]) for i in range(len(values))]
            left.step(numbers, best, where="post", color="#cc3311", label="best so far")
        if scored["pruned"]:
            left.plot(*zip(*scored["pruned"], strict=True), "o", color="#bbbbbb", label="pruned (last score)")
        unscored = [t["number"] for t in study["trials"] if not isinstance(t["value"], float)]
        if unscored:
            top = max((v for pairs in scored.values() for _, v in pairs), default=0.0)
            left.plot(unscored, [top] * len(unscored), "x", color="#999999", label="no finite score")
        left.xaxis.set_major_locator(MaxNLocator(integer=True))
        left.set_title(f"{name}: validation score (lower is better)", fontsize=9)
        left.set_xlabel("trial")
        left.legend(fontsize=7)
        weight = weights.get(name)
        if isinstance(weight, dict):
            keys = list(weight)
            right.barh(keys, [weight[k] for k in keys], color="#228833")
            right.invert_yaxis()
            right.set_xlim(0, 1)
            right.set_title("parameter importance (fANOVA)", fontsize=9)
        else:
            right.axis("off")
            right.text(0, 0.5, textwrap.fill(f"no importance: {weight}", 45), fontsize=8, va="center")
    fig.tight_layout()
    data = report._figure_png(fig)
    plt.close(fig)
    return data


def html(data: TuneReport, figure_png: bytes) -> str:
    """The self-contained tuning report (the figure embedded as a PNG data URI)."""
    return _environment().get_template("tune-report.html.j2").render(
        figure=base64.b64encode(figure_png).decode(), **_context(data, wall_time=True))


def write_tune_report(out: str | Path) -> dict[str, str]:
    """Render the report of the finished tuning run in ``out`` into ``tune-report.html`` and ``tune-results.md``
    (each written atomically); returns their paths."""
    out = Path(out)
    data = load(out)
    weights = importances(out, list(data.result["studies"]))
    atomic.write_text(out / MARKDOWN_NAME, markdown(data))
    atomic.write_text(out / HTML_NAME, html(data, history_plot(data.result, weights)))
    return {"html": str(out / HTML_NAME), "markdown": str(out / MARKDOWN_NAME)}
