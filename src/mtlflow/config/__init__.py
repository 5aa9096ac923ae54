"""Configuration models shared by the CLI, params.yaml, the pipelines and the Python API.
"""
