"""Gradient engine: ``heads=False`` leaves the heads alone, the graph is freed unless asked to retain
it, and the autojac backend says which input it lacks.

Each test pins a behaviour that the mutation run (docs/development/mutation-testing.md) found unchecked.
"""

from __future__ import annotations

import pytest
import torch
from test_grad_engine import reference, small_problem

from mtlflow.grad_engine import ForwardPass, jacobian_backend
from mtlflow.grad_engine.backends import AutojacBackend

GRAPH_BACKENDS = ["loop", "batched", "autojac"]


@pytest.mark.parametrize("backend", ["loop", "batched", "func"])
def test_jacobian_without_heads_leaves_every_head_gradient_unset(backend: str) -> None:
    model, problem = small_problem()
    expected_j, _, _ = reference(problem)
    model.zero_grad(set_to_none=True)
    _, jac = jacobian_backend(backend).jacobian(problem, heads=False)
    torch.testing.assert_close(jac, expected_j, rtol=1e-10, atol=1e-12)
    assert all(p.grad is None for params in problem.task_params for p in params)


@pytest.mark.parametrize("backend", ["loop", "batched"])
def test_jacobian_frees_the_graph_by_default(backend: str) -> None:
    model, problem = small_problem()
    forward, _ = jacobian_backend(backend).jacobian(problem, heads=False)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):
        torch.autograd.grad(forward.losses[0], problem.shared)


@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
def test_jacobian_with_retain_graph_keeps_it_for_another_backward(backend: str) -> None:
    model, problem = small_problem()
    expected_j, _, _ = reference(problem)
    model.zero_grad(set_to_none=True)
    forward, _ = jacobian_backend(backend).jacobian(problem, retain_graph=True)
    # a second differentiation of the same forward pass gives row 0 of J again
    again = torch.autograd.grad(forward.losses[0], problem.shared, allow_unused=True)
    row = torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1)
                     for g, p in zip(again, problem.shared, strict=True)])
    torch.testing.assert_close(row, expected_j[0], rtol=1e-10, atol=1e-12)


def test_autojac_without_shared_features_names_them() -> None:
    _, problem = small_problem()
    forward = problem.forward()
    with pytest.raises(ValueError) as caught:
        AutojacBackend().differentiate(ForwardPass(forward.losses, None), problem.shared, problem.task_params,
                                       retain_graph=False)
    assert str(caught.value) == "the autojac backend needs the shared features of the forward pass"


def test_autojac_without_heads_says_to_use_loop() -> None:
    _, problem = small_problem()
    with pytest.raises(ValueError) as caught:
        AutojacBackend().differentiate(problem.forward(), problem.shared, None, retain_graph=False)
    assert str(caught.value) == "the autojac backend always gives the heads their gradients; use loop instead"


@pytest.mark.parametrize("backend", GRAPH_BACKENDS)
def test_a_subset_of_the_trunk_as_shared_leaves_the_rest_of_the_trunk_alone(backend: str) -> None:
    """Shared parameters that are a subset of the trunk (the last layer here, as with adapters): J has
    their columns only, the heads get their plain gradients, and the other trunk parameters get neither a
    gradient nor a Jacobian (TorchJD must be told both parameter sets, not infer them from the graph)."""
    model, problem = small_problem()
    last = list(model.trunk[4].parameters())
    others = [p for p in model.trunk.parameters() if all(p is not q for q in last)]
    full_j, head_grads, _ = reference(problem)
    columns = sum(p.numel() for p in problem.shared[:-len(last)])
    model.zero_grad(set_to_none=True)
    forward = problem.forward()
    jac = jacobian_backend(backend).differentiate(forward, last, problem.task_params, retain_graph=False)
    torch.testing.assert_close(jac, full_j[:, columns:], rtol=1e-10, atol=1e-12)
    for params, expected in zip(problem.task_params, head_grads, strict=True):
        for p, g in zip(params, expected, strict=True):
            torch.testing.assert_close(p.grad, g, rtol=1e-10, atol=1e-12)
    assert all(p.grad is None and not hasattr(p, "jac") for p in others)


@pytest.mark.parametrize("backend", ["loop", "batched"])
def test_a_parameter_that_no_loss_uses_gets_a_zero_row_not_an_error(backend: str) -> None:
    model, problem = small_problem()
    unused = torch.nn.Parameter(torch.ones(3, dtype=torch.float64))
    head_unused = torch.nn.Parameter(torch.ones(2, dtype=torch.float64))
    full_j, _, _ = reference(problem)
    forward = problem.forward()
    heads = [list(params) + ([head_unused] if i == 0 else []) for i, params in enumerate(problem.task_params)]
    jac = jacobian_backend(backend).differentiate(forward, [*problem.shared, unused], heads, retain_graph=False)
    torch.testing.assert_close(jac[:, :-3], full_j, rtol=1e-10, atol=1e-12)
    assert torch.equal(jac[:, -3:], torch.zeros(len(problem.task_params), 3, dtype=torch.float64))
    assert head_unused.grad is None or torch.equal(head_unused.grad, torch.zeros(2, dtype=torch.float64))


def test_autogram_reuses_its_hooked_clone_until_the_trunk_changes() -> None:
    """The hooked clone and TorchJD's engine are built once per set of trunk parameters: rebuilding them
    every step would cost a deep copy of the trunk per step."""
    from mtlflow.grad_engine import AutogramGramian

    model, problem = small_problem()
    autogram = AutogramGramian(model.trunk)
    clone = autogram._clone
    for _ in range(2):
        with autogram.hooked(model):
            forward = problem.forward()
        autogram.gramian(torch.stack(forward.losses))
    assert autogram._clone is clone
    model.trunk[4] = torch.nn.Linear(4 * 6 * 6, 8).double()  # a replaced module: new parameters
    with autogram.hooked(model):
        problem.forward()
    assert autogram._clone is not clone


def test_task_jacobian_is_the_loop_backends_jacobian_with_the_heads_plain_gradients() -> None:
    from mtlflow.grad_engine import task_jacobian

    model, problem = small_problem()
    expected_j, head_grads, _ = reference(problem)
    model.zero_grad(set_to_none=True)
    losses = problem.forward().losses
    torch.testing.assert_close(task_jacobian(losses, problem.shared, problem.task_params), expected_j,
                               rtol=1e-10, atol=1e-12)
    for params, expected in zip(problem.task_params, head_grads, strict=True):
        for p, g in zip(params, expected, strict=True):
            torch.testing.assert_close(p.grad, g, rtol=1e-10, atol=1e-12)
    with pytest.raises(RuntimeError, match="backward through the graph a second time"):  # freed by default
        torch.autograd.grad(losses[0], problem.shared)


def test_the_func_backend_says_what_it_cannot_do() -> None:
    from dataclasses import replace

    _, problem = small_problem()
    func = jacobian_backend("func")
    with pytest.raises(ValueError) as caught:
        func.jacobian(replace(problem, functional_losses=None))
    assert str(caught.value) == "the func backend needs StepProblem.functional_losses"
    with pytest.raises(ValueError) as caught:
        func.jacobian(problem, retain_graph=True)
    assert str(caught.value) == "the func backend builds no autograd graph to retain; use loop or batched"
