"""The project image every component runs in (override with MTLFLOW_IMAGE at compile time)."""

import os

IMAGE = os.environ.get("MTLFLOW_IMAGE", "ghcr.io/mtlflow/mtlflow-python:0.1.0")
