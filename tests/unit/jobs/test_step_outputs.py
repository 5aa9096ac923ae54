"""What the train and compare_to_champion components copy into their kfp outputs (mtlflow.jobs.step_outputs),
checked against hand-written run.json records and gate decisions."""

from __future__ import annotations

import json

import pytest

from mtlflow.core.errors import DataError
from mtlflow.jobs.step_outputs import convergence_outputs, decision_metadata


def _run_dir(tmp_path, training):
    record = {"status": "completed", **({"training": training} if training is not None else {})}
    (tmp_path / "run.json").write_text(json.dumps(record))
    return tmp_path


NOT_CONVERGED = {"converged": False, "convergence": "not converged: train longer (best epoch 3 of 3)",
                 "best_epoch": 3, "epochs_run": 3, "steps": 30}


def test_a_run_that_did_not_converge_is_logged_as_0_with_its_note_as_the_warning(tmp_path):
    outputs = convergence_outputs(_run_dir(tmp_path, NOT_CONVERGED))
    assert outputs == {"metadata": {"converged": False, "convergence": NOT_CONVERGED["convergence"],
                                    "best_epoch": 3, "epochs_run": 3},
                       "metrics": {"converged": 0.0}, "warning": NOT_CONVERGED["convergence"]}


def test_a_converged_run_is_logged_as_1_without_a_warning(tmp_path):
    training = {**NOT_CONVERGED, "converged": True, "convergence": "converged at epoch 2", "best_epoch": 2}
    outputs = convergence_outputs(_run_dir(tmp_path, training))
    assert outputs["metrics"] == {"converged": 1.0} and outputs["warning"] == ""
    assert outputs["metadata"]["best_epoch"] == 2 and "steps" not in outputs["metadata"]


def test_a_run_recorded_before_the_training_record_adds_nothing(tmp_path):
    assert convergence_outputs(_run_dir(tmp_path, None)) == {"metadata": {}, "metrics": {}, "warning": ""}


def test_a_missing_run_json_is_one_clear_error(tmp_path):
    with pytest.raises(DataError, match="run description not found"):
        convergence_outputs(tmp_path)


def _outcome(champion, gate):
    decision = {"reason": "why", "split": "test", "data_hash": "abc", "champion": champion, "gate": gate}
    return {"promote": champion is None, "decision": decision}


def test_a_first_model_names_no_champion_and_the_no_champion_rule():
    assert decision_metadata(_outcome(None, None)) == {"promote": True, "reason": "why", "split": "test",
                                                       "data_hash": "abc", "champion": None,
                                                       "rule": "no champion: promote"}


def test_a_gated_decision_names_the_champion_version_and_the_gate_rule():
    metadata = decision_metadata(_outcome({"version": "v7"}, {"rule": "paired bootstrap"}))
    assert metadata["champion"] == "v7" and metadata["rule"] == "paired bootstrap" and metadata["promote"] is False
