# One image for every mtlflow component: CUDA-capable torch 2.14.1 + torchvision 0.29.1, the project,
# and kfp 2.17.0 (the same kfp that compiles the pipelines). No secrets; runs as a non-root user.
#
# Build (needs a Python 3.11 base image and a pip index with the CUDA torch wheels):
#   make image            # = docker build -t $(IMAGE) .
# Where no registry is reachable, pre-download wheels on the host
# into ./wheels (`pip download -d wheels -r requirements.txt -c constraints.txt`) and build with
# `--build-arg PIP_OPTIONS="--no-index --find-links /tmp/wheels"` and `--network none`.
ARG BASE_IMAGE=python:3.11-slim-bookworm
FROM ${BASE_IMAGE}

ARG PIP_OPTIONS=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1 \
    DVC_NO_ANALYTICS=1 \
    MTLFLOW_CACHE=/var/cache/mtlflow

WORKDIR /opt/mtlflow
COPY requirements.txt constraints.txt ./
# wheels/ is empty in git; fill it for offline builds (see above)
COPY wheels /tmp/wheels
RUN pip install --no-cache-dir ${PIP_OPTIONS} -r requirements.txt -c constraints.txt && rm -rf /tmp/wheels

COPY pyproject.toml README.md ./
COPY src ./src
COPY components ./components
COPY pipelines ./pipelines
RUN pip install --no-cache-dir --no-deps . \
    && useradd --create-home --uid 1000 mtlflow \
    && mkdir -p /var/cache/mtlflow && chown mtlflow /var/cache/mtlflow

USER 1000
HEALTHCHECK CMD ["mtlflow", "--help"]
ENTRYPOINT ["mtlflow"]
CMD ["--help"]
