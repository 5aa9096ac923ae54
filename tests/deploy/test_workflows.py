"""The GitHub Actions workflows: actionlint (the pinned dev dependency) finds nothing in .github/workflows, and
the structure the retraining defects were about holds, read from the YAML: retraining starts on a committed
data version (dvc.lock or a .dvc file, never the DVC-managed data/ that git does not see), the image is pushed
only by a job that needs the passed tests, the pipeline is submitted on the data version dvc.lock records; pull
requests get the tests, the compiled pipelines and the rendered manifests; every Python set-up caches pip over
the requirements files and installs CPU builds of the same exact torch pins.

actionlint runs with shellcheck and pyflakes off: they are optional plug-ins it uses when found on PATH, which
would make the result depend on the machine."""

from __future__ import annotations

import fnmatch
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
WORKFLOWS = ROOT / ".github" / "workflows"
ACTIONLINT = Path(sys.executable).parent / "actionlint"
REQUIREMENTS = ["requirements.txt", "requirements-dev.txt", "constraints.txt"]


def load(name: str) -> dict:
    workflow = yaml.safe_load((WORKFLOWS / name).read_text())
    workflow["on"] = workflow.pop(True, workflow.get("on"))  # YAML 1.1 reads the key `on` as true
    return workflow


def runs(job: dict) -> str:
    return "\n".join(step.get("run", "") for step in job["steps"])


def needed(workflow: dict, name: str) -> set[str]:
    """Every job that ``name`` waits for, directly or through other jobs."""
    direct = workflow["jobs"][name].get("needs", [])
    direct = [direct] if isinstance(direct, str) else direct
    return set(direct).union(*(needed(workflow, job) for job in direct))


def test_actionlint_finds_nothing():
    if not ACTIONLINT.exists():
        pytest.fail(f"{ACTIONLINT} is missing: `make install` installs it (requirements-dev.txt)")
    files = sorted(WORKFLOWS.glob("*.yml"))
    assert {f.name for f in files} == {"pull-request.yml", "retrain.yml"}
    done = subprocess.run([str(ACTIONLINT), "-shellcheck=", "-pyflakes=", "-no-color", *map(str, files)],
                          cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert (done.returncode, done.stdout + done.stderr) == (0, "")


def test_actionlint_reports_a_broken_workflow(tmp_path):
    """The check can fail: a job that needs a job that does not exist and an unknown runner-context key."""
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  a:\n    needs: [missing]\n    runs-on: ubuntu-latest\n"
                      "    steps:\n      - run: echo ${{ runner.nothing }}\n")
    done = subprocess.run([str(ACTIONLINT), "-shellcheck=", "-pyflakes=", "-no-color", str(broken)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 1 and '"missing"' in done.stdout and "nothing" in done.stdout, done.stdout


def test_retraining_starts_on_a_committed_data_version_only():
    push = load("retrain.yml")["on"]["push"]
    assert push["branches"] == ["main"]
    assert sorted(push["paths"]) == ["**.dvc", "dvc.lock"]
    for path in ["dvc.lock", "tables/churn.csv.dvc", "clintox.csv.dvc"]:
        assert any(path_filter_matches(pattern, path) for pattern in push["paths"]), path
    # data/ is DVC-managed (git never sees it); code, params and DVC's own config are not data versions
    for path in ["data/prepared/manifest.json", "src/mtlflow/jobs/stages.py", "params.yaml", ".dvc/config"]:
        assert not any(path_filter_matches(pattern, path) for pattern in push["paths"]), path


def path_filter_matches(pattern: str, path: str) -> bool:
    """GitHub's paths filter: ``**`` matches any characters, ``*`` any but ``/``."""
    regex = "".join(".*" if part == "**" else "[^/]*" if part == "*" else re.escape(part)
                    for part in re.split(r"(\*\*|\*)", pattern))
    return re.fullmatch(regex, path) is not None


def test_the_image_is_pushed_only_after_the_tests_pass():
    workflow = load("retrain.yml")
    testing = {name for name, job in workflow["jobs"].items() if "make test" in runs(job)}
    pushing = {name for name, job in workflow["jobs"].items() if "image-push" in runs(job) or "docker push" in runs(job)}
    assert testing and pushing
    for job in pushing:
        assert testing <= needed(workflow, job) and job not in testing, job
    submitting = {name for name, job in workflow["jobs"].items() if "pipeline submit" in runs(job)}
    assert submitting == {"retrain"} and pushing <= needed(workflow, "retrain") and testing <= needed(workflow, "retrain")


def test_the_pipeline_gets_the_data_version_dvc_lock_records():
    workflow = load("retrain.yml")
    retrain, data = workflow["jobs"]["retrain"], workflow["jobs"]["data-version"]
    submit, = (step for step in retrain["steps"] if "pipeline submit" in step.get("run", ""))
    assert submit["env"]["DATA_VERSION"] == "${{ needs.data-version.outputs.dvc_hash }}"
    assert '--param data_version="$DATA_VERSION"' in submit["run"]
    assert data["outputs"]["dvc_hash"] == "${{ steps.version.outputs.dvc_hash }}"
    # the data comes from the remote as committed, never made anew in CI
    assert "dvc pull prepare" in runs(data) and "mtlflow data push" not in runs(data)
    assert "dvc status --json prepare" in runs(data)


def test_the_version_step_reads_the_hash_of_data_prepared_from_dvc_lock(tmp_path):
    """The data-version job's own script, run on this repository's dvc.lock."""
    step, = (s for s in load("retrain.yml")["jobs"]["data-version"]["steps"] if s.get("id") == "version")
    script = step["run"].replace(".venv/bin/python", sys.executable)
    output = tmp_path / "github_output"
    subprocess.run(["bash", "-e", "-c", script], cwd=ROOT, env={"GITHUB_OUTPUT": str(output), "PATH": "/usr/bin:/bin"},
                   check=True, timeout=60)
    lock = yaml.safe_load((ROOT / "dvc.lock").read_text())
    prepared, = (out for out in lock["stages"]["prepare"]["outs"] if out["path"] == "data/prepared")
    assert output.read_text() == f"dvc_hash={prepared['md5']}\n" and prepared["md5"].endswith(".dir")


def test_pull_requests_get_tests_compiled_pipelines_and_manifests():
    workflow = load("pull-request.yml")
    assert workflow["on"] == {"pull_request": {"branches": ["main"]}}
    scripts = {name: runs(job) for name, job in workflow["jobs"].items()}
    assert "make test" in scripts["test"]
    assert "make compile" in scripts["compile"]
    assert "kubectl kustomize" in scripts["manifests"] and "tests/deploy/test_k8s_manifests.py" in scripts["manifests"]
    text = (WORKFLOWS / "pull-request.yml").read_text()
    assert "secrets." not in text and "image-push" not in text and "docker push" not in text
    assert workflow["permissions"] == {"contents": "read"}


@pytest.mark.parametrize("name", ["pull-request.yml", "retrain.yml"])
def test_python_set_up_caches_pip_and_installs_cpu_builds_of_the_pinned_torch(name):
    workflow = load(name)
    set_ups = [step for job in workflow["jobs"].values() for step in job["steps"]
               if step.get("uses", "").startswith("actions/setup-python@")]
    assert len(set_ups) == len(workflow["jobs"])
    for step in set_ups:
        assert step["with"]["cache"] == "pip"
        patterns = step["with"]["cache-dependency-path"].split()
        for requirements in REQUIREMENTS:
            assert (ROOT / requirements).exists() and any(fnmatch.fnmatch(requirements, p) for p in patterns)
    cpu_index = "https://download.pytorch.org/whl/cpu"
    if name == "pull-request.yml":  # nothing there builds the image
        assert workflow["env"]["PIP_EXTRA_INDEX_URL"] == cpu_index
    else:  # every job but the image's, which must get the CUDA build (test_the_image_job_never_sees_the_cpu_index)
        assert {job: spec.get("env", {}).get("PIP_EXTRA_INDEX_URL") for job, spec in workflow["jobs"].items()} == {
            "test": cpu_index, "data-version": cpu_index, "retrain": cpu_index, "image": None}
    # exact pins without a local label: `==2.14.1` is satisfied by 2.14.1+cpu and by the CUDA build alike
    pins = (ROOT / "requirements.txt").read_text().splitlines()
    for package in ("torch", "torchvision"):
        assert any(re.fullmatch(rf"{package}==\d+(\.\d+)+", line) for line in pins), package


def test_the_image_job_never_sees_the_cpu_index():
    """With PIP_EXTRA_INDEX_URL=.../whl/cpu in the workflow's env, `pip wheel` for the image would take 2.14.1+cpu for
    `torch==2.14.1` (issue 30, item 1): the CPU index is scoped to the jobs that test, and the image job checks the
    built image's torch before pushing it."""
    text = (WORKFLOWS / "retrain.yml").read_text()
    workflow = load("retrain.yml")
    assert "PIP_EXTRA_INDEX_URL" not in workflow.get("env", {})
    image = workflow["jobs"]["image"]
    assert "PIP_EXTRA_INDEX_URL" not in str(image)
    names = [step.get("name", step.get("uses", "")) for step in image["steps"]]
    build = next(n for n, s in enumerate(image["steps"]) if "make image " in s.get("run", "") + " ")
    check = next(n for n, s in enumerate(image["steps"]) if "torch.version.cuda" in s.get("run", ""))
    push = next(n for n, s in enumerate(image["steps"]) if "docker push" in s.get("run", ""))
    assert build < check < push, names
    assert "PIP_EXTRA_INDEX_URL" not in text.split("\n  image:", 1)[1].split("\n  retrain:", 1)[0]


@pytest.mark.parametrize("cuda, version, passes", [("13.0", "2.14.1", True), (None, "2.14.1+cpu", False)])
def test_the_cuda_check_fails_on_a_cpu_torch(tmp_path, cuda, version, passes):
    """The image job's own check step, run with a stand-in `docker` that runs the command on this machine against
    a stand-in torch module of the given build (no image can be built here)."""
    step, = (s for s in load("retrain.yml")["jobs"]["image"]["steps"] if "torch.version.cuda" in s.get("run", ""))
    fake_torch = tmp_path / "torch"
    fake_torch.mkdir()
    (fake_torch / "__init__.py").write_text(f"__version__ = {version!r}\n"
                                             f"class version:\n    cuda = {cuda!r}\n")
    docker = tmp_path / "bin" / "docker"
    docker.parent.mkdir()
    # `docker run --rm IMAGE CMD...` -> CMD..., with `python` the interpreter running the tests
    docker.write_text(f'#!/bin/bash\n[ "$1 $2" = "run --rm" ] || exit 99\nshift 4\nexec {sys.executable} "$@"\n')
    docker.chmod(0o755)
    done = subprocess.run(["bash", "-e", "-c", step["run"]], capture_output=True, text=True, timeout=60,
                          env={"PATH": f"{docker.parent}:/usr/bin:/bin", "IMAGE": "reg.example/m:1",
                               "PYTHONPATH": str(tmp_path)})
    assert (done.returncode == 0) == passes, done.stdout + done.stderr
    assert f"torch {version} CUDA {cuda}" in done.stdout
    if not passes:
        assert "the image holds a CPU-only torch" in done.stderr


def test_the_ci_image_builds_on_a_hosted_runner_from_a_pinned_registry_base():
    """A hosted runner has no debootstrap and about 14 GB free (issue 30, item 2): the image job builds on a
    python:3.11-slim-bookworm pinned by digest with PyPI inside the build (PIP_SOURCE=index: no wheels/ on the
    runner), after freeing disk; `make image` without those settings keeps the offline debootstrap path."""
    workflow = load("retrain.yml")
    assert re.fullmatch(r"python:3\.11-slim-bookworm@sha256:[0-9a-f]{64}", workflow["env"]["CI_BASE_IMAGE"])
    image = workflow["jobs"]["image"]
    steps = image["steps"]
    build = next(n for n, s in enumerate(steps) if "make image " in s.get("run", "") + " ")
    assert 'BASE_IMAGE="$CI_BASE_IMAGE"' in steps[build]["run"] and "PIP_SOURCE=index" in steps[build]["run"]
    free = next(n for n, s in enumerate(steps) if "df " in s.get("run", ""))
    assert free < build and "rm -rf /usr/share/dotnet" in steps[free]["run"]
    assert "debootstrap" not in runs(image) and "make wheels" not in runs(image)
    dry = subprocess.run(["make", "-n", "image", "PIP_SOURCE=index", "IMAGE=reg.example/m:t", "GIT_REV=abc",
                          f"BASE_IMAGE={workflow['env']['CI_BASE_IMAGE']}"], cwd=ROOT, capture_output=True,
                         text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    build_line = " ".join(dry.stdout.replace("\\\n", " ").split())
    assert f"docker build --build-arg BASE_IMAGE={workflow['env']['CI_BASE_IMAGE']} --build-arg PIP_OPTIONS= " \
        "--build-arg GIT_REV=abc -t reg.example/m:t ." in build_line
    assert "pip wheel" not in dry.stdout and "base-image.sh" not in dry.stdout
    assert "--network none" not in dry.stdout
    wrong = subprocess.run(["make", "-n", "image", "PIP_SOURCE=pypi"], cwd=ROOT, capture_output=True, text=True,
                           timeout=60)
    assert wrong.returncode != 0 and "PIP_SOURCE=pypi is neither wheels" in wrong.stderr


def test_the_build_context_is_the_sources_only():
    """What `docker build` sends, by .dockerignore's own rules (docker-py's implementation of them): without wheels/
    (empty in CI) a few MB, not the 3.5 GB of a working tree with a venv, data and runs."""
    from docker.utils.build import exclude_paths

    patterns = [line.strip() for line in (ROOT / ".dockerignore").read_text().splitlines()
                if line.strip() and not line.startswith("#")]
    sent = exclude_paths(str(ROOT), patterns)
    outside_wheels = [f for f in sent if not f.startswith("wheels/") and (ROOT / f).is_file()]
    size = sum((ROOT / f).stat().st_size for f in outside_wheels)
    assert size < 20e6, sorted(outside_wheels, key=lambda f: -(ROOT / f).stat().st_size)[:10]
    for needed in ("requirements.txt", "constraints.txt", "pyproject.toml", "setup.py", "src/mtlflow/__init__.py"):
        assert needed in sent, needed
    assert not any(f.startswith((".venv/", ".git/", "data/", "runs/", "tests/")) for f in sent)
