"""Where the pipelines keep state that outlives a task: the storage layout under one root.

On the cluster the root is ``/mnt/mtlflow`` and each sub-tree is a PersistentVolumeClaim from
``k8s/base/pvc.yaml`` mounted there; locally the root is a folder (``<workdir>/storage``). The layout
is fixed at compile time, like the volume mounts that back it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

#: mount root of the PVCs in every pipeline pod
CLUSTER_ROOT = "/mnt/mtlflow"
#: PVC name -> sub-directory of the root it is mounted at
VOLUMES = {"mtlflow-data": "data", "mtlflow-checkpoints": "checkpoints", "mtlflow-models": "models"}


#: where each kind of state lives, as path parts under the root
PLACES = {
    "dvc_remote": ("data", "dvc-remote"),
    "dvc_cache": ("data", "dvc-cache"),
    "datasets": ("data", "datasets"),
    "checkpoints": ("checkpoints", "runs"),
    "status": ("checkpoints", "status"),
    "models": ("models",),
}


@dataclass(frozen=True)
class StorageLayout:
    root: str = CLUSTER_ROOT
    dvc_remote: str = field(init=False)  # the default DVC remote: a local directory on the data volume
    dvc_cache: str = field(init=False)  # DVC's cache, shared by the data steps
    datasets: str = field(init=False)  # data sets staged for jobs outside KFP (TrainJobs), by content hash
    checkpoints: str = field(init=False)  # run directories (checkpoints, resumable), by run key
    status: str = field(init=False)  # one status record per pipeline run
    models: str = field(init=False)  # the model store (champions per benchmark)

    def __post_init__(self) -> None:
        for place, parts in PLACES.items():
            object.__setattr__(self, place, self._sub(*parts))

    def _sub(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def mount(self, claim: str) -> str:
        """Mount path of a PVC."""
        return self._sub(VOLUMES[claim])
