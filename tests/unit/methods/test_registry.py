"""The method registry: names, papers, families and costs, invalid hyper-parameter values (one line, exit
code 2), unknown names, type coercion, and one training run of Nash-MTL's amortised weights through the trainer.
(The properties every method of a family shares are the contracts in `method_contracts.py`.)
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from mtlflow import jobs, methods
from mtlflow.core.errors import InvalidParameterError, UnknownNameError, UsageError

#: the cost of one step of each gradient-free or gradient method, as `mtlflow methods` lists it
COSTS = {"si": "O(1)", "rlw": "O(1)", "dwa": "O(1)", "uw": "O(1)", "stch": "O(1)", "famo": "O(1)", "ls": "O(1)",
         "gradnorm": "O(K) (last shared layer)", "dbmtl": "O(K)", "pcgrad": "O(K)", "graddrop": "O(K)",
         "gradvac": "O(K)", "imtlg": "O(K)", "imtl": "O(K)", "cagrad": "O(K)", "nashmtl": "O(K)", "moco": "O(K)",
         "alignedmtl": "O(K)", "upgrad": "O(K)", "excessmtl": "O(K)"}


def test_registry_lists_the_four_methods() -> None:
    names = methods.available()
    assert {"ls", "mgda", "famo", "fairgrad"} <= set(names)
    assert names == sorted(names)
    for name in names:
        info = methods.info(name)
        assert info.name == name and info.paper and info.family


def test_registry_rejects_unknown_name_listing_valid_ones() -> None:
    with pytest.raises(UnknownNameError) as exc:
        methods.build("nope", 2)
    message = str(exc.value)
    assert "'nope'" in message
    for name in methods.available():
        assert name in message
    assert exc.value.valid == methods.available()
    assert isinstance(exc.value, UsageError) and exc.value.exit_code == 2


def test_built_in_methods_come_from_every_public_module_but_base_solvers_and_search() -> None:
    # the registry discovers its built-ins; listed here independently: the package's files, none underscored
    package = Path(methods.__file__).parent
    public = {f.stem for f in package.glob("*.py") if not f.stem.startswith("_")}
    origins = {methods.get(name).__module__ for name in methods.available() if methods.origin(name) == "mtlflow"}
    # base: the method API; solvers: shared K x K solves; search: the tuning spaces
    assert origins == {f"mtlflow.methods.{stem}" for stem in public - {"base", "solvers", "search"}}


def test_every_method_cites_its_paper_and_states_its_cost() -> None:
    for name, cost in COSTS.items():
        info = methods.info(name)
        assert info.cost == cost and info.paper and info.equations
        assert methods.get(name).__module__ == f"mtlflow.methods.{name}"


@pytest.mark.parametrize("name,hparams,fragment", [
    ("dwa", {"temperature": 0.0}, "temperature"),
    ("dwa", {"window": "batch"}, "window"),
    ("dwa", {"iteration_window": 0}, "iteration_window"),
    ("uw", {"min_losses": [0.0]}, "min_losses"),
    ("si", {"min_losses": "zero"}, "min_losses"),
    ("gradnorm", {"alpha": -1.0}, "alpha"),
    ("dbmtl", {"beta": 1.5}, "beta"),
    ("dbmtl", {"beta_sigma": -1.0}, "beta_sigma"),
    ("stch", {"mu": 0.0}, "mu"),
    ("stch", {"warmup_epochs": 1.5}, "warmup_epochs"),
    ("gradvac", {"beta": -0.1}, "beta"),
    ("graddrop", {"leak": 2.0}, "leak"),
    ("pcgrad", {"beta": 0.5}, "unknown hyper-parameter"),
    ("rlw", {"seed": 1}, "unknown hyper-parameter"),
    ("cagrad", {"c": 1.0}, "c=1.0"), ("cagrad", {"c": -0.1}, "c="), ("cagrad", {"rescale": 3}, "rescale"),
    ("nashmtl", {"optim_niter": 0}, "optim_niter"), ("nashmtl", {"update_weights_every": 0}, "update_weights_every"),
    ("nashmtl", {"solver": "nope"}, "solver"), ("nashmtl", {"two_task_closed_form": 1}, "two_task_closed_form"),
    ("moco", {"beta": 0.0}, "beta"), ("moco", {"gamma": -1.0}, "gamma"), ("moco", {"lambda_update": "x"}, "lambda"),
    ("alignedmtl", {"scale_mode": "max"}, "scale_mode"), ("upgrad", {"reg_eps": -1e-3}, "reg_eps"),
    ("excessmtl", {"robust_step_size": 0.0}, "robust_step_size"), ("excessmtl", {"warmup_epochs": -1}, "warmup"),
    ("fairgrad", {"alpha": 0.0}, "alpha"),
    ("fairgrad", {"alpha": -1.0}, "alpha"),
    ("fairgrad", {"alpha": float("nan")}, "finite"),
    ("fairgrad", {"alpha": "big"}, "alpha"),
    ("mgda", {"solver": "x"}, "solver"),
    ("mgda", {"max_iter": 0}, "max_iter"),
    ("famo", {"w_lr": 0.0}, "w_lr"),
    ("famo", {"gamma": -0.1}, "gamma"),
    ("ls", {"alpha": 1.0}, "unknown hyper-parameter"),
    ("mgda", {"alpha": 1.0}, "valid: max_iter, solver, tol"),
    ("ls", {"alpha": 1.0}, "ls: unknown hyper-parameter(s) alpha; valid: none (and scale_convention, for every method)"),
])
def test_invalid_hyper_parameter_values_are_one_line_naming_the_parameter(name: str, hparams: dict,
                                                                          fragment: str) -> None:
    with pytest.raises(InvalidParameterError) as exc:
        methods.build(name, 2, **hparams)
    assert fragment in str(exc.value)
    assert "\n" not in str(exc.value) and exc.value.exit_code == 2


def test_registry_coerces_int_to_float_and_rejects_bad_task_count() -> None:
    method = methods.build("fairgrad", 2, alpha=2)
    assert method.hp["alpha"] == 2.0 and isinstance(method.hp["alpha"], float)
    with pytest.raises(InvalidParameterError):
        methods.build("ls", 0)


def test_nashmtl_cccp_trains_on_toy_with_amortised_weights(tmp_path: Path) -> None:
    data = tmp_path / "toy"
    jobs.prepare("toy", data, start=3, steps_per_epoch=30)
    run = tmp_path / "run"
    jobs.train(data, run, method="nashmtl", hparams={"two_task_closed_form": False, "update_weights_every": 3},
               epochs=1, lr=0.05, progress=False)
    blob = torch.load(run / "model.pt", weights_only=False)
    assert torch.isfinite(blob["state_dict"]["trunk.x"]).all()
    state = torch.load(run / "checkpoint.pt", weights_only=False)["method"]
    alpha = state["alpha"]
    assert alpha is not None and torch.all(alpha > 0)


def test_a_method_reads_back_as_its_class_task_count_and_hyper_parameters() -> None:
    assert repr(methods.build("ls", 2)) == "LinearScalarization(n_tasks=2)"
    assert repr(methods.build("dwa", 3, temperature=1.5)) == (
        "DynamicWeightAverage(n_tasks=3, temperature=1.5, window='epoch', iteration_window=25, min_losses=None)")


def test_a_method_without_its_own_step_says_so_when_asked_for_one() -> None:
    with pytest.raises(NotImplementedError) as error:
        methods.build("ls", 2).training_step(None, None, 1)
    assert str(error.value) == "ls does not define its own training step"


@pytest.mark.parametrize("name,hparams,message", [
    ("fairgrad", {"alpha": True}, "fairgrad: hyper-parameter alpha=True must be a number, not a boolean"),
    ("ls", {"scale_convention": 5}, "ls: hyper-parameter scale_convention=5 must be of type str"),
    ("uw", {"min_losses": [0.0, 0.0, 0.0]}, "uw: min_losses has 3 entries for 2 tasks; "),
    ("ls", {"alpha": 1.0, "beta": 2.0}, "ls: unknown hyper-parameter(s) alpha, beta; valid: none"),
])
def test_a_hyper_parameter_refusal_names_the_method_and_the_parameter(name: str, hparams: dict, message: str) -> None:
    with pytest.raises(InvalidParameterError) as exc:
        methods.build(name, 2, **hparams)
    assert str(exc.value).startswith(message)


def test_a_method_built_without_a_seed_draws_as_with_seed_0() -> None:
    # RLW samples its weights from the method's own stream, seeded from the run seed (0 unless given)
    draws = {}
    for key, args in (("default", ()), ("0", (0,)), ("1", (1,))):
        method = methods.build("rlw", 3, *args)
        draws[key] = method.weights(torch.ones(3))
    assert torch.equal(draws["default"], draws["0"]) and not torch.equal(draws["default"], draws["1"])
