"""The trainer runs every method's solver with numpy's and scipy's BLAS on one thread (issue 29): OpenBLAS starts
a thread per core for each small K x K factorisation, and on a machine whose other cores are busy each call then
waits for a descheduled thread (a 40 x 40 eigendecomposition took 16 ms instead of 0.1 ms). Methods that do not
decorate their own solves (CAGrad, PCGrad, Aligned-MTL) get it from the trainer; the limit is lifted after."""

from __future__ import annotations

import pytest
import scipy.linalg  # noqa: F401 -- scipy's own OpenBLAS, which the limit must reach too
from threadpoolctl import threadpool_info, threadpool_limits

from mtlflow import jobs
from mtlflow.config.run import RunConfig
from mtlflow.engine.trainer import Trainer


def blas_threads() -> dict[str, int]:
    return {i["filepath"]: i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas"}


@pytest.mark.parametrize("method", ["cagrad", "pcgrad", "alignedmtl", "mgda"])
def test_a_training_step_solves_on_one_blas_thread_and_restores_the_setting(method, tmp_path, monkeypatch):
    folder = tmp_path / "data"
    jobs.prepare("toy", folder)
    bench, data = jobs.load_prepared(folder)
    run = Trainer(bench, data, RunConfig(method=method, epochs=1, batch_size=4), tmp_path / "run", progress=False)
    seen: list[dict[str, int]] = []
    # what the trainer calls: the Gramian methods' weights, the others' combination of the Jacobian
    name = "weights_from_gramian" if hasattr(run.method, "weights_from_gramian") else "combine"
    original = getattr(run.method, name)

    def watched(*args, **kwargs):
        seen.append(blas_threads())
        return original(*args, **kwargs)

    monkeypatch.setattr(run.method, name, watched)
    batch = next(iter(run._loader(1)))
    with threadpool_limits(2, user_api="blas"):
        before = blas_threads()
        adjustable = [library for library, threads in before.items() if threads == 2]
        assert len(adjustable) >= 2  # numpy's and scipy's OpenBLAS
        run.train_step(batch, 1)
        assert blas_threads() == before
    assert seen and all(threads[library] == 1 for threads in seen for library in adjustable)


def test_library_mode_solves_on_one_blas_thread_too(monkeypatch):
    """`MTLBackward` (library mode) calls the method's combine itself: the same rule as the trainer's step."""
    import torch
    from torch import nn

    from mtlflow.engine import MTLBackward

    torch.manual_seed(0)
    trunk, heads = nn.Linear(4, 3), nn.ModuleList([nn.Linear(3, 1) for _ in range(3)])
    backward = MTLBackward("cagrad", trunk, list(heads))
    seen: list[dict[str, int]] = []
    original = backward.method.combine

    def watched(*args, **kwargs):
        seen.append(blas_threads())
        return original(*args, **kwargs)

    monkeypatch.setattr(backward.method, "combine", watched)
    x = torch.randn(8, 4)
    features = trunk(x)
    losses = [(head(features).squeeze(1) - i).pow(2).mean() for i, head in enumerate(heads)]
    with threadpool_limits(2, user_api="blas"):
        before = blas_threads()
        adjustable = [library for library, threads in before.items() if threads == 2]
        backward(losses)
        assert blas_threads() == before
    assert len(adjustable) >= 2
    assert seen and all(threads[library] == 1 for threads in seen for library in adjustable)
