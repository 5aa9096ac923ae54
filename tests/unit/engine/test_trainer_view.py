"""Methods and callbacks see the trainer only through the typed `TrainerView` protocol: a real trainer
satisfies it, and the code of methods, COST, PaLoRA's front and the exporters reads nothing else of it
(no private member)."""

from __future__ import annotations

import ast
from pathlib import Path

from mtlflow.config.run import RunConfig
from mtlflow.core.callbacks import TrainerView

SRC = Path(__file__).resolve().parents[3] / "src" / "mtlflow"
USERS = ("methods", "teleport", "pareto", "ops", "core")


def protocol_members() -> set[str]:
    annotated = set(TrainerView.__annotations__)
    methods = {name for name, value in vars(TrainerView).items() if callable(value) and not name.startswith("_")}
    return annotated | methods


def trainer_accesses() -> dict[str, list[str]]:
    """Every ``trainer.<name>`` read in the methods/callbacks code: name -> where."""
    found: dict[str, list[str]] = {}
    for folder in USERS:
        for path in sorted((SRC / folder).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "trainer":
                    found.setdefault(node.attr, []).append(f"{path.relative_to(SRC)}:{node.lineno}")
    return found


def test_methods_and_callbacks_read_only_the_protocol():
    accesses = trainer_accesses()
    assert {"config", "model", "tasks", "steps_per_epoch", "inputs_targets", "task_losses"} <= set(accesses)
    private = {name: where for name, where in accesses.items() if name.startswith("_")}
    assert not private, f"private trainer members used: {private}"
    unknown = {name: where for name, where in accesses.items() if name not in protocol_members()}
    assert not unknown, f"trainer members outside TrainerView: {unknown}"


def test_the_trainer_is_a_trainer_view(tmp_path):
    from mtlflow import jobs
    from mtlflow.engine.trainer import Trainer

    bench, data = jobs.load_prepared(jobs.prepare("toy", tmp_path / "data") and tmp_path / "data")
    trainer = Trainer(bench, data, RunConfig(method="ls", epochs=1, batch_size=1), tmp_path / "run", progress=False)
    assert isinstance(trainer, TrainerView)
    missing = [name for name in protocol_members() if not hasattr(trainer, name)]
    assert not missing
    assert trainer.steps_per_epoch() == bench.config["steps_per_epoch"]
    inputs, targets = trainer.inputs_targets(next(iter(trainer._loader(1))))
    losses = trainer.task_losses(trainer.model(inputs), targets)
    assert len(losses) == len(trainer.tasks) == 2
