"""The TrainJob lifecycle of launch_trainjob (mtlflow.ops.k8s_jobs.run_job / delete_job): finished and
failed jobs are deleted, so the namespace's TrainJob quota (1 in dev) never fills up; a retried
launcher re-creates a failed job and re-attaches only to a running or finished one of the same inputs.

The Kubernetes API server is mocked because none can run here: FakeKubernetesApi keeps custom objects
in memory with the API's semantics (409 for an existing name, 404 for a missing one, 403 when the
namespace's object-count quota is reached, errors as the real ``kubernetes.client.ApiException``) and
plays the Trainer controller by moving each job through scripted status conditions."""

from __future__ import annotations

import copy
import json

import pytest
from kubernetes.client.exceptions import ApiException

from mtlflow.ops import k8s_jobs

NO_SLEEP = {"sleep": lambda seconds: None}


def api_error(status: int, reason: str, message: str) -> ApiException:
    error = ApiException(status=status, reason=reason)
    error.body = json.dumps({"kind": "Status", "message": message})
    return error


class FakeKubernetesApi:
    """Custom objects by (plural, namespace, name); ``script[name]`` lists the condition each poll of
    that job reports next (None: no condition yet), the last one repeating."""

    def __init__(self, script=None, quota=None):
        self.objects, self.script, self.quota, self.log = {}, dict(script or {}), quota, []

    def create_namespaced_custom_object(self, group, version, namespace, plural, body):
        key = (plural, namespace, body["metadata"]["name"])
        if key in self.objects:
            raise api_error(409, "Conflict", f'{plural} "{key[2]}" already exists')
        if self.quota is not None and sum(k[:2] == (plural, namespace) for k in self.objects) >= self.quota:
            raise api_error(403, "Forbidden", f'{plural} "{key[2]}" is forbidden: exceeded quota: mtlflow-compute, '
                            f"requested: count/{plural}.{group}=1, used: count/{plural}.{group}={self.quota}")
        self.objects[key] = {**copy.deepcopy(body), "status": {}}
        self.log.append(("create", key[2]))

    def get_namespaced_custom_object(self, group, version, namespace, plural, name):
        key = (plural, namespace, name)
        if key not in self.objects:
            raise api_error(404, "Not Found", f'{plural} "{name}" not found')
        states = self.script.get(name) or [None]
        state = states.pop(0) if len(states) > 1 else states[0]
        if state:
            self.objects[key]["status"] = {"conditions": [
                {"type": state, "status": "True", "reason": "BackoffLimitExceeded" if state == "Failed" else "Done",
                 "message": "pod node-0 OOMKilled" if state == "Failed" else ""}]}
        return copy.deepcopy(self.objects[key])

    def delete_namespaced_custom_object(self, group, version, namespace, plural, name, propagation_policy=None):
        key = (plural, namespace, name)
        if key not in self.objects:
            raise api_error(404, "Not Found", f'{plural} "{name}" not found')
        del self.objects[key]
        self.log.append(("delete", name))


def manifest(name="mtlflow-ls-s0-0123456789abcdef", **kw):
    job = k8s_jobs.DistributedTraining(name=name, namespace="mtlflow-dev", image="reg/mtlflow:1",
                                       command=["torchrun", "-m", "mtlflow", "train"], **kw)
    return k8s_jobs.trainjob_manifest(job)


def launch(api, m, **kw):
    """What launch_trainjob does with the API: run the job, collect, delete it."""
    finished = k8s_jobs.run_job(m, api, log=lambda line: None, **NO_SLEEP, **kw)
    k8s_jobs.delete_job(m, api, **NO_SLEEP)
    return finished


def test_finished_jobs_are_deleted_so_the_quota_admits_every_next_run():
    """dev's quota of one TrainJob: run after run succeeds because each launcher deletes its job."""
    api = FakeKubernetesApi({f"run-{i}": [None, "Complete"] for i in range(3)}, quota=1)
    for i in range(3):
        assert k8s_jobs.job_state(launch(api, manifest(f"run-{i}"))) == "succeeded"
    assert api.objects == {}
    assert api.log == [(verb, f"run-{i}") for i in range(3) for verb in ("create", "delete")]
    # without the deletion the second run waits for the quota, within its timeout, and then fails with the
    # quota's own message
    full = FakeKubernetesApi({"run-0": ["Complete"]}, quota=1)
    k8s_jobs.run_job(manifest("run-0"), full, log=lambda line: None, **NO_SLEEP)
    clock = FakeClock()
    with pytest.raises(k8s_jobs.JobFailedError, match=r"TrainJob mtlflow-dev/run-1 waited 600 s for the namespace's "
                       r"quota and was still refused \(HTTP 403 Forbidden: .*exceeded quota: mtlflow-compute"):
        k8s_jobs.run_job(manifest("run-1"), full, log=lambda line: None, timeout_seconds=600, poll_seconds=30,
                         sleep=clock.sleep, clock=clock)


class FakeClock:
    """Monotonic time that advances only when the code under test sleeps."""

    def __init__(self, on_sleep=None):
        self.now, self.on_sleep = 0.0, on_sleep

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds
        if self.on_sleep:
            self.on_sleep(self.now)


def test_a_job_refused_by_the_quota_waits_for_it_instead_of_failing():
    """Issue 30, item 10: two loops x parallelism 4 against dev's quota of one TrainJob: a launcher whose create the
    quota refuses says so once and retries until the other job is gone (here after 7 minutes: longer than the
    three KFP retries used to last), then runs its job."""
    api = FakeKubernetesApi({"first": ["Complete"], "second": [None, "Complete"]}, quota=1)
    k8s_jobs.run_job(manifest("first"), api, log=lambda line: None, **NO_SLEEP)
    clock = FakeClock(on_sleep=lambda now: now >= 420 and ("trainjobs", "mtlflow-dev", "first") in api.objects
                      and k8s_jobs.delete_job(manifest("first"), api, **NO_SLEEP))
    lines = []
    finished = k8s_jobs.run_job(manifest("second"), api, log=lines.append, poll_seconds=30, sleep=clock.sleep,
                                clock=clock)
    assert k8s_jobs.job_state(finished) == "succeeded"
    assert lines[0].startswith("waiting for quota: TrainJob mtlflow-dev/second is refused (HTTP 403 Forbidden")
    assert lines[1] == "quota admitted TrainJob mtlflow-dev/second after 420 s"
    assert api.log == [("create", "first"), ("delete", "first"), ("create", "second")]
    # any other refusal is not waited for
    forbidden = FakeKubernetesApi()
    forbidden.create_namespaced_custom_object = lambda *a: (_ for _ in ()).throw(
        api_error(403, "Forbidden", 'trainjobs is forbidden: User "system:serviceaccount:x:y" cannot create'))
    with pytest.raises(k8s_jobs.JobFailedError, match="could not create .* cannot create; check the pipeline pods'"):
        k8s_jobs.run_job(manifest("third"), forbidden, log=lambda line: None, **NO_SLEEP)


def test_a_failed_job_is_deleted_after_its_failure_is_read():
    api = FakeKubernetesApi({"job": [None, "Failed"]}, quota=1)
    with pytest.raises(k8s_jobs.JobFailedError, match=r"failed \(BackoffLimitExceeded: pod node-0 OOMKilled\); "
                       "it was deleted"):
        k8s_jobs.run_job(manifest("job"), api, log=lambda line: None, **NO_SLEEP)
    assert api.objects == {} and api.log == [("create", "job"), ("delete", "job")]


def test_a_retry_recreates_a_failed_job_instead_of_failing_at_once():
    """A failed job left behind (its launcher pod was killed before it could delete it) is deleted and
    created anew by the retried launcher, which then waits for the new job."""
    m = manifest("job")
    api = FakeKubernetesApi({"job": ["Failed"]})
    api.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "mtlflow-dev", "trainjobs", m)
    api.get_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "mtlflow-dev", "trainjobs", "job")
    api.script["job"] = [None, "Complete"]
    assert k8s_jobs.job_state(launch(api, m)) == "succeeded"
    assert api.log == [("create", "job"), ("delete", "job"), ("create", "job"), ("delete", "job")]


@pytest.mark.parametrize("state", [None, "Complete"])
def test_a_retry_reattaches_to_a_running_or_finished_job_of_the_same_inputs(state):
    m = manifest("job")
    api = FakeKubernetesApi({"job": [state, "Complete"]})
    api.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "mtlflow-dev", "trainjobs", m)
    lines = []
    k8s_jobs.run_job(m, api, log=lines.append, **NO_SLEEP)
    assert api.log == [("create", "job")]
    assert lines == [f"re-attaching to TrainJob mtlflow-dev/job ({'succeeded' if state else 'running'})"]


def test_a_job_of_other_inputs_under_the_same_name_is_replaced():
    api = FakeKubernetesApi({"job": [None, "Complete"]})
    api.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "mtlflow-dev", "trainjobs",
                                        manifest("job", gpus_per_node=2))
    m = manifest("job", gpus_per_node=4)
    k8s_jobs.run_job(m, api, log=lambda line: None, **NO_SLEEP)
    assert api.log == [("create", "job"), ("delete", "job"), ("create", "job")]
    stored = api.objects[("trainjobs", "mtlflow-dev", "job")]
    assert stored["spec"]["trainer"]["numProcPerNode"] == 4


def test_timeout_leaves_the_job_running_for_a_retry():
    clock = iter(range(0, 1000, 10))
    api = FakeKubernetesApi({"job": [None]})
    with pytest.raises(k8s_jobs.JobFailedError, match="did not finish within 25 s; it keeps running"):
        k8s_jobs.run_job(manifest("job"), api, timeout_seconds=25, log=lambda line: None, clock=lambda: next(clock),
                         **NO_SLEEP)
    assert ("trainjobs", "mtlflow-dev", "job") in api.objects
    assert manifest("job", timeout_seconds=7200)["spec"]["activeDeadlineSeconds"] == 7200


def test_delete_reports_a_job_that_does_not_go_away():
    class Stuck(FakeKubernetesApi):
        def delete_namespaced_custom_object(self, *args, **kwargs):
            """Accepted, but a finalizer keeps the object."""

    api = Stuck()
    m = manifest("job")
    api.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", "mtlflow-dev", "trainjobs", m)
    clock = iter(range(0, 1000, 10))
    with pytest.raises(k8s_jobs.JobFailedError, match="still there 30 s after its deletion; check its finalizers"):
        k8s_jobs.delete_job(m, api, timeout_seconds=30, clock=lambda: next(clock), **NO_SLEEP)
    k8s_jobs.delete_job(manifest("never-created"), FakeKubernetesApi(), **NO_SLEEP)  # a missing job is fine


class FakeCoreApi:
    """``CoreV1Api.read_namespaced_pod`` of the launcher's own pod, with the uid the API server gave it."""

    def __init__(self, pods):
        self.pods, self.reads = pods, []

    def read_namespaced_pod(self, name, namespace):
        from types import SimpleNamespace

        self.reads.append((namespace, name))
        if (namespace, name) not in self.pods:
            raise api_error(404, "Not Found", f'pods "{name}" not found')
        return SimpleNamespace(metadata=SimpleNamespace(name=name, uid=self.pods[(namespace, name)]))


def test_a_cancelled_runs_job_is_owned_by_the_launcher_pod(monkeypatch):
    """Issue 30, item 5: the job carries an ownerReference to the launcher's pod (the garbage collector deletes it
    with the pod) and the run's id as a label; an owner in another namespace would count as absent and get the job
    deleted at once, so then there is none."""
    import kubernetes_validate

    monkeypatch.setattr(k8s_jobs, "current_namespace", lambda default="default": "mtlflow-dev")
    core = FakeCoreApi({("mtlflow-dev", "retrain-abc-launch-123"): "5b0c6a52-0000-4000-8000-000000000001"})
    owner = k8s_jobs.launcher_owner(core, "mtlflow-dev", pod_name="retrain-abc-launch-123", log=lambda line: None)
    assert owner == {"apiVersion": "v1", "kind": "Pod", "name": "retrain-abc-launch-123",
                     "uid": "5b0c6a52-0000-4000-8000-000000000001"}
    m = manifest(owner=owner, run_id="9f1c2d3e-4b5a-6789-abcd-ef0123456789")
    assert m["metadata"]["ownerReferences"] == [owner]
    assert m["metadata"]["labels"][k8s_jobs.RUN_ID_LABEL] == "9f1c2d3e-4b5a-6789-abcd-ef0123456789"
    # ObjectMeta is checked by the API server, not the CRD schema: validate it as a core object's metadata
    kubernetes_validate.validate({"apiVersion": "v1", "kind": "ConfigMap", "metadata": m["metadata"]}, "1.32.0",
                                 strict=True)
    lines = []
    assert k8s_jobs.launcher_owner(core, "mtlflow", pod_name="retrain-abc-launch-123", log=lines.append) is None
    assert "gets no owner" in lines[0] and core.reads == [("mtlflow-dev", "retrain-abc-launch-123")]
    assert k8s_jobs.launcher_owner(core, "mtlflow-dev", pod_name="gone", log=lines.append) is None
    assert "HTTP 404" in lines[1]


def test_a_terminated_launcher_deletes_its_job():
    """Issue 30, item 5: SIGTERM (the run was cancelled, or the task timed out) while the launcher waits deletes
    the job and ends the launcher as a terminated process (exit 143); outside the wait SIGTERM is untouched."""
    import os
    import signal

    api, m = FakeKubernetesApi(), manifest()
    api.create_namespaced_custom_object(*k8s_jobs.API["TrainJob"][:2], "mtlflow-dev", "trainjobs", m)
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(SystemExit) as stopped:
        with k8s_jobs.deleted_on_termination(m, api, log=lambda line: None):
            os.kill(os.getpid(), signal.SIGTERM)  # the handler runs before the next statement
            pytest.fail("SIGTERM did not stop the launcher")
    assert stopped.value.code == 143 and api.log[-1] == ("delete", m["metadata"]["name"]) and api.objects == {}
    assert signal.getsignal(signal.SIGTERM) is before


def test_the_job_deadline_is_the_profiles_and_the_launcher_never_outlives_it(tmp_path):
    """Issue 30, item 5: the TrainJob's activeDeadlineSeconds is the profile's trainjob.deadline_seconds (not a fixed
    24 h), and the launcher task's KFP timeout is that plus the grace for staging and collecting."""
    import yaml

    from mtlflow.cli import main
    from mtlflow.config.cluster import load_profile
    from mtlflow.pipelines import cluster

    profile = tmp_path / "profile.yaml"
    profile.write_text(yaml.safe_dump({"name": "short", "trainjob": {"deadline_seconds": 7200}}))
    out = tmp_path / "distributed.yaml"
    assert main(["pipeline", "compile", "--pipeline", "distributed_train", "--out", str(out),
                 "--profile", str(profile)]) == 0
    ir, platform = yaml.safe_load_all(out.read_text())
    launch = next(task for comp in ir["components"].values()
                  for name, task in comp.get("dag", {}).get("tasks", {}).items() if name == "launch-trainjob")
    assert launch["inputs"]["parameters"]["timeout_seconds"]["runtimeValue"]["constant"] == 7200
    # item 8: the pipeline's Pushgateway reaches the launcher, which puts it in the job's command
    assert launch["inputs"]["parameters"]["pushgateway"]["componentInputParameter"].endswith("pushgateway")
    executor = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-launch-trainjob"]
    assert int(executor["activeDeadlineSeconds"]) == 7200 + cluster.LAUNCHER_GRACE_SECONDS
    assert load_profile(profile).trainjob.deadline_seconds == 7200
    assert manifest(timeout_seconds=7200)["spec"]["activeDeadlineSeconds"] == 7200
