"""The project image under test and how its containers run here (`make e2e` builds the image first).

Containers run the way the cluster runs them, only stricter: as UID 1000, with a read-only root file system
(tmpfs on /tmp and the cache, the work directory bind-mounted) and no network.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
#: the image `make e2e` builds and tags (the Makefile passes the same name as MTLFLOW_IMAGE)
IMAGE = os.environ.get("MTLFLOW_IMAGE", "ghcr.io/mtlflow/mtlflow-python:0.1.0")
#: what every component's container gets here: UID 1000, nothing writable but the mounted work directory and tmpfs
#: on /tmp and the cache, writable by the user like a Kubernetes emptyDir (a tmpfs over an image directory takes
#: that directory's mode but belongs to root unless uid= says otherwise)
STRICT_RUN = {"user": "1000:1000", "read_only": True, "network_mode": "none",
              "tmpfs": {"/tmp": "", "/var/cache/mtlflow": "uid=1000,gid=0"},
              "environment": {"OMP_NUM_THREADS": "1"}}


def folder_for_uid_1000(path: Path) -> Path:
    """A new folder that UID 1000 in the containers can write (the tests run as root on the host)."""
    path.mkdir()
    os.chown(path, 1000, 1000)
    return path


def docker_run(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    """``docker run --rm ARGS`` with its output captured."""
    return subprocess.run(["docker", "run", "--rm", *args], capture_output=True, text=True, timeout=timeout)
