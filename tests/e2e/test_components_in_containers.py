"""Every component of components/ run inside the image exactly as the cluster runs it -- the compiled task's own
command (`sh -ec ... python3 -m kfp.dsl.executor_main ...`) in the project image -- through kfp.local's DockerRunner,
as UID 1000 with a read-only root file system and no network.

kfp 2.17.0's DockerRunner counts a container that was auto-removed before its exit status was read as a success
(kubeflow/pipelines#13332), so each test also reads every container's exit code from the Docker daemon's event log.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml
from e2e_support import REPO_ROOT, STRICT_RUN, folder_for_uid_1000
from kfp import dsl, local

from mtlflow.jobs.compare.summary import Summary, from_json
from mtlflow.jobs.report import headline_markdown
from mtlflow.ops.storage import StorageLayout
from mtlflow.pipelines import runner


def demo_tasks(params: dict[str, Any]) -> int:
    """The demo sweep's tasks: plan_runs, plan_references, prepare_data, a train per method and seed and per
    reference task and seed, an evaluate per method and seed on the test split, aggregate, record_status."""
    runs = len(params["methods"]) * len(params["seeds"])
    references = 2 * len(params["reference_seeds"])  # MultiMNIST's two tasks
    return 3 + runs + references + runs + 2


class ContainerExitCodes:
    """Exit codes of the containers carrying ``label``, read from the Docker daemon's event stream while the pipeline
    runs. Reading the events afterwards (``since``/``until``) is not enough: the daemon keeps only its last 256
    events, and a 35-task sweep's containers produce more, so the first containers' exits were lost."""

    def __init__(self, label: dict[str, str]):
        import docker

        ((key, value),) = label.items()
        self.client = docker.from_env()
        self.stream = self.client.events(decode=True, filters={"type": "container", "event": "die",
                                                                "label": f"{key}={value}"})
        self.codes: list[int] = []
        self.reader = threading.Thread(target=self._read, daemon=True)
        self.reader.start()

    def _read(self) -> None:
        try:
            for event in self.stream:
                self.codes.append(int(event["Actor"]["Attributes"]["exitCode"]))
        except Exception:  # the stream closed by stop()
            pass

    def stop(self) -> list[int]:
        time.sleep(2)  # the last container's "die" event reaches the stream after kfp.local has read its status
        self.stream.close()
        self.reader.join(timeout=10)
        self.client.close()
        return self.codes


def run_in_containers(pipeline_func: Callable, params: dict[str, Any], artifacts: Path,
                      label: dict[str, str]) -> tuple[Path, list[int], str]:
    """Run ``pipeline_func`` with DockerRunner: the kfp.local run directory, the exit codes of its containers and
    kfp.local's error ("" when it reported success)."""
    local.init(runner=local.DockerRunner(**STRICT_RUN, labels=label), pipeline_root=str(artifacts),
               raise_on_error=True)
    error = ""
    exits = ContainerExitCodes(label)
    try:
        pipeline_func(**params)
    except RuntimeError as exc:  # kfp.local's "finished with status FAILURE"
        error = str(exc)
    finally:
        codes = exits.stop()
    run_dir = max((p for p in artifacts.iterdir() if p.name.startswith(pipeline_func.component_spec.name + "-")),
                  key=lambda p: p.stat().st_mtime)
    return run_dir, codes, error


@pytest.fixture
def artifacts(workdir: Path) -> Path:
    """The pipeline root, which DockerRunner bind-mounts at the same path; the storage root lives inside it."""
    return folder_for_uid_1000(workdir / "artifacts")


def test_demo_pipeline_runs_in_the_image(image, artifacts, run_label):
    """pipelines/demo.yaml (`make demo`'s sweep): prepare_data, plan_runs, plan_references, train, evaluate,
    aggregate and record_status, each in its own container."""
    params = yaml.safe_load((REPO_ROOT / "pipelines" / "demo.yaml").read_text())
    storage = artifacts / "storage"
    pipeline_func = runner.get_pipeline("benchmark_sweep", parallelism=2, storage_root=str(storage))
    run_dir, codes, error = run_in_containers(pipeline_func, params, artifacts, run_label)
    assert not error and codes == [0] * demo_tasks(params), error

    # the sweep in the containers gives the README's demo table to the last digit (one torch thread per run)
    results = json.loads(next(run_dir.rglob("aggregate/results/results.json")).read_text())
    assert {label.lower() for label in results["methods"]} == set(params["methods"])
    readme = (REPO_ROOT / "README.md").read_text()
    begin, end = readme.index("<!-- demo-table:begin"), readme.index("<!-- demo-table:end -->")
    expected = readme[readme.index("\n", begin) + 1:end].strip("\n") + "\n"
    assert headline_markdown(from_json(Summary, results)) == expected
    status = Path(StorageLayout(str(storage)).status) / f"{run_dir.name}.json"
    assert json.loads(status.read_text())["state"] == "SUCCEEDED"


def test_retrain_pipeline_promotes_in_the_image(image, artifacts, run_label):
    """The retraining pipeline's own components, compare_to_champion and promote (and plan_run), in containers."""
    storage = artifacts / "storage"
    pipeline_func = runner.get_pipeline("retrain", parallelism=2, storage_root=str(storage))
    params = {"benchmark": "multimnist", "data_options": {"n_train": 512, "n_val": 128, "n_test": 128},
              "method": "famo", "seed": 0, "hparams": {}, "epochs": 1, "train_options": {"device": "cpu"}}
    run_dir, codes, error = run_in_containers(pipeline_func, params, artifacts, run_label)
    assert not error and codes and all(code == 0 for code in codes), error
    decision = json.loads(next(run_dir.rglob("compare-to-champion/executor_output.json")).read_text())
    assert decision["parameterValues"]["Output"] is True, "no champion yet: the first model is promoted"
    models = Path(StorageLayout(str(storage)).models)
    (champion,) = models.rglob("champion.json")
    assert json.loads(champion.read_text()), f"promote wrote an empty champion record in {models}"


def test_launch_trainjob_stages_the_data_then_needs_the_cluster(image, artifacts, run_label, capfd):
    """launch_trainjob in the image up to the Kubernetes API, which cannot exist here: it stages the prepared data
    on the (here: bind-mounted) data volume, then fails with the Kubernetes client's configuration error."""
    from mtlflow.components.launch_trainjob.component import launch_trainjob
    from mtlflow.components.prepare_data.component import prepare_data

    layout = StorageLayout(str(artifacts / "storage"))

    @dsl.pipeline(name="launch-trainjob-e2e")
    def launch_only():
        prep = prepare_data(benchmark="multimnist", data_options={"n_train": 256, "n_val": 64, "n_test": 64})
        launch_trainjob(data=prep.outputs["data"], run_spec=json.dumps({"method": "ls", "seed": 0}), epochs=1,
                        train_options={}, storage_root=layout.root, image=image, namespace="mtlflow")

    run_dir, codes, error = run_in_containers(launch_only, {}, artifacts, run_label)
    # the daemon's exit codes decide: kfp.local reports this run as a success when launch_trainjob's container was
    # removed before its status was read (kubeflow/pipelines#13332; seen in 1 of 2 runs), else as a FAILURE
    assert sorted(codes) == [0, 1], "prepare_data succeeds, launch_trainjob exits 1"
    assert error == "" or "FAILURE" in error
    prepared = next(run_dir.rglob("prepare-data/data"))
    (staged,) = Path(layout.datasets).iterdir()
    assert sorted(p.name for p in staged.iterdir()) == sorted(p.name for p in prepared.iterdir())
    output = capfd.readouterr().out
    assert "submitting TrainJob mtlflow/" in output, "the job's manifest was built in the container"
    assert "ConfigException: Invalid kube-config file. No configuration found." in output
