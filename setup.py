"""Package layout only (everything else is in pyproject.toml).

The Kubeflow components and pipelines live at the repository's top level, one folder per component as
kubeflow/pipelines-components lays them out, but install under the mtlflow namespace
(``mtlflow.components``, ``mtlflow.pipelines``), never as top-level packages in site-packages.
"""

from setuptools import find_packages, setup

TOP_LEVEL_FOLDERS = {"mtlflow.components": "components", "mtlflow.pipelines": "pipelines"}

packages = find_packages("src", include=["mtlflow", "mtlflow.*"])
package_dir = {"": "src"}
for package, folder in TOP_LEVEL_FOLDERS.items():
    package_dir[package] = folder
    packages += [package] + [f"{package}.{sub}" for sub in find_packages(folder)]

setup(packages=packages, package_dir=package_dir, package_data={"mtlflow.pipelines": ["*.yaml"],
                                                                "mtlflow.jobs": ["templates/*.j2"]})
