"""MOML: the nested (iterative-differentiation) gradient method for multi-objective bi-level optimisation.

Feiyang Ye, *Multi-Task Learning: Effective Weighting Algorithms and Model Parameterization*, PhD
thesis, UTS 2024, Section 3.4, Algorithm 1 (Ye et al., NeurIPS 2021). The upper level (UL) variable α
(task weights on the simplex, or per-sample weights for hyper-cleaning; see :mod:`._moblo`) is judged
on the per-task validation losses F_i; the model weights ω are the lower level (LL), trained on the
α-weighted training loss f(ω, α). One trainer step is one UL iteration k:

1. ω_0 = the current weights; T differentiable SGD steps ω_j = ω_{j-1} − μ ∇_ω f(ω_{j-1}, α_k)
   (Algorithm 1, steps 3–6, μ = ``inner_lr``; the graph is kept, second-order terms included);
2. hypergradients ∇_α F_i(ω_T(α_k)) of every task's validation loss through the unrolled steps
   (step 7; the approximation of the true hypergradient, Eq. 3.7, that Theorem 3.3 bounds);
3. d = MOOSolver({∇_α F_i}) (step 8) -- MGDA's min-norm point of the hypergradients (Section 2.2,
   Eq. 2.3) by default, or any registered gradient method (``upper_solver=moco`` gives the thesis'
   MoCo baseline of Table 3.2, which the authors run as MOML with MoCo as the MOO solver);
4. α_{k+1} = α_k − ν d (step 9) with the UL optimizer (Adam with lr 1e-3 in the thesis' MTL runs,
   plain SGD with lr 10 for hyper-cleaning), projected back onto the simplex;
5. the real LL step: one step of the trainer's optimizer on f(ω, α_{k+1}) on the step's batch (the
   unrolled weights are discarded, as in the authors' MTL code; ω continues from its current value,
   Algorithm 1's "initialise ω_0^k").

Defaults (thesis, Section 3.7.2): T = 1 and LL step 0.1 (the grid is {0.05, 0.1, 0.5}), UL Adam lr
1e-3 ("a similar configuration to FORUM"). The hyper-cleaning benchmark sets the thesis' Section 3.7.1
configuration (shared with FORUM): T = 64, LL step 0.3, UL SGD lr 10. Complexity per UL iteration
O(m p (n + p) T) time, O(mn + mpT) memory (Table 3.1): the unrolled graph holds T copies of ω.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor

from mtlflow.core.callbacks import StepState, TrainerView
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.hparams import HParam
from mtlflow.core.numerics import cpu_float64
from mtlflow.methods._moblo import BilevelState, check_finite, common_hparams, step_model
from mtlflow.methods.base import GradientMethod, Method


def unrolled_hypergradients(variable: Tensor, params0: dict[str, Tensor],
                            lower: Callable[[Tensor, dict[str, Tensor], int], Tensor],
                            upper: Callable[[dict[str, Tensor]], Tensor], steps: int,
                            lr: float) -> tuple[Tensor, Tensor]:
    """``(H [K, numel(α)], F(ω_T) [K])``: row i is ∂F_i(ω_T(α))/∂α through ``steps`` SGD steps of size ``lr``.

    ``lower(α, ω, t)`` is the LL objective of inner step t, ``upper(ω)`` the K UL losses; ``params0``
    are leaf tensors requiring grad (ω_0, independent of α).
    """
    alpha = variable.detach().clone().requires_grad_(True)
    params = dict(params0)
    for t in range(steps):
        objective = lower(alpha, params, t)
        grads = torch.autograd.grad(objective, list(params.values()), create_graph=True, allow_unused=True)
        params = {name: p if g is None else p - lr * g for (name, p), g in zip(params.items(), grads, strict=True)}
    values = upper(params)
    rows = []
    for i in range(values.numel()):
        (grad,) = torch.autograd.grad(values[i], alpha, retain_graph=i + 1 < values.numel(), allow_unused=True)
        rows.append(torch.zeros_like(alpha) if grad is None else grad)
    return torch.stack(rows).reshape(values.numel(), -1), values.detach()


class MOML(Method):
    name = "moml"
    family = "bilevel"
    cost = "O(K·T) + unroll"
    paper = ("Ye, Multi-Task Learning: Effective Weighting Algorithms and Model Parameterization, PhD thesis "
             "UTS 2024, ch. 3 (MOML: Ye et al., NeurIPS 2021)")
    equations = ("Alg. 1: T unrolled LL SGD steps, ∇_α F_i(ω_T(α)) (approximating Eq. 3.7), "
                 "d = MGDA(Eq. 2.3), α ← Π_Δ(α − ν d); MTL instance Eq. 3.2")
    custom_step = True
    needs_trainer = "a bilevel method: every step unrolls inner SGD steps on the batch and reads validation losses"
    hparams = {
        **common_hparams(inner_steps=1, inner_lr=0.1),
        "upper_solver": HParam("mgda", "MOO solver on the hypergradients: a registered gradient method (mgda = "
                               "Algorithm 1; moco = the thesis' MoCo baseline)", lambda v: isinstance(v, str) and v,
                               "a registered gradient-method name", kind=str),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        # the registry package imports every method module, this one included: a module-level import is a cycle
        from mtlflow import methods  # noqa: PLC0415

        solver_cls = methods.get(self.hp["upper_solver"])
        if not issubclass(solver_cls, GradientMethod) or solver_cls.custom_step:
            raise InvalidParameterError(f"moml: upper_solver={self.hp['upper_solver']!r} is not a gradient method; "
                                        "use mgda, moco or another method that combines gradients")
        self.solver: GradientMethod = solver_cls(n_tasks)
        self.state = BilevelState(self.name)

    def setup(self, trainer: TrainerView) -> None:
        self.state.setup(self.hp, trainer)

    def training_step(self, trainer: TrainerView, batch: Any, epoch: int) -> dict[str, Any]:
        hp, state = self.hp, self.state
        model, upper = state.model, state.upper
        inner = state.inner_batch_source(hp, trainer, batch)
        inner_data = [model.inputs_targets(inner(t)) for t in range(hp["inner_steps"])]
        val_inputs, val_targets = model.inputs_targets(state.upper_batch(hp, trainer))

        def lower(alpha: Tensor, params: dict[str, Tensor], t: int) -> Tensor:
            inputs, targets = inner_data[t]
            return upper.lower_objective(alpha, model, model.predictions(params, inputs), targets)

        def upper_losses(params: dict[str, Tensor]) -> Tensor:
            return model.task_losses(model.predictions(params, val_inputs), val_targets)

        hyper, val_losses = unrolled_hypergradients(upper.variable, model.detached_copy(), lower, upper_losses,
                                                    hp["inner_steps"], hp["inner_lr"])
        check_finite(val_losses, self.name, trainer, "validation losses")
        started = time.perf_counter()
        direction = self.solver.combine(hyper, val_losses)
        solver_seconds = time.perf_counter() - started
        state.step_upper(direction.reshape(upper.variable.shape))

        inputs, targets = model.inputs_targets(batch)
        preds = model.predictions(None, inputs)
        losses = model.task_losses(preds, targets)
        check_finite(losses, self.name, trainer, "training losses")
        objective = upper.lower_objective(upper.variable, model, preds, targets) * state.lower_scale(trainer)
        step_state = StepState(epoch=epoch, step=trainer.global_step, batch=batch, losses=losses.detach())
        step_model(trainer, step_state, objective=objective)
        self.last_weights = cpu_float64(upper.weights_summary())
        return {"losses": losses.detach(), "weights": self.last_weights, "solver_seconds": solver_seconds,
                **step_state.info}

    def state_dict(self) -> dict[str, Any]:
        return {"bilevel": self.state.state_dict(), "solver": self.solver.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.load_state_dict(state["bilevel"])
        self.solver.load_state_dict(state["solver"])
