"""Versioning of prepared datasets with DVC: push to a remote, pull a version back, verify it.

A data version is identified by its DVC content hash (the ``<md5>.dir`` that ``dvc add`` writes into
a ``.dvc`` file) together with the remote holding it. Both are recorded in the Dataset artifact's
metadata by the ``prepare_data`` component, next to the git revision of the code that prepared the
data, so any dataset of any pipeline run can be fetched again with :func:`pull_dataset`.

The remote is a URL understood by DVC: a local directory (the default, see :func:`resolve_remote`)
or ``s3://bucket/prefix`` (S3 or MinIO; needs the ``dvc-s3`` plugin in the image). Credentials are
never stored here: DVC's S3 backend reads ``AWS_ACCESS_KEY_ID``/``AWS_SECRET_ACCESS_KEY`` from the
environment, which on the cluster comes from the ``mtlflow-dvc-remote`` Secret, and
``AWS_ENDPOINT_URL`` (MinIO) is applied as the remote's ``endpointurl``.

Every operation runs in a throw-away DVC workspace without git (``dvc init --no-scm``), so it works
inside a component container that has no repository checkout.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import logging
import os
import re
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from mtlflow.config.data import check_dir_hash
from mtlflow.core import atomic
from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.core.locks import file_lock
from mtlflow.core.outputs import check_output_dir

#: Environment variable naming the remote when no explicit URL is given (set from the Secret on the cluster).
REMOTE_ENV = "MTLFLOW_DVC_REMOTE"
#: Environment variable with the code revision baked into the image (``docker build --build-arg GIT_REV``).
GIT_REV_ENV = "MTLFLOW_GIT_REV"
#: S3-compatible endpoint (MinIO) applied to ``s3://`` remotes.
ENDPOINT_ENV = "AWS_ENDPOINT_URL"
REMOTE_NAME = "store"


def resolve_remote(url: str | None, default: str | os.PathLike | None = None) -> str | None:
    """The remote to use: ``url``, else ``$MTLFLOW_DVC_REMOTE``, else ``default`` (None: no versioning)."""
    chosen = url or os.environ.get(REMOTE_ENV) or (str(default) if default else None)
    return chosen or None


def remote_config(url: str) -> dict[str, Any]:
    """DVC remote section for ``url``; an S3 remote gets the MinIO endpoint from the environment."""
    config: dict[str, Any] = {"url": url}
    if url.startswith("s3://") and os.environ.get(ENDPOINT_ENV):
        config["endpointurl"] = os.environ[ENDPOINT_ENV]
    return config


def directory_md5(path: str | os.PathLike) -> str:
    """DVC's content hash of a directory (``<md5>.dir``), computed without a repository."""
    from dvc_data.hashfile.build import build
    from dvc_data.hashfile.db import HashFileDB
    from dvc_objects.fs.local import LocalFileSystem

    path = Path(path)
    if not path.is_dir():
        raise DataError(f"data directory not found: expected {path}")
    fs = LocalFileSystem()
    with tempfile.TemporaryDirectory(prefix="mtlflow-dvc-hash-") as scratch:
        _, _, obj = build(HashFileDB(fs, scratch), str(path), fs, "md5", dry_run=True)
    return obj.hash_info.value


def verify_directory(path: str | os.PathLike, dvc_hash: str) -> None:
    """Refuse a directory whose DVC hash is not ``dvc_hash`` (the recorded data version)."""
    actual = directory_md5(path)
    if actual != dvc_hash:
        raise DataError(f"data in {path} has DVC hash {actual}, expected {dvc_hash}; it is not the recorded "
                        "data version -- pull that version again (mtlflow data pull) or re-run prepare_data")


def git_revision() -> str:
    """The code revision: ``$MTLFLOW_GIT_REV`` (images), else ``git rev-parse HEAD`` (+``-dirty``)."""
    if os.environ.get(GIT_REV_ENV):
        return os.environ[GIT_REV_ENV]
    source = Path(__file__).resolve().parent
    try:
        rev = subprocess.run(["git", "rev-parse", "HEAD"], cwd=source, capture_output=True, text=True,
                             timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=source,
                               capture_output=True, text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "unknown"
    return f"{rev}-dirty" if dirty else rev


@contextlib.contextmanager
def _quiet_dvc() -> Iterator[None]:
    """DVC reports progress on stdout and through its logger; keep both out of the caller's output
    (the CLI prints JSON, components print their own lines)."""
    # DVC's failures are re-raised as one-line DataErrors, so its own log lines would only repeat them
    loggers = [logging.getLogger(name) for name in ("dvc", "dvc_data", "dvc_objects", "scmrepo")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        for logger, level in zip(loggers, levels, strict=True):
            logger.setLevel(level)


@contextlib.contextmanager
def _workspace(remote_url: str, cache_dir: str | os.PathLike | None = None,
               parent: str | os.PathLike | None = None) -> Iterator[tuple[Any, Path]]:
    """A temporary git-less DVC workspace whose default remote is ``remote_url``."""
    from dvc.repo import Repo

    if parent is not None:
        Path(parent).mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix=".mtlflow-dvc-", dir=parent))
    try:
        with _quiet_dvc():
            Repo.init(str(root), no_scm=True)
        repo = Repo(str(root))
        with repo.config.edit() as conf:
            conf["core"]["remote"] = REMOTE_NAME
            conf["core"]["analytics"] = False
            conf["remote"][REMOTE_NAME] = remote_config(remote_url)
            if cache_dir:
                conf["cache"]["dir"] = str(Path(cache_dir).resolve())
        repo.close()
        with Repo(str(root)) as repo:
            yield repo, root
    finally:
        shutil.rmtree(root, ignore_errors=True)


def _dvc_failure(action: str, remote_url: str, exc: Exception) -> DataError:
    text = " ".join(str(exc).split())[:300] or type(exc).__name__
    hint = " (s3:// remotes need the dvc-s3 plugin in the image)" if "s3" in text.lower() and "install" in text.lower() else ""
    return DataError(f"dvc {action} with remote {remote_url} failed: {text}{hint}; check the remote URL and "
                     "its credentials (the mtlflow-dvc-remote Secret on the cluster)")


def _local_remote_dir(remote_url: str) -> Path | None:
    """The directory of a local (path or ``file://``) remote; None for object stores."""
    if remote_url.startswith("file://"):
        return Path(remote_url[len("file://"):])
    return None if re.match(r"^[a-z][a-z0-9+.-]*://", remote_url) else Path(remote_url)


@contextlib.contextmanager
def _push_lock(remote_dir: Path | None) -> Iterator[None]:
    """mtlflow's pushes to one local remote take turns, so a push's clean-up never meets another's
    transfer in progress."""
    if remote_dir is None:
        yield
        return

    with file_lock(remote_dir / ".mtlflow-push.lock"):
        yield


def remove_transfer_leftovers(remote_dir: str | os.PathLike) -> list[Path]:
    """Delete the ``files/md5/.<random>.tmp`` files that ``dvc add --to-remote`` leaves in a local
    remote (full copies of every transferred file, a known DVC bug): each is deleted only if the object
    it copies -- same md5 -- is stored, so nothing the remote needs is lost."""
    removed = []
    objects = Path(remote_dir) / "files" / "md5"
    for tmp in objects.glob(".*.tmp") if objects.is_dir() else []:
        digest = hashlib.md5()
        with open(tmp, "rb") as fh:
            for block in iter(lambda: fh.read(1 << 20), b""):
                digest.update(block)
        h = digest.hexdigest()
        stored = [objects / h[:2] / name for name in (h[2:], h[2:] + ".dir")]
        if any(p.is_file() and p.stat().st_size == tmp.stat().st_size for p in stored):
            tmp.unlink()
            removed.append(tmp)
    return removed


def push_dataset(data_dir: str | os.PathLike, remote_url: str) -> dict[str, Any]:
    """Upload ``data_dir`` to the remote (``dvc add --to-remote``); returns its data version.

    Objects already in the remote are not transferred again, so pushing an unchanged dataset is cheap.
    """
    data_dir = Path(data_dir).resolve()
    if not data_dir.is_dir():
        raise DataError(f"data directory not found: expected {data_dir}")
    local = _local_remote_dir(remote_url)
    with _push_lock(local), _workspace(remote_url) as (repo, root):
        try:
            with _quiet_dvc():
                repo.add(str(data_dir), to_remote=True, out=str(root / "data"), remote=REMOTE_NAME)
        except Exception as exc:  # DVC raises many unrelated types; report them as one data error
            raise _dvc_failure("push", remote_url, exc) from None
        out = yaml.safe_load((root / "data.dvc").read_text())["outs"][0]
        if local is not None:
            remove_transfer_leftovers(local)
    return {"dvc_hash": out["md5"], "dvc_remote": remote_url, "size": out.get("size"), "nfiles": out.get("nfiles")}


def pull_dataset(dvc_hash: str, remote_url: str, out_dir: str | os.PathLike,
                 cache_dir: str | os.PathLike | None = None) -> Path:
    """Fetch the data version ``dvc_hash`` from the remote into ``out_dir`` and verify it.

    ``cache_dir`` (e.g. on a PVC) keeps fetched objects between pulls; without it a temporary cache
    is used. ``out_dir`` appears only once the complete, verified version is there.
    """
    check_dir_hash(dvc_hash)
    out_dir = check_output_dir(out_dir, "--out").resolve()
    if out_dir.exists() and any(out_dir.iterdir()):
        # an unusable output path, like every other --out (exit 2, docs/guides/cli.md), not missing data
        raise InvalidParameterError(f"{out_dir} is not empty; pull a data version into a new directory")
    with _workspace(remote_url, cache_dir, parent=out_dir.parent) as (repo, root):
        (root / "data.dvc").write_text(yaml.safe_dump({"outs": [{"md5": dvc_hash, "hash": "md5", "path": "data"}]}))
        try:
            with _quiet_dvc():
                repo.pull(targets=[str(root / "data.dvc")], remote=REMOTE_NAME)
        except Exception as exc:
            raise _dvc_failure(f"pull of data version {dvc_hash} (is it in this remote?)", remote_url, exc) from None
        pulled = root / "data"
        if not pulled.is_dir():
            raise DataError(f"data version {dvc_hash} is not in remote {remote_url}; push it first "
                            "(prepare_data does) or point --dvc-remote at the remote that holds it")
        verify_directory(pulled, dvc_hash)
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(pulled, out_dir)
    return out_dir


def version_metadata(data_dir: str | os.PathLike, remote_url: str | None) -> dict[str, Any]:
    """``{git_revision, dvc_hash, dvc_remote}`` of a prepared dataset, pushing it when a remote is set."""
    if remote_url:
        pushed = push_dataset(data_dir, remote_url)
        return {"git_revision": git_revision(), "dvc_hash": pushed["dvc_hash"], "dvc_remote": remote_url}
    return {"git_revision": git_revision(), "dvc_hash": directory_md5(data_dir), "dvc_remote": ""}


def file_md5(path: str | os.PathLike) -> str:
    """DVC's hash of a single file (``md5`` in ``dvc.lock``): the MD5 of its bytes."""
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "md5").hexdigest()


def locked_md5(lock: str | os.PathLike, stage: str, out: str) -> str | None:
    """The MD5 that ``dvc.lock`` records for output ``out`` of ``stage``; None when the stage never ran."""
    lock = Path(lock)
    if not lock.is_file():
        return None

    entry = ((atomic.read_yaml(lock, "dvc.lock") or {}).get("stages") or {}).get(stage) or {}
    return next((o.get("md5") for o in entry.get("outs") or [] if o.get("path") == out), None)


def pipeline_status(root: str | os.PathLike = ".") -> dict[str, Any]:
    """``dvc status`` of the project at ``root``: each stage that ``dvc repro`` would run, with why."""
    from dvc.repo import Repo

    try:
        with _quiet_dvc(), Repo(str(root)) as repo:
            return repo.status()
    except Exception as exc:  # DVC raises many unrelated types; report them as one data error
        text = " ".join(str(exc).split())[:300] or type(exc).__name__
        raise DataError(f"dvc status in {Path(root).resolve()} failed: {text}") from None
