"""launch_trainjob compiles, and its body drives a (fake) Kubernetes API end to end: the dataset is
staged on the "PVC", the TrainJob created with the cluster profile and polled, the run directory copied
back and the TrainJob deleted. No API server exists here, so the API is mocked: the fake plays the
API server (404 for a missing object) and the Trainer controller, running the job's command
(``torchrun -m mtlflow train ...``) as ``python -m mtlflow train ...`` in-process."""

import json
import shlex
from pathlib import Path

import pytest
import yaml
from kfp import compiler, dsl

from mtlflow.cli import main
from mtlflow.components.launch_trainjob.component import launch_trainjob
from mtlflow.core.errors import InvalidParameterError
from mtlflow.ops import k8s_jobs


class NotFound(Exception):
    status = 404


class TrainerControllerStub:
    """Records created and deleted objects; the first poll of a created job runs its command."""

    def __init__(self):
        self.created, self.deleted, self.live = [], [], {}

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        self.created.append((group, version, namespace, plural, body))
        self.live[body["metadata"]["name"]] = body

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        if name not in self.live:
            raise NotFound(name)
        body = self.live[name]
        if "status" not in body:
            command = body["spec"]["trainer"]["command"]
            assert command[:4] == ["torchrun", "-m", "mtlflow", "train"]
            assert main(command[3:]) == 0
            body["status"] = {"conditions": [{"type": "Complete", "status": "True"}]}
        return body

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, propagation_policy=None):
        self.deleted.append(name)
        del self.live[name]


def test_component_compiles_without_runtime_pip(tmp_path):
    out = tmp_path / "launch.yaml"
    compiler.Compiler().compile(launch_trainjob, str(out))
    spec = yaml.safe_load(out.read_text())
    container = next(iter(spec["deploymentSpec"]["executors"].values()))["container"]
    assert "pip install" not in " ".join(container["command"] + container["args"])


def test_launcher_stages_data_submits_waits_and_collects_the_run(tiny_dataset, tmp_path, monkeypatch):
    data, _ = tiny_dataset
    api = TrainerControllerStub()
    monkeypatch.setattr(k8s_jobs, "custom_objects_api", lambda: api)
    monkeypatch.setattr(k8s_jobs, "core_api", lambda: None)  # not in a pod here: the job gets no owner
    run = dsl.Artifact(uri=str(tmp_path / "run"))
    model = dsl.Model(uri=str(tmp_path / "model.pt"))
    spec = json.dumps({"method": "ls", "seed": 0, "hparams": {}})
    launch_trainjob.python_func(data=data, run_spec=spec, epochs=1, train_options={"batch_size": 64, "device": "cpu"},
                                storage_root=str(tmp_path / "mnt"), run=run, model=model, kind="TrainJob",
                                num_nodes=1, gpus_per_node=1, image="registry.example/mtlflow:1", namespace="ml",
                                profile={"tolerations": [{"key": "dedicated", "value": "ml-training",
                                                          "effect": "NoSchedule"}],
                                         "image_pull_secrets": ["regcred"]})
    (created,) = api.created
    group, version, namespace, plural, body = created
    assert (group, version, plural, namespace) == ("trainer.kubeflow.org", "v1alpha1", "trainjobs", "ml")
    staged = tmp_path / "mnt" / "data" / "datasets" / data.metadata["content_hash"]
    assert staged.is_dir() and shlex.join(body["spec"]["trainer"]["command"]).count(str(staged)) == 1
    assert json.loads((Path(run.path) / "run.json").read_text())["status"] == "completed"
    assert not (Path(run.path) / "checkpoint.pt").exists()
    assert Path(model.path).is_file() and run.metadata["kind"] == "TrainJob"
    # the finished job was deleted after the run directory was collected: it holds no quota
    assert api.deleted == [body["metadata"]["name"]] and api.live == {}
    pod = body["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0][
        "template"]["spec"]["template"]["spec"]
    assert pod["tolerations"] == [{"key": "dedicated", "operator": "Equal", "value": "ml-training",
                                   "effect": "NoSchedule"}]
    assert pod["imagePullSecrets"] == [{"name": "regcred"}]


def test_launcher_refuses_unknown_kind(tiny_dataset, tmp_path, monkeypatch):
    data, _ = tiny_dataset
    monkeypatch.setattr(k8s_jobs, "custom_objects_api", lambda: pytest.fail("must not reach the API"))
    with pytest.raises(InvalidParameterError, match="unknown job kind"):
        launch_trainjob.python_func(data=data, run_spec=json.dumps({"method": "ls", "seed": 0}), epochs=1,
                                    train_options={}, storage_root=str(tmp_path),
                                    run=dsl.Artifact(uri=str(tmp_path / "r")), model=dsl.Model(uri=str(tmp_path / "m")),
                                    kind="MPIJob", image="x", namespace="ml")
