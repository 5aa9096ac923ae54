"""launch_trainjob: multi-GPU training as a Kubeflow Trainer TrainJob (or a training-operator v1
PyTorchJob) running the project image with ``torchrun -m mtlflow train``.

The work is :func:`mtlflow.jobs.launch.launch_trainjob`; the component only passes its artifacts' paths and
metadata. Cluster only: the launcher creates Kubernetes objects, which kfp.local cannot, so the tests here
drive it against a stand-in for the Kubernetes API (``test_component.py``) and run it under kfp.local up
to the first request (``test_component_local.py``).
"""

from kfp import dsl

from mtlflow.components.image import IMAGE

#: tested against a stand-in for the Kubernetes API only: no cluster runs in this project's tests
STABILITY = "beta"
#: what it needs besides Kubeflow Pipelines
SERVICES = ("Kubeflow Trainer v2 (TrainJob, trainer.kubeflow.org/v1alpha1) or training-operator v1 (PyTorchJob)",
            "RBAC on trainjobs/pytorchjobs for the pipeline pods (k8s/base/rbac.yaml)",
            "the mtlflow-data and mtlflow-checkpoints PersistentVolumeClaims (k8s/base)")


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def launch_trainjob(data: dsl.Input[dsl.Dataset], run_spec: str, epochs: int, train_options: dict,
                    storage_root: str, run: dsl.Output[dsl.Artifact], model: dsl.Output[dsl.Model],
                    kind: str = "TrainJob", num_nodes: int = 1, gpus_per_node: int = 2, image: str = "",
                    namespace: str = "", timeout_seconds: int = 86400, run_id: str = "",
                    profile: dict = {},  # noqa: B006 (kfp compiles the literal into the IR; the body never mutates it)
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

    Args:
        data: the prepared dataset (from ``prepare_data``), with its content and DVC hashes in the metadata
        run_spec: one run as JSON: ``{"method", "seed", "hparams"[, "tasks"]}`` (from the plan components)
        epochs: training epochs
        train_options: RunConfig fields (``mtlflow config schema``), e.g. ``{batch_size: 256, device: auto}``
        storage_root: root of the data and checkpoint PVCs
        run: the run directory (run.json, metrics.json, model.pt, report)
        model: the trained weights (model.pt)
        kind: ``TrainJob`` (Kubeflow Trainer) or ``PyTorchJob``
        num_nodes: nodes
        gpus_per_node: GPUs per node (one process each)
        image: the project image
        namespace: namespace (default: the profile's, else the pod's)
        timeout_seconds: how long to wait for the job (also its ``activeDeadlineSeconds``)
        run_id: the pipeline run's id (part of the run key)
        profile: the cluster profile (``mtlflow.config.cluster.ClusterProfile`` fields; ``{}``: the defaults)
        pushgateway: Prometheus Pushgateway the job's rank 0 pushes its telemetry to (empty: off)
        pipeline_run: the pipeline run's name, added to the grouping key of those pushes (the exit handler
            deletes the group by it)
    """
    from mtlflow.jobs.launch import launch_trainjob as launch

    run.metadata.update(launch(data.path, dict(data.metadata), run.path, model.path, run_spec, epochs, train_options,
                               storage_root, kind, num_nodes, gpus_per_node, image, namespace, timeout_seconds,
                               run_id, profile, pushgateway, pipeline_run))
