"""launch_katib compiles, and its body drives a fake Katib end to end: the dataset is staged on the "PVC", one
Experiment per method created, a trial run, the best trial returned. Katib cannot run here (it needs a cluster and
its controller, webhook and suggestion services), so the Kubernetes API is mocked: the fake plays the API server
(404 for a missing object) and Katib's controller, which substitutes an assignment into the trial's TrainJob
command (``torchrun -m mtlflow train ...``), runs it as ``mtlflow train ...`` in-process, reads its stdout with
the StdOut collector's own format and reports the observed metrics as the Experiment's best trial."""

import json
import re
from pathlib import Path
from types import SimpleNamespace

import yaml
from kfp import compiler, dsl

from mtlflow.cli import main
from mtlflow.components.launch_katib.component import launch_katib
from mtlflow.jobs import tune, tune_study
from mtlflow.jobs.katib_metrics import load_scorer
from mtlflow.ops import k8s_jobs, katib


class NotFound(Exception):
    status = 404


class KatibControllerStub:
    """The first poll of a created Experiment runs one trial (every parameter at its first value) and succeeds."""

    def __init__(self, capsys):
        self.capsys, self.live, self.trial_outputs = capsys, {}, {}

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        assert (group, version, plural) == katib.API
        self.live[body["metadata"]["name"]] = json.loads(json.dumps(body))

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        if name not in self.live:
            raise NotFound(name)
        body = self.live[name]
        if "status" not in body:
            body["status"] = self._run_trial(name, body["spec"])
        return body

    def _run_trial(self, name, spec):
        values = {p["name"]: p["feasibleSpace"].get("list", [p["feasibleSpace"].get("min")])[0]
                  for p in spec["parameters"]}
        values[katib.TRIAL_NAME] = f"{name}-x7k2p9qd"
        command = [re.sub(r"\$\{trialParameters\.(.+?)\}", lambda m: values[m.group(1)], part)
                   for part in spec["trialTemplate"]["trialSpec"]["spec"]["trainer"]["command"]]
        assert command[:4] == ["torchrun", "-m", "mtlflow", "train"]
        self.capsys.readouterr()
        assert main(command[3:]) == 0
        stdout = self.capsys.readouterr().out
        self.trial_outputs[name] = (command, stdout)
        observed = {}
        for match in re.finditer(spec["metricsCollectorSpec"]["source"]["filter"]["metricsFormat"][0], stdout):
            observed.setdefault(match.group(1), []).append(float(match.group(2)))
        wanted = [spec["objective"]["objectiveMetricName"], *spec["objective"]["additionalMetricNames"]]
        metrics = [{"name": m, "min": str(min(observed[m])), "max": str(max(observed[m])),
                    "latest": str(observed[m][-1])} for m in wanted if m in observed]
        return {"conditions": [{"type": "Succeeded", "status": "True"}], "trials": 1, "trialsSucceeded": 1,
                "currentOptimalTrial": {"bestTrialName": values[katib.TRIAL_NAME],
                                        "parameterAssignments": [{"name": k, "value": v} for k, v in values.items()
                                                                 if k != katib.TRIAL_NAME],
                                        "observation": {"metrics": metrics}}}

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, propagation_policy=None):
        del self.live[name]


class LabelledNamespace:
    def read_namespace(self, name):
        return SimpleNamespace(metadata=SimpleNamespace(labels={katib.INJECTION_LABEL: "enabled"}))


def test_component_compiles_without_runtime_pip(tmp_path):
    out = tmp_path / "launch.yaml"
    compiler.Compiler().compile(launch_katib, str(out))
    spec = yaml.safe_load(out.read_text())
    container = next(iter(spec["deploymentSpec"]["executors"].values()))["container"]
    assert "pip install" not in " ".join(container["command"] + container["args"])


def test_the_components_defaults_are_mtlflow_tunes():
    inputs = launch_katib.component_spec.inputs
    assert inputs["budget_trials"].default == tune.BUDGET_TRIALS
    assert inputs["startup_trials"].default == tune_study.STARTUP_TRIALS


def test_launcher_runs_a_trial_whose_lines_katib_reads_and_returns_the_best(tiny_dataset, tmp_path, monkeypatch,
                                                                             capsys):
    data, _ = tiny_dataset
    api = KatibControllerStub(capsys)
    monkeypatch.setattr(k8s_jobs, "custom_objects_api", lambda: api)
    monkeypatch.setattr(k8s_jobs, "core_api", lambda: LabelledNamespace())  # not in a pod: no owner
    result = dsl.Artifact(uri=str(tmp_path / "katib.json"))
    best = launch_katib.python_func(data=data, methods=["ls"], storage_root=str(tmp_path / "mnt"), result=result,
                                    image="registry.example/mtlflow:1", budget_trials=2, seed=0,
                                    train_options={"batch_size": 64, "device": "cpu", "epochs": 2},
                                    namespace="ml")
    assert json.loads(Path(result.path).read_text()) == best and result.metadata["studies"] == ["ls"]
    ls = best["ls"]
    assert ls["train_options"] == {"lr": 1e-4, "weight_decay": 0.0}
    ((command, stdout),) = api.trial_outputs.values()
    run_dir = Path(command[command.index("--out") + 1])
    assert run_dir.name == ls["best_trial"] and json.loads((run_dir / "run.json").read_text())["status"] == "completed"
    # the printed objective is the study's score of each epoch's val metrics, recomputed from the run's record
    scorer = load_scorer(command[command.index("--katib-metrics") + 1])
    history = json.loads((run_dir / "metrics.json").read_text())["epochs"]
    scores = [scorer(epoch["splits"]["val"]) for epoch in history]
    assert len(scores) == 2 and ls["metrics"]["val_score"]["min"] == min(scores)
    assert ls["metrics"]["val_score"]["latest"] == scores[-1]
    left = [m for m in ls["metrics"] if m.startswith("val_left_")]
    assert left and all(ls["metrics"][m]["latest"] == history[-1]["splits"]["val"]["left"][m[len("val_left_"):]]
                        for m in left)
    # what Katib reads is val only: every printed metric is the score or a val metric
    assert {m.group(1).split("_")[0] for m in re.finditer(katib.METRICS_FORMAT, stdout)} == {"val"}
