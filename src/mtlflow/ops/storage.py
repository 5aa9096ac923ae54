"""Where the pipelines keep state that outlives a task: the storage layout under one root.

On the cluster the root is ``/mnt/mtlflow`` and each sub-tree is a PersistentVolumeClaim from
``k8s/base/pvc.yaml`` mounted there; locally the root is a folder (``<workdir>/storage``). The layout
is fixed at compile time, like the volume mounts that back it.
"""

from __future__ import annotations

from dataclasses import dataclass

#: mount root of the PVCs in every pipeline pod
CLUSTER_ROOT = "/mnt/mtlflow"
#: PVC name -> sub-directory of the root it is mounted at
VOLUMES = {"mtlflow-data": "data", "mtlflow-checkpoints": "checkpoints", "mtlflow-models": "models"}


@dataclass(frozen=True)
class StorageLayout:
    root: str = CLUSTER_ROOT

    def _sub(self, *parts: str) -> str:
        return "/".join([self.root.rstrip("/"), *parts])

    def mount(self, claim: str) -> str:
        """Mount path of a PVC."""
        return self._sub(VOLUMES[claim])

    @property
    def dvc_remote(self) -> str:
        """The default DVC remote: a local directory on the data volume."""
        return self._sub("data", "dvc-remote")

    @property
    def dvc_cache(self) -> str:
        return self._sub("data", "dvc-cache")

    @property
    def datasets(self) -> str:
        """Datasets staged for jobs outside KFP (TrainJobs), by content hash."""
        return self._sub("data", "datasets")

    @property
    def checkpoints(self) -> str:
        return self._sub("checkpoints", "runs")

    @property
    def status(self) -> str:
        return self._sub("checkpoints", "status")

    @property
    def models(self) -> str:
        return self._sub("models")
