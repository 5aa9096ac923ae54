# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.mtlflow-installed
export HF_HUB_OFFLINE := 1
export TRANSFORMERS_OFFLINE := 1
export DVC_NO_ANALYTICS := 1

.PHONY: install demo test compile clean image

# pip only: it is the one installer that sees the machine's local wheel cache (torch is a 5.5 GB CUDA build).
$(STAMP): requirements.txt constraints.txt pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install --disable-pip-version-check -qq -r requirements.txt -c constraints.txt
	$(PY) -m pip install --disable-pip-version-check -q --no-deps -e .
	touch $(STAMP)

install: $(STAMP)

demo: install
	$(VENV)/bin/mtlflow pipeline run --local --params-file pipelines/demo.yaml --workdir demo

test: install
	$(PY) -m pytest -q -p no:cacheprovider

compile: install
	$(VENV)/bin/mtlflow pipeline compile --out build/main_pipeline.yaml

clean:
	rm -rf build demo runs .pytest_cache

IMAGE ?= ghcr.io/mtlflow/mtlflow-python:0.1.0
image:
	docker build -t $(IMAGE) .
