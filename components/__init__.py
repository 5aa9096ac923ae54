"""Thin Kubeflow Pipelines wrappers around :mod:`mtlflow.jobs`.

One folder per component (``component.py`` + its tests). Every component is a lightweight
``@dsl.component`` with ``install_kfp_package=False`` and no ``packages_to_install``; the body imports
the installed ``mtlflow`` package, and ``base_image`` is the project image, so the same file runs
under kfp.local's SubprocessRunner and on a cluster. A body calls into :mod:`mtlflow.jobs` and only copies the
results into its kfp outputs; its docstring documents every input and output (``Args:``, ``Returns:``), and each
folder's README.md and metadata.yaml are generated from the code (``make component-docs``).
"""
