"""NORMAL: a shared second-order neural ODE after the shared backbone, read at learnable task positions.

Feiyang Ye, *Multi-Task Learning: Effective Weighting Algorithms and Model Parameterization*, PhD thesis,
UTS 2024, Chapter 5 (IJCAI 2023; ``shared/seeds/ye-thesis-mobl-asmg-normal.txt``). An *architecture*,
not a weighting: it wraps any benchmark's :class:`~mtlflow.models.base.MultiTaskModel` (hard
parameter sharing: backbone f_θ + heads h_φi) and trains with any method.

Model (Eq. 5.6): task i predicts h_φi(Q_φ(f_θ(x), p_i)), where Q_φ(·, p) = z(p) is the state of the
heavy-ball ODE (HBNODE, Eq. 5.5) started at z(0) = f_θ(x), q(0) = u(f_θ(x); φ_v) (Eq. 5.9):

    dz/dt = −q(t),     dq/dt = −γ q(t) + g(z(t)[, t]; φ_o) + ξ z(t),     γ = sigmoid(ω).

u and g are FC → LeakyReLU → FC with the feature width in and out (Conv1x1 for feature maps, as the
thesis' NYUv2 model); ω is learnable, ξ a hyper-parameter. The ODE is integrated with torchdiffeq's
fixed-step solvers (Euler by default, as the thesis) and differentiated through the solver steps
(``gradient="direct"``, the default) or with the adjoint method (``gradient="adjoint"``, the thesis).
Deviation: with a fixed step the adjoint ODE, integrated backwards on the same coarse grid, is not the
gradient of the discrete forward that produced the loss -- at the defaults (Euler, h = 0.1) ∂L/∂ω
differs from a finite difference of the production forward by about 12 % (test_normal.py), while the
direct gradient matches it to 1e-8. The adjoint only saves memory, which these trunks do not need.

**Task positions** p_i are learnable scalars. Their gradient is the thesis' Eq. 5.11,
d_{p_i} = dL_i/dz(p_i) · dz/dt|_{p_i} = −dL_i/dz(p_i) · q(p_i), with q(p_i) saved in the forward pass:
the head reads z(p_i) + (p_i − sg(p_i)) · sg(dz/dt(p_i)), whose value is z(p_i) and whose gradient
w.r.t. p_i is exactly Eq. 5.11 (sg = stop-gradient); the solver itself sees the detached positions.
Positions may be negative (the thesis' unconstrained form; the ODE is then integrated backwards from
0); ``position_param="exp"`` is its ablation p_i = e^{v_i}.

**Where the parameters live.** θ, φ_v, φ_o and ω are task-shared: the backbone and the ODE form the
model's ``trunk`` (``shared_parameters()``, the parameters gradient methods combine). p_i is
task-specific (Algorithm 4 lists {p_i} with the heads' parameters): it sits in head i's module
(``task_parameters(i)``), so gradient methods give it the plain gradient of L_i -- the d_{p_i} of
Eq. 5.11, which involves L_i only -- exactly as they treat the heads. The shared features the gradient
engine sees are the ODE states at all positions, ``[K, 2, B, *feature]`` (state z(p_i) and its time
derivative per task; the derivative is only read detached, so representation-mode methods differentiate
through z(p_i)); the positions enter only downstream, in the heads.

Hyper-parameters the thesis does not state, and the values chosen (``architecture_options``):
``step_size`` 0.1 (Euler step; p ≈ 1 gives 10 steps), ``xi`` 0 (ξ, "tuned"), ``omega_init`` 0
(γ = 0.5 at the start), ``initial_positions`` 1.0 for every task (the ablation's constant p = 1),
``hidden`` = the feature width (the thesis' 512/2048 equal the backbones' widths), ``position_lr``
= the model's learning rate (η = μ; Algorithm 4 allows a separate η), g autonomous (``time_input``
false: the thesis writes g(z, t) but gives FC layers with equal input and output widths), joint updates
of Θ and p (the thesis allows joint or alternating). Ablations (Table 5.4): ``learn_positions=false``
(constant p_i), ``position_param="exp"``, ``order=1`` (first-order NODE dz/dt = g(z)), and
``replace_ode="shared-layers"`` / ``"task-layers"``: the thesis' "+ task-shared / task-specific layers
(parameter-matched)" rows, read as the backbone followed by plain layers instead of the ODE. The thesis
gives no layout; mtlflow uses u's and g's layers (FC → LeakyReLU → FC, twice, a LeakyReLU between),
shared by every task, or one such stack per task with the hidden width h′ that matches the ODE's
parameters in total (:func:`matched_task_hidden`; the per-task stacks are task parameters).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import torch
from torch import Tensor, nn

from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.hparams import HParam, one_of, positive, resolve_architecture_options
from mtlflow.models.base import MultiTaskModel

SOLVERS = ("euler", "midpoint", "rk4")
GRADIENTS = ("adjoint", "direct")
POSITION_PARAMS = ("free", "exp")
REPLACEMENTS = ("none", "shared-layers", "task-layers")


def _positions_ok(v: Any) -> bool:
    values = v if isinstance(v, list) else [v]
    return bool(values) and all(isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
                                for x in values)


#: The architecture options of NORMAL (``--architecture-option KEY=VALUE``), validated like method hyper-parameters.
OPTIONS: dict[str, HParam] = {
    "step_size": HParam(0.1, "fixed step of the ODE solver (not stated in the thesis)", positive),
    "solver": HParam("euler", "torchdiffeq fixed-grid solver: euler (the thesis), midpoint or rk4",
                     one_of(*SOLVERS)),
    "gradient": HParam("direct", "how Θ's gradients go through the ODE: direct (back-propagation through the "
                       "solver steps: the exact gradient of the discrete forward) or adjoint (the thesis; O(h) off)",
                       one_of(*GRADIENTS)),
    "xi": HParam(0.0, "ξ of the skip term ξ z(t) in dq/dt (a tuned hyper-parameter, value not stated)", kind=float),
    "omega_init": HParam(0.0, "initial ω of the damping γ = sigmoid(ω) (not stated)", kind=float),
    "initial_positions": HParam(1.0, "initial task positions p_i: one number for all tasks or one per task "
                                "(not stated; 1 = the ablation's constant position)", _positions_ok,
                                "a finite number or a list of finite numbers", kind=object),
    "learn_positions": HParam(True, "learn p_i (false: the ablation with constant positions)", kind=bool),
    "position_param": HParam("free", "p_i itself ('free', the thesis) or p_i = exp(v_i) ('exp', its ablation)",
                             one_of(*POSITION_PARAMS)),
    "position_lr": HParam(None, "step size η of the positions (default: the model's learning rate)",
                          lambda v: v is None or v > 0, "> 0", kind=float),
    "order": HParam(2, "2: the heavy-ball ODE (the thesis); 1: first-order NODE dz/dt = g(z) (its ablation)",
                    one_of(1, 2), kind=int),
    "hidden": HParam(None, "hidden width of u and g (default: the feature width, as the thesis)",
                     lambda v: v is None or v >= 1, "an integer >= 1", kind=int),
    "time_input": HParam(False, "g(z, t) reads t as an extra input feature/channel (default: g(z))", kind=bool),
    "replace_ode": HParam("none", "Table 5.4's parameter-matched rows: the ODE replaced by plain layers shared by "
                          "every task ('shared-layers') or one stack per task ('task-layers'); 'none' = NORMAL",
                          one_of(*REPLACEMENTS)),
}


def resolve_options(options: dict[str, Any] | None) -> dict[str, Any]:
    """NORMAL's options with defaults, each validated (one-line error naming the option)."""
    resolved = resolve_architecture_options("normal", OPTIONS, options)
    if resolved["position_param"] == "exp" and any(p <= 0 for p in _as_list(resolved["initial_positions"])):
        raise InvalidParameterError("normal: position_param=exp needs initial_positions > 0 (p = e^v)")
    return resolved


def _as_list(value: Any) -> list[float]:
    return [float(v) for v in value] if isinstance(value, list) else [float(value)]


def _layer_stack(kind: str, width: int, hidden: int) -> nn.Module:
    """Two FC → LeakyReLU → FC blocks with a LeakyReLU between: the parameters of the ODE's u and g (ω aside)
    as plain layers, for Table 5.4's ``replace_ode`` rows."""
    return nn.Sequential(_two_layer(kind, width, hidden, 0), nn.LeakyReLU(), _two_layer(kind, width, hidden, 0))


def matched_task_hidden(width: int, hidden: int, n_tasks: int) -> int:
    """The hidden width h′ that gives ``n_tasks`` stacks of :func:`_layer_stack` (2(2wh′ + h′ + w) parameters
    each) together the parameters of one stack of width ``hidden``, rounded to the nearest unit (at least 1)."""
    per_task = (2 * width * hidden + hidden + width) / n_tasks
    return max(1, round((per_task - width) / (2 * width + 1)))


def _two_layer(kind: str, width: int, hidden: int, extra_inputs: int) -> nn.Module:
    """FC → LeakyReLU → FC (Conv1x1 for feature maps), ``width + extra_inputs`` in, ``width`` out."""
    if kind == "vector":
        return nn.Sequential(nn.Linear(width + extra_inputs, hidden), nn.LeakyReLU(), nn.Linear(hidden, width))
    return nn.Sequential(nn.Conv2d(width + extra_inputs, hidden, 1), nn.LeakyReLU(), nn.Conv2d(hidden, width, 1))


class HeavyBallField(nn.Module):
    """The vector field of the ODE state: (dz/dt, dq/dt) = (−q, −γq + g(z) + ξz) (Eq. 5.5), or
    dz/dt = g(z) for ``order=1``. ``forward(t, state)`` is what torchdiffeq integrates."""

    def __init__(self, kind: str, width: int, hidden: int, order: int, xi: float, omega_init: float,
                 time_input: bool):
        super().__init__()
        self.kind, self.order, self.xi, self.time_input = kind, order, xi, time_input
        self.g = _two_layer(kind, width, hidden, 1 if time_input else 0)
        if order == 2:
            self.omega = nn.Parameter(torch.tensor(float(omega_init)))

    def damping(self) -> Tensor:
        """γ = sigmoid(ω) > 0."""
        return torch.sigmoid(self.omega)

    def g_value(self, t: Tensor, z: Tensor) -> Tensor:
        if not self.time_input:
            return self.g(z)
        shape = (z.shape[0], 1, *z.shape[2:])
        return self.g(torch.cat([z, t.to(z).expand(shape)], dim=1))

    def forward(self, t: Tensor, state: tuple[Tensor, ...]) -> tuple[Tensor, ...]:
        if self.order == 1:
            return (self.g_value(t, state[0]),)
        z, q = state
        return -q, -self.damping() * q + self.g_value(t, z) + self.xi * z


def solve_at(field: HeavyBallField, state0: tuple[Tensor, ...], times: Sequence[float], solver: str,
             step_size: float, adjoint: bool) -> list[tuple[Tensor, ...]]:
    """The ODE state at each of ``times`` (any signs, repeats allowed) from ``state0`` at t = 0.

    Positive and negative times are two integrations from 0 (forwards and backwards); one trajectory
    serves all times of one sign (torchdiffeq interpolates between grid points inside a step).
    """
    from torchdiffeq import odeint, odeint_adjoint

    out: list[tuple[Tensor, ...] | None] = [None] * len(times)
    reference = state0[0]
    for sign in (1.0, -1.0):
        wanted = sorted({t for t in times if t * sign > 0}, key=lambda t: t * sign)
        if not wanted:
            continue
        grid = torch.tensor([0.0, *wanted], dtype=reference.dtype, device=reference.device)
        kwargs = dict(method=solver, options={"step_size": step_size})
        if adjoint:
            solution = odeint_adjoint(field, state0, grid, adjoint_params=tuple(field.parameters()), **kwargs)
        else:
            solution = odeint(field, state0, grid, **kwargs)
        row = {t: j + 1 for j, t in enumerate(wanted)}
        for k, t in enumerate(times):
            if t * sign > 0:
                out[k] = tuple(part[row[t]] for part in solution)
    return [state0 if s is None else s for s in out]


class NormalTrunk(nn.Module):
    """Backbone f_θ, initial-velocity net u and the ODE field: everything task-shared.

    ``forward(x, positions)`` returns ``[K, 2, B, *feature]``: per task the state z(p_i) and its time
    derivative dz/dt(p_i) (−q(p_i), or g(z(p_i)) for the first-order ablation). ``positions`` are read
    as plain numbers (the trunk never differentiates w.r.t. them).
    """

    def __init__(self, backbone: nn.Module, feature_shape: Sequence[int], options: dict[str, Any],
                 input_index: Sequence[int] | None = None, n_tasks: int = 1):
        super().__init__()
        if len(feature_shape) not in (1, 3):
            raise InvalidParameterError(f"normal: the backbone's features have shape {list(feature_shape)} per "
                                        "sample; NORMAL supports vectors [D] and feature maps [C, H, W]")
        kind = "vector" if len(feature_shape) == 1 else "map"
        width = int(feature_shape[0])
        hidden = options["hidden"] or width
        self.backbone = backbone
        self.input_index = None if input_index is None else list(input_index)
        self.order = options["order"]
        self.solver, self.step_size = options["solver"], options["step_size"]
        self.adjoint = options["gradient"] == "adjoint"
        self.replace_ode = options["replace_ode"]
        self.layers = _layer_stack(kind, width, hidden) if self.replace_ode == "shared-layers" else None
        self.task_layers = (nn.ModuleList(_layer_stack(kind, width, matched_task_hidden(width, hidden, n_tasks))
                                          for _ in range(n_tasks)) if self.replace_ode == "task-layers" else None)
        if self.replace_ode != "none":
            self.velocity = self.field = None
            return
        self.velocity = _two_layer(kind, width, hidden, 0) if self.order == 2 else None
        self.field = HeavyBallField(kind, width, hidden, self.order, options["xi"], options["omega_init"],
                                    options["time_input"])

    def initial_features(self, x: Any) -> Tensor:
        """z(0) = f_θ(x): ``[B, *feature]``, or ``[K, B, *feature]`` for multi-input models (one input per task)."""
        if self.input_index is None:
            return self.backbone(x)
        return torch.stack([self.backbone(x[:, j]) for j in self.input_index])

    def _initial_state(self, z0: Tensor) -> tuple[Tensor, ...]:
        return (z0,) if self.order == 1 else (z0, self.velocity(z0))

    def _read(self, state: tuple[Tensor, ...], t: float) -> Tensor:
        """(z(t), dz/dt(t)) stacked: ``[2, B, *feature]``; dz/dt = −q for the heavy-ball ODE."""
        if self.order == 2:
            return torch.stack([state[0], -state[1]])
        derivative = self.field(torch.tensor(t, dtype=state[0].dtype, device=state[0].device), state)[0]
        return torch.stack([state[0], derivative])

    def _replaced(self, z0: Tensor, n_tasks: int) -> Tensor:
        """``replace_ode``: per task the plain layers' output and a zero derivative (the positions do nothing)."""
        if self.task_layers is None and self.input_index is None:  # one input through shared layers: once
            y = self.layers(z0)
            return torch.stack([torch.stack([y, torch.zeros_like(y)])] * n_tasks)
        outputs = []
        for i in range(n_tasks):
            z = z0 if self.input_index is None else z0[i]
            y = self.layers(z) if self.task_layers is None else self.task_layers[i](z)
            outputs.append(torch.stack([y, torch.zeros_like(y)]))
        return torch.stack(outputs)

    def forward(self, x: Any, positions: Tensor) -> Tensor:
        times = [float(p) for p in positions.detach().cpu()]
        z0 = self.initial_features(x)
        if self.replace_ode != "none":
            return self._replaced(z0, len(times))
        if self.input_index is None:
            states = solve_at(self.field, self._initial_state(z0), times, self.solver, self.step_size, self.adjoint)
        else:  # every task starts from its own input's features and reads its own position
            states = [solve_at(self.field, self._initial_state(z0[i]), [t], self.solver, self.step_size,
                               self.adjoint)[0] for i, t in enumerate(times)]
        return torch.stack([self._read(state, t) for state, t in zip(states, times, strict=True)])


class TaskPositionHead(nn.Module):
    """Task head h_φi reading the ODE at its learnable position p_i (the gradient of Eq. 5.11)."""

    def __init__(self, head: nn.Module, initial: float, parametrisation: str, learn: bool):
        super().__init__()
        self.head, self.parametrisation = head, parametrisation
        value = math.log(initial) if parametrisation == "exp" else float(initial)
        self.position_parameter = nn.Parameter(torch.tensor(value), requires_grad=learn)

    def position(self) -> Tensor:
        """p_i (= e^{v_i} for the ``exp`` parametrisation)."""
        v = self.position_parameter
        return torch.exp(v) if self.parametrisation == "exp" else v

    def forward(self, state: Tensor) -> Tensor:
        z, dz_dt = state[0], state[1]
        p = self.position()
        # value z(p_i); d/dp_i = <dL/dz(p_i), dz/dt(p_i)> = −<dL/dz(p_i), q(p_i)> (Eq. 5.11)
        return self.head(z + (p - p.detach()).to(z) * dz_dt.detach())


class NormalModel(MultiTaskModel):
    """A benchmark's model with NORMAL between its backbone and its heads (see the module docstring)."""

    def __init__(self, base: MultiTaskModel, feature_shape: Sequence[int], options: dict[str, Any]):
        options = resolve_options(options)
        n_tasks = len(base.heads)
        initial = _as_list(options["initial_positions"])
        if len(initial) == 1:
            initial = initial * n_tasks
        if len(initial) != n_tasks:
            raise InvalidParameterError(f"normal: initial_positions has {len(initial)} values for {n_tasks} tasks; "
                                        "give one number or one per task")
        trunk = NormalTrunk(base.trunk, feature_shape, options, getattr(base, "input_index", None), n_tasks)
        learn = options["learn_positions"] and options["replace_ode"] == "none"  # without the ODE p_i does nothing
        heads = [TaskPositionHead(head, p, options["position_param"], learn)
                 for head, p in zip(base.heads, initial, strict=True)]
        super().__init__(trunk, heads, base.task_names)
        # the new ODE field, velocity map and positions take the base model's dtype: a float64 benchmark
        # (toy, asmg-synthetic) must not feed float64 features into float32 layers
        self.to(next((p.dtype for p in base.parameters() if p.is_floating_point()), torch.get_default_dtype()))
        self.options = options
        self.feature_shape = [int(v) for v in feature_shape]

    def positions(self) -> Tensor:
        """The task positions p_1..p_K."""
        return torch.stack([head.position() for head in self.heads])

    def features(self, x: Any) -> Tensor:
        return self.trunk(x, self.positions().detach())

    def trunk_task_parameters(self, index: int) -> list[nn.Parameter]:
        """``replace_ode="task-layers"``: task ``index``'s own layer stack (a task parameter, like a head)."""
        return [] if self.trunk.task_layers is None else list(self.trunk.task_layers[index].parameters())

    def forward_heads(self, z: Tensor) -> list[Tensor]:
        return [head(z[i]) for i, head in enumerate(self.heads)]

    def batch_features(self, z: Tensor) -> Tensor:
        """``[B, *feature]`` from the features ``[K, 2, B, *feature]``: the mean over tasks of the ODE states
        z(p_i) (what a method reading one shared representation per sample, e.g. LDC-MTL's router, sees)."""
        return z[:, 0].mean(dim=0)

    def optimizer_groups(self, lr: float) -> list[dict[str, Any]]:
        """Parameter groups for the trainer's optimizer.

        The task positions t_k are integration end points of Eq. 5.11, not weights: they never get weight
        decay (decay would pull every head towards t = 0, the input). They get ``position_lr`` when set.
        """
        positions = [h.position_parameter for h in self.heads if h.position_parameter.requires_grad]
        ids = {id(p) for p in positions}
        rest = [p for p in self.parameters() if p.requires_grad and id(p) not in ids]
        if not positions:
            return [{"params": rest}]
        position_group: dict[str, Any] = {"params": positions, "weight_decay": 0.0}
        if self.options["position_lr"] is not None:
            position_group["lr"] = self.options["position_lr"]
        return [{"params": rest}, position_group]

    def architecture_spec(self) -> dict[str, Any]:
        """What ``model.pt`` records to rebuild this model without data."""
        return {"name": "normal", "options": dict(self.options), "feature_shape": list(self.feature_shape)}
