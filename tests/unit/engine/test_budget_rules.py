"""The run's budget fitted to the training rows, the convergence verdict and the finite-evaluation check,
against hand-counted cases."""

from __future__ import annotations

import math

import pytest

from mtlflow.config.run import RunConfig
from mtlflow.core.errors import InvalidParameterError, NonFiniteLossError
from mtlflow.engine.trainer import NOT_CONVERGED, check_finite_evaluation, fit_budget, training_outcome


def test_a_small_table_gets_a_smaller_batch_and_enough_epochs_for_the_minimum_steps():
    # 344 rows at batch 256 would be 2 steps an epoch; batch <= 344 // 8 = 43 gives ceil(344 / 43) = 8 steps,
    # and 500 steps need ceil(500 / 8) = 63 epochs
    config = RunConfig(epochs=10, batch_size=256, min_steps=500, min_steps_per_epoch=8)
    budget = fit_budget(config, 344)
    assert (budget["batch_size"], budget["steps_per_epoch"], budget["max_epochs"]) == (43, 8, 63)
    assert (budget["requested_batch_size"], budget["requested_epochs"]) == (256, 10)
    assert budget["max_epochs"] * budget["steps_per_epoch"] >= 500 > (budget["max_epochs"] - 1) * 8


def test_a_large_table_keeps_its_batch_and_epochs():
    budget = fit_budget(RunConfig(epochs=10, batch_size=256, min_steps=500, min_steps_per_epoch=8), 60000)
    assert (budget["batch_size"], budget["steps_per_epoch"], budget["max_epochs"]) == (256, 235, 10)


def test_the_budget_counts_the_step_cap_and_the_processes():
    budget = fit_budget(RunConfig(epochs=1, batch_size=10, min_steps=20, max_steps_per_epoch=3), 100)
    assert (budget["steps_per_epoch"], budget["max_epochs"]) == (3, 7)
    # two processes: each takes rows / (batch x 2); the batch cap is per process
    budget = fit_budget(RunConfig(epochs=1, batch_size=256, min_steps=100, min_steps_per_epoch=8), 1600, 2)
    assert (budget["batch_size"], budget["steps_per_epoch"], budget["max_epochs"]) == (100, 8, 13)
    assert fit_budget(RunConfig(batch_size=4, min_steps_per_epoch=8), 5)["batch_size"] == 1  # never below 1


def test_without_budget_options_nothing_changes():
    budget = fit_budget(RunConfig(epochs=3, batch_size=50), 400)
    assert (budget["batch_size"], budget["steps_per_epoch"], budget["max_epochs"]) == (50, 8, 3)


@pytest.mark.parametrize("field", ["min_steps", "min_steps_per_epoch", "patience", "threads"])
def test_budget_options_must_be_positive(field):
    with pytest.raises(InvalidParameterError, match=f"{field} must be a positive integer when set, got 0"):
        RunConfig(**{field: 0})


def test_patience_selects_best_val_by_default_and_an_explicit_rule_wins():
    assert RunConfig().selection == "last"
    assert RunConfig(patience=3).selection == "best-val"
    assert RunConfig(patience=3, select="last").selection == "last"


def test_palora_refuses_early_stopping():
    with pytest.raises(InvalidParameterError, match="'palora' selects a Pareto front from its last epochs"):
        RunConfig(method="palora", patience=2)


def _history(scores: list[float]) -> list[dict]:
    return [{"epoch": i + 1, "val_score": s} for i, s in enumerate(scores)]


@pytest.mark.parametrize("scores, patience, epochs, converged, stopped, best", [
    ([0.0, -0.2, -0.1, -0.15], 2, 10, True, True, 2),     # two epochs without improvement: stopped, converged
    ([0.0, -0.1, -0.2, -0.3], 2, 4, False, False, 4),     # still improving at the epoch cap
    ([0.0, -0.1, -0.3, -0.2], 2, 4, False, False, 3),     # best within the last 2 epochs: not converged
    ([0.0, -0.3, -0.2], None, 3, True, False, 2),         # no patience: converged unless the last epoch is best
    ([0.0], None, 1, False, False, 1),                    # one epoch shows nothing
])
def test_a_run_whose_validation_score_still_improves_at_the_end_is_not_converged(
        scores, patience, epochs, converged, stopped, best):
    outcome = training_outcome(_history(scores), RunConfig(epochs=epochs, patience=patience), 40)
    assert (outcome["converged"], outcome["stopped_early"], outcome["best_epoch"]) == (converged, stopped, best)
    assert outcome["convergence"].startswith(NOT_CONVERGED) != converged
    assert outcome["best_val_score"] == min(scores)


@pytest.mark.parametrize("bad, named", [
    ({"loss": math.nan, "acc": 0.1}, "val/a/loss=nan"),
    ({"loss": math.inf, "acc": 0.1}, "val/a/loss=inf"),
    ({"loss": 0.5, "mae": -math.inf}, "val/a/mae=-inf"),
])
def test_a_non_finite_evaluation_fails_like_a_non_finite_loss(bad, named):
    with pytest.raises(NonFiniteLossError, match=rf"non-finite evaluation after epoch 2 \({named}\): the model "
                                                 r"diverged; lower --lr") as exc:
        check_finite_evaluation({"val": {"a": bad, "b": {"loss": 0.3}}}, "after epoch 2")
    assert exc.value.exit_code == 4


def test_an_undefined_metric_with_a_finite_loss_passes():
    check_finite_evaluation({"val": {"a": {"loss": 0.5, "roc_auc": math.nan}}}, "after epoch 1")
