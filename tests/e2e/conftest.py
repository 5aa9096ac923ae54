"""Fixtures of the end-to-end tests: the built image, a work directory UID 1000 can write, a run label."""

from __future__ import annotations

import subprocess
import uuid
from pathlib import Path

import pytest
from e2e_support import IMAGE, REPO_ROOT, folder_for_uid_1000


@pytest.fixture(scope="session")
def image() -> str:
    """The built image's name; fails with the fix when the daemon or the image is missing."""
    subprocess.run([str(REPO_ROOT / "tools" / "docker-daemon.sh")], check=True)
    found = subprocess.run(["docker", "image", "inspect", IMAGE], capture_output=True, text=True)
    if found.returncode != 0:
        pytest.fail(f"image {IMAGE} not built: run `make e2e` (or `make image IMAGE={IMAGE}`) first")
    from mtlflow.components.image import IMAGE as component_image

    assert component_image == IMAGE, "the components must be compiled with MTLFLOW_IMAGE naming the image under test"
    return IMAGE


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A work directory that UID 1000 in the containers can write."""
    return folder_for_uid_1000(tmp_path / "work")


@pytest.fixture
def run_label() -> dict[str, str]:
    """A label that tells this test's containers apart in the daemon's event log."""
    return {"mtlflow.e2e": uuid.uuid4().hex}
