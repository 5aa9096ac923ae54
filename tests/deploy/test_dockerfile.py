"""The Dockerfile and the requirements split, statically (`make e2e` builds and runs the image: tests/e2e/):
a local base and pinned requirements installed offline from wheels/, a runtime image without test tooling, a
build without a BuildKit frontend image, a non-root user in group 0, no secrets, every COPY source present, and
`make image` building it."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECRET_WORDS = re.compile(r"(SECRET|PASSWORD|PASSWD|TOKEN|ACCESS_KEY|API_KEY|CREDENTIAL)", re.I)


def instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with line continuations joined and comments dropped."""
    logical, current = [], ""
    for line in (ROOT / "Dockerfile").read_text().splitlines():
        stripped = line.strip()
        if not current and (not stripped or stripped.startswith("#")):
            continue
        if stripped.startswith("#"):
            continue
        current += " " + stripped.rstrip("\\").strip()
        if not stripped.endswith("\\"):
            logical.append(current.strip())
            current = ""
    return [(text.split(None, 1)[0].upper(), text.split(None, 1)[1] if " " in text else "") for text in logical]


@pytest.fixture(scope="module")
def parsed():
    return instructions()


def args_of(parsed, name):
    return [a for i, a in parsed if i == name]


def test_base_image_is_the_local_debootstrap_base_and_no_frontend_is_pulled(parsed):
    base = next(a for i, a in parsed if i == "ARG" and a.startswith("BASE_IMAGE="))
    assert base.split("=", 1)[1] == "local/debian-python:3.11-bookworm"
    assert args_of(parsed, "FROM") == ["${BASE_IMAGE} AS build", "${BASE_IMAGE}"]
    text = (ROOT / "Dockerfile").read_text()
    directives = re.match(r"(\s*#\s*\w+=.*\n)*", text).group(0)  # parser directives come first, if any
    assert "syntax" not in directives, "a syntax directive makes BuildKit pull a frontend image (no registry here)"
    assert "--mount" not in " ".join(args_of(parsed, "RUN")), "RUN --mount needs BuildKit; the classic builder too"
    makefile = (ROOT / "Makefile").read_text()
    assert re.search(r"^BASE_IMAGE \?= local/debian-python:3\.11-bookworm$", makefile, re.M)


def pins(path: Path) -> dict[str, str]:
    """Normalised name -> exact version of a pip requirements file (every line must be an exact pin)."""
    lines = [l.split("#")[0].strip() for l in path.read_text().splitlines()]
    found = {}
    for line in filter(None, lines):
        match = re.fullmatch(r"([A-Za-z0-9_.\-]+)(\[[\w,-]+\])?==([\w.+!-]+)", line)
        assert match, f"{path.name}: {line!r} is not an exact pin"
        found[re.sub(r"[-_.]+", "-", match.group(1)).lower()] = match.group(3)
    return found


#: test and development tooling: never in the image (requirements-dev.txt only)
DEV_TOOLING = {"pytest", "pytest-timeout", "pytest-xdist", "hypothesis", "kubernetes-validate", "mkdocs",
               "mkdocs-material", "mkdocstrings", "mkdocstrings-python", "import-linter", "grimp", "lightning",
               "docker"}


def test_runtime_requirements_hold_the_cluster_stack_and_no_test_tooling(parsed):
    runtime, dev = pins(ROOT / "requirements.txt"), pins(ROOT / "requirements-dev.txt")
    for name, version in {"torch": "2.14.1", "torchvision": "0.29.1", "kfp": "2.17.0", "kfp-kubernetes": "2.17.0",
                          "dvc": "3.67.1", "peft": "0.21.2", "rdkit": "2026.9.1"}.items():
        assert runtime.get(name) == version, name
    assert not DEV_TOOLING & runtime.keys(), sorted(DEV_TOOLING & runtime.keys())
    assert DEV_TOOLING <= dev.keys(), sorted(DEV_TOOLING - dev.keys())
    assert not runtime.keys() & dev.keys(), "a package is pinned in both files"
    constraints = pins(ROOT / "constraints.txt")
    for name, version in {**runtime, **dev}.items():
        assert constraints.get(name, version) == version, f"{name}: requirements and constraints disagree"
    assert {"setuptools", "wheel"} <= constraints.keys(), "the offline build backend is pinned"


def test_image_installs_only_the_runtime_requirements_from_wheels_and_checks_them(parsed):
    runs = " ".join(args_of(parsed, "RUN"))
    assert "-r /tmp/mtlflow/requirements.txt -c /tmp/mtlflow/constraints.txt" in runs
    assert "requirements-dev" not in (ROOT / "Dockerfile").read_text()
    assert "pip wheel ${PIP_OPTIONS} --no-deps -w /tmp/dist /tmp/mtlflow" in runs
    assert "pip install --no-index --no-deps /tmp/dist/*.whl" in runs, "the project without re-resolving its requirements"
    assert "pip check" in runs and "mtlflow --help" in runs
    pip_options = next(a for i, a in parsed if i == "ARG" and a.startswith("PIP_OPTIONS="))
    assert pip_options == 'PIP_OPTIONS="--no-index --find-links /tmp/wheels"'
    # the wheels reach the build stage only; the runtime stage copies the environment and the project's wheel
    runtime_stage = parsed[max(n for n, (i, _) in enumerate(parsed) if i == "FROM"):]
    copies = [a for i, a in runtime_stage if i == "COPY"]
    assert copies == ["--from=build /opt/mtlflow/venv /opt/mtlflow/venv", "--from=build /tmp/dist /tmp/dist"]
    makefile = (ROOT / "Makefile").read_text()
    assert "pip wheel --disable-pip-version-check -q -w wheels -r requirements.txt -c constraints.txt" in makefile
    assert "requirements-dev.txt" in makefile.split("$(STAMP):", 1)[1].split("\n\n", 1)[0], "make install: both"


def test_cache_and_home_are_group_0_writable_for_random_uids(parsed):
    runs = " ".join(args_of(parsed, "RUN"))
    assert "--gid 0" in runs and "chown 1000:0 /home/mtlflow /var/cache/mtlflow" in runs
    assert "chmod 0775 /home/mtlflow /var/cache/mtlflow" in runs
    env = " ".join(args_of(parsed, "ENV"))
    assert "HOME=/home/mtlflow" in env and "MTLFLOW_CACHE=/var/cache/mtlflow" in env
    # DVC's default site cache, /var/tmp/dvc, is not writable under readOnlyRootFilesystem
    assert "DVC_SITE_CACHE_DIR=/var/cache/mtlflow/dvc" in env


def test_runs_as_non_root(parsed):
    users = args_of(parsed, "USER")
    assert users and users[-1] == "1000:0"
    last_user = max(n for n, (i, _) in enumerate(parsed) if i == "USER")
    assert not any(i in ("RUN", "COPY", "ADD") for i, _ in parsed[last_user:]), "nothing runs as root after USER"


def test_no_secrets_in_the_image(parsed):
    for name in ("ENV", "ARG", "LABEL"):
        for arg in args_of(parsed, name):
            keys = re.findall(r"([A-Za-z_][A-Za-z0-9_.]*)=", arg) or [arg.split()[0]]
            assert not any(SECRET_WORDS.search(k) for k in keys), arg
    for arg in args_of(parsed, "COPY") + args_of(parsed, "ADD"):
        assert not re.search(r"\.env\b|secret|credential|\.dvc/config\.local|kube", arg, re.I), arg
    ignored = (ROOT / ".dockerignore").read_text().split()
    for pattern in (".git", ".venv", ".dvc/config.local", "**/*.env", "k8s/**/secret*.yaml"):
        assert pattern in ignored


def test_no_entrypoint_so_the_task_command_runs_and_healthcheck_runs_the_cli(parsed):
    """Kubernetes replaces an ENTRYPOINT with the task's command, but kfp.local's DockerRunner passes the command as
    the container's arguments: an ENTRYPOINT would run `mtlflow sh -ec ...` there."""
    assert not args_of(parsed, "ENTRYPOINT")
    assert json.loads(args_of(parsed, "CMD")[-1]) == ["mtlflow", "--help"]
    health = args_of(parsed, "HEALTHCHECK")[-1]
    assert health.split("CMD", 1)[1].strip() == '["mtlflow", "--help"]'
    proc = subprocess.run([sys.executable, "-m", "mtlflow", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "pipeline" in proc.stdout


def test_copy_sources_exist_and_make_image_builds_this_dockerfile(parsed):
    for arg in args_of(parsed, "COPY"):
        if arg.startswith("--from="):
            continue  # from the build stage
        sources = [s for s in shlex.split(arg)[:-1] if not s.startswith("--")]
        for source in sources:
            assert (ROOT / source).exists(), source
    dry = subprocess.run(["make", "-n", "image", "IMAGE=reg.example/mtlflow:t", "GIT_REV=abc"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    assert "DOCKER_BUILDKIT=0 docker build --network none --build-arg BASE_IMAGE=local/debian-python:3.11-bookworm" \
        in dry.stdout
    assert "--build-arg GIT_REV=abc -t reg.example/mtlflow:t ." in dry.stdout
    assert "tools/base-image.sh local/debian-python:3.11-bookworm" in dry.stdout
    named = subprocess.run(["make", "-n", "image", "MTLFLOW_IMAGE=reg.example/named:1"], cwd=ROOT,
                           capture_output=True, text=True, timeout=60)
    assert "-t reg.example/named:1 ." in named.stdout, "MTLFLOW_IMAGE names the image the pipelines compile against"
