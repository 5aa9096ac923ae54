"""Hyper-parameter tuning on the cluster with Katib 0.19 (``kubeflow.org/v1beta1`` ``Experiment``): the manifest
of one Experiment per method and the Experiments' lifecycle (used by the ``launch_katib`` component through
:func:`mtlflow.jobs.katib_launch.launch_katib`).

* **Search space** (:func:`parameter`): a method's :class:`~mtlflow.core.hparams.SearchRange` as Katib parameters
  -- ``log`` as a double with ``logUniform``, ``linear`` as a double with ``uniform``, ``int`` as an int,
  ``categorical`` as Katib's categorical, whose values are strings (JSON for non-strings, which ``mtlflow train``
  parses back: ``1e-05``, ``true``).
* **Algorithm**: ``multivariate-tpe``, Katib's Optuna service (the ``tpe`` of Katib's default katib-config is
  hyperopt's), seeded by ``random_state``; Katib's Optuna service sets ``multivariate`` and ``constant_liar``
  itself, as ``mtlflow tune``'s sampler does, and takes ``n_startup_trials`` and ``n_ei_candidates``.
* **Early stopping**: ``medianstop`` (the only early-stopping algorithm of Katib) with ``min_trials_required`` and
  ``start_step`` explicit; a step is one epoch (one ``val_score=`` line per epoch).
* **Trials** are Kubeflow Trainer ``TrainJob`` s (a trial kind since Katib 0.19), built by
  :func:`mtlflow.ops.k8s_jobs.trainjob_manifest` as ``launch_trainjob`` builds them, running ``mtlflow train`` with
  the trial's values as ``${trialParameters.NAME}`` placeholders; the primary pod is the runtime's ``node`` job's
  rank 0 (Katib's default primary labels for TrainJob), whose ``node`` container prints the metrics.
* **Metrics**: the StdOut collector (``name=value`` lines in Katib's default format, :data:`METRICS_FORMAT`); one
  objective (Katib's limit) -- the validation score, minimised -- and the per-task validation metrics as
  ``additionalMetricNames``.

Known pitfalls handled here: Katib's webhook refuses an Experiment in a namespace without the label
``katib.kubeflow.org/metrics-collector-injection: enabled`` (and without it no collector is injected, so trials
end ``MetricsUnavailable``): :func:`check_namespace` says so in one line before anything is created; an Istio
sidecar keeps a trial pod from completing: trial pods carry ``sidecar.istio.io/inject: "false"`` whatever the
profile says.
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from mtlflow.config.run import cli_flag
from mtlflow.core.errors import InvalidParameterError, MtlflowError
from mtlflow.core.hparams import SearchRange
from mtlflow.ops import k8s_jobs

API = ("kubeflow.org", "v1beta1", "experiments")
#: Katib's webhook accepts an Experiment only in a namespace with this label, and injects the collector by it
INJECTION_LABEL = "katib.kubeflow.org/metrics-collector-injection"
ALGORITHM = "multivariate-tpe"
EARLY_STOPPING = "medianstop"
#: Katib's default StdOut filter (pkg/metricscollector/v1beta1/common/const.go, DefaultFilter), stated explicitly
METRICS_FORMAT = r"([\w|-]+)\s*=\s*([+-]?\d*(\.\d+)?([Ee][+-]?\d+)?)"
#: the objective metric: the validation score of mtlflow tune (lower is better)
OBJECTIVE = "val_score"
#: the trial parameter holding the trial's name (its run directory's name)
TRIAL_NAME = "trialName"
#: Katib names a trial ``<experiment>-<8 characters>`` and its TrainJob after it; a TrainJob name has <= 63
EXPERIMENT_NAME_LENGTH = 63 - 9
#: the rank-0 pod of the TrainJob's trainer job: Katib 0.19's default primary pod labels for TrainJob
PRIMARY_POD_LABELS = {"jobset.sigs.k8s.io/replicatedjob-name": k8s_jobs.TRAINER_NODE,
                      "batch.kubernetes.io/job-completion-index": "0"}
SPEC_DIGEST = k8s_jobs.SPEC_DIGEST


class ExperimentFailedError(MtlflowError):
    """A Katib Experiment failed, could not be created, or did not finish in time."""


@dataclass(frozen=True)
class Search:
    """How one Experiment searches: trial counts, the sampler's seed and settings, median stopping's settings."""

    max_trials: int
    parallel_trials: int
    seed: int
    startup_trials: int
    ei_candidates: int
    median_min_trials: int
    median_start_step: int
    max_failed_trials: int

    def validate(self) -> None:
        if not 1 <= self.parallel_trials <= self.max_trials:
            raise InvalidParameterError(f"parallel trials must be in [1, max trials = {self.max_trials}], got "
                                        f"{self.parallel_trials}")
        if self.seed < 0 or self.startup_trials < 0 or self.ei_candidates < 1:
            raise InvalidParameterError("Katib's TPE needs seed >= 0, startup trials >= 0 and EI candidates >= 1")
        if self.median_min_trials < 1 or self.median_start_step < 1 or self.max_failed_trials < 0:
            raise InvalidParameterError("median stopping needs min trials >= 1 and start step >= 1, and max failed "
                                        "trials must be >= 0")


def metric_name(*parts: str) -> str:
    """A metric name the StdOut collector's default format reads (``[A-Za-z0-9_|-]``): other characters become _."""
    return "_".join(re.sub(r"[^A-Za-z0-9_-]", "_", part) for part in parts)


def experiment_name(key: str, prefix: str = "mtlflow-katib") -> str:
    """An RFC 1035 label of at most :data:`EXPERIMENT_NAME_LENGTH` characters from a key, keeping its hash suffix."""
    cleaned = re.sub(r"[^a-z0-9-]+", "-", f"{prefix}-{key}".lower()).strip("-")
    if len(cleaned) > EXPERIMENT_NAME_LENGTH:
        head, _, digest = cleaned.rpartition("-")
        cleaned = f"{head[:EXPERIMENT_NAME_LENGTH - 1 - len(digest)].rstrip('-')}-{digest}"
    return cleaned


def categorical_value(choice: Any) -> str:
    """A categorical choice as Katib's string, which ``mtlflow train`` parses back into the same value."""
    return choice if isinstance(choice, str) else json.dumps(choice)


def parameter(name: str, search: SearchRange) -> dict[str, Any]:
    """One Katib parameter of a search range."""
    if search.scale == "categorical":
        return {"name": name, "parameterType": "categorical",
                "feasibleSpace": {"list": [categorical_value(c) for c in search.choices]}}
    if search.scale == "int":
        return {"name": name, "parameterType": "int",
                "feasibleSpace": {"min": str(int(search.low)), "max": str(int(search.high)), "distribution": "uniform"}}
    return {"name": name, "parameterType": "double",
            "feasibleSpace": {"min": repr(float(search.low)), "max": repr(float(search.high)),
                              "distribution": "logUniform" if search.scale == "log" else "uniform"}}


def placeholder(name: str) -> str:
    return "${trialParameters." + name + "}"


def trial_arguments(space: Mapping[str, SearchRange], training_options: Sequence[str]) -> list[str]:
    """The ``mtlflow train`` arguments of a trial's values: a training option as its flag (``--lr``), a method
    hyper-parameter as ``--hp NAME=VALUE``."""
    arguments: list[str] = []
    for name in space:
        if name in training_options:
            arguments += [cli_flag(name), placeholder(name)]
        else:
            arguments += ["--hp", f"{name}={placeholder(name)}"]
    return arguments


def trial_spec(trainjob: Mapping[str, Any]) -> dict[str, Any]:
    """A TrainJob manifest as a trial's template: Katib names it and puts it in the Experiment's namespace (no
    name, namespace, owner or digest), and its pods never get an Istio sidecar (one keeps a trial from ending)."""
    spec = copy.deepcopy(dict(trainjob))
    spec["metadata"] = {"labels": dict(spec["metadata"].get("labels") or {})}
    for patch in spec["spec"].get("runtimePatches") or []:
        for job in patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]:
            job["template"]["spec"]["template"]["metadata"]["labels"][k8s_jobs.ISTIO_INJECT] = "false"
    return spec


def _settings(values: Mapping[str, int]) -> list[dict[str, str]]:
    return [{"name": name, "value": str(value)} for name, value in values.items()]


def experiment_manifest(name: str, namespace: str, space: Mapping[str, SearchRange], trainjob: Mapping[str, Any],
                        search: Search, metrics: Sequence[str], objective_strategy: str = "min",
                        labels: Mapping[str, str] | None = None,
                        owner: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The Experiment searching ``space`` with ``trainjob`` (whose command holds :func:`trial_arguments`) as its
    trial; ``metrics`` are the additional metric names, ``objective_strategy`` how a trial's objective is read from
    its epochs (``min``: the best epoch, ``latest``: the last)."""
    search.validate()
    if not space:
        raise InvalidParameterError(f"experiment {name}: the search space is empty")
    command = " ".join(trainjob["spec"]["trainer"]["command"])
    missing = [n for n in space if placeholder(n) not in command]
    if missing:
        raise InvalidParameterError(f"experiment {name}: the trial's command does not use {', '.join(missing)}")
    metadata: dict[str, Any] = {"name": name, "namespace": namespace, "labels": {**k8s_jobs.PART_OF, **(labels or {})}}
    if owner:
        metadata["ownerReferences"] = [dict(owner)]
    spec = {
        "objective": {"type": "minimize", "objectiveMetricName": OBJECTIVE, "additionalMetricNames": list(metrics),
                      "metricStrategies": [{"name": OBJECTIVE, "value": objective_strategy},
                                           *({"name": m, "value": "latest"} for m in metrics)]},
        "algorithm": {"algorithmName": ALGORITHM, "algorithmSettings": _settings({
            "random_state": search.seed, "n_startup_trials": search.startup_trials,
            "n_ei_candidates": search.ei_candidates})},
        "earlyStopping": {"algorithmName": EARLY_STOPPING, "algorithmSettings": _settings({
            "min_trials_required": search.median_min_trials, "start_step": search.median_start_step})},
        "maxTrialCount": search.max_trials, "parallelTrialCount": search.parallel_trials,
        "maxFailedTrialCount": search.max_failed_trials, "resumePolicy": "Never",
        "metricsCollectorSpec": {"collector": {"kind": "StdOut"},
                                 "source": {"filter": {"metricsFormat": [METRICS_FORMAT]}}},
        "parameters": [parameter(n, s) for n, s in space.items()],
        "trialTemplate": {
            "primaryContainerName": k8s_jobs.TRAINER_NODE, "primaryPodLabels": dict(PRIMARY_POD_LABELS),
            "retain": False,
            "trialParameters": [{"name": n, "reference": n} for n in space]
            + [{"name": TRIAL_NAME, "reference": "${trialSpec.Name}"}],
            "trialSpec": trial_spec(trainjob)},
    }
    digest = hashlib.sha256(json.dumps(spec, sort_keys=True).encode()).hexdigest()[:16]
    metadata["annotations"] = {SPEC_DIGEST: digest}
    return {"apiVersion": f"{API[0]}/{API[1]}", "kind": "Experiment", "metadata": metadata, "spec": spec}


def check_namespace(core_api: Any, namespace: str, log: Callable[[str], None] = print) -> None:
    """Refuse, in one line, a namespace without the metrics-collector injection label. A namespace the launcher may
    not read (a Role grants nothing on cluster-scoped Namespaces) is logged, and Katib's webhook checks it."""
    try:
        labels = core_api.read_namespace(namespace).metadata.labels or {}
    except Exception as exc:  # kubernetes.client.ApiException, without importing kubernetes here
        log(f"could not read namespace {namespace} ({k8s_jobs._api_error(exc)}); Katib's webhook checks its label "
            f"{INJECTION_LABEL}=enabled")
        return
    if labels.get(INJECTION_LABEL) != "enabled":
        raise InvalidParameterError(_label_fix(namespace))


def _label_fix(namespace: str) -> str:
    return (f"namespace {namespace} lacks the label {INJECTION_LABEL}=enabled, without which Katib refuses the "
            f"Experiments and collects no metrics; run `kubectl label namespace {namespace} {INJECTION_LABEL}=enabled` "
            "(k8s/base/namespace.yaml sets it)")


def experiment_state(obj: Mapping[str, Any]) -> str:
    """``succeeded``, ``failed`` or ``running`` from an Experiment's status conditions."""
    active = {c.get("type") for c in (obj.get("status") or {}).get("conditions") or [] if str(c.get("status")) == "True"}
    if "Failed" in active:
        return "failed"
    return "succeeded" if "Succeeded" in active else "running"


def best_trial(obj: Mapping[str, Any]) -> dict[str, Any]:
    """The Experiment's best trial: its name, parameter values (Katib's strings) and metrics (min, max, latest)."""
    status = obj.get("status") or {}
    optimal = status.get("currentOptimalTrial") or {}
    metrics = {m["name"]: {k: float(m[k]) for k in ("min", "max", "latest") if m.get(k) not in (None, "")}
               for m in (optimal.get("observation") or {}).get("metrics") or []}
    return {"trial": optimal.get("bestTrialName", ""),
            "parameters": {p["name"]: p["value"] for p in optimal.get("parameterAssignments") or []},
            "metrics": metrics,
            "trials": {key: int(status.get(key) or 0) for key in ("trials", "trialsSucceeded", "trialsEarlyStopped",
                                                                   "trialsFailed", "trialMetricsUnavailable")}}


def _ref(manifest: Mapping[str, Any]) -> tuple[str, str, str, str, str]:
    return API[0], API[1], manifest["metadata"]["namespace"], API[2], manifest["metadata"]["name"]


def _get(api: Any, manifest: Mapping[str, Any]) -> dict[str, Any] | None:
    try:
        return api.get_namespaced_custom_object(*_ref(manifest))
    except Exception as exc:
        if getattr(exc, "status", None) == 404:
            return None
        raise ExperimentFailedError(f"could not read Experiment {manifest['metadata']['name']}: "
                                    f"{k8s_jobs._api_error(exc)}") from None


def delete_experiment(manifest: Mapping[str, Any], api: Any, timeout_seconds: float = 300.0, poll_seconds: float = 2.0,
                      sleep: Callable[[float], None] = time.sleep, clock: Callable[[], float] = time.monotonic) -> None:
    """Delete the Experiment (its trials and their TrainJobs go with it) and wait until it is gone; a missing one
    is fine."""
    k8s_jobs.delete_and_wait(api, _ref(manifest), lambda: _get(api, manifest),
                             f"Experiment {manifest['metadata']['name']}", ExperimentFailedError,
                             propagation="Foreground", delete_hint="kubectl delete it",
                             finalizer_hint="check its trials' finalizers", timeout_seconds=timeout_seconds,
                             poll_seconds=poll_seconds, sleep=sleep, clock=clock)


def _create(manifest: Mapping[str, Any], api: Any) -> None:
    group, version, namespace, plural, name = _ref(manifest)
    try:
        api.create_namespaced_custom_object(group, version, namespace, plural, copy.deepcopy(dict(manifest)))
    except Exception as exc:
        message = k8s_jobs._api_error(exc)
        if INJECTION_LABEL in message:
            raise InvalidParameterError(_label_fix(namespace)) from None
        raise ExperimentFailedError(f"could not create Experiment {namespace}/{name}: {message}; check that Katib "
                                    "0.19 is installed and the pipeline pods' RBAC (k8s/base/rbac.yaml)") from None


def submit(manifest: Mapping[str, Any], api: Any, log: Callable[[str], None] = print,
           sleep: Callable[[float], None] = time.sleep) -> None:
    """Create the Experiment, or re-attach to one of the same spec that has not failed (a retried launcher); one
    of another spec, or a failed one, is deleted and created anew."""
    name = manifest["metadata"]["name"]
    existing = _get(api, manifest)
    if existing is not None:
        digest = ((existing.get("metadata") or {}).get("annotations") or {}).get(SPEC_DIGEST)
        same_inputs = digest == manifest["metadata"]["annotations"][SPEC_DIGEST]
        if same_inputs and experiment_state(existing) != "failed":
            log(f"re-attaching to Experiment {name} ({experiment_state(existing)})")
            return
        log(f"deleting Experiment {name} ({'failed' if same_inputs else 'other inputs'}) to create it anew")
        delete_experiment(manifest, api, sleep=sleep)
    _create(manifest, api)


def await_experiments(manifests: Sequence[Mapping[str, Any]], api: Any, timeout_seconds: float,
                      poll_seconds: float = 60.0, sleep: Callable[[float], None] = time.sleep,
                      clock: Callable[[], float] = time.monotonic) -> dict[str, dict[str, Any]]:
    """Poll the Experiments until every one succeeded; returns the finished objects by name. A failed one, one
    deleted meanwhile, or ``timeout_seconds`` passing raises :class:`ExperimentFailedError` (on timeout the
    Experiments keep running: a retried launcher re-attaches)."""
    deadline, finished = clock() + timeout_seconds, {}
    while True:
        for manifest in manifests:
            name = manifest["metadata"]["name"]
            if name in finished:
                continue
            obj = _get(api, manifest)
            if obj is None:
                raise ExperimentFailedError(f"Experiment {name} was deleted while the launcher waited for it")
            state = experiment_state(obj)
            if state == "failed":
                raise ExperimentFailedError(f"Experiment {name} failed ({_failure(obj)}); see `kubectl describe "
                                            f"experiment {name}`; a retry creates it anew")
            if state == "succeeded":
                finished[name] = obj
        if len(finished) == len(manifests):
            return finished
        if clock() >= deadline:
            running = sorted({m["metadata"]["name"] for m in manifests} - set(finished))
            raise ExperimentFailedError(f"Experiment(s) {', '.join(running)} did not finish within "
                                        f"{timeout_seconds:.0f} s; they keep running -- retry the task to re-attach")
        sleep(poll_seconds)


def _failure(obj: Mapping[str, Any]) -> str:
    status = obj.get("status") or {}
    for cond in status.get("conditions") or []:
        if cond.get("type") == "Failed":
            reason = f"{cond.get('reason', '')}: {cond.get('message', '')}".strip(": ")
            break
    else:
        reason = "no failure message"
    if int(status.get("trialMetricsUnavailable") or 0):
        reason += (f"; {status['trialMetricsUnavailable']} trial(s) reported no metrics: check the namespace's label "
                   f"{INJECTION_LABEL}=enabled and that the trial prints {OBJECTIVE}= lines")
    return reason


def deleted_on_termination(manifests: Sequence[Mapping[str, Any]], api: Any,
                           log: Callable[[str], None] = print) -> contextlib.AbstractContextManager[None]:
    """While the launcher waits: on SIGTERM (the run was cancelled, or the task timed out) delete the Experiments,
    so that their trials free their GPUs, then exit with 143 as a terminated process."""

    def delete() -> None:
        for manifest in manifests:
            log(f"terminated: deleting Experiment {manifest['metadata']['name']}")
            try:
                delete_experiment(manifest, api, timeout_seconds=20.0, poll_seconds=1.0)
            except ExperimentFailedError as exc:
                log(str(exc))

    return k8s_jobs.on_termination(delete)
