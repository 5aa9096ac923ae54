# One image for every mtlflow component and training job (docs/guides/image.md): the runtime stack of
# requirements.txt -- CUDA 13 torch 2.14.1 + torchvision 0.29.1 (the wheels bundle the CUDA runtime; the node needs
# an NVIDIA driver >= 580), kfp 2.17.0, DVC -- and the project, in a virtual environment; no test tooling.
# No secrets: DVC/S3 credentials reach the pods as environment variables from the mtlflow-dvc-remote Secret.
#
# Built offline by `make image`: the base is a debootstrap'ed Debian bookworm with Python 3.11 (`make base-image`,
# no registry), pip installs only from wheels/ (`make wheels` fills it on the host), the build runs with
# `--network none`. No `# syntax=` line and no RUN --mount: the classic builder and BuildKit's built-in frontend
# both build it without pulling a frontend image. The wheels are copied into the build stage only; the runtime
# stage copies the virtual environment and the project's own wheel, so no dependency's wheel ends up in the image.
# With a package index instead of wheels/: --build-arg PIP_OPTIONS="" (and a registry base, e.g.
# --build-arg BASE_IMAGE=python:3.11-slim-bookworm@sha256:<digest>, whose python3.11 is at /usr/local/bin); that is
# how CI builds it on a hosted runner: `make image PIP_SOURCE=index BASE_IMAGE=...` (.github/workflows/retrain.yml).
ARG BASE_IMAGE=local/debian-python:3.11-bookworm

FROM ${BASE_IMAGE} AS build
ARG PIP_OPTIONS="--no-index --find-links /tmp/wheels"
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    PYTHONDONTWRITEBYTECODE=1
RUN python3.11 -m venv /opt/mtlflow/venv
COPY wheels /tmp/wheels
COPY requirements.txt constraints.txt /tmp/mtlflow/
RUN /opt/mtlflow/venv/bin/pip install ${PIP_OPTIONS} -r /tmp/mtlflow/requirements.txt -c /tmp/mtlflow/constraints.txt
# The project as a wheel (its build backend from wheels/ too), installed in the runtime stage: a change of the code
# alone then rebuilds only the small layers, not the environment's.
COPY pyproject.toml setup.py README.md /tmp/mtlflow/
COPY src /tmp/mtlflow/src
COPY components /tmp/mtlflow/components
COPY pipelines /tmp/mtlflow/pipelines
RUN /opt/mtlflow/venv/bin/pip wheel ${PIP_OPTIONS} --no-deps -w /tmp/dist /tmp/mtlflow

FROM ${BASE_IMAGE}
# First, so that neither the revision nor the settings below rebuild this largest layer (about 7 GB).
COPY --from=build /opt/mtlflow/venv /opt/mtlflow/venv
ARG GIT_REV=unknown
LABEL org.opencontainers.image.title="mtlflow" \
      org.opencontainers.image.description="Multi-task learning methods, benchmarks and Kubeflow pipelines" \
      org.opencontainers.image.revision="${GIT_REV}"
# PATH: `python3` is the environment's (KFP's executor runs `python3 -m kfp.dsl.executor_main`). HOME is set for
# any UID: OpenShift runs the container as a random UID that has no passwd entry, in group 0. DVC's site cache
# (default /var/tmp/dvc) goes to the cache directory: with a read-only root file system only /tmp and
# /var/cache/mtlflow need to be writable.
ENV PATH=/opt/mtlflow/venv/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    HOME=/home/mtlflow \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    DVC_NO_ANALYTICS=1 \
    DVC_SITE_CACHE_DIR=/var/cache/mtlflow/dvc \
    MTLFLOW_CACHE=/var/cache/mtlflow \
    MTLFLOW_GIT_REV=${GIT_REV}
# UID 1000 in group 0; the writable directories belong to group 0 with the owner's permissions (g=u), so that a
# random UID in group 0 (OpenShift's restricted SCC) writes them as UID 1000 does.
RUN useradd --uid 1000 --gid 0 --no-create-home --home-dir /home/mtlflow mtlflow \
    && mkdir -p /home/mtlflow /var/cache/mtlflow \
    && chown 1000:0 /home/mtlflow /var/cache/mtlflow \
    && chmod 0775 /home/mtlflow /var/cache/mtlflow
COPY --from=build /tmp/dist /tmp/dist
# The project without re-resolving dependencies; pip check fails the build on a missing or conflicting requirement.
RUN pip install --no-index --no-deps /tmp/dist/*.whl && rm -rf /tmp/dist && pip check && mtlflow --help > /dev/null

USER 1000:0
WORKDIR /home/mtlflow
HEALTHCHECK --interval=60s --timeout=30s --retries=3 CMD ["mtlflow", "--help"]
# No ENTRYPOINT: Kubernetes (and kfp.local's DockerRunner, which passes a task's command as the container's
# arguments) runs each component's own command, `sh -ec ... python3 -m kfp.dsl.executor_main ...`.
CMD ["mtlflow", "--help"]
