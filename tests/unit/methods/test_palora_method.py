"""PaLoRA as a method, without training: when the front is evaluated, and what Pareto expansion's
``init_from`` and a step before setup refuse (with the exact one-line messages the user sees)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mtlflow import methods
from mtlflow.core.errors import DataError, InvalidParameterError


def test_a_single_task_is_refused_with_the_ls_alternative() -> None:
    with pytest.raises(InvalidParameterError) as error:
        methods.build("palora", 1)
    assert str(error.value) == ("palora learns a Pareto front over at least 2 tasks; train single-task references "
                                "with --method ls")


@pytest.mark.parametrize("every,select,due", [
    (3, "last-k:2", [3, 6, 9, 10]),   # multiples of 3, and the two epochs the selection averages
    (4, "last", [4, 8, 10]),          # the final epoch always, so the selected front exists
    (0, "last-k:3", [8, 9, 10]),      # 0: only the selection window
    (1, "last", list(range(1, 11))),  # 1: every epoch (the default)
])
def test_front_is_due_every_front_every_epochs_and_in_the_selection_window(every: int, select: str,
                                                                          due: list[int]) -> None:
    method = methods.build("palora", 2, front_every=every)
    assert [epoch for epoch in range(1, 11) if method.front_due(epoch, 10, select)] == due


@pytest.mark.parametrize("total_steps,progress", [(1, [0.0, 1.0, 1.0]), (2, [0.0, 1.0, 1.0]), (5, [0.0, 0.25, 0.5])])
def test_annealing_progress_runs_from_0_at_the_first_step_to_1_at_the_last(total_steps: int,
                                                                           progress: list[float]) -> None:
    method = methods.build("palora", 2)
    method.total_steps = total_steps
    assert [method.progress(step) for step in (0, 1, 2)] == progress


def _expansion_trainer() -> SimpleNamespace:
    """What ``init_from`` reads of the trainer: a two-task benchmark ``b`` on data ``h``, a 2 x 2 linear model."""
    tasks = [SimpleNamespace(name="left"), SimpleNamespace(name="right")]
    return SimpleNamespace(device="cpu", tasks=tasks, bench=SimpleNamespace(name="b"),
                           data=SimpleNamespace(content_hash="h" * 64), model=nn.Linear(2, 2))


def _single_point_blob(state_dict: dict[str, torch.Tensor]) -> dict:
    return {"benchmark": "b", "tasks": ["left", "right"], "data_hash": "h" * 64, "state_dict": state_dict}


def test_init_from_a_model_of_other_shapes_names_the_benchmark_configuration(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save(_single_point_blob({"weight": torch.zeros(3, 2), "bias": torch.zeros(3)}), path)
    method = methods.build("palora", 2, init_from=str(path))
    with pytest.raises(InvalidParameterError) as error:
        method.setup(_expansion_trainer())
    assert str(error.value) == (f"init_from: {path} does not fit this model (different benchmark options?); "
                                "use the benchmark configuration it was trained with")


def test_init_from_a_model_of_other_tasks_names_both_task_lists(tmp_path: Path) -> None:
    path = tmp_path / "model.pt"
    torch.save({**_single_point_blob(nn.Linear(2, 2).state_dict()), "tasks": ["left", "up"]}, path)
    method = methods.build("palora", 2, init_from=str(path))
    with pytest.raises(InvalidParameterError) as error:
        method.setup(_expansion_trainer())
    assert str(error.value) == (f"init_from: {path} is a b model of tasks ['left', 'up']; expansion needs a b "
                                "model of ['left', 'right']")


def test_a_training_step_before_setup_is_refused_in_one_line() -> None:
    with pytest.raises(RuntimeError) as error:
        methods.build("palora", 2).training_step(None, None, 1)
    assert str(error.value) == "palora: setup(trainer) must run before training_step"


def test_init_from_loads_the_single_point_model_and_freezes_it(tmp_path: Path) -> None:
    source = nn.Linear(2, 2)
    path = tmp_path / "model.pt"
    torch.save(_single_point_blob(source.state_dict()), path)
    trainer = _expansion_trainer()
    method = methods.build("palora", 2, init_from=str(path))
    method._load_initial_model(trainer, path)
    assert method.frozen_base is True
    assert torch.equal(trainer.model.weight, source.weight) and torch.equal(trainer.model.bias, source.bias)
    assert not any(p.requires_grad for p in trainer.model.parameters())


def test_init_from_refuses_a_corrupt_file_a_palora_model_and_other_data_in_one_line(tmp_path: Path) -> None:
    corrupt = tmp_path / "corrupt.pt"
    corrupt.write_bytes(b"not a checkpoint")
    try:
        torch.load(corrupt, weights_only=False)
    except Exception as exc:  # the error torch gives this file, whatever its type in this torch version
        corrupt_error = type(exc).__name__
    palora = tmp_path / "palora.pt"
    torch.save({**_single_point_blob(nn.Linear(2, 2).state_dict()), "palora": {}}, palora)
    other_data = tmp_path / "other.pt"
    torch.save({**_single_point_blob(nn.Linear(2, 2).state_dict()), "data_hash": "d" * 64}, other_data)
    cases = [(corrupt, DataError, f"init_from: {corrupt} is corrupt ({corrupt_error}); retrain that run"),
             (palora, InvalidParameterError, f"init_from: {palora} is a PaLoRA model; expansion starts from a "
                                             "single-point model such as an LS run's model.pt"),
             (other_data, DataError, f"init_from: {other_data} was trained on data dddddddddddd, this run uses "
                                     "hhhhhhhhhhhh; expand on the data the model was trained on")]
    for path, error_type, message in cases:
        with pytest.raises(error_type) as error:
            methods.build("palora", 2, init_from=str(path)).setup(_expansion_trainer())
        assert str(error.value) == message


def test_a_checkpoint_restores_the_annealing_horizon_and_an_older_one_without_it_keeps_the_runs() -> None:
    """The horizon of the τ annealing travels with the checkpoint; a checkpoint written before it did (no
    ``total_steps``) keeps the horizon the resumed run computed in setup."""
    saved = methods.build("palora", 2)
    saved.total_steps = 40
    state = saved.state_dict()
    resumed = methods.build("palora", 2)
    resumed.total_steps = 90
    resumed.load_state_dict(state)
    assert resumed.total_steps == 40
    del state["total_steps"]
    older = methods.build("palora", 2)
    older.total_steps = 90
    older.load_state_dict(state)
    assert older.total_steps == 90
