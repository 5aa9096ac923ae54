"""The project image every component runs in (override with MTLFLOW_IMAGE at compile time)."""

import os

#: the image of this release (the Makefile's IMAGE default); the component docs name this one
DEFAULT_IMAGE = "ghcr.io/mtlflow/mtlflow-python:0.1.0"
IMAGE = os.environ.get("MTLFLOW_IMAGE", DEFAULT_IMAGE)
