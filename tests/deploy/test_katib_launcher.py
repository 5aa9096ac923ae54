"""The Katib launcher (mtlflow.jobs.katib_launch / mtlflow.ops.katib) against a fake Kubernetes API server: Katib
cannot run here (it needs a cluster, its controller, webhook and suggestion services), so the API is mocked --
FakeKubernetesApi of the TrainJob lifecycle tests keeps the objects with the API's semantics (404, 409, errors as
``kubernetes.client.ApiException``), and FakeKatib adds what Katib's controller writes into an Experiment's status
(the best trial, picked here as the first value of every parameter) and what its webhook refuses (a namespace
without the metrics-collector injection label)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_trainjob_lifecycle import FakeKubernetesApi, api_error

from mtlflow.benchmarks.base import read_manifest
from mtlflow.core.errors import InvalidParameterError
from mtlflow.jobs import katib_launch
from mtlflow.ops import k8s_jobs, katib

NAMESPACE = "mtlflow-dev"


def first_value(parameter):
    space = parameter["feasibleSpace"]
    return space["list"][0] if "list" in space else space["min"]


class FakeKatib(FakeKubernetesApi):
    """Experiments move through ``script`` (default: Running, then Succeeded); a succeeded one reports its best
    trial. ``labelled``: whether the namespace carries the injection label (else the webhook refuses creation)."""

    def __init__(self, script=None, labelled=True, default=("Running", "Succeeded")):
        super().__init__(script)
        self.labelled, self.default = labelled, list(default)

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        if plural == "experiments" and not self.labelled:
            raise api_error(400, "Bad Request", f'admission webhook "validator.experiment.katib.kubeflow.org" denied '
                            f'the request: Cannot create the Experiment "{body["metadata"]["name"]}" in namespace '
                            f'"{namespace}": the namespace lacks label "{katib.INJECTION_LABEL}: enabled"')
        self.script.setdefault(body["metadata"]["name"], list(self.default))
        super().create_namespaced_custom_object(group, version, namespace, plural, body)

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        obj = super().get_namespaced_custom_object(group, version, namespace, plural, name)
        if katib.experiment_state(obj) == "succeeded":
            params = obj["spec"]["parameters"]
            obj["status"].update(trials=obj["spec"]["maxTrialCount"], trialsSucceeded=obj["spec"]["maxTrialCount"],
                                 currentOptimalTrial={
                                     "bestTrialName": f"{name}-x7k2p9qd",
                                     "parameterAssignments": [{"name": p["name"], "value": first_value(p)}
                                                              for p in params],
                                     "observation": {"metrics": [{"name": "val_score", "min": "-0.3", "max": "0.1",
                                                                  "latest": "-0.25"}]}})
        return copy.deepcopy(obj)

    def experiments(self):
        return [body for (plural, _, _), body in self.objects.items() if plural == "experiments"]


class FakeCore:
    """CoreV1Api's namespace and pod reads; ``readable=False``: the Role may not read Namespaces (403)."""

    def __init__(self, labels, readable=True):
        self.labels, self.readable = labels, readable

    def read_namespace(self, name):
        if not self.readable:
            raise api_error(403, "Forbidden", f'namespaces "{name}" is forbidden')
        return SimpleNamespace(metadata=SimpleNamespace(labels=dict(self.labels)))

    def read_namespaced_pod(self, name, namespace):
        raise api_error(404, "Not Found", f'pods "{name}" not found')


def run_launcher(data_dir, tmp_path, monkeypatch, api, core=None, methods=("ls",), **kw):
    monkeypatch.setattr(k8s_jobs, "custom_objects_api", lambda: api)
    monkeypatch.setattr(k8s_jobs, "core_api", lambda: core or FakeCore({katib.INJECTION_LABEL: "enabled"}))
    kw = {"namespace": NAMESPACE, "poll_seconds": 0.0, "train_options": {"batch_size": 64}, **kw}
    return katib_launch.launch_katib(str(data_dir), {"content_hash": read_manifest(data_dir)["content_hash"]},
                                     str(tmp_path / "mnt"), list(methods), "reg/mtlflow:1", **kw)


def test_the_launcher_creates_one_experiment_per_method_and_returns_the_best_trials(multimnist_small, tmp_path,
                                                                                   monkeypatch):
    api = FakeKatib()
    result = run_launcher(multimnist_small, tmp_path, monkeypatch, api, methods=("cagrad",), budget_trials=6,
                          parallel_trials=2)
    created = {e["metadata"]["name"]: e for e in api.experiments()}
    assert sorted(result["studies"]) == ["cagrad", "ls"]  # LS always: the baseline
    assert len(created) == 2 and [name for op, name in api.log if op == "delete"] == []
    cagrad = result["studies"]["cagrad"]
    # the first value of each parameter, typed back by its range (weight_decay's "0.0" is the float 0.0)
    assert cagrad["train_options"] == {"lr": 1e-4, "weight_decay": 0.0} and cagrad["hparams"] == {"c": 0.2}
    assert cagrad["metrics"]["val_score"]["min"] == -0.3
    spec = created[cagrad["experiment"]]["spec"]
    assert spec["maxTrialCount"] == cagrad["max_trials"] == 6 and spec["parallelTrialCount"] == 2
    assert cagrad["budget_steps"] == 6 * cagrad["trial_steps"]
    # each study's scorer sits where its trials read it, and the result is written next to them
    command = spec["trialTemplate"]["trialSpec"]["spec"]["trainer"]["command"]
    scorer = command[command.index("--katib-metrics") + 1]
    assert set(json.loads(open(scorer).read())) == {"reference", "primary", "specs"}
    assert json.loads((Path(result["work_dir"]) / "katib.json").read_text()) == result["studies"]

def test_the_budget_in_steps_gives_the_whole_trials_it_holds(multimnist_small, tmp_path, monkeypatch):
    """Katib counts trials: budget_steps of 2.5 whole trials runs 2 (a local study would not start a third)."""
    first = run_launcher(multimnist_small, tmp_path / "a", monkeypatch, FakeKatib(), budget_trials=1)
    trial_steps = first["studies"]["ls"]["trial_steps"]
    api = FakeKatib()
    result = run_launcher(multimnist_small, tmp_path / "b", monkeypatch, api, budget_steps=int(2.5 * trial_steps))
    assert result["studies"]["ls"]["max_trials"] == 2 == api.experiments()[0]["spec"]["maxTrialCount"]
    assert katib_launch.trials_in_budget(10, 20) == 1 and katib_launch.trials_in_budget(59, 20) == 2


def test_a_retried_launcher_reattaches_and_other_inputs_recreate(multimnist_small, tmp_path, monkeypatch):
    api = FakeKatib(default=("Running",))
    with pytest.raises(katib.ExperimentFailedError, match="did not finish within 0 s; they keep running"):
        run_launcher(multimnist_small, tmp_path, monkeypatch, api, timeout_seconds=0)
    (name,) = [e["metadata"]["name"] for e in api.experiments()]
    api.script[name] = ["Succeeded"]
    run_launcher(multimnist_small, tmp_path, monkeypatch, api)
    assert [op for op, n in api.log if n == name] == ["create"]  # re-attached, not created again
    manifest = api.experiments()[0]
    changed = copy.deepcopy(manifest)
    changed["metadata"]["annotations"][katib.SPEC_DIGEST] = "other"
    katib.submit(changed, api, log=lambda line: None, sleep=lambda s: None)
    assert [op for op, n in api.log if n == name] == ["create", "delete", "create"]


def test_an_unlabelled_namespace_is_refused_in_one_line(multimnist_small, tmp_path, monkeypatch):
    """The launcher's own check (when it may read the namespace) and Katib's webhook (when it may not) both end in
    the one line that names the label and the kubectl command."""
    for core, api in ((FakeCore({}), FakeKatib()), (FakeCore({}, readable=False), FakeKatib(labelled=False))):
        with pytest.raises(InvalidParameterError) as refused:
            run_launcher(multimnist_small, tmp_path, monkeypatch, api, core=core)
        message = str(refused.value)
        assert "\n" not in message and f"kubectl label namespace {NAMESPACE} {katib.INJECTION_LABEL}=enabled" in message
    assert api.log == []  # nothing was created


def test_a_failed_experiment_says_why_and_points_at_the_metrics_label(multimnist_small, tmp_path, monkeypatch):
    api = FakeKatib(default=("Failed",))
    original = api.get_namespaced_custom_object

    def failed_without_metrics(*args):
        obj = original(*args)
        obj["status"]["trialMetricsUnavailable"] = 3
        return obj

    api.get_namespaced_custom_object = failed_without_metrics
    with pytest.raises(katib.ExperimentFailedError, match="3 trial.s. reported no metrics: check the namespace's "
                       "label katib.kubeflow.org/metrics-collector-injection=enabled"):
        run_launcher(multimnist_small, tmp_path, monkeypatch, api)


def test_bad_requests_fail_before_any_request(multimnist_small, tmp_path, monkeypatch):
    api = FakeKatib()
    with pytest.raises(InvalidParameterError, match="budget_trials, budget_steps and parallel_trials must be >= 1"):
        run_launcher(multimnist_small, tmp_path, monkeypatch, api, parallel_trials=0)
    with pytest.raises(InvalidParameterError, match="search space given for nashmtl, which is not tuned"):
        run_launcher(multimnist_small, tmp_path, monkeypatch, api, search_spaces={"nashmtl": {}})
    assert api.log == []
