"""launch_trainjob: multi-GPU training as a Kubeflow Trainer TrainJob (or a training-operator v1
PyTorchJob) running the project image with ``torchrun -m mtlflow train``."""

from kfp import dsl

from mtlflow.components.image import IMAGE


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def launch_trainjob(data: dsl.Input[dsl.Dataset], run_spec: str, epochs: int, train_options: dict,
                    storage_root: str, run: dsl.Output[dsl.Artifact], model: dsl.Output[dsl.Model],
                    kind: str = "TrainJob", num_nodes: int = 1, gpus_per_node: int = 2, image: str = "",
                    namespace: str = "", timeout_seconds: int = 86400, run_id: str = "", profile: dict = {},
                    pushgateway: str = "", pipeline_run: str = ""):
    """Stage the dataset on the data PVC, submit the job (``kind`` TrainJob or PyTorchJob) in
    ``namespace`` (default: the profile's, else this pod's), wait for it, then copy the run directory
    from the checkpoints PVC to ``run``.

    The job writes to ``<checkpoints>/<run key>`` with ``--resume``. A retried launcher re-attaches to
    a running or finished job of the same inputs and re-creates a failed one, so neither a retry nor a
    restarted job loses finished epochs; the key (and the job name) include ``run_id``, the pipeline
    run's id, so another pipeline run gets its own job and directory. The job is deleted once its run
    directory is copied (or once it failed), so finished jobs hold no quota. ``profile`` is the cluster
    profile the pipeline was compiled with (node selector, tolerations, UID/fsGroup, pull Secrets,
    CPU/memory per GPU; ``{}``: the defaults). ``train_options["batch_size"]`` is per process: the
    global batch is ``num_nodes x gpus_per_node x batch_size``. ``pushgateway`` (empty: off): the job's
    rank 0 pushes its epoch telemetry there, as a training task does, grouped also by ``pipeline_run`` (the
    pipeline run's name, by which the pipeline's exit handler deletes the group when the run ends).

    A cancelled run does not leave the job holding its GPUs: the job is owned by this pod (deleted with it
    by the garbage collector), is deleted by this launcher when it is terminated (SIGTERM), and stops at
    ``timeout_seconds`` (its ``activeDeadlineSeconds``) at the latest.
    Needs RBAC on trainjobs/pytorchjobs for the pipeline pods (``k8s/base/rbac.yaml``).
    """
    import dataclasses
    import shutil
    from pathlib import Path

    from mtlflow.config.cluster import ClusterProfile
    from mtlflow.config.pipeline import from_struct, run_key
    from mtlflow.core import atomic
    from mtlflow.core.errors import InvalidParameterError
    from mtlflow.ops import dvc as dvc_io
    from mtlflow.ops import k8s_jobs
    from mtlflow.ops.storage import StorageLayout

    if not image:
        raise InvalidParameterError("launch_trainjob needs the image the job runs (the project image)")
    layout = StorageLayout(storage_root)
    cluster_profile = ClusterProfile.model_validate(from_struct(profile))
    train_options = from_struct(train_options)
    content_hash = data.metadata["content_hash"]
    if data.metadata.get("dvc_hash"):
        dvc_io.verify_directory(data.path, data.metadata["dvc_hash"])
    staged = Path(layout.datasets) / content_hash
    if not staged.is_dir():
        with atomic.atomic_dir(staged) as tmp:
            shutil.copytree(data.path, tmp, dirs_exist_ok=True)
    key = run_key(run_spec, content_hash, epochs, train_options, run_id)
    work_dir = Path(layout.checkpoints) / key
    job = k8s_jobs.DistributedTraining(
        name=k8s_jobs.job_name(key), image=image,
        namespace=namespace or cluster_profile.namespace or k8s_jobs.current_namespace(),
        command=k8s_jobs.train_command(str(staged), str(work_dir), run_spec, epochs, train_options, pushgateway,
                                       pipeline_run),
        num_nodes=num_nodes, gpus_per_node=gpus_per_node, profile=cluster_profile, timeout_seconds=timeout_seconds,
        volumes=tuple(k8s_jobs.Volume(claim, layout.mount(claim)) for claim in ("mtlflow-data", "mtlflow-checkpoints")),
        run_id=run_id)
    manifest = k8s_jobs.build_manifest(kind, job)  # checks the kind and the job before any request
    # said before the first request, so the log shows what was to run when the cluster's API refuses
    print(f"submitting {kind} {job.namespace}/{job.name}: {' '.join(job.command)}")
    api = k8s_jobs.custom_objects_api()
    owner = k8s_jobs.launcher_owner(k8s_jobs.core_api(), job.namespace)
    if owner:
        manifest = k8s_jobs.build_manifest(kind, dataclasses.replace(job, owner=owner))
    with k8s_jobs.deleted_on_termination(manifest, api):
        k8s_jobs.run_job(manifest, api, timeout_seconds=timeout_seconds)
    shutil.copytree(work_dir, run.path, ignore=shutil.ignore_patterns("checkpoint.pt"), dirs_exist_ok=True)
    shutil.copyfile(work_dir / "model.pt", model.path)
    k8s_jobs.delete_job(manifest, api)
    run.metadata.update({"job": job.name, "kind": kind, "data_hash": content_hash, "num_nodes": num_nodes,
                         "gpus_per_node": gpus_per_node})
