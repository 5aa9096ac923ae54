"""Every Katib Experiment the launcher generates -- one per registered method, each from the method's own search
space -- validates against the vendored schema of Katib v0.19.0 (k8s/schemas/kubeflow.org_experiments.v1beta1.json,
strict: an unknown field is an error), its trial against the vendored TrainJob schema of Kubeflow Trainer, and
against the rules of Katib's admission webhook that a schema cannot state (checked here as the webhook's Go code
does). Katib cannot run here; the Experiments are captured by the fake API server of test_katib_launcher.py. Also
the deployment side: the namespace label Katib needs, the RBAC on Experiments and the version the guide states."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from test_k8s_manifests import builds, by_kind  # noqa: F401 (builds: the kustomize fixture)
from test_katib_launcher import FakeKatib, run_launcher

import kubernetes_schemas
from mtlflow import methods
from mtlflow.jobs import katib_launch
from mtlflow.methods.search import search_space
from mtlflow.ops import katib

ROOT = Path(__file__).resolve().parents[2]
#: the trial kinds of Katib v0.19.0's default katib-config (trialResources)
TRIAL_KINDS = {("trainer.kubeflow.org/v1alpha1", "TrainJob"), ("batch/v1", "Job"), ("kubeflow.org/v1", "PyTorchJob")}
#: the algorithms of that katib-config whose service is Optuna's (``tpe`` there is hyperopt's)
OPTUNA_ALGORITHMS = {"multivariate-tpe", "cmaes", "grid", "random"}


@pytest.fixture(scope="module")
def experiments(multimnist_small, tmp_path_factory):
    monkeypatch = pytest.MonkeyPatch()
    api = FakeKatib()
    try:
        run_launcher(multimnist_small, tmp_path_factory.mktemp("katib"), monkeypatch, api,
                     methods=methods.available(), budget_trials=4, parallel_trials=2)
    finally:
        monkeypatch.undo()
    return {e["metadata"]["labels"][katib_launch.STUDY_LABEL]: e for e in api.experiments()}


def webhook_errors(experiment):
    """The checks of Katib v0.19.0's experiment validator (pkg/webhook/v1beta1/experiment/validator) that apply to
    these Experiments, as messages."""
    spec, found = experiment["spec"], []
    if not 0 < spec["parallelTrialCount"] <= spec["maxTrialCount"]:
        found.append("parallelTrialCount must be in (0, maxTrialCount]")
    if spec["maxFailedTrialCount"] > spec["maxTrialCount"]:
        found.append("maxFailedTrialCount must not exceed maxTrialCount")
    names = [p["name"] for p in spec["parameters"]]
    if len(set(names)) != len(names):
        found.append("parameter names must be unique")
    for p in spec["parameters"]:
        space = p["feasibleSpace"]
        if p["parameterType"] in ("double", "int"):
            if "list" in space or float(space["min"]) >= float(space["max"]):
                found.append(f"{p['name']}: a {p['parameterType']} needs min < max and no list")
            if p["parameterType"] == "int" and not all(re.fullmatch(r"-?\d+", space[k]) for k in ("min", "max")):
                found.append(f"{p['name']}: an int's bounds must be integers")
        elif p["parameterType"] == "categorical" and (not space.get("list") or "min" in space):
            found.append(f"{p['name']}: a categorical needs a list and no bounds")
    template = spec["trialTemplate"]
    trial = template["trialSpec"]
    if (trial["apiVersion"], trial["kind"]) not in TRIAL_KINDS:
        found.append(f"trial kind {trial['kind']} is not in katib-config's trialResources")
    placeholders = set(re.findall(r"\$\{trialParameters\.(.+?)\}", str(trial)))
    declared = {p["name"] for p in template["trialParameters"]}
    if placeholders != declared:
        found.append(f"trialParameters {sorted(declared)} != placeholders in trialSpec {sorted(placeholders)}")
    for p in template["trialParameters"]:
        if p["reference"] not in names and not re.fullmatch(r"\$\{trialSpec\.(Name|Namespace|Kind|APIVersion)\}",
                                                            p["reference"]):
            found.append(f"trial parameter {p['name']} refers to unknown {p['reference']}")
    if spec["algorithm"]["algorithmName"] not in OPTUNA_ALGORITHMS:
        found.append(f"algorithm {spec['algorithm']['algorithmName']} is not Optuna's")
    allowed = {"n_startup_trials", "n_ei_candidates", "random_state"}  # the Optuna service's TPE settings
    for setting in spec["algorithm"]["algorithmSettings"]:
        if setting["name"] not in allowed or int(setting["value"]) < 0:
            found.append(f"algorithm setting {setting}")
    stopping = {s["name"]: int(s["value"]) for s in spec["earlyStopping"]["algorithmSettings"]}
    if set(stopping) - {"min_trials_required", "start_step"} or stopping["min_trials_required"] < 1 \
            or stopping["start_step"] < 1:
        found.append(f"medianstop settings {stopping}")
    objective = spec["objective"]
    if objective["objectiveMetricName"] in objective["additionalMetricNames"]:
        found.append("the objective is also an additional metric")
    for metric in [objective["objectiveMetricName"], *objective["additionalMetricNames"]]:
        if not re.fullmatch(r"[\w|-]+", metric):  # else the StdOut collector's format never reads it
            found.append(f"metric name {metric!r} does not match the collector's format")
    return found


def test_one_experiment_per_registered_method(experiments):
    assert len(experiments) == len(methods.available())


def test_every_experiment_validates_against_katibs_schema(experiments):
    for name, experiment in experiments.items():
        assert kubernetes_schemas.errors(experiment) == [], name


def test_every_trial_is_a_valid_trainjob(experiments):
    for name, experiment in experiments.items():
        trial = experiment["spec"]["trialTemplate"]["trialSpec"]
        named = {**trial, "metadata": {**trial["metadata"], "name": f"{name[:40]}-x7k2p9qd"}}  # Katib names it
        assert kubernetes_schemas.errors(named) == [], name


def test_every_experiment_passes_the_webhooks_rules(experiments):
    for name, experiment in experiments.items():
        assert webhook_errors(experiment) == [], name


def test_each_experiment_searches_its_methods_space(experiments):
    """The parameters are exactly the method's space (mtlflow.methods.search), each with its range."""
    for experiment in experiments.values():
        command = experiment["spec"]["trialTemplate"]["trialSpec"]["spec"]["trainer"]["command"]
        method = command[command.index("--method") + 1]
        space = search_space(methods.get(method))
        params = {p["name"]: p for p in experiment["spec"]["parameters"]}
        assert set(params) == set(space), method
        for pname, search in space.items():
            if search.scale == "categorical":
                assert params[pname]["feasibleSpace"]["list"] == [katib.categorical_value(c) for c in search.choices]
            else:
                bounds = params[pname]["feasibleSpace"]
                assert (float(bounds["min"]), float(bounds["max"])) == (search.low, search.high), (method, pname)


def test_strict_validation_catches_mistakes(experiments):
    experiment = next(iter(experiments.values()))
    bad = {**experiment, "spec": {**experiment["spec"], "maxTrialCount": "20", "parallelTrials": 2}}
    found = kubernetes_schemas.errors(bad)
    assert any("maxTrialCount" in e and "is not of type 'integer'" in e for e in found)
    assert any("parallelTrials" in e for e in found)
    wrong = {**experiment, "spec": {**experiment["spec"], "parameters": [
        {"name": "lr", "parameterType": "float", "feasibleSpace": {"min": "0.1", "max": "1",
                                                                   "distribution": "log"}}]}}
    assert len(kubernetes_schemas.errors(wrong)) == 2


def test_the_namespace_carries_the_metrics_collector_injection_label(builds):  # noqa: F811
    for env, objs in builds.items():
        (namespace,) = by_kind(objs, "Namespace").values()
        assert namespace["metadata"]["labels"][katib.INJECTION_LABEL] == "enabled", env


def test_the_pipeline_account_may_manage_experiments(builds):  # noqa: F811
    (role,) = by_kind(builds["base"], "Role").values()
    grants = {(g, r): set(rule["verbs"]) for rule in role["rules"] for g in rule["apiGroups"] for r in rule["resources"]}
    assert {"create", "get", "delete"} <= grants[(katib.API[0], katib.API[2])]


def test_the_guide_states_the_katib_release_of_the_schema():
    guide = (ROOT / "docs" / "guides" / "kubeflow.md").read_text()
    section = guide.split("## Backend versions", 1)[1].split("\n## ", 1)[0]
    assert f"| Katib | {kubernetes_schemas.versions()['katib']['version']} |" in section
    assert "## Tuning with Katib" in guide
