"""The distributed launch behind the ``launch_trainjob`` component: stage the dataset on the data PVC, submit
a Kubeflow Trainer TrainJob (or a training-operator v1 PyTorchJob) that runs ``torchrun -m mtlflow train``,
wait for it and collect its run directory. No kfp import here: the component copies the returned metadata
into its ``run`` artifact, and the tests drive this with a stand-in for the Kubernetes API.
"""

from __future__ import annotations

import dataclasses
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from mtlflow.config.cluster import ClusterProfile
from mtlflow.config.pipeline import from_struct, run_key
from mtlflow.core import atomic
from mtlflow.core.errors import InvalidParameterError
from mtlflow.ops import dvc as dvc_io
from mtlflow.ops import k8s_jobs
from mtlflow.ops.storage import StorageLayout

#: the PersistentVolumeClaims the job mounts, at the paths the launcher sees them (StorageLayout.mount)
JOB_CLAIMS = ("mtlflow-data", "mtlflow-checkpoints")


def stage_dataset(data: str, data_metadata: Mapping[str, Any], layout: StorageLayout) -> tuple[Path, str]:
    """Copy the Dataset at ``data`` to ``<datasets>/<content hash>`` on the data PVC (once: a staged copy is
    kept; the copy is atomic, so a killed launcher leaves none half-written), after checking its DVC hash.
    Returns the staged path and the content hash."""
    content_hash = data_metadata.get("content_hash")
    if not content_hash:
        raise InvalidParameterError("the dataset has no content_hash in its metadata: pass prepare_data's "
                                    "data output")
    if data_metadata.get("dvc_hash"):
        dvc_io.verify_directory(data, data_metadata["dvc_hash"])
    staged = Path(layout.datasets) / content_hash
    if not staged.is_dir():
        with atomic.atomic_dir(staged) as tmp:
            shutil.copytree(data, tmp, dirs_exist_ok=True)
    return staged, content_hash


def launch_trainjob(data: str, data_metadata: Mapping[str, Any], run_out: str, model_out: str, run_spec: str,
                    epochs: int, train_options: Mapping[str, Any], storage_root: str, kind: str = "TrainJob",
                    num_nodes: int = 1, gpus_per_node: int = 2, image: str = "", namespace: str = "",
                    timeout_seconds: int = 86400, run_id: str = "", profile: Mapping[str, Any] | None = None,
                    pushgateway: str = "", pipeline_run: str = "") -> dict[str, Any]:
    """Train ``run_spec`` as a ``kind`` job of ``num_nodes x gpus_per_node`` processes running ``image`` in
    ``namespace`` (default: the profile's, else this pod's) and copy its run directory to ``run_out`` (without
    the checkpoint) and its weights to ``model_out``. The job writes ``<checkpoints>/<run key>`` with
    ``--resume``; the key includes ``run_id``, so a retried launcher re-attaches to the job of the same inputs
    (:func:`mtlflow.ops.k8s_jobs.run_job`). The job is owned by this pod when it runs in one, deleted when this
    launcher is terminated, and deleted once its run directory is copied. Returns the ``run`` artifact's
    metadata (job name, kind, data hash, topology)."""
    if not image:
        raise InvalidParameterError("launch_trainjob needs the image the job runs (the project image)")
    layout = StorageLayout(storage_root)
    cluster_profile = ClusterProfile.model_validate(from_struct(dict(profile or {})))
    options = from_struct(dict(train_options))
    staged, content_hash = stage_dataset(data, data_metadata, layout)
    key = run_key(run_spec, content_hash, epochs, options, run_id)
    work_dir = Path(layout.checkpoints) / key
    job = k8s_jobs.DistributedTraining(
        name=k8s_jobs.job_name(key), image=image,
        namespace=namespace or cluster_profile.namespace or k8s_jobs.current_namespace(),
        command=k8s_jobs.train_command(str(staged), str(work_dir), run_spec, epochs, options, pushgateway,
                                       pipeline_run),
        num_nodes=num_nodes, gpus_per_node=gpus_per_node, profile=cluster_profile, timeout_seconds=timeout_seconds,
        volumes=tuple(k8s_jobs.Volume(claim, layout.mount(claim)) for claim in JOB_CLAIMS), run_id=run_id)
    manifest = k8s_jobs.build_manifest(kind, job)  # checks the kind and the job before any request
    # said before the first request, so the log shows what was to run when the cluster's API refuses
    print(f"submitting {kind} {job.namespace}/{job.name}: {' '.join(job.command)}")
    api = k8s_jobs.custom_objects_api()
    owner = k8s_jobs.launcher_owner(k8s_jobs.core_api(), job.namespace)
    if owner:
        manifest = k8s_jobs.build_manifest(kind, dataclasses.replace(job, owner=owner))
    with k8s_jobs.deleted_on_termination(manifest, api):
        k8s_jobs.run_job(manifest, api, timeout_seconds=timeout_seconds)
    shutil.copytree(work_dir, run_out, ignore=shutil.ignore_patterns("checkpoint.pt"), dirs_exist_ok=True)
    shutil.copyfile(work_dir / "model.pt", model_out)
    k8s_jobs.delete_job(manifest, api)
    return {"job": job.name, "kind": kind, "data_hash": content_hash, "num_nodes": num_nodes,
            "gpus_per_node": gpus_per_node}
