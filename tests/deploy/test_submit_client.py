"""`mtlflow pipeline submit` / `schedule` against a loopback HTTP server standing in for the KFP API.

No Kubeflow Pipelines API server can run on this machine, so the tests start a small HTTP server on
127.0.0.1 that implements the KFP v2beta1 REST endpoints kfp.Client calls (healthz, experiments,
pipelines and their versions with multipart uploads, runs, recurring runs with list filters and
delete; the v1beta1 healthz, the one endpoint that names the backend's release), keeps their objects in memory and records every request; the assertions are on what the
real kfp.Client sent and on the objects left on the fake server.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import os
import subprocess
import sys
import threading
from email.parser import BytesParser
from email.policy import default as email_policy
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import pytest
import yaml

from mtlflow.cli import main

RETRAIN_PARAMS = ["--param", "method=famo", "--param", "epochs=2", "--param", "hparams={}"]
#: what `--param epochs=3` of a sweep logs: the default budget's min_steps yields to a given epochs
BUDGET_NOTE = ("train_options: nothing overridden; the default budget min_steps_per_epoch=8, patience=10 kept; "
               "min_steps=500 dropped (epochs given: a default rule never changes what was asked for)\n")
API = "/apis/v2beta1"


def _matches(item: dict, query: dict) -> bool:
    """The EQUALS predicates of a KFP list filter (the only operation sent here; protojson takes the enum's
    name, which mtlflow sends, or its number 1, which kfp.Client sends)."""
    if "filter" not in query:
        return True
    predicates = json.loads(query["filter"][0])["predicates"]
    assert all(p["operation"] in ("EQUALS", 1) for p in predicates), predicates
    return all(item.get(p["key"]) == p["stringValue"] for p in predicates)


class FakeKfpApi(BaseHTTPRequestHandler):
    requests: list = []
    fail_runs = False
    ids = itertools.count(1)
    experiments: dict = {}
    pipelines: dict = {}
    versions: dict = {}  # version id -> {pipeline_id, pipeline_version_id, display_name, content}
    recurring_runs: dict = {}
    #: the release /apis/v1beta1/healthz reports (None: the endpoint is missing)
    backend_version: str | None = "2.17.0"

    @classmethod
    def reset(cls) -> None:
        cls.requests, cls.fail_runs, cls.ids = [], False, itertools.count(1)
        cls.backend_version = "2.17.0"
        cls.experiments, cls.pipelines, cls.versions, cls.recurring_runs = {}, {}, {}, {}

    def log_message(self, *args):  # keep pytest output clean
        pass

    def _reply(self, status: int, body: dict) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _new_id(self, kind: str) -> str:
        return f"{kind}-{next(self.ids)}"

    def _read(self):
        url = urlparse(self.path)
        length = int(self.headers.get("Content-Length", 0))
        raw = self.rfile.read(length) if length else b""
        ctype = self.headers.get("Content-Type", "")
        if ctype.startswith("multipart/form-data"):
            message = BytesParser(policy=email_policy).parsebytes(f"Content-Type: {ctype}\r\n\r\n".encode() + raw)
            body = {part.get_param("name", header="content-disposition"): part.get_payload(decode=True)
                    for part in message.iter_parts()}
        else:
            body = json.loads(raw or b"{}")
        query = parse_qs(url.query)
        self.requests.append({"method": self.command, "path": url.path, "query": query,
                              "auth": self.headers.get("Authorization"), "body": body})
        return url.path, query, body

    def do_GET(self):
        path, query, _ = self._read()
        listings = {f"{API}/experiments": ("experiments", self.experiments),
                    f"{API}/pipelines": ("pipelines", self.pipelines),
                    f"{API}/recurringruns": ("recurringRuns", self.recurring_runs)}
        if path == f"{API}/healthz":
            return self._reply(200, {"multi_user": False})
        if path == "/apis/v1beta1/healthz" and self.backend_version:
            return self._reply(200, {"commit_sha": "0123abc", "tag_name": self.backend_version, "multi_user": False})
        if path in listings:
            key, items = listings[path]
            found = [i for i in items.values() if _matches(i, query)
                     and ("experiment_id" not in query or i.get("experiment_id") == query["experiment_id"][0])]
            return self._reply(200, {key: found} if found else {})
        if path.startswith(f"{API}/pipelines/") and path.endswith("/versions"):
            pipeline_id = path.split("/")[-2]
            found = [{k: v for k, v in i.items() if k != "content"} for i in self.versions.values()
                     if i["pipeline_id"] == pipeline_id and _matches(i, query)]
            return self._reply(200, {"pipeline_versions": found} if found else {})
        return self._reply(404, {"error": "not found"})

    def do_POST(self):
        path, query, body = self._read()
        if path == f"{API}/experiments":
            exp = {"experiment_id": self._new_id("exp"), "display_name": body["display_name"]}
            self.experiments[exp["experiment_id"]] = exp
            return self._reply(200, exp)
        if path == f"{API}/pipelines/upload":
            pipeline = {"pipeline_id": self._new_id("pipeline"), "display_name": query["name"][0]}
            self.pipelines[pipeline["pipeline_id"]] = pipeline
            # like the server: the pipeline's first version, named after the pipeline
            self._add_version(pipeline["pipeline_id"], query["name"][0], body["uploadfile"])
            return self._reply(200, pipeline)
        if path == f"{API}/pipelines/upload_version":
            version = self._add_version(query["pipelineid"][0], query["name"][0], body["uploadfile"])
            return self._reply(200, {k: v for k, v in version.items() if k != "content"})
        if path == f"{API}/runs":
            if self.fail_runs:
                return self._reply(500, {"error": "internal"})
            return self._reply(200, {"run_id": self._new_id("run"), "display_name": body["display_name"]})
        if path == f"{API}/recurringruns":
            recurring = {**body, "recurring_run_id": self._new_id("rr")}
            self.recurring_runs[recurring["recurring_run_id"]] = recurring
            return self._reply(200, recurring)
        return self._reply(404, {"error": "not found"})

    def do_DELETE(self):
        path, _, _ = self._read()
        if path.startswith(f"{API}/recurringruns/") and self.recurring_runs.pop(path.rsplit("/", 1)[1], None):
            return self._reply(200, {})
        return self._reply(404, {"error": "not found"})

    def _add_version(self, pipeline_id: str, name: str, content: bytes) -> dict:
        version = {"pipeline_id": pipeline_id, "pipeline_version_id": self._new_id("version"), "display_name": name,
                   "content": content}
        self.versions[version["pipeline_version_id"]] = version
        return version


@pytest.fixture
def kfp_api(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))  # no ~/.config/kfp/context.json of the machine
    monkeypatch.setenv("MTLFLOW_KFP_TOKEN", "test-token")
    FakeKfpApi.reset()
    server = ThreadingHTTPServer(("127.0.0.1", 0), FakeKfpApi)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}", FakeKfpApi
    server.shutdown()
    server.server_close()


def _last_json(capsys) -> dict:
    return json.loads(capsys.readouterr().out.strip().splitlines()[-1])


def _uploads(api) -> list:
    return [r for r in api.requests if r["path"].startswith(f"{API}/pipelines/upload")]


def test_submit_uploads_one_version_per_pipeline_content_and_runs_it(kfp_api, capsys):
    host, api = kfp_api
    assert main(["pipeline", "submit", "--host", host, "--experiment", "retrain-ci", "--run-name", "ci-42",
                 *RETRAIN_PARAMS]) == 0
    first = _last_json(capsys)
    assert api.requests[0]["path"] == f"{API}/healthz"
    pipeline_upload, version_upload = _uploads(api)
    assert pipeline_upload["query"]["name"] == ["mtlflow-retrain"]
    content = version_upload["body"]["uploadfile"]
    spec, platform = yaml.safe_load_all(content)
    # the version is named by the uploaded package's content, computed here from what the server received
    assert version_upload["query"]["name"] == [f"mtlflow-retrain-{hashlib.sha256(content).hexdigest()[:16]}"]
    assert version_upload["query"]["pipelineid"] == [first["pipeline_id"]]
    # the IR and its Kubernetes platform spec (PVCs, Secret, GPU scheduling) travel together
    assert spec["pipelineInfo"]["name"] == "mtlflow-retrain"
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    assert executors["exec-prepare-data"]["secretAsEnv"][0]["secretName"] == "mtlflow-dvc-remote"
    run = api.requests[-1]
    assert run["path"] == f"{API}/runs" and run["auth"] == "Bearer test-token"
    body = run["body"]
    [experiment] = api.experiments.values()
    assert experiment["display_name"] == "retrain-ci"
    assert body["display_name"] == "ci-42" and body["experiment_id"] == experiment["experiment_id"]
    assert body.get("pipeline_spec") is None  # the run refers to the uploaded version, it embeds no spec
    assert body["pipeline_version_reference"] == {"pipeline_id": first["pipeline_id"],
                                                  "pipeline_version_id": first["pipeline_version_id"]}
    assert body["runtime_config"]["parameters"] == {"method": "famo", "epochs": 2, "hparams": {}}
    assert first["run_name"] == "ci-42" and first["experiment"] == "retrain-ci"

    # the same content again: nothing uploaded, the run uses the same version
    assert main(["pipeline", "submit", "--host", host, "--run-name", "ci-43", *RETRAIN_PARAMS]) == 0
    second = _last_json(capsys)
    assert len(_uploads(api)) == 2
    assert second["pipeline_version_id"] == first["pipeline_version_id"] != second["run_id"]
    assert api.requests[-1]["body"]["pipeline_version_reference"]["pipeline_version_id"] == first["pipeline_version_id"]

    # --no-cache is other content: one new version of the same pipeline, every task (nested DAGs too) uncached
    assert main(["pipeline", "submit", "--host", host, "--no-cache", *RETRAIN_PARAMS]) == 0
    uncached = _last_json(capsys)
    assert len(_uploads(api)) == 3 and _uploads(api)[-1]["path"] == f"{API}/pipelines/upload_version"
    assert uncached["pipeline_id"] == first["pipeline_id"]
    assert uncached["pipeline_version_id"] != first["pipeline_version_id"]
    spec = next(yaml.safe_load_all(api.versions[uncached["pipeline_version_id"]]["content"]))
    dags = [spec["root"]["dag"], *(c["dag"] for c in spec["components"].values() if "dag" in c)]
    assert len(dags) > 1 and all(not t.get("cachingOptions", {}).get("enableCache")
                                 for dag in dags for t in dag["tasks"].values())
    cached = next(yaml.safe_load_all(api.versions[first["pipeline_version_id"]]["content"]))
    assert any(t.get("cachingOptions", {}).get("enableCache")
               for c in cached["components"].values() for t in c.get("dag", {}).get("tasks", {}).values())


def _schedule(host: str, *extra: str) -> list[str]:
    return ["pipeline", "schedule", "--host", host, "--param", "epochs=3", *extra]


def test_schedule_keeps_one_recurring_run_per_name(kfp_api, capsys):
    host, api = kfp_api
    assert main(_schedule(host, "--cron", "0 0 3 * * *")) == 0
    first = _last_json(capsys)
    assert list(api.recurring_runs) == [first["recurring_run_id"]] and first["replaced"] == []
    body = api.recurring_runs[first["recurring_run_id"]]
    assert body["display_name"] == "benchmark_sweep-nightly"
    assert body["trigger"]["cron_schedule"]["cron"] == "0 0 3 * * *"
    assert int(body["max_concurrency"]) == 1 and body["no_catchup"] is True and body["mode"] == "ENABLE"
    assert body.get("pipeline_spec") is None
    assert body["pipeline_version_reference"]["pipeline_version_id"] == first["pipeline_version_id"]
    assert api.versions[first["pipeline_version_id"]]["display_name"].startswith("mtlflow-benchmark-sweep-")
    # a given epochs is the most a run trains: the default min_steps yields to it (docs/guides/training.md)
    assert body["runtime_config"]["parameters"] == {"epochs": 3, "train_options": {
        "device": "auto", "min_steps_per_epoch": 8, "patience": 10}}

    # the same call again: the same recurring run, nothing created or deleted
    assert main(_schedule(host, "--cron", "0 0 3 * * *")) == 0
    again = _last_json(capsys)
    assert again["recurring_run_id"] == first["recurring_run_id"] and list(api.recurring_runs) == [first["recurring_run_id"]]
    assert [r["method"] for r in api.requests if r["path"].startswith(f"{API}/recurringruns")][-1] == "GET"

    # another cron replaces it: still one, the new one
    assert main(_schedule(host, "--cron", "0 30 4 * * *")) == 0
    moved = _last_json(capsys)
    assert moved["replaced"] == [first["recurring_run_id"]] and list(api.recurring_runs) == [moved["recurring_run_id"]]
    assert api.recurring_runs[moved["recurring_run_id"]]["trigger"]["cron_schedule"]["cron"] == "0 30 4 * * *"

    # duplicates left by an older mtlflow (one recurring run per call) are cleaned up; other names are kept
    experiment_id = api.recurring_runs[moved["recurring_run_id"]]["experiment_id"]
    for rid, name in (("rr-old-1", "benchmark_sweep-nightly"), ("rr-old-2", "benchmark_sweep-nightly"),
                      ("rr-other", "weekly")):
        api.recurring_runs[rid] = {"recurring_run_id": rid, "display_name": name, "experiment_id": experiment_id}
    assert main(_schedule(host, "--cron", "0 30 4 * * *")) == 0
    cleaned = _last_json(capsys)
    assert cleaned["recurring_run_id"] == moved["recurring_run_id"]
    assert sorted(cleaned["replaced"]) == ["rr-old-1", "rr-old-2"]
    assert sorted(api.recurring_runs) == sorted([moved["recurring_run_id"], "rr-other"])


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


def test_an_unreachable_host_is_one_line_naming_it(tmp_path):
    """Through the real CLI in a subprocess: kfp.Client calls /healthz in its constructor (no
    --namespace), which used to escape the error handling as a traceback."""
    env = {**os.environ, "HOME": str(tmp_path), "HF_HUB_OFFLINE": "1"}
    env.pop("MTLFLOW_KFP_TOKEN", None)
    proc = subprocess.run([sys.executable, "-m", "mtlflow", "pipeline", "submit", "--host", "http://127.0.0.1:1",
                           *RETRAIN_PARAMS], capture_output=True, text=True, timeout=120, env=env)
    assert proc.returncode == 6
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith("mtlflow: error: connecting to the KFP API at http://127.0.0.1:1 failed")
    assert "check --host" in proc.stderr


def _executors(content: bytes) -> dict:
    _, platform = yaml.safe_load_all(content)
    return platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def test_a_backend_that_rejects_security_context_is_refused_before_any_upload(kfp_api, capsys, tmp_path):
    """Issue 30, item 3: KFP before 2.16 fails every task carrying a securityContext ("no field named
    securityContext"). Its release is read from the API and the submission refused with one line naming the fix;
    a profile with that kfp_backend compiles without securityContext and is accepted; 2.16 and later get it."""
    host, api = kfp_api
    api.backend_version = "2.15.2"
    sweep = ["pipeline", "submit", "--host", host, "--pipeline", "benchmark_sweep", "--param", "epochs=3"]
    assert main(sweep) == 6
    err = capsys.readouterr().err.removeprefix(BUDGET_NOTE)  # the budget rule's own line comes first
    assert err.count("\n") == 1 and f"the KFP backend at {host} is 2.15.2" in err
    assert 'set kfp_backend: "2.15.2" in the cluster profile' in err
    assert _uploads(api) == [] and any(r["path"] == "/apis/v1beta1/healthz" and r["auth"] == "Bearer test-token"
                                       for r in api.requests)
    profile = tmp_path / "old-kfp.yaml"
    profile.write_text("name: old-kfp\nkfp_backend: 2.15.2\n")
    assert main([*sweep, "--profile", str(profile)]) == 0
    executors = _executors(_uploads(api)[-1]["body"]["uploadfile"])
    assert executors and not any("securityContext" in spec for spec in executors.values())
    api.backend_version = "2.16.0"
    assert main([*sweep, "--run-name", "new-kfp"]) == 0
    assert all(spec["securityContext"] == {"runAsNonRoot": True}
               for spec in _executors(_uploads(api)[-1]["body"]["uploadfile"]).values())


def test_a_backend_that_does_not_name_its_release_gets_the_run_and_a_warning(kfp_api, capsys):
    host, api = kfp_api
    api.backend_version = None
    assert main(["pipeline", "submit", "--host", host, "--pipeline", "benchmark_sweep", "--param", "epochs=3"]) == 0
    assert "does not name its release" in capsys.readouterr().err
