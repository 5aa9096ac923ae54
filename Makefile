# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mtlflow-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export DVC_NO_ANALYTICS := 1

.PHONY: install demo demo-tuned tuned-table readme-table lint test test-deps docs compile clean image image-push mutation wheels base-image e2e

# pip only: it is the one installer that sees the machine's local wheel cache (torch is a 5.5 GB CUDA build).
$(STAMP): requirements.txt requirements-dev.txt constraints.txt pyproject.toml setup.py
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -qq -r requirements.txt -r requirements-dev.txt -c constraints.txt
	$(PY) -m pip install --disable-pip-version-check -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/mtlflow pipeline run --local --params-file pipelines/demo.yaml --workdir demo

# After `make demo`: README.md's demo table and docs/results/demo.json from demo/results/results.json (tools/demo_table.py)
readme-table: install
	$(PY) tools/demo_table.py update demo/results/results.json

# The tuned sweep on the docs' 400-row real table (churn.csv: real scm20d rows, tools/tuned_table.py; the shared
# real-data folder must be present): every method and single-task reference tuned under the same budget, retrained
# and at its defaults with 3 seeds each, into demo-tuned/ (tune/tune-report.html, tune/tune-results.md).
# `make tuned-table` copies its table into docs/guides/tuning.md and docs/results/demo-tuned.json (a test checks both).
DEMO_TUNED_ARGS ?= --methods ls,mgda,famo,fairgrad --budget-trials 6 --epochs 20 --retrain-seeds 3
demo-tuned: install
	$(PY) tools/tuned_table.py table demo-tuned/churn.csv
	cd demo-tuned && ../$(VENV)/bin/mtlflow spec init churn.csv --tasks churned,spend,plan --out churn.yaml --overwrite
	$(VENV)/bin/mtlflow tune --spec demo-tuned/churn.yaml --out demo-tuned/tune --threads 1 --no-progress \
	  $(DEMO_TUNED_ARGS) $(if $(wildcard demo-tuned/tune/plan.json),--resume)

tuned-table: install
	$(PY) tools/tuned_table.py update demo-tuned/tune

# One pytest worker per core (pytest-xdist): the suite runs mostly one core at a time (subprocesses, small models),
# so two workers on the 2-core machine take it from 18 to 12 minutes. TEST_WORKERS=0 runs it in one process.
TEST_WORKERS ?= auto
test: install lint test-deps docs
	$(PY) -m pytest -q -p no:cacheprovider -n $(TEST_WORKERS)

# ruff: pyflakes, isort, bugbear, pyupgrade and function-local imports ([tool.ruff] in pyproject.toml) over src/,
# components/, pipelines/, tools/ and tests/; tests/unit/core/test_house.py runs the same check inside the suite.
lint: install
	$(VENV)/bin/ruff check --quiet

# The documentation site, strict: a broken link, page or docstring reference fails the build (and `make test`).
export NO_MKDOCS_2_WARNING := 1
docs: install
	$(VENV)/bin/mkdocs build --strict --quiet -d build/site

# components/*/README.md and metadata.yaml from the components' code (tools/component_docs.py; a test fails when stale)
.PHONY: component-docs
component-docs: install
	$(PY) tools/component_docs.py write

# docs/research/claims.md from the stored claim results (docs/research/claims/*.json); `mtlflow reproduce CLAIM` adds one.
.PHONY: claims-ledger
claims-ledger: install
	$(VENV)/bin/mtlflow reproduce --ledger

# Debian's Prometheus Pushgateway and promtool for the observability tests (skipped when both exist).
SUDO := $(shell [ "$$(id -u)" = 0 ] || echo sudo)
test-deps:
	@command -v prometheus-pushgateway >/dev/null && command -v promtool >/dev/null || { \
	  $(SUDO) apt-get update -qq && \
	  $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus-pushgateway prometheus; }

# Mutation testing of methods/, teleport/, pareto/, grad_engine/ and metrics/scoring.py
# (docs/development/mutation-testing.md): hours on one core, so it runs before resolving an issue, not in CI. It resumes where it
# stopped (MUTATION_ARGS="--stop-after 3600" bounds one sitting) and retests only changed functions.
MUTATION_ARGS ?=
mutation: install
	$(PY) -m pip install --disable-pip-version-check -q -r requirements-mutation.txt -c constraints.txt
	$(PY) tools/mutation.py run $(MUTATION_ARGS)

# PROFILE=k8s/overlays/prod/profile.yaml: the cluster profile the pipelines are compiled for (default: none)
PROFILE ?=
compile: install
	MTLFLOW_IMAGE=$(IMAGE) $(VENV)/bin/mtlflow pipeline compile --all --out-dir build $(if $(PROFILE),--profile $(PROFILE))

clean:
	rm -rf build demo demo-tuned runs .pytest_cache

# The project image (Dockerfile, docs/guides/image.md), built offline: the base from debootstrap when BASE_IMAGE is
# not present locally (`make base-image`; a registry image given as BASE_IMAGE is pulled by docker build instead),
# the pinned wheels from wheels/ (`make wheels`), no network in the build. MTLFLOW_IMAGE, when set, names the image,
# so that the pipelines compiled with it (components/image.py) run this image.
IMAGE ?= $(or $(MTLFLOW_IMAGE),ghcr.io/mtlflow/mtlflow-python:0.1.0)
BASE_IMAGE ?= local/debian-python:3.11-bookworm
GIT_REV ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
# The classic builder needs no BuildKit frontend image (no registry here); DOCKER_BUILDKIT=1 works too (no RUN --mount).
DOCKER_BUILDKIT ?= 0
# Where the build's pip takes the pinned stack from: `wheels` (offline: wheels/ filled on the host by `make wheels`,
# no network in the build) or `index` (CI on a hosted runner: PyPI inside the build on a registry BASE_IMAGE, nothing
# downloaded on the host -- the host's PIP_EXTRA_INDEX_URL cannot reach the build -- and a build context of the
# sources only, since wheels/ stays empty).
PIP_SOURCE ?= wheels
ifeq ($(PIP_SOURCE),index)
DOCKER_BUILD_ARGS ?=
IMAGE_INPUTS := base-image
PIP_BUILD_ARG := --build-arg PIP_OPTIONS=
else ifeq ($(PIP_SOURCE),wheels)
DOCKER_BUILD_ARGS ?= --network none
IMAGE_INPUTS := wheels base-image
PIP_BUILD_ARG :=
else
$(error PIP_SOURCE=$(PIP_SOURCE) is neither wheels (offline, wheels/) nor index (PyPI inside the build))
endif
WHEELS_STAMP := wheels/.downloaded

# Every wheel of requirements.txt (resolved with constraints.txt) plus the build backend, for Linux x86_64 CPython
# 3.11: pip on this machine takes torch and torchvision from the local wheel cache. Sdists are built into wheels here.
$(WHEELS_STAMP): requirements.txt constraints.txt
	python3 -m pip wheel --disable-pip-version-check -q -w wheels -r requirements.txt -c constraints.txt setuptools wheel
	touch $(WHEELS_STAMP)

wheels: $(WHEELS_STAMP)

# debootstrap only for the local base: a registry BASE_IMAGE (CI) is pulled by docker build
base-image:
	tools/docker-daemon.sh
ifeq ($(BASE_IMAGE),local/debian-python:3.11-bookworm)
	@docker image inspect $(BASE_IMAGE) >/dev/null 2>&1 || tools/base-image.sh $(BASE_IMAGE)
endif

# wheels/ is COPY'd by the Dockerfile: empty with PIP_SOURCE=index
image: $(IMAGE_INPUTS)
	mkdir -p wheels
	DOCKER_BUILDKIT=$(DOCKER_BUILDKIT) docker build $(DOCKER_BUILD_ARGS) --build-arg BASE_IMAGE=$(BASE_IMAGE) \
	  $(PIP_BUILD_ARG) --build-arg GIT_REV=$(GIT_REV) -t $(IMAGE) .

image-push: image
	docker push $(IMAGE)

# The image built here and every component run in its containers as the cluster runs them (tests/e2e/,
# docs/guides/image.md): as root (or with sudo) for dockerd and debootstrap. Not part of `make test`.
e2e: install image
	MTLFLOW_IMAGE=$(IMAGE) $(PY) -m pytest -q -p no:cacheprovider tests/e2e
