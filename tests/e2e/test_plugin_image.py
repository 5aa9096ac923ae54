"""A user's plug-in image, built as docs/guides/plugins.md shows it: FROM the mtlflow image with the example
plug-in package (examples/plugin_package/) installed; its method is listed by the CLI inside the container."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import uuid

from e2e_support import REPO_ROOT, docker_run


def documented_dockerfile() -> str:
    """The plug-in image's Dockerfile exactly as the plug-ins guide prints it."""
    guide = (REPO_ROOT / "docs" / "guides" / "plugins.md").read_text()
    (block,) = re.findall(r"```dockerfile\n(.*?)```", guide, re.S)
    return block


def test_plugin_image_from_the_mtlflow_image_lists_the_plugin(image, tmp_path):
    source = tmp_path / "source"
    shutil.copytree(REPO_ROOT / "examples" / "plugin_package", source)
    # the guide's first step, on the host: the package's wheel in dist/ (no network: no build isolation)
    wheel = subprocess.run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
                            "--no-index", "-w", str(source / "dist"), str(source)],
                           capture_output=True, text=True, timeout=300)
    assert wheel.returncode == 0, wheel.stderr
    dockerfile = documented_dockerfile()
    documented_base = re.search(r"^FROM (\S+)$", dockerfile, re.M).group(1)
    (source / "Dockerfile").write_text(dockerfile.replace(f"FROM {documented_base}", f"FROM {image}"))
    tag = f"mtlflow-plugin-e2e:{uuid.uuid4().hex[:12]}"
    build = subprocess.run(["docker", "build", "--network", "none", "-t", tag, str(source)],
                           capture_output=True, text=True, timeout=600, env={**os.environ, "DOCKER_BUILDKIT": "0"})
    try:
        assert build.returncode == 0, build.stdout[-3000:] + build.stderr[-3000:]
        listed = docker_run("--network", "none", "--user", "1000:1000", "--read-only", "--tmpfs", "/tmp", tag,
                            "mtlflow", "methods", "--json")
        assert listed.returncode == 0, listed.stderr
        methods = {entry["name"]: entry for entry in json.loads(listed.stdout)}
        assert methods["unitsum"]["from"] == "churn-plugin"
        user = docker_run("--network", "none", tag, "id", "-u")
        assert user.stdout.strip() == "1000", "the plug-in image runs as the mtlflow user again"
    finally:
        subprocess.run(["docker", "rmi", "-f", tag], capture_output=True)

