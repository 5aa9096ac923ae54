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
    # without the deletion the second run is refused with the quota's own message
    full = FakeKubernetesApi({"run-0": ["Complete"]}, quota=1)
    k8s_jobs.run_job(manifest("run-0"), full, log=lambda line: None, **NO_SLEEP)
    with pytest.raises(k8s_jobs.JobFailedError, match=r"could not create TrainJob mtlflow-dev/run-1: HTTP 403 "
                       r"Forbidden: .*exceeded quota: mtlflow-compute"):
        k8s_jobs.run_job(manifest("run-1"), full, log=lambda line: None, **NO_SLEEP)


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
