"""The built image itself: runtime packages only and consistent, the CUDA build the docs name, the default user,
and writable cache/home directories for OpenShift's random UIDs in group 0."""

from __future__ import annotations

import json
import random
import re

from e2e_support import REPO_ROOT, docker_run

#: test and development tooling that requirements-dev.txt installs and the image must not hold (import names)
DEV_ONLY = ["pytest", "hypothesis", "kubernetes_validate", "xdist", "pytest_timeout", "mkdocs", "importlinter",
            "lightning", "docker"]


def test_image_holds_runtime_packages_only_and_pip_check_passes(image):
    probe = ("import importlib.util, json; "
             f"print(json.dumps({{n: importlib.util.find_spec(n) is not None for n in {DEV_ONLY!r}}}))")
    found = docker_run("--network", "none", image, "python3", "-c", probe)
    assert found.returncode == 0, found.stderr
    assert json.loads(found.stdout) == {name: False for name in DEV_ONLY}
    check = docker_run("--network", "none", image, "pip", "check")
    assert check.returncode == 0 and "No broken requirements" in check.stdout, check.stdout + check.stderr
    # what the runtime code imports lazily is there: the COST adapters (peft, which imports transformers), the
    # SMILES featuriser (rdkit), the components' SDK and DVC
    runtime = docker_run("--network", "none", image, "python3", "-c",
                         "import peft, transformers, rdkit.Chem, kfp, dvc.api, mtlflow.components.train.component")
    assert runtime.returncode == 0, runtime.stderr


def test_torch_is_the_cuda_build_the_docs_name_with_its_driver(image):
    versions = docker_run("--network", "none", image, "python3", "-c",
                          "import torch, torchvision; print(torch.__version__, torch.version.cuda, torchvision.__version__)")
    assert versions.returncode == 0, versions.stderr
    torch_version, cuda, torchvision_version = versions.stdout.split()
    assert (torch_version, torchvision_version) == ("2.14.1+cu130", "0.29.1+cu130")
    assert cuda == "13.0"
    # CUDA 13.0's minimum Linux driver is 580 (NVIDIA's CUDA 13.0 release notes, table 3)
    guide = (REPO_ROOT / "docs" / "guides" / "image.md").read_text()
    assert f"CUDA {cuda}" in guide and re.search(r"driver\S* >= 580", guide)


def test_default_user_is_1000_and_no_wheel_is_left_in_the_image(image):
    who = docker_run("--network", "none", image, "sh", "-c", "id -u; id -g; echo $HOME; ls /tmp/wheels 2>&1 || true")
    uid, gid, home, wheels = who.stdout.splitlines()
    assert (uid, gid, home) == ("1000", "0", "/home/mtlflow")
    assert "No such file" in wheels


def test_a_random_uid_in_group_0_writes_the_cache_and_home_but_another_group_does_not(image):
    """OpenShift's restricted SCC runs the container as an arbitrary UID with GID 0 and no passwd entry."""
    uid = str(random.randint(1_000_000_000, 1_999_999_999))
    write = ("set -e; touch /var/cache/mtlflow/probe $HOME/probe; mkdir -p /var/cache/mtlflow/data/x; "
             "python3 -c 'import mtlflow.jobs.cache as c; print(c.default_cache_dir())'")
    in_group_0 = docker_run("--network", "none", "--user", f"{uid}:0", image, "sh", "-c", write)
    assert in_group_0.returncode == 0, in_group_0.stderr
    assert in_group_0.stdout.strip() == "/var/cache/mtlflow"
    other_group = docker_run("--network", "none", "--user", f"{uid}:{uid}", image, "sh", "-c", write)
    assert other_group.returncode != 0 and "Permission denied" in other_group.stderr
