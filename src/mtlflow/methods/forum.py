"""FORUM: a first-order multi-gradient method for multi-objective bi-level optimisation.

Feiyang Ye, *Multi-Task Learning: Effective Weighting Algorithms and Model Parameterization*, PhD
thesis, UTS 2024, Section 3.5, Algorithm 2 (Ye et al., ECAI 2024). With z = (α, ω), the MOBLO problem
is rewritten with the value function f*(α) = min_ω f(α, ω) as the constrained multi-objective problem
min_z F(z) s.t. q(z) = f(z) − f*(α) ≤ 0 (Eq. 3.12/3.13), and f* is approximated by T SGD steps
ω̃^{t+1} = ω̃^t − η ∇_ω f(α, ω̃^t) from ω̃^0 = ω_k (Eq. 3.15): q̃(z) = f(z) − f(α, ω̃^T) (Eq. 3.16). No
Hessian is needed: ∇_α f*(α) = ∇_α f(α, ω*) (Eq. 3.14). One trainer step is one UL iteration k:

* ∇q̃(z_k) = ∇_z f(z_k) − (∇_α f(α_k, ω̃^T), 0) (Algorithm 2, step 9) and ∇F_i(z_k) (step 10; the
  validation losses depend on ω only, so their α-part is 0);
* λ^k from the (K+1)-dimensional QP (Eq. 3.29) on the Gram matrix of (∇F_1, …, ∇F_K, ∇q̃):
  min_{λ ∈ Δ, γ} ½‖Σ λ_i ∇F_i + γ∇q̃‖² − γ ϕ_k  s.t. γ ≥ 0, γ ≥ Σ λ_i π_i, with the dynamic barrier
  ϕ_k = (ρ/2)‖∇q̃‖² (Eq. 3.20) and π_i = (2ϕ_k − ⟨∇q̃, ∇F_i⟩)/‖∇q̃‖² (Eq. 3.27), solved exactly with
  ``quadprog`` (the thesis uses CVXPY; the tests check the KKT conditions and CVXPY's optimum);
* momentum λ̃^k = (1 − β_k) λ̃^{k−1} + β_k λ^k, β_k = (k + 1)^{-3/4}, λ̃^{-1} = 1/K (Eq. 3.30);
* ν(λ̃^k) = max(ρ − ⟨∇q̃, Σ λ̃_i ∇F_i⟩/‖∇q̃‖², 0) (Eq. 3.27) and d_k = −(Σ λ̃_i ∇F_i + ν ∇q̃) (Eq. 3.26);
* z_{k+1} = z_k + μ d_k (Eq. 3.17): −d_k's α-part goes to the UL optimizer (Adam lr 1e-3 in the
  thesis' MTL runs, SGD lr 10 for hyper-cleaning; then the simplex projection), its ω-part to the
  trainer's optimizer (the thesis feeds the two parts to separate optimizers as well).

**Text vs proof.** Minimising Eq. 3.24 over ν alone gives ν = (ϕ_k − ⟨∇q̃, G⟩)/‖∇q̃‖², i.e. ρ/2 in
place of ρ, whereas the printed Eq. 3.25/3.27 (with 2ϕ_k) and the proof of Lemma A.2 use
ν = max((ρ‖∇q̃‖² − ⟨∇q̃, G⟩)/‖∇q̃‖², 0). This implementation uses the proof's ν (the step along
∇q̃ for which Theorem 3.7 holds); it is also what the QP's constraint γ ≥ Σ λ_i π_i makes binding, so
the QP's γ equals ν(λ^k). The proof also takes one step size μ for all of z; the experiments use
different UL/LL optimizers, as here.

Defaults (thesis, Section 3.7.2, Office-31/NYUv2): ρ = 0.1, T = 5, η = 0.1, UL Adam lr 1e-3. The
hyper-cleaning benchmark sets Section 3.7.1's ρ = 0.5, T = 64, η = 0.3, UL SGD lr 10. The authors'
code differs in two places, available as options: ``normalize_upper_grads`` (each ∇_ω F_i scaled to
unit norm) and the momentum counter (their β uses the epoch, not the iteration; not replicated).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from mtlflow.core.callbacks import StepState, TrainerView
from mtlflow.core.errors import NonFiniteValueError, SolverError
from mtlflow.core.hparams import HParam, SearchRange, positive
from mtlflow.core.numerics import cpu_float64
from mtlflow.methods._moblo import BilevelState, check_finite, common_hparams, step_model
from mtlflow.methods.base import Method
from mtlflow.methods.solvers import min_norm_weights_qp

#: ‖∇q̃‖² at or below this fraction of the largest squared gradient norm counts as 0 (q̃ is stationary)
STATIONARY_CONSTRAINT = 1e-12


@dataclass(frozen=True)
class ForumQPSolution:
    """Solution of Eq. 3.29: λ on the simplex, γ, and the Lagrange multipliers of its constraints."""

    lam: Tensor                # [K]
    gamma: float
    phi: float
    pi: Tensor                 # [K]
    #: multipliers of Σλ = 1 (free sign), λ_i ≥ 0 (K), γ ≥ 0, γ − πᵀλ ≥ 0 (all ≥ 0 at a KKT point)
    multipliers: Tensor        # [K + 3]


def forum_qp(gram: Tensor, rho: float) -> ForumQPSolution:
    """Solve Eq. 3.29 exactly from the (K+1) x (K+1) Gram matrix of (∇F_1, …, ∇F_K, ∇q̃).

    Falls back to the min-norm (MGDA) weights with γ = 0 when ‖∇q̃‖ = 0 (ϕ_k = 0 and π undefined).
    """
    try:
        import quadprog
    except ImportError:
        raise SolverError("forum needs quadprog for its QP (Eq. 3.29): pip install quadprog") from None
    m = cpu_float64(gram).numpy()
    if not np.all(np.isfinite(m)):
        raise NonFiniteValueError("forum: the gradient Gram matrix contains NaN or Inf; check the losses and learning rates")
    m = 0.5 * (m + m.T)
    k = m.shape[0] - 1
    q_norm2 = float(m[k, k])
    scale = float(np.max(np.diag(m)))
    if scale <= 0 or q_norm2 <= STATIONARY_CONSTRAINT * scale:
        lam = min_norm_weights_qp(torch.from_numpy(m[:k, :k].copy()))
        return ForumQPSolution(lam, 0.0, 0.0, torch.full((k,), float("nan"), dtype=torch.float64),
                               torch.full((k + 3,), float("nan"), dtype=torch.float64))
    phi = 0.5 * rho * q_norm2
    pi = (2.0 * phi - m[:k, k]) / q_norm2
    # quadprog: min ½ xᵀGx − aᵀx s.t. Cᵀx ≥ b (first meq equalities); the objective is divided by
    # `scale`, and a ridge far below the solver tolerance makes the PSD Gram matrix positive definite.
    g = m / scale + 1e-10 * np.eye(k + 1)
    a = np.zeros(k + 1)
    a[k] = phi / scale
    simplex_sum = np.concatenate([np.ones(k), [0.0]])
    barrier = np.concatenate([-pi, [1.0]])
    c = np.column_stack([simplex_sum, np.eye(k + 1), barrier])
    b = np.concatenate([[1.0], np.zeros(k + 1), [0.0]])
    try:
        solution = quadprog.solve_qp(g, a, c, b, meq=1)
    except ValueError as exc:
        raise SolverError(f"forum: the QP of Eq. 3.29 failed ({exc})") from None
    x, multipliers = solution[0], solution[4] * scale
    lam = np.clip(x[:k], 0.0, None)
    return ForumQPSolution(torch.from_numpy(lam / lam.sum()), float(max(x[k], 0.0)), phi, torch.from_numpy(pi),
                           torch.from_numpy(multipliers))


def forum_nu(gram: Tensor, lam: Tensor, rho: float) -> float:
    """ν(λ) = max(ρ − ⟨∇q̃, Σ λ_i ∇F_i⟩/‖∇q̃‖², 0): Eq. 3.27 with ϕ_k = (ρ/2)‖∇q̃‖², the proof's form."""
    k = lam.numel()
    q_norm2 = float(gram[k, k])
    if q_norm2 <= STATIONARY_CONSTRAINT * float(gram.diagonal().max()):
        return 0.0
    inner = float(lam.to(gram) @ gram[:k, k])
    return max(rho - inner / q_norm2, 0.0)


def _flat(grads: tuple[Tensor | None, ...], like: list[Tensor]) -> Tensor:
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for g, p in zip(grads, like, strict=True)])


class FORUM(Method):
    name = "forum"
    family = "bilevel"
    cost = "O(K + T)"
    paper = ("Ye, Multi-Task Learning: Effective Weighting Algorithms and Model Parameterization, PhD thesis "
             "UTS 2024, ch. 3 (FORUM: Ye et al., ECAI 2024)")
    equations = ("Alg. 2: q̃ = f(z) − f(α, ω̃^T) (Eq. 3.15-3.16), QP Eq. 3.29, momentum Eq. 3.30, "
                 "ν Eq. 3.27 (proof's form), d Eq. 3.26, z ← z + μd (Eq. 3.17)")
    custom_step = True
    needs_trainer = "a bilevel method: every step runs inner SGD steps on the batch and reads validation losses"
    hparams = {
        **common_hparams(inner_steps=5, inner_lr=0.1),
        "rho": HParam(0.1, "ρ of the dynamic barrier ϕ_k = (ρ/2)‖∇q̃‖² (thesis: 0.1 MTL, 0.5 hyper-cleaning)",
                      positive, search=SearchRange("categorical", choices=(0.1, 0.5, 0.9),
                                                   source="Ye's thesis: ρ grid {0.1, 0.5, 0.9} of its baselines")),
        "beta_power": HParam(0.75, "momentum β_k = (k + 1)^(-beta_power) on λ (Eq. 3.30)", lambda v: 0 < v <= 1,
                             "in (0, 1]"),
        "normalize_upper_grads": HParam(False, "scale each ∇_ω F_i to unit norm (the authors' code)", kind=bool),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        self.state = BilevelState(self.name)
        self.lam_tilde = torch.full((n_tasks,), 1.0 / n_tasks, dtype=torch.float64)
        self.iteration = 0

    def setup(self, trainer: TrainerView) -> None:
        self.state.setup(self.hp, trainer)

    def training_step(self, trainer: TrainerView, batch: Any, epoch: int) -> dict[str, Any]:
        hp, state = self.hp, self.state
        model, upper = state.model, state.upper
        alpha = upper.variable.detach().clone().requires_grad_(True)
        live = model.current()
        params = list(live.values())

        # f(z_k) and ∇_z f(z_k) on the step's batch
        inputs, targets = model.inputs_targets(batch)
        preds = model.predictions(None, inputs)
        losses = model.task_losses(preds, targets)
        check_finite(losses, self.name, trainer, "training losses")
        f_value = upper.lower_objective(alpha, model, preds, targets)
        grads = torch.autograd.grad(f_value, [alpha, *params], allow_unused=True)
        f_alpha = torch.zeros_like(alpha) if grads[0] is None else grads[0]
        f_omega = _flat(grads[1:], params)

        # T inner SGD steps from ω̃^0 = ω_k (Eq. 3.15), then ∇_α f(α_k, ω̃^T) on the same batch
        inner = state.inner_batch_source(hp, trainer, batch)
        tilde = model.detached_copy()
        for t in range(hp["inner_steps"]):
            t_inputs, t_targets = model.inputs_targets(inner(t))
            inner_value = upper.lower_objective(alpha.detach(), model, model.predictions(tilde, t_inputs), t_targets)
            check_finite(inner_value.reshape(1), self.name, trainer, "inner lower-level loss")
            inner_grads = torch.autograd.grad(inner_value, list(tilde.values()), allow_unused=True)
            with torch.no_grad():
                for p, g in zip(tilde.values(), inner_grads, strict=True):
                    if g is not None:
                        p.sub_(hp["inner_lr"] * g)
        frozen = {n: p.detach() for n, p in tilde.items()}
        f_tilde = upper.lower_objective(alpha, model, model.predictions(frozen, inputs), targets)
        (tilde_alpha,) = torch.autograd.grad(f_tilde, alpha, allow_unused=True)
        q_alpha = f_alpha - (torch.zeros_like(alpha) if tilde_alpha is None else tilde_alpha)

        # ∇_ω F_i(z_k) on an upper-level (validation) batch
        val_inputs, val_targets = model.inputs_targets(state.upper_batch(hp, trainer))
        val_losses = model.task_losses(model.predictions(live, val_inputs), val_targets)
        check_finite(val_losses, self.name, trainer, "validation losses")
        upper_grads = torch.stack([
            _flat(torch.autograd.grad(val_losses[i], params, retain_graph=i + 1 < self.n_tasks, allow_unused=True),
                  params) for i in range(self.n_tasks)])
        if hp["normalize_upper_grads"]:
            upper_grads = upper_grads / (upper_grads.norm(dim=1, keepdim=True) + 1e-8)

        started = time.perf_counter()
        gram = self._gram(upper_grads, f_omega, q_alpha)
        solution = forum_qp(gram, hp["rho"])
        beta = 1.0 / math.pow(self.iteration + 1, hp["beta_power"])
        self.lam_tilde = (1.0 - beta) * self.lam_tilde + beta * solution.lam
        nu = forum_nu(gram, self.lam_tilde, hp["rho"])
        solver_seconds = time.perf_counter() - started
        self.iteration += 1

        lam = self.lam_tilde.to(upper_grads)
        omega_direction = (lam @ upper_grads + nu * f_omega) * state.lower_scale(trainer)
        state.step_upper(nu * q_alpha)
        offsets = np.cumsum([0] + [p.numel() for p in params])
        step_state = StepState(epoch=epoch, step=trainer.global_step, batch=batch, losses=losses.detach())
        step_model(trainer, step_state, grads={name: omega_direction[offsets[i]:offsets[i + 1]].view_as(p)
                                               for i, (name, p) in enumerate(live.items())})
        self.last_weights = cpu_float64(upper.weights_summary())
        return {"losses": losses.detach(), "weights": self.last_weights, "solver_seconds": solver_seconds,
                **step_state.info}

    @staticmethod
    def _gram(upper_grads: Tensor, f_omega: Tensor, q_alpha: Tensor) -> Tensor:
        """Gram matrix of (∇F_1, …, ∇F_K, ∇q̃) in z = (α, ω), without materialising the zero α-parts of ∇F_i."""
        k = upper_grads.shape[0]
        gram = torch.zeros(k + 1, k + 1, dtype=torch.float64)
        g = upper_grads.detach().to(torch.float64)
        f = f_omega.detach().to(torch.float64)
        gram[:k, :k] = (g @ g.T).cpu()
        cross = (g @ f).cpu()
        gram[:k, k] = cross
        gram[k, :k] = cross
        gram[k, k] = float(f @ f + q_alpha.detach().to(torch.float64).pow(2).sum())
        return gram

    def state_dict(self) -> dict[str, Any]:
        return {"bilevel": self.state.state_dict(), "lam_tilde": self.lam_tilde.clone(), "iteration": self.iteration}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.load_state_dict(state["bilevel"])
        self.lam_tilde = cpu_float64(state["lam_tilde"])
        self.iteration = int(state["iteration"])
