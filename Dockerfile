# syntax=docker/dockerfile:1
# One image for every mtlflow component and training job: CUDA-capable torch 2.14.1 + torchvision
# 0.29.1 (the PyPI wheels bundle the CUDA runtime; the node's NVIDIA driver does the rest), the
# project, and kfp 2.17.0 -- the kfp that compiles the pipelines. No secrets: DVC/S3 credentials
# reach the pods as environment variables from the mtlflow-dvc-remote Secret at run time.
#
# Build and push (see docs/guides/kubeflow.md):
#   make image IMAGE=registry.example.com/mtlflow/mtlflow-python:0.1.0 GIT_REV=$(git rev-parse HEAD)
#   docker push registry.example.com/mtlflow/mtlflow-python:0.1.0
# Offline / behind a TLS-intercepting proxy: pre-download the wheels on the host, then build
# without network:
#   pip download -d wheels -r requirements.txt -c constraints.txt "setuptools>=68" wheel
#   make image DOCKER_BUILD_ARGS='--network none --build-arg PIP_OPTIONS="--no-index --find-links /tmp/wheels"'
# Pin the base by digest in production: --build-arg BASE_IMAGE=python:3.11.7-slim-bookworm@sha256:<digest>
ARG BASE_IMAGE=python:3.11.7-slim-bookworm
FROM ${BASE_IMAGE}

ARG PIP_OPTIONS=""
ARG GIT_REV=unknown
LABEL org.opencontainers.image.title="mtlflow" \
      org.opencontainers.image.description="Multi-task learning methods, benchmarks and Kubeflow pipelines" \
      org.opencontainers.image.revision="${GIT_REV}"
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_NO_CACHE_DIR=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    DVC_NO_ANALYTICS=1 \
    MTLFLOW_CACHE=/var/cache/mtlflow \
    MTLFLOW_GIT_REV=${GIT_REV}

# No apt packages: everything comes from pip wheels (DVC runs git-less, the code revision is
# MTLFLOW_GIT_REV), so the build also works with --network none.
RUN useradd --create-home --uid 1000 --user-group mtlflow \
    && mkdir -p /var/cache/mtlflow /opt/mtlflow \
    && chown mtlflow:mtlflow /var/cache/mtlflow

WORKDIR /opt/mtlflow
COPY requirements.txt constraints.txt ./
# wheels/ holds only .gitkeep in git; fill it for offline builds (see above). Bind-mounted, so the
# wheels never end up in a layer.
RUN --mount=type=bind,source=wheels,target=/tmp/wheels \
    pip install ${PIP_OPTIONS} -r requirements.txt -c constraints.txt

COPY pyproject.toml setup.py README.md ./
COPY src ./src
COPY components ./components
COPY pipelines ./pipelines
RUN --mount=type=bind,source=wheels,target=/tmp/wheels \
    pip install ${PIP_OPTIONS} --no-deps . && mtlflow --help > /dev/null

USER 1000:1000
WORKDIR /home/mtlflow
HEALTHCHECK --interval=60s --timeout=30s --retries=3 CMD ["mtlflow", "--help"]
ENTRYPOINT ["mtlflow"]
CMD ["--help"]
