"""An epoch's telemetry (`mtlflow.engine.telemetry.EpochTelemetry`) against a direct computation of the same
means, fractions and times from the steps it was given, and the gradient cosines against
``torch.nn.functional.cosine_similarity``."""

from __future__ import annotations

import statistics

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from mtlflow.engine.telemetry import EpochTelemetry, cosines_to_mean, jacobian_cosines_to_mean

NAMES = ["a", "b", "c"]


def steps(seed: int, n: int) -> list[dict]:
    gen = torch.Generator().manual_seed(seed)
    infos = []
    for i in range(n):
        info = {"losses": torch.rand(3, generator=gen), "engine_seconds": 0.01 * (i + 1),
                "weights": torch.rand(3, generator=gen), "cosines": torch.rand(3, generator=gen) * 2 - 1}
        if i % 2 == 0:  # an amortised method solves on some steps only
            info["solver_seconds"] = 0.001 * (i + 1)
        infos.append(info)
    return infos


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_epoch_summary_is_the_direct_mean_of_its_steps(seed):
    infos = steps(seed, 5)
    telemetry = EpochTelemetry(3, torch.device("cpu"))
    for i, info in enumerate(infos):
        telemetry.add_step(info, seconds=0.1 * (i + 1))
    telemetry.end_training()
    timing = telemetry.timing(NAMES, samples_per_step=8)
    stats = telemetry.step_statistics(NAMES)

    losses = np.array([i["losses"].double().numpy() for i in infos])
    weights = np.array([i["weights"].double().numpy() for i in infos])
    cosines = np.array([i["cosines"].double().numpy() for i in infos])
    assert timing["steps"] == 5
    np.testing.assert_allclose([timing["train_loss"][n] for n in NAMES], losses.mean(0), rtol=1e-12)
    assert timing["step_seconds_median"] == pytest.approx(0.3)
    assert timing["samples_per_second"] == pytest.approx(5 * 8 / timing["train_seconds"])
    assert timing["epoch_seconds"] >= timing["train_seconds"] > 0
    np.testing.assert_allclose([stats["method_weights_mean"][n] for n in NAMES], weights.mean(0), rtol=1e-6)
    np.testing.assert_allclose([stats["cosine_to_mean"][n] for n in NAMES], cosines.mean(0), rtol=1e-6)
    assert stats["conflict_ratio"] == pytest.approx(float((cosines < 0).any(axis=1).mean()))
    solves = [i["solver_seconds"] for i in infos if "solver_seconds" in i]
    assert stats["weight_solves"] == len(solves) == 3
    assert stats["solver_seconds_per_step"] == pytest.approx(sum(solves) / 5)
    assert stats["solver_seconds_median"] == pytest.approx(statistics.median(solves))
    assert stats["engine_seconds_median"] == pytest.approx(0.03)


def test_steps_that_report_only_losses_add_no_method_fields():
    telemetry = EpochTelemetry(3, torch.device("cpu"))
    telemetry.add_step({"losses": torch.ones(3)}, seconds=0.5)
    telemetry.end_training()
    assert telemetry.step_statistics(NAMES) == {}
    assert telemetry.timing(NAMES, 1)["train_loss"] == {n: 1.0 for n in NAMES}


def test_an_epoch_without_steps_reports_zeros():
    telemetry = EpochTelemetry(3, torch.device("cpu"))
    telemetry.end_training()
    timing = telemetry.timing(NAMES, 4)
    assert timing["steps"] == 0 and timing["step_seconds_median"] == 0.0 and timing["samples_per_second"] == 0.0
    assert timing["train_loss"] == {n: 0.0 for n in NAMES}


@pytest.mark.parametrize("seed", [0, 1])
def test_gradient_cosines_to_the_mean_match_cosine_similarity(seed):
    grads = torch.randn(4, 50, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    expected = F.cosine_similarity(grads, grads.mean(0, keepdim=True), dim=1)
    torch.testing.assert_close(jacobian_cosines_to_mean(grads), expected)
    torch.testing.assert_close(cosines_to_mean(grads @ grads.T), expected)
