"""`mtlflow pipeline submit` / `schedule` against a loopback HTTP server standing in for the KFP API.

No Kubeflow Pipelines API server can run on this machine, so the tests start a tiny HTTP server on
127.0.0.1 that answers the KFP v2beta1 REST calls kfp.Client makes (experiments, runs, recurring
runs) and records every request; the assertions are on what the client sent.
"""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest

from mtlflow.cli import main

RETRAIN_PARAMS = ["--param", "method=famo", "--param", "epochs=2", "--param", "hparams={}"]


class FakeKfpApi(BaseHTTPRequestHandler):
    requests: list = []
    fail_runs = False

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self, body=None):
        url = urlparse(self.path)
        self.requests.append({"method": self.command, "path": url.path, "query": parse_qs(url.query),
                              "auth": self.headers.get("Authorization"), "body": body})

    def do_GET(self):
        self._record()
        if self.path.startswith("/apis/v2beta1/healthz"):
            return self._reply(200, {"multi_user": False})
        if self.path.startswith("/apis/v2beta1/experiments"):
            return self._reply(200, {"experiments": []})
        return self._reply(404, {"error": "not found"})

    def do_POST(self):
        length = int(self.headers.get("Content-Length", 0))
        body = json.loads(self.rfile.read(length) or b"{}")
        self._record(body)
        path = urlparse(self.path).path
        if path == "/apis/v2beta1/experiments":
            return self._reply(200, {"experiment_id": "exp-1", "display_name": body["display_name"]})
        if path == "/apis/v2beta1/runs":
            if self.fail_runs:
                return self._reply(500, {"error": "internal"})
            return self._reply(200, {"run_id": "run-1", "display_name": body["display_name"]})
        if path == "/apis/v2beta1/recurringruns":
            return self._reply(200, {"recurring_run_id": "rr-1", "display_name": body["display_name"]})
        return self._reply(404, {"error": "not found"})


@pytest.fixture
def kfp_api(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/kfp/context.json of the machine
    monkeypatch.setenv("MTLFLOW_KFP_TOKEN", "test-token")
    FakeKfpApi.requests = []
    FakeKfpApi.fail_runs = False
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeKfpApi)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", FakeKfpApi
    server.shutdown()
    server.server_close()


def test_submit_creates_the_experiment_and_one_run(kfp_api, capsys):
    host, api = kfp_api
    assert main(["pipeline", "submit", "--host", host, "--experiment", "retrain-ci", "--run-name", "ci-42",
                 *RETRAIN_PARAMS]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out == {"run_id": "run-1", "run_name": "ci-42", "experiment": "retrain-ci"}
    health, lookup, created, run = api.requests
    assert health["path"] == "/apis/v2beta1/healthz"
    assert lookup["method"] == "GET" and "retrain-ci" in lookup["query"]["filter"][0]
    assert created["body"]["display_name"] == "retrain-ci"
    assert run["path"] == "/apis/v2beta1/runs" and run["auth"] == "Bearer test-token"
    body = run["body"]
    assert body["experiment_id"] == "exp-1" and body["display_name"] == "ci-42"
    # the IR and its Kubernetes platform spec (PVCs, Secret, GPU scheduling) travel together
    assert body["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "mtlflow-retrain"
    executors = body["pipeline_spec"]["platform_spec"]["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert executors["exec-prepare-data"]["secretAsEnv"][0]["secretName"] == "mtlflow-dvc-remote"
    assert body["runtime_config"]["parameters"] == {"method": "famo", "epochs": 2, "hparams": {}}


def test_schedule_creates_a_recurring_run_without_overlap_or_catch_up(kfp_api, capsys):
    host, api = kfp_api
    assert main(["pipeline", "schedule", "--host", host, "--cron", "0 0 3 * * *", "--param", "epochs=3"]) == 0
    out = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert out["recurring_run_id"] == "rr-1" and out["cron"] == "0 0 3 * * *"
    recurring = api.requests[-1]
    assert recurring["path"] == "/apis/v2beta1/recurringruns"
    body = recurring["body"]
    assert body["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * *"
    assert int(body["max_concurrency"]) == 1 and body["no_catchup"] is True and body["mode"] == "ENABLE"
    assert body["pipeline_spec"]["pipeline_spec"]["pipelineInfo"]["name"] == "mtlflow-benchmark-sweep"
    assert body["runtime_config"]["parameters"] == {"epochs": 3}


@pytest.mark.parametrize("argv, message", [
    (["schedule", "--cron", "0 3 * * *"], "has 5 fields but KFP needs 6"),
    (["schedule", "--cron", "0 0 3 * * * *"], "has 7 fields"),
    (["submit", "--param", "method=nope"], "unknown method 'nope'"),
    (["submit", "--param", "epochs=-1"], "epochs must be a positive integer"),
    (["schedule", "--cron", "0 0 3 * * *", "--param", "methods=[]"], "method list is empty"),
    (["submit", "--param", "data_version=latest"], "not a DVC directory hash"),
    (["submit", "--param", "train_options={device: tpu}"], "device 'tpu' is not valid"),
    (["submit", "--pipeline", "nope"], "unknown pipeline 'nope'"),
])
def test_invalid_input_is_rejected_before_any_request(kfp_api, capsys, argv, message):
    host, api = kfp_api
    assert main(["pipeline", *argv, "--host", host]) == 2
    err = capsys.readouterr().err
    assert err.startswith("mtlflow: error: ") and message in err and err.count("\n") == 1
    assert api.requests == []


def test_server_errors_are_one_line_with_their_own_exit_code(kfp_api, capsys):
    host, api = kfp_api
    api.fail_runs = True
    assert main(["pipeline", "submit", "--host", host, *RETRAIN_PARAMS]) == 6
    err = capsys.readouterr().err
    assert "creating the run" in err and "HTTP 500" in err and err.count("\n") == 1
    assert main(["pipeline", "submit", "--host", "kubeflow.example.com", *RETRAIN_PARAMS]) == 2


def test_ci_workflow_compiles_tests_and_submits_retrain_on_data_or_code_changes():
    from pathlib import Path

    import yaml

    workflow = yaml.safe_load((Path(__file__).resolve().parents[2] / ".github" / "workflows" / "retrain.yml").read_text())
    triggers = workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads `on` as True
    assert {"data/**", "src/**"} <= set(triggers["push"]["paths"])
    steps = [step.get("run", "") for job in workflow["jobs"].values() for step in job["steps"]]
    script = "\n".join(steps)
    order = [script.index(s) for s in ("make compile", "make test", "mtlflow pipeline submit --pipeline retrain")]
    assert order == sorted(order)
    assert "secrets.KFP_TOKEN" in str(workflow) and "MTLFLOW_KFP_TOKEN" in str(workflow)
    assert "password" not in script.lower().replace("--password-stdin", "")
