"""Property-test mixins, one per method family: a test class ``TestX(FamilyContract)`` with ``name = "x"``
checks that method against every property its family promises.

* every method (:class:`MethodContract`): an unknown hyper-parameter is one line, the task count must be
  positive, a checkpointed state continues a run exactly (the generator of a stochastic method included:
  the clone is built with another seed), a state saved before the first step restores, and the run seed
  alone decides a stochastic method's draws;
* loss weighting (:class:`LossWeightingContract`): the gradient of the objective w.r.t. the losses is
  exactly the weights the method logs (autograd against ``last_weights``, after every step), and those
  weights and the objective come in the losses' dtype;
* gradient methods (:class:`GradientContract`): one finite direction entry per parameter;
* Gramian weightings (:class:`GramianContract`): the direction is ``last_weights @ J``, depends on J only
  through its Gramian (rotating the parameter space rotates the direction), a NaN gradient is refused in
  one line naming the method, and, for deterministic methods, does not depend on the order of the tasks;
  all of this and the method's own defining property (:meth:`GramianContract.assert_defining_property`,
  which every method's class states) also hold on rank-deficient Jacobians with unequal gradient norms.
"""

from __future__ import annotations

from typing import Any, ClassVar

import pytest
import torch
from method_helpers import ctx, jacobian, positive_losses, rank_deficient_jacobians, through_torch_save

from mtlflow import methods
from mtlflow.core.errors import InvalidParameterError, NonFiniteValueError
from mtlflow.methods.base import StepContext


class MethodContract:
    name: ClassVar[str]
    hparams: ClassVar[dict[str, Any]] = {}
    n_tasks: ClassVar[int] = 3

    def build(self, seed: int = 0) -> methods.Method:
        return methods.build(self.name, self.n_tasks, seed, **self.hparams)

    def step(self, method: methods.Method, i: int) -> torch.Tensor:
        """Step ``i`` of a run (the same data for every instance) and what it produced."""
        raise NotImplementedError

    def test_an_unknown_hyper_parameter_is_refused_in_one_line(self) -> None:
        with pytest.raises(InvalidParameterError, match="unknown hyper-parameter") as exc:
            methods.build(self.name, self.n_tasks, not_a_hyper_parameter=1)
        assert "\n" not in str(exc.value)

    def test_the_task_count_must_be_a_positive_integer(self) -> None:
        with pytest.raises(InvalidParameterError, match="n_tasks"):
            methods.build(self.name, 0)

    def test_a_checkpointed_state_continues_the_run_exactly(self) -> None:
        original = self.build(seed=5)
        for i in range(3):
            self.step(original, i)
        original.on_epoch_end(1)
        resumed = self.build(seed=6)  # another seed: the state must carry the generator
        resumed.load_state_dict(through_torch_save(original.state_dict()))
        for i in range(3, 6):
            assert torch.equal(self.step(original, i), self.step(resumed, i)), i
            if original.last_weights is not None:
                assert torch.equal(original.last_weights, resumed.last_weights), i

    def test_a_state_saved_before_the_first_step_restores_a_fresh_run(self) -> None:
        """A checkpoint written before any step (its state still empty: no EMA, no baseline, no window)
        restores, and the restored method then steps as a fresh one does."""
        original = self.build(seed=5)
        resumed = self.build(seed=6)
        resumed.load_state_dict(through_torch_save(original.state_dict()))
        for i in range(3):
            assert torch.equal(self.step(original, i), self.step(resumed, i)), i

    def test_the_run_seed_decides_the_draws(self) -> None:
        first, again, other = self.build(seed=7), self.build(seed=7), self.build(seed=8)
        outputs = [self.step(first, i) for i in range(4)]
        assert all(torch.equal(out, self.step(again, i)) for i, out in enumerate(outputs))
        differs = any(not torch.equal(out, self.step(other, i)) for i, out in enumerate(outputs))
        assert differs == methods.get(self.name).stochastic


class LossWeightingContract(MethodContract):
    def step(self, method: methods.Method, i: int, dtype: torch.dtype = torch.float64) -> torch.Tensor:
        losses = positive_losses(100 + i, self.n_tasks).to(dtype).requires_grad_(True)
        method.before_backward(ctx(losses, step=i))
        gradient, = torch.autograd.grad(method.objective(losses), losses)
        after = losses.detach() * 0.9  # what a step did to the losses, for the methods that watch it (FAMO)
        method.after_optimizer_step(StepContext(step=i, epoch=1, losses=losses.detach(),
                                                recompute_losses=lambda: after))
        return gradient

    def test_the_objective_applies_exactly_the_weights_it_logs(self) -> None:
        method = self.build()
        for i in range(4):
            gradient = self.step(method, i)
            torch.testing.assert_close(gradient, method.last_weights.to(gradient), rtol=1e-12, atol=0)

    def test_the_weights_and_the_objective_come_in_the_losses_dtype(self) -> None:
        for dtype in (torch.float32, torch.float64):
            method = self.build()
            for i in range(3):
                self.step(method, i, dtype)
                assert method.last_weights.dtype == dtype, (dtype, i)
            losses = positive_losses(110, self.n_tasks).to(dtype).requires_grad_(True)
            method.before_backward(ctx(losses, step=3))
            assert method.objective(losses).dtype == dtype


class GradientContract(MethodContract):
    n_params: ClassVar[int] = 9

    def data(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        return jacobian(200 + i, self.n_tasks, self.n_params), positive_losses(200 + i, self.n_tasks)

    def step(self, method: methods.Method, i: int) -> torch.Tensor:
        return method.combine(*self.data(i))

    def test_the_direction_has_one_finite_entry_per_parameter(self) -> None:
        method = self.build()
        for i in range(3):
            direction = self.step(method, i)
            assert direction.shape == (self.n_params,) and torch.isfinite(direction).all()


class GramianContract(GradientContract):
    #: False for methods that visit the tasks in a random order (PCGrad, GradVac)
    task_symmetric: ClassVar[bool] = True
    #: how closely the method's solver meets its optimality conditions (Nash-MTL's iterations stop near 1e-9)
    solver_atol: ClassVar[float] = 1e-9
    #: False for a method that returns non-finite weights for the trainer to report (a plug-in may)
    refuses_non_finite: ClassVar[bool] = True

    def test_the_direction_is_the_logged_weights_times_the_gradients(self) -> None:
        method = self.build()
        for i in range(3):
            grads, losses = self.data(i)
            direction = method.combine(grads, losses)
            torch.testing.assert_close(direction, method.last_weights.to(grads) @ grads, rtol=1e-9, atol=1e-12)

    def test_the_direction_depends_on_the_jacobian_through_its_gramian_only(self) -> None:
        rotation, _ = torch.linalg.qr(jacobian(99, self.n_params, self.n_params))
        plain, rotated = self.build(seed=3), self.build(seed=3)
        for i in range(3):
            grads, losses = self.data(i)
            torch.testing.assert_close(rotated.combine(grads @ rotation, losses),
                                       plain.combine(grads, losses) @ rotation, rtol=1e-7, atol=self.solver_atol)

    def test_a_non_finite_gradient_is_refused_naming_the_method(self) -> None:
        """Through ``combine`` (the Jacobian) and through ``weights_from_gramian`` (the Gramian the autogram
        backend hands over)."""
        if not self.refuses_non_finite:
            pytest.skip(f"{self.name} leaves non-finite input to the trainer, which names it at the step")
        grads, losses = self.data(0)
        grads[1, 2] = float("nan")
        gramian = grads @ grads.T
        for solve in (lambda m: m.combine(grads, losses), lambda m: m.weights_from_gramian(gramian, losses)):
            with pytest.raises(NonFiniteValueError) as error:
                solve(self.build())
            assert str(error.value).startswith(f"{self.name}: ") and "\n" not in str(error.value)

    def test_relabelling_the_tasks_leaves_the_direction_unchanged(self) -> None:
        if not self.task_symmetric:
            pytest.skip(f"{self.name} visits the tasks in a random order")
        order = torch.randperm(self.n_tasks, generator=torch.Generator().manual_seed(1))
        plain, relabelled = self.build(), self.build()
        for i in range(3):
            grads, losses = self.data(i)
            torch.testing.assert_close(relabelled.combine(grads[order], losses[order]), plain.combine(grads, losses),
                                       rtol=1e-7, atol=self.solver_atol)

    def assert_defining_property(self, grads: torch.Tensor, losses: torch.Tensor, method: methods.Method,
                                 direction: torch.Tensor) -> None:
        """Assert the property that defines this method (its paper's equations, checked independently of
        its solver) for ``direction``, just computed by ``method`` (fresh, built with seed 3) on ``grads``."""
        raise NotImplementedError(f"{type(self).__name__} must state the defining property of {self.name}")

    def test_rank_deficient_jacobians_of_unequal_norms_keep_the_contract(self) -> None:
        """On every Jacobian of :func:`method_helpers.rank_deficient_jacobians`: a finite direction equal to
        the logged weights times J, rotated with the parameter space, unchanged by relabelling the tasks,
        and the method's defining property."""
        rotation, _ = torch.linalg.qr(jacobian(99, self.n_params, self.n_params))
        losses = positive_losses(300, self.n_tasks)
        for label, grads in rank_deficient_jacobians(self.n_tasks, self.n_params).items():
            scale = float(grads.norm(dim=1).max())
            method = self.build(seed=3)
            direction = method.combine(grads, losses)
            assert direction.shape == (self.n_params,) and torch.isfinite(direction).all(), label
            torch.testing.assert_close(direction, method.last_weights.to(grads) @ grads, rtol=1e-9,
                                       atol=1e-12 * scale, msg=label)
            torch.testing.assert_close(self.build(seed=3).combine(grads @ rotation, losses), direction @ rotation,
                                       rtol=1e-7, atol=self.solver_atol * scale, msg=label)
            if self.task_symmetric:
                order = torch.randperm(self.n_tasks, generator=torch.Generator().manual_seed(1))
                torch.testing.assert_close(self.build(seed=3).combine(grads[order], losses[order]), direction,
                                           rtol=1e-7, atol=self.solver_atol * scale, msg=label)
            self.assert_defining_property(grads, losses, method, direction)
