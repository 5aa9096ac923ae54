"""The learned Pareto front: evaluation on a preference grid, hypervolume, selection, aggregation, plot.

A Pareto-front-learning model is evaluated at every preference of an even simplex grid (PaLoRA Sec. 6.1
and App. B.2: 11 points λ ∈ {0, 0.1, ..., 1} for two tasks). Each point gets the task metrics of the
benchmark; its objective vector is the error of each task's primary metric
(:func:`mtlflow.metrics.task.metric_error`: 1 − accuracy for bounded higher-is-better metrics), the
same objective the aggregate's single-point hypervolume uses. The front's hypervolume
(Zitzler & Thiele 1999) is computed with :func:`mtlflow.metrics.scoring.hypervolume` against the benchmark's
fixed reference point (``TaskSpec.hv_reference``), which is recorded next to every value. The paper's
second front metric, the number of non-dominated grid points (Fig. 5b), is recorded as the number of
DISTINCT non-dominated objective vectors (:data:`DISTINCT_TOL`): grid points that collapse onto one point
count once, so a front that learned nothing (every preference giving the same model) scores 1, not 11.
The paper's third diagnostic (Figs. 12-13), the Spearman rank correlation between each task's preference
λ_t and its error over the grid, is recorded per task (negative: more preference, less error; None where
either side is constant).
"""

from __future__ import annotations

import io
import statistics
from collections.abc import Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.nn.utils import parametrize

from mtlflow.core.errors import InvalidParameterError
from mtlflow.metrics.evaluation import evaluate_model
from mtlflow.metrics.scoring import hypervolume, pareto_mask
from mtlflow.metrics.selection import parse_selection
from mtlflow.metrics.task import metric_error
from mtlflow.pareto.adapters import PreferenceAdapters

OBJECTIVE = "error of each task's primary metric (1 - value for bounded higher-is-better metrics)"
#: two non-dominated objective vectors closer than this in every task are one point of the front
DISTINCT_TOL = 1e-9
Metrics = dict[str, dict[str, float]]  # task -> metric -> value


def evaluate_front(model: nn.Module, adapters: PreferenceAdapters, bench: Any, dataset: Any, tasks: Sequence[Any],
                   target_index: Sequence[int], preferences: torch.Tensor, batch_size: int = 512,
                   device: torch.device | str = "cpu") -> list[Metrics]:
    """Task metrics of ``model`` on ``dataset`` at every preference (row) of ``preferences``."""
    points = []
    for lam in preferences:
        # cached(): each adapted weight is merged once per preference, not once per batch
        with adapters.preference(lam), parametrize.cached():
            points.append(evaluate_model(model, bench, dataset, tasks, target_index, batch_size, device))
    return points


def task_info(tasks: Sequence[Any]) -> tuple[list[str], dict[str, str], dict[str, Any], list[float]]:
    """(names, primary metric, metric specs, hypervolume reference point) of task specs."""
    return ([t.name for t in tasks], {t.name: t.primary for t in tasks}, {t.name: t.metric_specs() for t in tasks},
            [float(t.hv_reference) for t in tasks])


def distinct_count(vectors: Sequence[Sequence[float]], tol: float = DISTINCT_TOL) -> int:
    """How many of ``vectors`` are distinct: a vector within ``tol`` of an earlier one in every
    coordinate is the same point."""
    kept: list[Sequence[float]] = []
    for v in vectors:
        if not any(all(abs(a - b) <= tol for a, b in zip(v, k, strict=True)) for k in kept):
            kept.append(v)
    return len(kept)


def preference_spearman(preferences: Sequence[Sequence[float]], errors: Sequence[Sequence[float]],
                        tasks: Sequence[str]) -> dict[str, float | None]:
    """Spearman's ρ between λ_t and task t's error over the grid points, per task (PaLoRA Figs. 12-13);
    None where the preferences or the errors of that task are constant (ρ is undefined)."""
    from scipy.stats import spearmanr

    out: dict[str, float | None] = {}
    for i, task in enumerate(tasks):
        lam = [float(p[i]) for p in preferences]
        err = [float(e[i]) for e in errors]
        if len(set(lam)) < 2 or len(set(err)) < 2:
            out[task] = None
        else:
            out[task] = float(spearmanr(lam, err).statistic)
    return out


def summarise_points(points: Sequence[Metrics], tasks: Sequence[str], primary: Mapping[str, str],
                     specs: Mapping[str, Mapping[str, Mapping[str, bool]]],
                     reference_point: Sequence[float],
                     preferences: Sequence[Sequence[float]] | None = None) -> dict[str, Any]:
    """Objective vectors, hypervolume, Pareto mask, distinct non-dominated count and (given the grid's
    ``preferences``) the preference/error Spearman correlation of one split's grid points."""
    errors = [[metric_error(p[t][primary[t]], specs[t][primary[t]]["higher_is_better"],
                            specs[t][primary[t]]["unit_interval"]) for t in tasks] for p in points]
    mask = pareto_mask(errors)
    summary = {"metrics": [dict(p) for p in points], "errors": errors,
               "hypervolume": hypervolume(errors, reference_point),
               "non_dominated": distinct_count([e for e, keep in zip(errors, mask, strict=True) if keep]),
               "pareto_mask": mask}
    if preferences is not None:
        summary["spearman"] = preference_spearman(preferences, errors, tasks)
    return summary


def front_record(preferences: torch.Tensor, by_split: Mapping[str, Sequence[Metrics]], tasks: Sequence[str],
                 primary: Mapping[str, str], specs: Mapping[str, Mapping[str, Mapping[str, bool]]],
                 reference_point: Sequence[float]) -> dict[str, Any]:
    """The JSON record of a front: preferences, reference point, and per split the points' metrics,
    errors, hypervolume and non-dominated count."""
    return {"preferences": [[round(float(v), 12) for v in lam] for lam in preferences],
            "reference_point": [float(v) for v in reference_point], "objective": OBJECTIVE,
            "splits": {split: summarise_points(points, tasks, primary, specs, reference_point,
                                               [[float(v) for v in lam] for lam in preferences])
                       for split, points in by_split.items()}}


def _mean_points(fronts: Sequence[Mapping[str, Any]], split: str) -> list[Metrics]:
    """Point-wise mean of the metrics of several fronts on the same grid."""
    first = fronts[0]["splits"][split]["metrics"]
    return [{task: {m: statistics.fmean(f["splits"][split]["metrics"][i][task][m] for f in fronts)
                    for m in values} for task, values in point.items()} for i, point in enumerate(first)]


def _check_same_grid(fronts: Sequence[Mapping[str, Any]], what: str) -> None:
    grids = {tuple(map(tuple, f["preferences"])) for f in fronts}
    refs = {tuple(f["reference_point"]) for f in fronts}
    if len(grids) > 1 or len(refs) > 1:
        raise InvalidParameterError(f"{what} were evaluated on different preference grids or reference points; "
                                    "use the same eval_subdivisions for all of them")


def select_front(history: Sequence[Mapping[str, Any]], rule: str, tasks: Sequence[str], primary: Mapping[str, str],
                 specs: Mapping[str, Mapping[str, Mapping[str, bool]]]) -> dict[str, Any] | None:
    """The run's front under its selection rule: the last epoch's, or the point-wise mean of the last K
    epochs' fronts (``last-k:K``); the test split never selects. None if those epochs have no front."""
    _, k = parse_selection(rule)
    window = [e.get("preference_front") for e in history[-k:]]
    if not window or any(f is None for f in window):
        return None
    _check_same_grid(window, "the selected epochs' fronts")
    by_split = {split: _mean_points(window, split) for split in window[-1]["splits"]}
    preferences = torch.tensor(window[-1]["preferences"], dtype=torch.float64)
    record = front_record(preferences, by_split, tasks, primary, specs, window[-1]["reference_point"])
    record["selection"] = {"rule": rule, "epochs": [e["epoch"] for e in history[-k:]]}
    return record


def aggregate_fronts(fronts: Sequence[Mapping[str, Any]], split: str, tasks: Sequence[str],
                     primary: Mapping[str, str],
                     specs: Mapping[str, Mapping[str, Mapping[str, bool]]]) -> dict[str, Any]:
    """One method's front over seeds: the point-wise mean front, its hypervolume and non-dominated
    count, and the hypervolume of every seed's own front (mean ± std)."""
    _check_same_grid(fronts, "the runs of one method")
    missing = [i for i, f in enumerate(fronts) if split not in f["splits"]]
    if missing:
        raise InvalidParameterError(f"the preference front of {len(missing)} run(s) lacks the {split!r} split")
    reference_point = fronts[0]["reference_point"]
    mean = summarise_points(_mean_points(fronts, split), tasks, primary, specs, reference_point,
                            fronts[0]["preferences"])
    per_seed = [f["splits"][split]["hypervolume"] for f in fronts]
    return {"preferences": fronts[0]["preferences"], "reference_point": reference_point, "split": split,
            "errors": mean["errors"], "metrics": mean["metrics"], "pareto_mask": mean["pareto_mask"],
            "non_dominated": mean["non_dominated"], "spearman": mean["spearman"], "hypervolume": mean["hypervolume"],
            "hypervolume_per_seed": per_seed, "hypervolume_seed_mean": statistics.fmean(per_seed),
            "hypervolume_seed_std": statistics.stdev(per_seed) if len(per_seed) > 1 else 0.0}


def dominates(a: Sequence[float], b: Sequence[float]) -> bool:
    """True when error vector ``a`` Pareto-dominates ``b`` (≤ everywhere, < somewhere)."""
    return all(x <= y for x, y in zip(a, b, strict=True)) and any(x < y for x, y in zip(a, b, strict=True))


def attach_fronts(rows: dict[str, dict[str, Any]], groups: Mapping[str, Sequence[Mapping[str, Any]]], split: str,
                  tasks: Sequence[str], primary: Mapping[str, str],
                  specs: Mapping[str, Mapping[str, Mapping[str, bool]]]) -> list[str]:
    """Add ``preference_front`` to the aggregate row of every method whose runs learned a front (their
    ``metrics.json`` holds one), and list the other methods each front dominates. Returns the labels
    of the front methods."""
    labels = []
    for label, group in groups.items():
        fronts = [g["metrics"].get("preference_front") for g in group]
        if any(f is None for f in fronts):
            continue
        rows[label]["preference_front"] = aggregate_fronts(fronts, split, tasks, primary, specs)
        labels.append(label)
    for label in labels:
        front = rows[label]["preference_front"]
        front["dominates"] = sorted(other for other, row in rows.items() if other != label
                                    and any(dominates(p, row["primary_errors"]) for p in front["errors"]))
    return labels


def front_plot(front: Mapping[str, Any], tasks: Sequence[str], primary: Mapping[str, str], title: str) -> bytes:
    """PNG of :func:`front_figure`."""
    import matplotlib.pyplot as plt

    fig = front_figure(front, tasks, primary, title)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def front_figure(front: Mapping[str, Any], tasks: Sequence[str], primary: Mapping[str, str], title: str):
    """The figure of a front record (every split it holds): the grid points' errors, labelled by λ₁ for two
    tasks; parallel coordinates over the tasks for more. The caller closes it."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4.5))
    prefs = front["preferences"]
    for split, values in front["splits"].items():
        errors = values["errors"]
        label = f"{split} (HV {values['hypervolume']:.4f}, {values['non_dominated']}/{len(errors)} non-dominated)"
        if len(tasks) == 2:
            line, = ax.plot([e[0] for e in errors], [e[1] for e in errors], marker="o", ms=4, lw=1, label=label)
            for lam, e in zip(prefs, errors, strict=True):
                ax.annotate(f"{lam[0]:.1f}", e, fontsize=6, color=line.get_color(), xytext=(3, 3),
                            textcoords="offset points")
        else:
            for i, e in enumerate(errors):
                ax.plot(range(len(tasks)), e, lw=0.8, alpha=0.6, label=label if i == 0 else None,
                        color=f"C{list(front['splits']).index(split)}")
    if len(tasks) == 2:
        ax.set_xlabel(f"{tasks[0]} error ({primary[tasks[0]]})")
        ax.set_ylabel(f"{tasks[1]} error ({primary[tasks[1]]})")
    else:
        ax.set_xticks(range(len(tasks)), tasks, rotation=45, ha="right")
        ax.set_ylabel("error of the primary metric")
    ax.set_title(title + (" (labels: λ₁)" if len(tasks) == 2 else ""), fontsize=9)
    ax.legend(fontsize=7)
    return fig


def front_tables(summary: Mapping[str, Any]) -> list[tuple[str, list[str], list[list[str]]]]:
    """For the aggregate report: one overview table of the front methods, then one table per front
    with every grid point's primary metrics (mean over seeds). ``[(title, header, rows), ...]``."""
    labels = summary.get("preference_front_methods") or []
    if not labels:
        return []
    tasks, primary = summary["tasks"], summary["primary_metrics"]
    ref = summary["hypervolume_reference_point"]
    overview = []
    for label in labels:
        row = summary["methods"][label]
        front = row["preference_front"]
        overview.append([label, str(len(row["seeds"])), str(len(front["errors"])), f"{front['hypervolume']:.4f}",
                         f"{front['hypervolume_seed_mean']:.4f} ± {front['hypervolume_seed_std']:.4f}",
                         f"{front['non_dominated']}/{len(front['errors'])}",
                         ", ".join("–" if r is None else f"{r:+.2f}" for r in front["spearman"].values()),
                         f"{row.get('hypervolume_raw', row['hypervolume']):.4f}",  # raw units, as the fronts
                         ", ".join(front["dominates"]) or "none"])
    tables = [(f"Pareto-front methods ({summary['split']} split, hypervolume reference point {ref})",
               ["method", "seeds", "grid points", "HV of the mean front ↑", "HV per seed ↑",
                "distinct non-dominated ↑", "Spearman ρ(λ_t, error_t) per task ↓", "HV of the centre point ↑", "single-point methods it dominates"], overview)]
    for label in labels:
        front = summary["methods"][label]["preference_front"]
        rows = [[", ".join(f"{v:.2f}" for v in lam)] + [f"{point[t][primary[t]]:.4f}" for t in tasks]
                + ["yes" if keep else ""] for lam, point, keep in zip(front["preferences"], front["metrics"],
                                                                       front["pareto_mask"], strict=True)]
        tables.append((f"{label}: front on the preference grid (mean over seeds)",
                       ["λ"] + [f"{t} {primary[t]}" for t in tasks] + ["non-dominated"], rows))
    return tables
