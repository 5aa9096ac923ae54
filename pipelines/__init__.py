"""Kubeflow pipeline definitions (``main``), compilation and local execution."""
