"""Submitting compiled pipelines to a Kubeflow Pipelines API server: one run (CI-triggered
retraining) or a recurring run (nightly sweeps), through ``kfp.Client``.

The callers (``mtlflow pipeline submit | schedule``, ``mtlflow reproduce --pipeline --host``) validate the
parameters and compile the pipeline *before* any request is sent, so an invalid sweep never reaches the
cluster; this module takes the compiled package. Runs start from an uploaded pipeline version, not an embedded
spec: the pipeline is found by its IR name (uploaded on first use) and the version is named by the
SHA-256 of the compiled package, so it is uploaded once per pipeline content and every run and
recurring run links to the exact version it ran. ``schedule_package`` is idempotent: it keeps one recurring
run per name in the experiment, replacing one whose version, cron or parameters differ.

Backend version: before a package whose tasks carry a ``securityContext`` is uploaded, the backend's release is
read (``tag_name`` of ``/apis/v1beta1/healthz``; v2beta1's healthz names none): a backend before 2.16 does not
know the field (2.14 and 2.15 refuse the run, 'unknown field "securityContext"'; older ones drop it silently), so
submitting to one is refused with one line naming the profile's ``kfp_backend`` setting, which compiles without it.

Authentication: ``$MTLFLOW_KFP_TOKEN`` (a bearer token, e.g. a service-account token in CI) when
set; otherwise kfp's own defaults (in-cluster credentials, ``~/.config/kfp/context.json`` cookies).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import sys
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from mtlflow.config.cluster import TASK_SECURITY_CONTEXT_SINCE, supports_task_security_context, version_tuple
from mtlflow.config.pipeline import validate_cron
from mtlflow.core.errors import InvalidParameterError, MtlflowError

TOKEN_ENV = "MTLFLOW_KFP_TOKEN"
#: recurring runs listed per request when looking for those of one name (duplicates included)
PAGE_SIZE = 100


class SubmissionError(MtlflowError):
    """The API server refused or could not be reached (exit code 6)."""

    exit_code = 6


def check_host(host: str) -> None:
    """Refuse a ``--host`` that is not an http(s) URL (before anything is compiled or sent)."""
    if not host.startswith(("http://", "https://")):
        raise InvalidParameterError(f"--host {host!r} must be an http(s) URL of the KFP API, "
                                    "e.g. https://kubeflow.example.com/pipeline")


def _call(what: str, host: str, func, *args, **kwargs):
    try:
        return func(*args, **kwargs)
    except MtlflowError:
        raise
    except Exception as exc:  # ApiException, urllib3 errors: one line for the user
        status = getattr(exc, "status", None)
        detail = f"HTTP {status} {getattr(exc, 'reason', '')}".strip() if status else f"{type(exc).__name__}: {exc}"
        raise SubmissionError(f"{what} at {host} failed ({detail.splitlines()[0]}); check --host, "
                              f"the experiment/namespace and ${TOKEN_ENV}") from None


def _client(host: str, namespace: str | None = None) -> Any:
    """A ``kfp.Client``; its constructor already calls ``/healthz`` (without a namespace), so building it
    is a request like any other and fails as one line."""
    import kfp

    def connect():
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)  # "only works with KFP v2.0.0-beta.2 and later"
            # kfp logs every failed /healthz attempt with its traceback before retrying; the failure
            # itself is reported by _call
            logging.disable(logging.ERROR)
            try:
                return kfp.Client(host=host, namespace=namespace or "kubeflow",
                                  existing_token=os.environ.get(TOKEN_ENV) or None)
            finally:
                logging.disable(logging.NOTSET)

    return _call("connecting to the KFP API", host, connect)


def backend_version(client: Any) -> str | None:
    """The release of the KFP backend ``client`` talks to (``2.15.0``), None when the server does not say:
    ``tag_name`` of the v1beta1 healthz, with the client's credentials (kfp.Client has no public call for it)."""
    api_client = client._healthz_api.api_client
    try:
        body = api_client.call_api("/apis/v1beta1/healthz", "GET", response_type="object", auth_settings=["Bearer"],
                                   _return_http_data_only=True)
    except Exception:  # an older or newer server without the v1beta1 API: the version is unknown
        return None
    tag = (body or {}).get("tag_name") if isinstance(body, dict) else None
    return tag if tag and version_tuple(tag) else None


def _tasks_with_security_context(package: Path) -> list[str]:
    documents = list(yaml.safe_load_all(package.read_text()))
    executors = {}
    for document in documents[1:]:
        executors.update((((document or {}).get("platforms") or {}).get("kubernetes") or {})
                         .get("deploymentSpec", {}).get("executors", {}))
    return sorted(name for name, spec in executors.items() if "securityContext" in spec)


def check_backend(client: Any, host: str, package: Path) -> str | None:
    """Refuse (:class:`SubmissionError`) a package whose tasks carry a securityContext when the backend is older
    than 2.16; returns the backend's release (None: unknown, said on stderr, and submitted)."""
    tasks = _tasks_with_security_context(package)
    version = backend_version(client)
    if tasks and version is None:
        print(f"warning: the KFP backend at {host} does not name its release; its tasks' securityContext needs KFP "
              f">= {'.'.join(map(str, TASK_SECURITY_CONTEXT_SINCE))}", file=sys.stderr)
    elif tasks and not supports_task_security_context(version):
        since = ".".join(map(str, TASK_SECURITY_CONTEXT_SINCE))
        raise SubmissionError(f"the KFP backend at {host} is {version}: before {since} its driver rejects the tasks' "
                              f"securityContext ({len(tasks)} tasks carry one); set kfp_backend: \"{version}\" in the "
                              f"cluster profile (--profile) to compile without it, or upgrade KFP to >= {since}")
    return version


def _equals(key: str, value: str) -> str:
    """A KFP API list filter selecting ``key == value``."""
    return json.dumps({"predicates": [{"operation": "EQUALS", "key": key, "stringValue": value}]})


def with_caching(package: Path, enabled: bool) -> Path:
    """Set every task's cache option in the compiled ``package`` (root and nested DAGs, e.g. loop
    bodies) to ``enabled``. A run started from a pipeline version cannot override caching (kfp's
    ``enable_caching`` rewrites only embedded specs), so ``--no-cache`` is a version of its own."""
    documents = list(yaml.safe_load_all(package.read_text()))
    spec = documents[0]
    dags = [spec["root"]["dag"], *(c["dag"] for c in spec.get("components", {}).values() if "dag" in c)]
    for dag in dags:
        for task in dag.get("tasks", {}).values():
            task["cachingOptions"] = {"enableCache": enabled} if enabled else {}
    package.write_text(yaml.safe_dump_all(documents, sort_keys=True))
    return package


def version_name(package: Path) -> tuple[str, str]:
    """``(pipeline name, version name)`` of a compiled package: the IR's pipeline name, and that name
    with the first 16 hex digits of the package's SHA-256 (the same content, the same version)."""
    name = next(yaml.safe_load_all(package.read_text()))["pipelineInfo"]["name"]
    return name, f"{name}-{hashlib.sha256(package.read_bytes()).hexdigest()[:16]}"


def pipeline_version(client: Any, host: str, package: Path, namespace: str | None = None) -> dict[str, str]:
    """The pipeline and version holding ``package``, uploading only what the server lacks: the pipeline
    (by name) the first time, a version once per content. Returns ``{pipeline_id, pipeline_version_id,
    pipeline_version}``."""
    name, version = version_name(package)
    found = _call("looking up the pipeline", host, client.list_pipelines, filter=_equals("display_name", name),
                  namespace=namespace).pipelines or []
    if found:
        pipeline_id = found[0].pipeline_id
    else:
        pipeline_id = _call("uploading the pipeline", host, client.upload_pipeline, str(package),
                            pipeline_name=name, namespace=namespace).pipeline_id
    versions = _call("looking up the pipeline version", host, client.list_pipeline_versions, pipeline_id,
                     filter=_equals("display_name", version)).pipeline_versions or []
    if versions:
        version_id = versions[0].pipeline_version_id
    else:
        version_id = _call("uploading the pipeline version", host, client.upload_pipeline_version, str(package),
                           version, pipeline_id=pipeline_id,
                           description=f"sha256 {hashlib.sha256(package.read_bytes()).hexdigest()}"
                           ).pipeline_version_id
    return {"pipeline_id": pipeline_id, "pipeline_version_id": version_id, "pipeline_version": version}


def submit_package(host: str, package: Path, params: Mapping[str, Any], experiment: str = "mtlflow",
                   run_name: str | None = None, namespace: str | None = None,
                   service_account: str | None = None) -> dict[str, str]:
    """Upload the compiled ``package``'s version if new and start one run of that version with ``params``
    (those it was validated with); returns ``{run_id, run_name, experiment, pipeline_id, pipeline_version_id,
    pipeline_version}``. Caching is the package's (:func:`with_caching` sets it for every task)."""
    check_host(host)
    client = _client(host, namespace)
    check_backend(client, host, package)
    version = pipeline_version(client, host, package, namespace)
    exp = _call("creating the experiment", host, client.create_experiment, name=experiment, namespace=namespace)
    name = run_name or f"{package.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
    result = _call("creating the run", host, client.run_pipeline, experiment_id=exp.experiment_id,
                   job_name=name, params=dict(params), pipeline_id=version["pipeline_id"],
                   version_id=version["pipeline_version_id"], service_account=service_account)
    return {"run_id": result.run_id, "run_name": name, "experiment": experiment, **version}


def _same_schedule(existing: Any, version_id: str, cron: str, params: Mapping[str, Any],
                   service_account: str | None) -> bool:
    """Whether a recurring run already runs ``version_id`` on ``cron`` with ``params``, enabled, one run
    at a time without catch-up (then ``schedule`` has nothing to change)."""
    reference = existing.pipeline_version_reference
    trigger = existing.trigger.cron_schedule if existing.trigger else None
    return (reference is not None and reference.pipeline_version_id == version_id
            and trigger is not None and trigger.cron == cron
            and dict((existing.runtime_config.parameters if existing.runtime_config else None) or {}) == dict(params)
            and str(existing.mode) == "ENABLE" and int(existing.max_concurrency or 0) == 1
            and bool(existing.no_catchup) and (existing.service_account or None) == (service_account or None))


def schedule_package(host: str, package: Path, cron: str, params: Mapping[str, Any], experiment: str = "mtlflow",
                     job_name: str | None = None, namespace: str | None = None,
                     service_account: str | None = None) -> dict[str, Any]:
    """Keep exactly one recurring run named ``job_name`` in ``experiment``: the compiled ``package``'s
    version on a 6-field KFP cron, at most one run at a time and no catch-up of missed intervals.
    An identical one is kept as it is; otherwise the new one is created first and every other of that
    name deleted after (KFP cannot update a recurring run), so a failed request never leaves none.
    Returns ``{recurring_run_id, job_name, cron, replaced, pipeline_id, pipeline_version_id, pipeline_version}``."""
    check_host(host)
    cron = validate_cron(cron)
    client = _client(host, namespace)
    check_backend(client, host, package)
    version = pipeline_version(client, host, package, namespace)
    exp = _call("creating the experiment", host, client.create_experiment, name=experiment, namespace=namespace)
    name = job_name or f"{package.stem}-nightly"
    existing = _call("listing the recurring runs", host, client.list_recurring_runs,
                     experiment_id=exp.experiment_id, page_size=PAGE_SIZE,
                     filter=_equals("display_name", name)).recurring_runs or []
    same = [r for r in existing if _same_schedule(r, version["pipeline_version_id"], cron, params, service_account)]
    if same:
        kept = same[0].recurring_run_id
    else:
        kept = _call("creating the recurring run", host, client.create_recurring_run,
                     experiment_id=exp.experiment_id, job_name=name, cron_expression=cron, max_concurrency=1,
                     no_catchup=True, params=dict(params), pipeline_id=version["pipeline_id"],
                     version_id=version["pipeline_version_id"],
                     service_account=service_account).recurring_run_id
    replaced = [r.recurring_run_id for r in existing if r.recurring_run_id != kept]
    for recurring_run_id in replaced:
        _call(f"deleting the replaced recurring run {recurring_run_id}", host, client.delete_recurring_run,
              recurring_run_id)
    return {"recurring_run_id": kept, "job_name": name, "cron": cron, "replaced": replaced, **version}
