"""The Dockerfile, linted (no Docker engine runs here): a pinned base, pinned requirements, the
project + kfp 2.17.0 + CUDA torch 2.14.1, a non-root user, no secrets, a healthy `mtlflow --help`
entrypoint, every COPY source present, and `make image` building it."""

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


def test_base_image_is_pinned_to_a_full_version(parsed):
    base = next(a for i, a in parsed if i == "ARG" and a.startswith("BASE_IMAGE="))
    image = base.split("=", 1)[1]
    assert re.fullmatch(r"python:3\.11\.\d+-slim-bookworm(@sha256:[0-9a-f]{64})?", image), image
    assert args_of(parsed, "FROM") == ["${BASE_IMAGE}"]


def test_requirements_are_pinned_and_hold_the_cluster_stack(parsed):
    reqs = [l.split("#")[0].strip() for l in (ROOT / "requirements.txt").read_text().splitlines()]
    reqs = [r for r in reqs if r]
    assert all(re.fullmatch(r"[A-Za-z0-9_.\-\[\]]+==[\w.+!-]+", r) for r in reqs), [r for r in reqs if "==" not in r]
    for pin in ("torch==2.14.1", "torchvision==0.29.1", "kfp==2.17.0", "kfp-kubernetes==2.17.0", "dvc==3.67.1"):
        assert pin in reqs
    constraints = [l.strip() for l in (ROOT / "constraints.txt").read_text().splitlines() if l.strip() and not l.startswith("#")]
    assert all("==" in c or c.startswith("-e") for c in constraints)
    runs = " ".join(args_of(parsed, "RUN"))
    assert "pip install ${PIP_OPTIONS} -r requirements.txt -c constraints.txt" in runs
    assert "--no-deps ." in runs, "the project itself is installed without re-resolving dependencies"
    assert "mtlflow --help" in runs, "the build fails when the entrypoint is broken"


def test_runs_as_non_root(parsed):
    users = args_of(parsed, "USER")
    assert users and users[-1].split(":")[0] not in ("0", "root")
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


def test_entrypoint_and_healthcheck_run_the_cli(parsed):
    assert json.loads(args_of(parsed, "ENTRYPOINT")[-1]) == ["mtlflow"]
    health = args_of(parsed, "HEALTHCHECK")[-1]
    assert health.split("CMD", 1)[1].strip() == '["mtlflow", "--help"]'
    proc = subprocess.run([sys.executable, "-m", "mtlflow", "--help"], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0 and "pipeline" in proc.stdout


def test_copy_sources_exist_and_make_image_builds_this_dockerfile(parsed):
    for arg in args_of(parsed, "COPY"):
        sources = [s for s in shlex.split(arg)[:-1] if not s.startswith("--")]
        for source in sources:
            assert (ROOT / source).exists(), source
    bind_sources = re.findall(r"--mount=type=bind,source=([^,\s]+)", " ".join(args_of(parsed, "RUN")))
    assert bind_sources and all((ROOT / s).exists() for s in bind_sources)
    dry = subprocess.run(["make", "-n", "image", "IMAGE=reg.example/mtlflow:t", "GIT_REV=abc"], cwd=ROOT,
                         capture_output=True, text=True, timeout=60)
    assert dry.returncode == 0
    assert "docker build" in dry.stdout and "--build-arg GIT_REV=abc -t reg.example/mtlflow:t ." in dry.stdout
