"""Operations: DVC data versioning, storage, the model store, run status, Kubernetes jobs, the Kubeflow
client and Prometheus observability.
"""
