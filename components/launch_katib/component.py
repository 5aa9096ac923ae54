"""launch_katib: tuning on the cluster with Katib 0.19 -- one Experiment per method, its trials Kubeflow Trainer
TrainJobs running ``mtlflow train`` with the trial's values -- awaited, and each method's best trial returned.

The work is :func:`mtlflow.jobs.katib_launch.launch_katib`; the component only passes its artifacts' paths and
metadata. The search space, the budget in optimizer steps and the validation score are ``mtlflow tune``'s
(docs/guides/kubeflow.md, "Tuning with Katib"). Cluster only: Katib cannot run here, so the tests drive the
launcher against a stand-in for the Kubernetes API (``test_component.py``).
"""

from kfp import dsl

from mtlflow.components.image import IMAGE

#: tested against a stand-in for the Kubernetes API only: no Katib runs in this project's tests
STABILITY = "alpha"
#: what it needs besides Kubeflow Pipelines
SERVICES = ("Katib >= v0.19.0 (Experiment, kubeflow.org/v1beta1; TrainJob trials)",
            "Kubeflow Trainer v2 (TrainJob, trainer.kubeflow.org/v1alpha1) and the mtlflow-torch-distributed runtime",
            "the namespace label katib.kubeflow.org/metrics-collector-injection=enabled (k8s/base/namespace.yaml)",
            "RBAC on experiments for the pipeline pods (k8s/base/rbac.yaml)",
            "the mtlflow-data and mtlflow-checkpoints PersistentVolumeClaims (k8s/base)")


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def launch_katib(data: dsl.Input[dsl.Dataset], methods: list, storage_root: str, result: dsl.Output[dsl.Artifact],
                 image: str = "", tasks: list = [],  # noqa: B006 (kfp compiles the literal into the IR; never mutated)
                 budget_trials: int = 20, budget_steps: int = 0, seed: int = 0,
                 search_spaces: dict = {},  # noqa: B006 (as above)
                 hparams: dict = {},  # noqa: B006 (as above)
                 train_options: dict = {},  # noqa: B006 (as above)
                 parallel_trials: int = 1, startup_trials: int = 10, num_nodes: int = 1, gpus_per_node: int = 1,
                 namespace: str = "", timeout_seconds: int = 604800, run_id: str = "",
                 profile: dict = {}) -> dict:  # noqa: B006 (as above)
    """Stage the dataset on the data PVC, create one Katib Experiment per method (LS always) in ``namespace``
    (default: the profile's, else this pod's), wait until every one succeeded, and return each method's best
    trial: ``{study: {experiment, best_trial, train_options, hparams, metrics, trials, max_trials, budget_steps,
    trial_steps, ...}}`` (also written to ``result`` as katib.json).

    Each Experiment searches the method's space of ``mtlflow tune`` with Optuna's multivariate TPE (seeded),
    Katib's median stopping, and ``maxTrialCount`` = the whole trials that ``budget_trials`` trials (or
    ``budget_steps`` optimizer steps) hold; its objective is the validation score, the per-task validation
    metrics are additional metrics (the StdOut collector reads the lines ``mtlflow train --katib-metrics``
    prints). The trials write ``<checkpoints>/katib/<key>/<method>/<trial>`` with ``--resume``. The namespace
    must carry the label ``katib.kubeflow.org/metrics-collector-injection: enabled``; trial pods get no Istio
    sidecar. A retried launcher re-attaches to the Experiments of the same inputs; the Experiments are owned
    by this pod and deleted when it is terminated (a cancelled run).

    Args:
        data: the prepared dataset (from ``prepare_data``), with its content and DVC hashes in the metadata
        methods: the methods to tune (LS is always tuned: the baseline)
        storage_root: root of the data and checkpoint PVCs
        result: katib.json: every method's best trial, budget and trial counts
        image: the project image
        tasks: the tasks to train (empty: all)
        budget_trials: the budget of each method in whole trials (when ``budget_steps`` is 0)
        budget_steps: the budget of each method in optimizer steps (0: ``budget_trials`` trials)
        seed: the search seed (Katib's TPE ``random_state`` and every trial's training seed)
        search_spaces: ``*`` or a method to ``{setting: {scale, low, high} | {choices} | null}``
        hparams: a method to its fixed hyper-parameters (not searched)
        train_options: RunConfig fields of every trial (a shared setting given here is not searched)
        parallel_trials: Katib's parallelTrialCount of each Experiment
        startup_trials: random trials before TPE models the history
        num_nodes: nodes of each trial's TrainJob
        gpus_per_node: GPUs per node (one process each)
        namespace: namespace (default: the profile's, else the pod's)
        timeout_seconds: how long to wait for all Experiments
        run_id: the pipeline run's id (part of the Experiments' key)
        profile: the cluster profile (``mtlflow.config.cluster.ClusterProfile`` fields; ``{}``: the defaults)

    Returns:
        every method's best trial (the studies of katib.json)
    """
    from mtlflow.jobs.katib_launch import launch_katib as launch

    out = launch(data.path, dict(data.metadata), storage_root, list(methods), image, tasks=list(tasks) or None,
                 budget_trials=budget_trials, budget_steps=budget_steps or None, seed=seed,
                 search_spaces=search_spaces, hparams=hparams, train_options=train_options,
                 parallel_trials=parallel_trials, startup_trials=startup_trials, num_nodes=num_nodes,
                 gpus_per_node=gpus_per_node, namespace=namespace, timeout_seconds=timeout_seconds, run_id=run_id,
                 profile=profile, result_out=result.path)
    result.metadata.update({"work_dir": out["work_dir"], "studies": sorted(out["studies"])})
    return out["studies"]
