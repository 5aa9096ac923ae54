"""The baselines of a sweep: what a report needs to say whether the multi-task methods learned anything.

``baseline(data_dir, kind, out_dir)`` (``mtlflow baseline --data DIR --kind KIND --out DIR``) fits, per task and
on the training split's labelled rows only, one of

- ``trivial``: the constant of :mod:`mtlflow.metrics.baselines` (base rate, class frequencies, median or mean),
  for any prepared data whose tasks are binary, multi-label, multiclass or regression;
- ``hgb``: scikit-learn's HistGradientBoostingClassifier/Regressor, one model per task (per label of a
  multi-label task), its learning rate and leaf count chosen by 5-fold cross-validation on the training rows
  with the task's primary metric as the score;
- ``linear``: LogisticRegression / Ridge, its regularisation chosen the same way;

the last two on a table's prepared features (a tabular spec, a table benchmark): the same encoded, standardised
and imputed columns the networks see. A row without a label for a task is dropped for that task, as the
multi-task trainer masks it.

Every split is scored with the trained runs' metric code (:func:`mtlflow.metrics.baselines.evaluate_predictions`),
and ``out_dir`` becomes a run-like directory that the comparison reads as one more row of the sweep:

- ``run.json``: ``status: completed``, ``kind: baseline``, the benchmark, its configuration, the data hash, the
  tasks, ``config: {method: baseline-<kind>, seed: 0, hparams: {}}`` (so :func:`mtlflow.engine.rundir.run_label`
  names the row ``baseline-<kind>``) and ``baseline``: the kind, the cache key, the fitting rule and, per task,
  what was fitted (the constant, or the model, its grid, the chosen values and their cross-validated score);
- ``metrics.json``: a run's ``metrics.json`` without the training history (no ``epochs``): tasks, primary metrics,
  hypervolume references, metric specs, data hash, ``selection`` and ``final`` (every split's metrics);
- ``<split>_evaluation.json`` and ``<split>_evaluation.per_example.npz`` for every split but train: the files of
  ``mtlflow evaluate --per-example`` (:func:`mtlflow.jobs.evaluate`), so that paired per-example intervals
  against the trained methods come from the same code.

The result is cached under ``$MTLFLOW_CACHE/baselines/`` by the data's content hash, the kind, its settings and
the versions of mtlflow and scikit-learn: a second call on the same data copies it, and an ``out_dir`` that
already holds it is reused as it is.
"""

from __future__ import annotations

import hashlib
import json
import sys
import warnings
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

import mtlflow
from mtlflow.benchmarks.base import Benchmark, MultiTaskTensorDataset, read_manifest
from mtlflow.core import atomic
from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.core.locks import file_lock
from mtlflow.core.outputs import RUN_FILES, check_output_dir, run_dir_guard
from mtlflow.jobs import split_evaluation_name
from mtlflow.jobs.cache import default_cache_dir
from mtlflow.jobs.data import load_prepared, manifest_benchmark
from mtlflow.metrics import baselines as constants
from mtlflow.metrics.classification import valid_label_mask
from mtlflow.metrics.evaluation import examples_path, paired_statistic, read_examples, write_examples
from mtlflow.metrics.task import TaskSpec

KINDS = ("trivial", "hgb", "linear")
#: folds of the cross-validated grid, and the seed of their shuffle and of the boosting
CV_FOLDS = 5
SEED = 0
#: the grids (scikit-learn parameter names) per kind and estimator family
GRIDS: dict[str, dict[str, dict[str, list[float]]]] = {
    "hgb": {"classifier": {"learning_rate": [0.05, 0.2], "max_leaf_nodes": [7, 31]},
            "regressor": {"learning_rate": [0.05, 0.2], "max_leaf_nodes": [7, 31]}},
    "linear": {"classifier": {"C": [0.01, 0.1, 1.0, 10.0, 100.0]},
               "regressor": {"alpha": [0.01, 0.1, 1.0, 10.0, 100.0]}},
}
#: boosting iterations (scikit-learn's default), without early stopping: its stratified inner validation split
#: fails on a class with a single training row, which small tables have
HGB_ITERATIONS = 100
#: the scikit-learn scorer of each primary metric (a multi-label task's F1 is scored per label)
SCORING = {"roc_auc": "roc_auc", "f1": "f1", "acc": "accuracy", "macro_f1": "f1_macro",
           "mae": "neg_mean_absolute_error", "rmse": "neg_root_mean_squared_error", "r2": "r2"}
#: the probability a classifier's log-probabilities are floored at (and that of a class no training row has)
PROBABILITY_FLOOR = 1e-12
#: HistGradientBoosting treats a code column as categorical up to this many codes (its max_bins)
MAX_CATEGORIES = 255


def method_name(kind: str) -> str:
    """The method a baseline's row is named by in the comparison (``baseline-<kind>``)."""
    return f"baseline-{kind}"


def settings(kind: str) -> dict[str, Any]:
    """What decides a baseline's numbers besides the data: its rule, grid and folds, and the code versions."""
    common = {"evaluation_batch_size": constants.EVALUATION_BATCH_SIZE, "pseudo_count": constants.PSEUDO_COUNT,
              "versions": {"mtlflow": mtlflow.__version__}}
    if kind == "trivial":
        return common
    return {**common, "grid": GRIDS[kind], "cv_folds": CV_FOLDS, "seed": SEED, "scoring": SCORING,
            "probability_floor": PROBABILITY_FLOOR,
            **({"max_iter": HGB_ITERATIONS} if kind == "hgb" else {}),
            "versions": {**common["versions"], "scikit-learn": metadata.version("scikit-learn")}}


def applicable_kinds(data_dir: str | Path) -> list[str]:
    """The kinds that fit the prepared data ``data_dir`` (what the sweep plans its baseline steps by, so that no
    step is refused): none when a task is of a kind no baseline covers (dense maps, analytic objectives),
    ``trivial`` for any other data, and ``hgb`` and ``linear`` too when every split is a table of features."""
    bench, data = load_prepared(data_dir)
    if any(task.loss not in constants.KIND_OF_LOSS for task in bench.tasks):
        return []
    tabular = all(isinstance(d, MultiTaskTensorDataset) and d.inputs.dim() == 2 for d in data.splits.values())
    return list(KINDS) if tabular else ["trivial"]


def cache_key(kind: str, data_hash: str) -> str:
    """The baseline's cache key: the data's content hash, the kind and its :func:`settings`."""
    identity = {"kind": kind, "data_hash": data_hash, "settings": settings(kind)}
    return hashlib.sha256(json.dumps(identity, sort_keys=True).encode()).hexdigest()[:16]


def baseline(data_dir: str | Path, kind: str, out_dir: str | Path, overwrite: bool = False) -> dict[str, Any]:
    """Fit the ``kind`` baseline of every task of the prepared data ``data_dir`` on its training rows and write
    the run-like directory ``out_dir`` (see the module's docstring); returns ``{"out", "kind", "method", "key",
    "source", "metrics"}`` with ``source`` ``fitted``, ``cache`` or ``reused`` (``out_dir`` held it already) and
    ``metrics`` every split's metrics.

    An ``out_dir`` holding another run or baseline is replaced only with ``overwrite``."""
    if kind not in KINDS:
        raise InvalidParameterError(f"unknown baseline kind {kind!r}; valid: {', '.join(KINDS)}")
    out_dir = check_output_dir(out_dir, "--out", [("--data", data_dir)])
    manifest = read_manifest(data_dir)
    key = cache_key(kind, manifest["content_hash"])
    if _holds(out_dir, key):
        return _outcome(out_dir, kind, key, "reused")
    held = [name for name in RUN_FILES if (out_dir / name).exists()]
    if held and not overwrite:  # refused before any work
        raise InvalidParameterError(f"--out {out_dir} already holds a run or another baseline ({', '.join(held)}); "
                                    "pass --overwrite to replace it or choose another directory")
    manifest_benchmark(data_dir, manifest)  # a benchmark that is not installed: refused before the cache is touched
    cached = default_cache_dir() / "baselines" / f"{kind}-{key}"
    with file_lock(cached.with_name(f".{cached.name}.lock")):
        try:
            files, source = _read_dir(cached), "cache"
        except DataError:
            print(f"fitting the {kind} baseline of {data_dir}", file=sys.stderr)
            files, source = fit_baseline(data_dir, kind, key), "fitted"
            with atomic.atomic_dir(cached) as tmp:
                _write_dir(tmp, cached, files)
    with run_dir_guard(out_dir, overwrite=overwrite):
        _write_dir(out_dir, out_dir, files)
    return _outcome(out_dir, kind, key, source)


def _outcome(out_dir: Path, kind: str, key: str, source: str) -> dict[str, Any]:
    final = atomic.read_json(out_dir / "metrics.json", "baseline metrics")["final"]
    return {"out": str(out_dir), "kind": kind, "method": method_name(kind), "key": key, "source": source,
            "metrics": final}


def _holds(out_dir: Path, key: str) -> bool:
    """Whether ``out_dir`` holds the complete baseline of cache key ``key``."""
    try:
        files = _read_dir(out_dir)
    except DataError:
        return False
    return files["run"].get("baseline", {}).get("key") == key


# -- fitting ---------------------------------------------------------------------------------------------------

def fit_baseline(data_dir: str | Path, kind: str, key: str) -> dict[str, Any]:
    """The baseline's files as data (``run``, ``metrics``, ``evaluations``: split -> (JSON, per-example values)),
    fitted on ``data_dir``'s training split and scored on every split."""
    bench, data = load_prepared(data_dir)
    tasks = bench.tasks
    kinds = [constants.task_kind(t) for t in tasks]  # a task of another kind is refused before any fitting
    features = None if kind == "trivial" else _features(bench, data.splits)  # and data that is not a table
    splits = {name: _targets(bench, dataset, len(tasks)) for name, dataset in data.splits.items()}
    widths = _output_widths(bench, data.splits["train"])
    if features is None:
        outputs = [constants.trivial_prediction(t, splits["train"][i], widths[i]) for i, t in enumerate(tasks)]
        predictions = {s: [constants.constant_predictions(o, len(targets[0])) for o, _ in outputs]
                       for s, targets in splits.items()}
        described = {t.name: d for t, (_, d) in zip(tasks, outputs, strict=True)}
    else:
        predictions = {s: [] for s in splits}
        described = {}
        for i, task in enumerate(tasks):
            per_split, described[task.name] = fit_task(kind, task, kinds[i], features, splits["train"][i], widths[i],
                                                       code_columns(bench))
            for s in splits:
                predictions[s].append(per_split[s])
    evaluations, final = {}, {}
    for split, targets in splits.items():
        values, examples = constants.evaluate_predictions(tasks, predictions[split], targets)
        final[split] = values
        if split != "train":
            evaluations[split] = (_evaluation(bench, data.content_hash, tasks, split, kind, values), examples)
    return {"run": _run_record(bench, data.content_hash, tasks, kind, key, described),
            "metrics": _metrics_record(bench, data.content_hash, tasks, kind, final), "evaluations": evaluations}


def _targets(bench: Benchmark, dataset: Any, n_tasks: int) -> list[Tensor]:
    """Every task's targets of one split in the split's order (the evaluation's batches, concatenated)."""
    parts: list[list[Tensor]] = [[] for _ in range(n_tasks)]
    for batch in bench.make_loader(dataset, batch_size=constants.EVALUATION_BATCH_SIZE, shuffle=False):
        _, targets = bench.unpack(batch)
        for i in range(n_tasks):
            parts[i].append(targets[i])
    return [torch.cat(p) for p in parts]


@torch.no_grad()
def _output_widths(bench: Benchmark, train: Any) -> list[int]:
    """The size of each task's model output for one example (labels, classes, 1): read off the benchmark's own
    model on two training rows, so that a class no training row has still gets its output."""
    model = bench.make_model()
    model.eval()
    inputs, _ = bench.unpack(next(iter(bench.make_loader(train, batch_size=2, shuffle=False))))
    return [int(out[0].numel()) for out in model(inputs)]


def _features(bench: Benchmark, splits: Mapping[str, Any]) -> dict[str, np.ndarray]:
    """Each split's feature matrix (float64), as the networks get it; refused for data that is not a table."""
    if not all(isinstance(d, MultiTaskTensorDataset) and d.inputs.dim() == 2 for d in splits.values()):
        raise InvalidParameterError(f"{bench.label}'s inputs are not a table of features (images, molecules or "
                                    "another structure); the hgb and linear baselines need a tabular spec or table "
                                    "benchmark, use --kind trivial")
    return {s: d.inputs.double().numpy() for s, d in splits.items()}


def code_columns(bench: Benchmark) -> dict[int, int]:
    """The feature columns that hold category codes (a spec's ``features.encoding: embedding``): column -> number of
    codes (the training categories plus 0 for any other value); none for one-hot or numeric features."""
    features = (getattr(bench, "schema", None) or {}).get("features") or {}
    if features.get("encoding") != "embedding":
        return {}
    first = len(features["numeric"])
    return {first + i: len(c["categories"]) + 1 for i, c in enumerate(features["categorical"])}


def one_hot_codes(x: np.ndarray, codes: Mapping[int, int]) -> np.ndarray:
    """``x`` with every code column replaced by its one-hot block (what a linear model needs of a category)."""
    if not codes:
        return x
    keep = [j for j in range(x.shape[1]) if j not in codes]
    blocks = [x[:, keep]] + [np.eye(n)[np.clip(x[:, j].astype(np.int64), 0, n - 1)] for j, n in codes.items()]
    return np.concatenate(blocks, axis=1)


def fit_task(kind: str, task: TaskSpec, task_kind: str, features: Mapping[str, np.ndarray], train_target: Tensor,
             width: int, codes: Mapping[int, int] | None = None) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """One task's ``kind`` model (one per label of a multi-label task) fitted on its labelled training rows: its
    model output on every split (``[N, width]`` float32) and what was fitted."""
    codes = {} if codes is None else codes
    x = {s: one_hot_codes(f, codes) if kind == "linear" else f for s, f in features.items()}
    categorical = [j in codes and codes[j] <= MAX_CATEGORIES for j in range(features["train"].shape[1])]
    if task_kind == "regression":
        labelled = torch.isfinite(train_target[..., 0]).numpy()
        y = train_target[..., 0].double().numpy()[labelled]
        search = _search(kind, task, "regressor", x["train"][labelled], y, categorical)
        outputs = {s: torch.from_numpy(search.predict(v)).float().reshape(-1, 1) for s, v in x.items()}
        return outputs, _fitted(search, int(labelled.sum()))
    if task_kind == "multiclass":
        return _fit_multiclass(kind, task, x, train_target, width, categorical)
    columns = train_target.reshape(len(train_target), width)
    outputs: dict[str, list[Tensor]] = {s: [] for s in x}
    described = []
    for j in range(width):
        labelled = valid_label_mask(columns[:, j]).numpy()
        y = (columns[:, j].double().numpy()[labelled] > 0.5).astype(np.int64)
        if len(np.unique(y)) < 2:  # one class among the training labels: nothing to fit, the base rate stands
            logit = constants.base_rate_logit(y)
            for s, v in x.items():
                outputs[s].append(torch.full((len(v),), logit))
            described.append({"model": "constant (one class in the training labels)", "logit": logit})
            continue
        search = _search(kind, task, "classifier", x["train"][labelled], y, categorical)
        for s, v in x.items():  # the decision function is the logit: its sign the class, its order the ranking
            outputs[s].append(torch.from_numpy(search.decision_function(v)).float())
        described.append(_fitted(search, int(labelled.sum())))
    return ({s: torch.stack(o, dim=1) for s, o in outputs.items()},
            described[0] if width == 1 else {"labels": described})


def _fit_multiclass(kind: str, task: TaskSpec, x: Mapping[str, np.ndarray], train_target: Tensor, width: int,
                    categorical: list[bool]) -> tuple[dict[str, Tensor], dict[str, Any]]:
    """A multiclass task's model: log-probabilities of the training classes, the floor for the others."""
    labelled = valid_label_mask(train_target).numpy()
    y = train_target.numpy()[labelled].astype(np.int64)
    if len(np.unique(y)) < 2:
        output, described = constants.trivial_prediction(task, train_target, width)
        return ({s: constants.constant_predictions(output, len(v)) for s, v in x.items()},
                {"model": "constant (one class in the training labels)", **described})
    search = _search(kind, task, "classifier", x["train"][labelled], y, categorical)
    outputs = {}
    for s, v in x.items():
        logits = np.full((len(v), width), np.log(PROBABILITY_FLOOR))
        logits[:, search.classes_] = np.log(np.clip(search.predict_proba(v), PROBABILITY_FLOOR, None))
        outputs[s] = torch.from_numpy(logits).float()
    return outputs, _fitted(search, int(labelled.sum()))


def _search(kind: str, task: TaskSpec, family: str, x: np.ndarray, y: np.ndarray, categorical: list[bool]) -> Any:
    """The grid of ``kind``'s ``family`` estimator searched by cross-validation on ``(x, y)`` (the task's labelled
    training rows) with the task's primary metric, refitted on all of them."""
    from sklearn.model_selection import GridSearchCV, KFold, StratifiedKFold
    from threadpoolctl import threadpool_limits

    if task.primary not in SCORING:
        raise InvalidParameterError(f"task {task.name!r} has primary metric {task.primary!r}, which no baseline "
                                    f"scores; the {kind} baseline scores {', '.join(SCORING)}")
    if family == "classifier":
        counts = np.bincount(y)
        counts = counts[counts > 0]
        # two classes: every test fold needs both (ROC-AUC), so no more folds than the rarer class has rows; more
        # classes: a rare class may miss some folds (accuracy and macro F1 are defined without it)
        limit = int(counts.min() if len(counts) == 2 else counts.max())
        folds = StratifiedKFold(max(2, min(CV_FOLDS, limit)), shuffle=True, random_state=SEED)
    else:
        if len(y) < 2:
            raise DataError(f"task {task.name!r} has {len(y)} labelled training row(s); a model needs two")
        folds = KFold(min(CV_FOLDS, len(y)), shuffle=True, random_state=SEED)
    search = GridSearchCV(_estimator(kind, task, family, categorical), GRIDS[kind][family],
                          scoring=SCORING[task.primary], cv=folds, n_jobs=1, error_score=np.nan)
    # one thread per fit: these fits are small, and OpenMP's spinning threads on a busy machine made one boosting
    # fit 60x slower (300 rows, 2 cores under load: 57 s against 0.96 s for three fits)
    with warnings.catch_warnings(), threadpool_limits(limits=1):
        # a class with fewer rows than folds leaves some folds without it: said by folds_used, not per fit
        warnings.filterwarnings("ignore", message="The least populated class", category=UserWarning)
        search.fit(x, y)
    return search


def _estimator(kind: str, task: TaskSpec, family: str, categorical: list[bool]) -> Any:
    from sklearn.ensemble import HistGradientBoostingClassifier, HistGradientBoostingRegressor
    from sklearn.linear_model import LogisticRegression, Ridge

    if kind == "linear":
        return LogisticRegression(max_iter=5000) if family == "classifier" else Ridge()
    options = {"max_iter": HGB_ITERATIONS, "early_stopping": False, "random_state": SEED,
               "categorical_features": categorical if any(categorical) else None}
    if family == "classifier":
        return HistGradientBoostingClassifier(**options)
    # the median minimises the absolute error: MAE-primary tasks boost the absolute error
    return HistGradientBoostingRegressor(loss="absolute_error" if task.primary == "mae" else "squared_error",
                                         **options)


def _fitted(search: Any, rows: int) -> dict[str, Any]:
    """What a grid search fitted: the estimator, its grid, the chosen values and their cross-validated score."""
    return {"model": type(search.best_estimator_).__name__, "grid": search.param_grid,
            "chosen": dict(search.best_params_), "scoring": search.scoring,
            "cv_score": float(search.best_score_), "folds_used": int(search.n_splits_), "train_rows": rows}


# -- the run-like directory ------------------------------------------------------------------------------------

def _run_record(bench: Benchmark, data_hash: str, tasks: Sequence[TaskSpec], kind: str, key: str,
                described: Mapping[str, Any]) -> dict[str, Any]:
    return {"kind": "baseline", "status": "completed", "benchmark": bench.name, "benchmark_config": bench.config,
            "dataset": bench.label, "data_hash": data_hash, "tasks": [t.name for t in tasks],
            "config": {"method": method_name(kind), "seed": SEED, "hparams": {}},
            "baseline": {"kind": kind, "key": key, "settings": settings(kind),
                         "fitted_on": "the train split's labelled rows of each task (cross-validated there)",
                         "tasks": dict(described)}}


def _metrics_record(bench: Benchmark, data_hash: str, tasks: Sequence[TaskSpec], kind: str,
                    final: Mapping[str, Any]) -> dict[str, Any]:
    return {"schema": 1, "benchmark": bench.name, "method": method_name(kind), "seed": SEED,
            "tasks": [t.name for t in tasks], "primary_metrics": {t.name: t.primary for t in tasks},
            "hv_reference": {t.name: t.hv_reference for t in tasks},
            "metric_specs": {t.name: t.metric_specs() for t in tasks}, "data_hash": data_hash,
            "selection": {"rule": "baseline", "split_used_for_selection": "train",
                          "note": "fitted (and its grid cross-validated) on the train split only; val and test "
                                  "never select"},
            "final": dict(final)}


def _evaluation(bench: Benchmark, data_hash: str, tasks: Sequence[TaskSpec], split: str, kind: str,
                values: Mapping[str, Any]) -> dict[str, Any]:
    """``<split>_evaluation.json`` as :func:`mtlflow.jobs.evaluate` writes it with per-example values (``run`` and
    ``per_example.file`` are set when the directory is written)."""
    return {"benchmark": bench.name, "dataset": bench.label, "method": method_name(kind), "split": split,
            "data_hash": data_hash, "tasks": [t.name for t in tasks],
            "metric_specs": {t.name: t.metric_specs() for t in tasks}, "metrics": dict(values),
            "per_example": {"statistics": {t.name: paired_statistic(t) for t in tasks}}}


def _write_dir(target: Path, named: Path, files: Mapping[str, Any]) -> None:
    """Write the baseline's files into ``target``, naming ``named`` as their run (``target`` itself, or the final
    name of a directory built in a temporary one)."""
    atomic.write_json(target / "run.json", files["run"])
    atomic.write_json(target / "metrics.json", files["metrics"])
    for split, (evaluation, examples) in files["evaluations"].items():
        path = target / split_evaluation_name(split)
        n = len(next(iter(next(iter(examples.values())).values())))
        kept = {**evaluation["per_example"], "file": examples_path(path).name, "examples": n}
        write_examples(examples_path(path), examples)
        atomic.write_json(path, {"run": str(named), **{k: v for k, v in evaluation.items() if k != "run"},
                                 "per_example": kept})


def _read_dir(directory: Path) -> dict[str, Any]:
    """The files :func:`_write_dir` wrote, as data; a DataError when one is missing or unreadable."""
    run = atomic.read_json(directory / "run.json", "baseline run description")
    if run.get("kind") != "baseline":
        raise DataError(f"{directory} holds no baseline")
    metrics = atomic.read_json(directory / "metrics.json", "baseline metrics")
    evaluations = {}
    for split in metrics.get("final", {}):
        if split == "train":
            continue
        path = directory / split_evaluation_name(split)
        evaluations[split] = (atomic.read_json(path, "baseline evaluation"), read_examples(examples_path(path)))
    return {"run": run, "metrics": metrics, "evaluations": evaluations}
