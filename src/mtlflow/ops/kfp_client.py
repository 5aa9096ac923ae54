"""Submitting compiled pipelines to a Kubeflow Pipelines API server: one run (CI-triggered
retraining) or a recurring run (nightly sweeps), through ``kfp.Client``.

Parameters are validated and the pipeline compiled *before* any request is sent, so an invalid
sweep never reaches the cluster. Authentication: ``$MTLFLOW_KFP_TOKEN`` (a bearer token, e.g. a
service-account token in CI) when set; otherwise kfp's own defaults (in-cluster credentials,
``~/.config/kfp/context.json`` cookies).
"""

from __future__ import annotations

import os
import tempfile
import time
from pathlib import Path
from typing import Any, Mapping

from mtlflow.config.pipeline import validate_cron
from mtlflow.core.errors import InvalidParameterError, MtlflowError

TOKEN_ENV = "MTLFLOW_KFP_TOKEN"


class SubmissionError(MtlflowError):
    """The API server refused or could not be reached (exit code 6)."""

    exit_code = 6


def _check_host(host: str) -> None:
    if not host.startswith(("http://", "https://")):
        raise InvalidParameterError(f"--host {host!r} must be an http(s) URL of the KFP API, "
                                    "e.g. https://kubeflow.example.com/pipeline")


def _client(host: str, namespace: str | None = None) -> Any:
    import warnings

    import kfp

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # "only works with KFP v2.0.0-beta.2 and later"
        return kfp.Client(host=host, namespace=namespace or "kubeflow", existing_token=os.environ.get(TOKEN_ENV) or None)


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


def _compiled(pipeline: str, params: Mapping[str, Any], directory: Path) -> Path:
    from mtlflow.pipelines import runner

    runner.validate_params(pipeline, params)
    return runner.compile_pipeline(directory / f"{runner.canonical_name(pipeline)}.yaml", pipeline=pipeline)


def submit(host: str, pipeline: str, params: Mapping[str, Any], experiment: str = "mtlflow",
           run_name: str | None = None, namespace: str | None = None, enable_caching: bool | None = None,
           service_account: str | None = None) -> dict[str, str]:
    """Validate, compile and start one run of ``pipeline``; returns ``{run_id, run_name, experiment}``."""
    _check_host(host)
    with tempfile.TemporaryDirectory(prefix="mtlflow-submit-") as tmp:
        package = _compiled(pipeline, params, Path(tmp))
        client = _client(host, namespace)
        name = run_name or f"{package.stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        result = _call("creating the run", host, client.create_run_from_pipeline_package, str(package),
                       arguments=dict(params), run_name=name, experiment_name=experiment, namespace=namespace,
                       enable_caching=enable_caching, service_account=service_account)
    return {"run_id": result.run_id, "run_name": name, "experiment": experiment}


def schedule(host: str, pipeline: str, cron: str, params: Mapping[str, Any], experiment: str = "mtlflow",
             job_name: str | None = None, namespace: str | None = None,
             service_account: str | None = None) -> dict[str, str]:
    """Create a recurring run of ``pipeline`` on a 6-field KFP cron, at most one run at a time and no
    catch-up of missed intervals; returns ``{recurring_run_id, job_name, cron}``."""
    _check_host(host)
    cron = validate_cron(cron)
    with tempfile.TemporaryDirectory(prefix="mtlflow-schedule-") as tmp:
        package = _compiled(pipeline, params, Path(tmp))
        client = _client(host, namespace)
        exp = _call("creating the experiment", host, client.create_experiment, name=experiment, namespace=namespace)
        name = job_name or f"{package.stem}-nightly"
        job = _call("creating the recurring run", host, client.create_recurring_run, experiment_id=exp.experiment_id,
                    job_name=name, cron_expression=cron, max_concurrency=1, no_catchup=True,
                    params=dict(params), pipeline_package_path=str(package), service_account=service_account)
    return {"recurring_run_id": job.recurring_run_id, "job_name": name, "cron": cron}
