import json

import pytest

from mtlflow.components.plan_runs.component import plan_references, plan_runs
from mtlflow.core.errors import InvalidParameterError, UnknownNameError


def test_plan_runs_expands_methods_and_seeds():
    specs = [json.loads(s) for s in plan_runs.python_func(methods=["ls", "fairgrad"], seeds=[0.0, 1.0],
                                                          method_hparams={"fairgrad": {"alpha": 2.0}})]
    assert [(s["method"], s["seed"]) for s in specs] == [("ls", 0), ("ls", 1), ("fairgrad", 0), ("fairgrad", 1)]
    assert specs[2]["hparams"] == {"alpha": 2}
    assert all(isinstance(s["seed"], int) for s in specs)


def test_plan_runs_rejects_bad_sweeps():
    with pytest.raises(UnknownNameError, match="valid methods"):
        plan_runs.python_func(methods=["nope"], seeds=[0], method_hparams={})
    with pytest.raises(InvalidParameterError, match="empty"):
        plan_runs.python_func(methods=[], seeds=[0], method_hparams={})
    with pytest.raises(InvalidParameterError, match="alpha"):
        plan_runs.python_func(methods=["fairgrad"], seeds=[0], method_hparams={"fairgrad": {"alpha": -1}})


def test_plan_references_one_single_task_run_per_task_and_seed():
    specs = [json.loads(s) for s in plan_references.python_func(tasks=["left", "right"], seeds=[3])]
    assert specs == [{"method": "ls", "seed": 3, "hparams": {}, "tasks": ["left"], "reference": True},
                     {"method": "ls", "seed": 3, "hparams": {}, "tasks": ["right"], "reference": True}]
    with pytest.raises(InvalidParameterError, match="reference_seeds is empty"):
        plan_references.python_func(tasks=["left"], seeds=[])
