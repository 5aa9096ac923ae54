"""Nash-MTL: multi-task learning as a bargaining game.

Navon, Shamsian, Achituve, Maron, Kawaguchi, Chechik & Fetaya, "Multi-Task Learning as a Bargaining
Game", ICML 2022 (Algorithm 1). The update is the Nash bargaining solution d = Σ_i α_i g_i
with α > 0 solving

    α ⊙ (GᵀG α) = 1,    i.e.   g_iᵀ d = 1/α_i  for every task i,

(GᵀG the K×K Gramian of the task gradients). The direction always has ‖d‖² = αᵀGᵀGα = K, and every
task improves: g_iᵀd > 0. The training loss is Σ_i α_i L_i (scale "sum": no ×K rescaling).

Solver (the paper's CCCP sequence, as in the official code): with φ_i(α) = log α_i + log β_i(α),
β = GᵀGα, the weights minimise Σ_i β_i(α) + φ(α) subject to φ_i(α) ≥ 0, α ≥ 0; φ = Σ φ_i is concave,
so each CCCP step solves the convex problem with φ linearised at the previous iterate,

    min_{α ≥ 0}  Σ_i β_i(α) + ∇φ(α_prev)ᵀ α    s.t.  log α_i + log β_i(α) ≥ 0,

with cvxpy (at most ``optim_niter`` = 20 steps; stop when ‖G_n α − 1/α‖ < 1e-3 or the step
‖α − α_prev‖ < 1e-6), warm-started from the previous step's weights (initially ones).

Differences from the official code (AvivNavon/nash-mtl), by design:

* Solver policy: the official code solves with ECOS inside a bare ``except`` and silently reuses the
  previous weights when the solve raises -- with cvxpy ≥ 1.6 ECOS is not installed and Nash-MTL
  silently becomes fixed-weight training (nash-mtl issue #21). Here the solver (default Clarabel,
  installed with cvxpy) is checked at construction and every solve's status is checked: a missing
  solver or a non-optimal status raises :class:`~mtlflow.core.errors.SolverError`.
* Units: the problem is solved for the scale-free Gramian C_n = D GᵀG D / ‖D GᵀG D‖_F with
  D = diag(1/‖g_i‖) (the correlation matrix of the gradients, Frobenius-normalised), and mapped back
  by α = D α_n / √‖D GᵀG D‖_F. The fixed point α ⊙ GᵀGα = 1 is invariant under this change of
  variables; the subproblems become independent of the gradient scales. (The official code
  normalises GᵀG but keeps α in unnormalised units, so its subproblem depends on the gradient scale.)
* Start: a linearisation point needs α > 0 and GᵀGα > 0. The warm start (or ones) is used when it
  qualifies; otherwise the start is the min-norm (MGDA) weights plus a small positive shift, which
  satisfies both whenever the gradients are not Pareto-stationary. The start is scaled so that
  min_i α_i (GᵀGα)_i = 1 (the official code starts from the previous α as is).
* Two tasks: the fixed point has the closed form α_i = 1 / (‖g_i‖ √(1 + cos(g_1, g_2))), which is
  used by default for K = 2 (``two_task_closed_form``); it is exact and stays accurate close to the
  Pareto front, where the conic solver loses accuracy (nearly anti-parallel gradients). Set it to
  false to run the CCCP for two tasks too.
* Pareto-stationary gradients (0 in their convex hull: a zero task gradient, or for K = 2
  anti-parallel gradients, to working precision of the Gramian's dtype): the bargaining problem has
  no solution (α → ∞). On the CCCP path, "to working precision" means min_i (C_n w_mn)_i ≤ 1e-8
  (w_mn the min-norm weights), what the conic solver can resolve. The weights are then the min-norm
  (MGDA) weights -- an update of zero at an exactly stationary point -- and ``stationary_steps``
  counts such steps. This is a property of the gradients, checked before any solve, not a solver
  failure (the CAGrad toy's Pareto front is reached with exactly anti-parallel gradients).
* ``max_norm``: the official code clips the norm of the shared parameters' gradient to 1.0 (heads
  unclipped). ``--hp max_norm=1.0`` does exactly that (the trainer clips ``trainer.shared`` after
  its own global clipping, via :meth:`~mtlflow.methods.base.Method.shared_grad_max_norm`); the
  default 0 is the paper (no clipping). ``--clip-grad-norm 1.0`` is not the same: it clips the
  global norm of all parameters, heads included.
* ``update_weights_every`` (amortisation) is applied by the trainer, which reuses ``last_weights``
  between solves; every solve warm-starts from them.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from torch import Tensor

from mtlflow.core.errors import SolverError
from mtlflow.core.hparams import HParam, non_negative, positive
from mtlflow.core.numerics import cpu_float64, gramian_array, one_blas_thread
from mtlflow.methods._cvx import EXP_CONE_SOLVERS, require_cvxpy, require_solver, solve_checked
from mtlflow.methods.base import UPDATE_WEIGHTS_EVERY, GramianWeighting
from mtlflow.methods.solvers import min_norm_weights_qp


def _gramian_array(gramian: Tensor) -> np.ndarray:
    return gramian_array(gramian, "nashmtl")


#: On the CCCP path, gradients whose min-norm point has squared norm below this (in units of the
#: normalised correlation Gramian C_n) count as Pareto-stationary: the conic solver (accuracy ~1e-8)
#: cannot resolve the bargaining weights, which grow like 1/√(that norm), any closer to the front.
CONIC_STATIONARITY_TOL = 1e-8


def stationarity_tol(dtype: torch.dtype) -> float:
    """Below this, 1 + cos θ (K = 2) or min_i (C_n w_mn)_i (K ≥ 3) is zero to working precision."""
    return 64.0 * float(torch.finfo(dtype).eps)


def two_task_nash_weights(gramian: np.ndarray, tol: float) -> np.ndarray | None:
    """Closed-form bargaining weights for K = 2, α_i = 1 / (‖g_i‖ √(1 + cos θ)); None when 1 + cos θ ≤ tol."""
    norms = np.sqrt(np.diag(gramian))
    cos = gramian[0, 1] / (norms[0] * norms[1])
    if not 1.0 + cos > tol:
        return None
    return 1.0 / (norms * np.sqrt(1.0 + cos))


def _valid_linearisation_point(c: np.ndarray, x: np.ndarray) -> bool:
    return bool(np.all(np.isfinite(x)) and np.all(x > 0) and np.all(c @ x > 0))


def cccp_start(c: np.ndarray, warm: np.ndarray | None, tol: float) -> np.ndarray | None:
    """A point α > 0 with Cα > 0 -- the warm start, else ones, else the shifted min-norm weights, scaled
    onto the constraint boundary -- or None when the gradients are Pareto-stationary to working
    precision (no such point exists)."""
    k = c.shape[0]
    w = min_norm_weights_qp(torch.from_numpy(c)).numpy()
    margin = float((c @ w).min())        # ≥ ‖Σ w_i g_i‖² > 0 unless the gradients are Pareto-stationary
    if not margin > tol:
        return None
    start = next((x for x in (warm, np.ones(k)) if x is not None and _valid_linearisation_point(c, x)), None)
    if start is None:
        # (C(w + s1))_i ≥ min(Cw) - s max|C1| > 0 for the shift s below; max|C1| ≥ 1ᵀC1/K ≥ K wᵀCw ≥ K·margin > 0
        # (w minimises wᵀCw over the simplex, and min(Cw) ≤ wᵀCw), so the quotient is finite
        start = w + min(0.5 * margin / float(np.abs(c.sum(axis=1)).max()), 1.0 / k)
        if not _valid_linearisation_point(c, start):
            return None
    # Scale onto the constraint boundary, min_i α_i (Cα)_i = 1: the magnitude of the solution changes
    # fast near the Pareto front, and a linearisation point of the wrong magnitude can make the
    # convex subproblem unbounded.
    return start / np.sqrt(float(np.min(start * (c @ start))))


class _CCCPProblem:
    """The convex CCCP subproblem for K tasks, compiled once with cvxpy parameters (DPP)."""

    def __init__(self, k: int, solver: str):
        cp = require_cvxpy("nashmtl")
        self.solver = solver
        self.alpha = cp.Variable(k, nonneg=True)
        self.gramian = cp.Parameter((k, k))
        self.linear = cp.Parameter(k)   # ∇φ(α_prev)
        beta = self.gramian @ self.alpha
        self.problem = cp.Problem(cp.Minimize(cp.sum(beta) + self.linear @ self.alpha),
                                  [cp.log(self.alpha) + cp.log(beta) >= 0])

    def step(self, c: np.ndarray, previous: np.ndarray) -> np.ndarray:
        self.gramian.value = c
        self.linear.value = 1.0 / previous + c.T @ (1.0 / (c @ previous))
        solve_checked(self.problem, self.solver, "nashmtl")
        value = self.alpha.value
        if value is None or not np.all(np.isfinite(value)) or not np.all(value > 0):
            raise SolverError(f"nashmtl: the {self.solver} solve returned no positive weights; the task "
                              "gradients may be degenerate")
        return np.asarray(value, dtype=np.float64)


class NashMTL(GramianWeighting):
    name = "nashmtl"
    paper = "Navon et al., Multi-Task Learning as a Bargaining Game, ICML 2022"
    equations = "Alg. 1: α ⊙ (GᵀG α) = 1, d = Σ α_i g_i; CCCP with cvxpy"
    natural_scale = "sum"
    hparams = {
        "solver": HParam("CLARABEL", "cvxpy solver of the CCCP steps (one with exponential cones: "
                         + ", ".join(EXP_CONE_SOLVERS) + ")",
                         lambda v: v.upper() in EXP_CONE_SOLVERS, "one of " + ", ".join(EXP_CONE_SOLVERS)),
        "optim_niter": HParam(20, "maximum CCCP iterations per solve", positive),
        "residual_tol": HParam(1e-3, "stop when ‖G_n α − 1/α‖ falls below this", positive),
        "step_tol": HParam(1e-6, "stop when the CCCP step ‖α − α_prev‖ falls below this", positive),
        "two_task_closed_form": HParam(True, "use the exact closed form for K = 2 instead of the CCCP",
                                       kind=bool),
        "update_weights_every": UPDATE_WEIGHTS_EVERY,
        "max_norm": HParam(0.0, "clip the shared parameters' gradient to this norm, as the official code "
                           "(1.0); 0 = no clipping (the paper)", non_negative),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        self.solver = require_solver(self.name, self.hp["solver"])
        self._problem: _CCCPProblem | None = None
        #: the last solved weights in float64: warm start of the next solve and checkpointed state
        self._alpha: np.ndarray | None = None
        #: CCCP iterations of the last solve (0 for the closed form), for logging
        self.last_iterations = 0
        #: max_i |α_i (GᵀGα)_i − 1| of the last solve, for logging
        self.last_residual: float | None = None
        #: steps at which the gradients were Pareto-stationary (min-norm weights were used)
        self.stationary_steps = 0

    @one_blas_thread
    def weights_from_gramian(self, gramian: Tensor, losses: Tensor) -> Tensor:
        m = _gramian_array(gramian)
        tol = stationarity_tol(gramian.dtype)
        self.last_iterations = 0
        alpha: np.ndarray | None = None
        if np.all(np.diag(m) > 0):
            if self.n_tasks == 1:
                alpha = 1.0 / np.sqrt(m[:, 0])
            elif self.n_tasks == 2 and self.hp["two_task_closed_form"]:
                alpha = two_task_nash_weights(m, tol)
            else:
                alpha = self._cccp(m, max(tol, CONIC_STATIONARITY_TOL))
        if alpha is None:
            # Pareto-stationary to working precision: the bargaining solution does not exist.
            self.stationary_steps += 1
            self.last_residual = None
            self.last_weights = min_norm_weights_qp(torch.from_numpy(m))
            return self.last_weights
        if not np.all(np.isfinite(alpha)):
            raise SolverError("nashmtl: the bargaining weights overflowed; the task gradients are degenerate")
        self.last_residual = float(np.max(np.abs(alpha * (m @ alpha) - 1.0)))
        self._alpha = alpha
        self.last_weights = torch.from_numpy(alpha.copy())
        return self.last_weights

    def _cccp(self, m: np.ndarray, tol: float) -> np.ndarray | None:
        norms = np.sqrt(np.diag(m))
        scaled = m / np.outer(norms, norms)           # correlation matrix D GᵀG D
        frobenius = float(np.linalg.norm(scaled))
        c = scaled / frobenius                          # C_n
        to_normalised = np.sqrt(frobenius) * norms      # α_n = α · √‖·‖_F / D
        warm = None if self._alpha is None else self._alpha * to_normalised
        x = cccp_start(c, warm, tol)
        if x is None:
            return None
        if self._problem is None:
            self._problem = _CCCPProblem(self.n_tasks, self.solver)
        for iterations in range(1, self.hp["optim_niter"] + 1):
            new = self._problem.step(c, x)
            converged = (np.linalg.norm(c @ new - 1.0 / new) < self.hp["residual_tol"]
                         or np.linalg.norm(new - x) < self.hp["step_tol"])
            x = new
            self.last_iterations = iterations
            if converged:
                break
        return x / to_normalised

    def shared_grad_max_norm(self) -> float | None:
        return self.hp["max_norm"] if self.hp["max_norm"] > 0 else None

    def state_dict(self) -> dict[str, Any]:
        return {"alpha": None if self._alpha is None else torch.from_numpy(self._alpha.copy()),
                "stationary_steps": self.stationary_steps}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        alpha = state["alpha"]
        self._alpha = None if alpha is None else cpu_float64(alpha).numpy()
        self.last_weights = None if alpha is None else torch.from_numpy(self._alpha.copy())
        self.stationary_steps = int(state["stationary_steps"])
