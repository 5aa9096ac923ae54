"""Location of the optional real-data folder (MNIST IDX, QM9/Tox21 CSVs, Mulan tables, ...).

Looked up in order: ``$MTLFLOW_REALDATA``; ``../shared/realdata`` next to the repository; and
``/work/shared/realdata``. Nothing is downloaded and nothing is copied into the repository.
"""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[3]


def candidates() -> list[Path]:
    paths = []
    if os.environ.get("MTLFLOW_REALDATA"):
        paths.append(Path(os.environ["MTLFLOW_REALDATA"]))
    paths += [REPO_ROOT.parent / "shared" / "realdata", Path("/work/shared/realdata")]
    return paths


def realdata_dir() -> Path | None:
    """The first existing real-data folder, or None."""
    for path in candidates():
        if path.is_dir():
            return path
    return None


def realdata_path(*parts: str) -> Path | None:
    """``<realdata>/<parts...>`` if the folder and that entry exist, else None."""
    root = realdata_dir()
    if root is None:
        return None
    path = root.joinpath(*parts)
    return path if path.exists() else None
