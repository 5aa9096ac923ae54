"""cvxpy helpers that make a missing or failed convex solve an error, never a silent fallback.

The official Nash-MTL code calls cvxpy with ECOS inside a bare ``except`` and reuses the previous
weights when the solve raises; since cvxpy 1.6 no longer installs ECOS, every solve failed there and
training silently degraded to fixed weights (nash-mtl issue #21). These helpers check the solver at
construction time and the status after every solve. cvxpy is imported lazily (optional dependency).
"""

from __future__ import annotations

from types import ModuleType
from typing import Any

from mtlflow.core.errors import SolverError

#: cvxpy solvers able to handle the exponential cones that ``log`` constraints compile to.
EXP_CONE_SOLVERS = ("CLARABEL", "ECOS", "SCS", "MOSEK")


def require_cvxpy(method: str) -> ModuleType:
    try:
        import cvxpy
    except ImportError:
        raise SolverError(f"{method} needs cvxpy: pip install cvxpy (it brings the Clarabel solver)") from None
    return cvxpy


def require_solver(method: str, solver: str) -> str:
    """The canonical name of ``solver`` if cvxpy has it installed; :class:`SolverError` otherwise."""
    cvxpy = require_cvxpy(method)
    name = solver.upper()
    installed = list(cvxpy.installed_solvers())
    if name not in installed:
        usable = [s for s in EXP_CONE_SOLVERS if s in installed]
        extra = f"pip install {name.lower()}" if name != "MOSEK" else "install MOSEK and its licence"
        raise SolverError(
            f"{method}: cvxpy solver {name} is not installed (installed: {', '.join(installed) or 'none'}); "
            f"{extra}, or choose an installed one with --hp solver={usable[0] if usable else 'CLARABEL'}")
    return name


def solve_checked(problem: Any, solver: str, method: str, **options: Any) -> None:
    """Solve ``problem`` with ``solver`` and raise :class:`SolverError` unless the status is optimal.

    The solver's own warm start is off: the result then depends only on the problem data, so a
    resumed run repeats the uninterrupted one exactly (warm starts belong to the caller's state).
    """
    cvxpy = require_cvxpy(method)
    try:
        problem.solve(solver=solver, warm_start=False, **options)
    except cvxpy.error.SolverError as exc:
        raise SolverError(f"{method}: the {solver} solve failed ({exc}); the task gradients may be "
                          "degenerate (zero, NaN or linearly dependent)") from None
    if problem.status != cvxpy.OPTIMAL:
        raise SolverError(f"{method}: the {solver} solve ended with status {problem.status!r} instead of "
                          "'optimal'; the task gradients may be degenerate (zero, NaN or linearly dependent)")
