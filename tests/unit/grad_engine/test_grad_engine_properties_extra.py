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
                     for g, p in zip(again, problem.shared)])
    torch.testing.assert_close(row, expected_j[0], rtol=1e-10, atol=1e-12)


def test_autojac_without_shared_features_names_them() -> None:
    _, problem = small_problem()
    forward = problem.forward()
    with pytest.raises(ValueError) as caught:
        AutojacBackend().differentiate(ForwardPass(forward.losses, None), problem.shared, problem.task_params,
                                       retain_graph=False)
    assert str(caught.value) == "the autojac backend needs the shared features of the forward pass"
