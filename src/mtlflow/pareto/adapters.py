"""Task-specific low-rank adapters mixed by a preference: PaLoRA's Eq. 2.

Paper: Dimitriadis, Frossard & Fleuret, "Pareto Low-Rank Adapters: Efficient Multi-Task Learning with
Preferences" (PaLoRA), Sec. 4.1. A layer with weight W ∈ ℝ^{n×m} (output y = W x) gets one low-rank
pair per task, A_t ∈ ℝ^{n×r} and B_t ∈ ℝ^{r×m}, and for a preference λ ∈ Δ_T computes

    y' = (W + (α/r) Σ_t λ_t A_t B_t) x                                    (Eq. 2)

so a layer of mn weights carries mn + T·r·(m + n) parameters (Sec. 4.1, "Memory complexity").

Implementation: a ``torch.nn.utils.parametrize`` parametrisation of the layer's ``weight`` (torch's
own mechanism; the digest measured its merge to be exact); biases are left alone (the paper omits
them). Every adapted layer of one model reads the same preference, so setting it once reconfigures
the whole network, and for a given λ the adapters merge into the base weights:
:meth:`PreferenceAdapters.merged_state_dict` is the state dict of the plain network (no adapters,
no extra inference cost).

Convolutions (the paper does not say how it adapts them), two factorisations of a Conv2d weight
[n, c, k, k] (c = in_channels / groups):

* ``matrix`` (default, the paper's formula read literally): the n × m matrix with m = c·k², so the
  layer gains T·r·(m + n) parameters, as Sec. 4.1 states for a linear layer;
* ``kernel``: A_t ∈ ℝ^{nk × rk}, B_t ∈ ℝ^{rk × ck}, A_t B_t reshaped to [n, c, k, k] (the LoRA
  reference implementation's convolution layout), T·r·k²(n + c) parameters. With this layout and
  adapters on every layer including the heads (``layers=all``), the counts reproduce the overheads the
  paper reports: 12.50 % on PaMaL's MultiMNIST LeNet at r = 1, 4.19 % / 6.33 % on the CityScapes /
  NYUv2 SegNet at r = 4 (paper: 12.5 %, 4.2 %, 6.3 %; see docs/research/palora.md), so it is most
  likely what the authors ran.

Not stated by the paper and chosen here (documented in the method): adapters on every Conv2d and
Linear layer of the shared trunk by default (``layers``: ``trunk``, ``all`` = trunk and heads, or module
names); LoRA's initialisation, i.e. the output-side factor A_t = 0 (the network starts as the base
network for every λ) and the input-side factor B_t Kaiming-uniform with a = √5 (bound 1/√fan-in).
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parametrize

from mtlflow.core.errors import InvalidParameterError

ADAPTABLE = (nn.Conv2d, nn.Linear)
FACTORIZATIONS = ("matrix", "kernel")


def factor_shapes(module: nn.Module, rank: int,
                  factorization: str = "matrix") -> tuple[tuple[int, int], tuple[int, int]]:
    """Shapes of one task's (A_t, B_t) for ``module``; A_t B_t has as many entries as its weight."""
    weight = module.weight
    n, m = int(weight.shape[0]), int(weight[0].numel())
    if factorization == "kernel" and isinstance(module, nn.Conv2d):
        kh, kw = module.kernel_size
        if kh != kw:
            raise InvalidParameterError(f"factorization 'kernel' needs square kernels, {module} has {kh}x{kw}; "
                                        "use factorization=matrix")
        c = m // (kh * kw)
        return (n * kh, rank * kh), (rank * kh, c * kh)
    if factorization not in FACTORIZATIONS:
        raise InvalidParameterError(f"unknown adapter factorization {factorization!r}; valid: "
                                    f"{', '.join(FACTORIZATIONS)}")
    return (n, rank), (rank, m)


class PreferenceState:
    """The preference λ that every adapted layer of one model reads (shared state, not a parameter)."""

    def __init__(self, value: Tensor):
        self.value = value


class LowRankPreferenceDelta(nn.Module):
    """The parametrisation W ↦ W + (α/r) Σ_t λ_t A_t B_t of one layer's weight (Eq. 2)."""

    def __init__(self, module: nn.Module, n_tasks: int, rank: int, alpha: float, state: PreferenceState,
                 factorization: str):
        super().__init__()
        weight = module.weight.detach()
        shape_a, shape_b = factor_shapes(module, rank, factorization)
        factory = {"dtype": weight.dtype, "device": weight.device}
        self.A = nn.Parameter(torch.zeros(n_tasks, *shape_a, **factory))
        down = torch.empty(n_tasks, *shape_b, **factory)
        for t in range(n_tasks):
            nn.init.kaiming_uniform_(down[t], a=math.sqrt(5))
        self.B = nn.Parameter(down)
        self.scale = alpha / rank
        self._state = state

    def delta(self, preference: Tensor) -> Tensor:
        """(α/r) Σ_t λ_t A_t B_t as a matrix with as many entries as the weight."""
        lam = preference.to(device=self.A.device, dtype=self.A.dtype)
        return self.scale * torch.einsum("t,tnr,trm->nm", lam, self.A, self.B)

    def forward(self, weight: Tensor) -> Tensor:
        return weight + self.delta(self._state.value).view_as(weight)


@dataclass(frozen=True)
class AdapterSpec:
    """What rebuilds the adapters of a saved model: tasks, rank, α, the adapted layers' names and the
    convolution factorisation."""

    n_tasks: int
    rank: int
    alpha: float
    layers: tuple[str, ...]
    factorization: str = "matrix"

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "layers": list(self.layers)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> AdapterSpec:
        return cls(int(data["n_tasks"]), int(data["rank"]), float(data["alpha"]), tuple(data["layers"]),
                   str(data.get("factorization", "matrix")))


def _stored_weight(module: nn.Module) -> Tensor:
    """The weight parameter a module stores: under adapters (a parametrization) ``module.weight`` is
    computed on each access, the parameter is the parametrization's ``original``."""
    if parametrize.is_parametrized(module, "weight"):
        return module.parametrizations.weight.original
    return module.weight


def select_layers(model: nn.Module, layers: str = "trunk") -> list[str]:
    """Names (relative to ``model``) of the Conv2d/Linear layers to adapt.

    ``layers``: ``trunk`` (every layer of the shared ``model.trunk``), ``all`` (every layer of the
    model, heads included) or a comma-separated list of module names of the model; a name also selects
    every layer below it (``trunk.conv`` selects ``trunk.conv.0`` and ``trunk.conv.3``).
    """
    candidates = [name for name, module in model.named_modules() if isinstance(module, ADAPTABLE)]
    choice = layers.strip()
    if choice == "trunk" and not isinstance(getattr(model, "trunk", None), nn.Module):
        raise InvalidParameterError("the model has no shared `trunk` module to put adapters on; give "
                                    "layers=all or module names")
    # "trunk" is its own one-name list: the names under the module `trunk`
    patterns = [""] if choice == "all" else [p.strip() for p in choice.split(",") if p.strip()]

    def under(name: str, pattern: str) -> bool:
        return pattern == "" or name == pattern or name.startswith(pattern + ".")

    chosen = [c for c in candidates if any(under(c, p) for p in patterns)]
    if choice == "trunk" and callable(getattr(model, "trunk_task_parameters", None)):
        # "trunk" means the layers every task shares (MultiTaskModel.shared_parameters), never a task's own
        # trunk modules such as SegNet-MTAN's attention masks; by ownership, not requires_grad, because
        # Pareto expansion freezes the base model before its adapters are placed
        own = {id(p) for i in range(len(model.heads)) for p in model.trunk_task_parameters(i)}
        chosen = [c for c in chosen if id(_stored_weight(model.get_submodule(c))) not in own]
    unmatched = [p for p in patterns if not any(under(c, p) for c in candidates)]
    if unmatched or not chosen:
        raise InvalidParameterError(f"layers {', '.join(unmatched) or layers!r} match no Conv2d/Linear layer; "
                                    f"valid: trunk, all, or names among {', '.join(candidates) or 'none'}")
    return chosen


class PreferenceAdapters:
    """The adapters of one model: inject, set the preference, merge, save and rebuild."""

    def __init__(self, model: nn.Module, spec: AdapterSpec):
        self.model, self.spec = model, spec
        first = model.get_submodule(spec.layers[0]).weight
        self._centre = torch.full((spec.n_tasks,), 1.0 / spec.n_tasks, dtype=first.dtype, device=first.device)
        self.state = PreferenceState(self._centre)
        self.deltas: dict[str, LowRankPreferenceDelta] = {}
        for name in spec.layers:
            module = model.get_submodule(name)
            if parametrize.is_parametrized(module, "weight"):
                raise InvalidParameterError(f"layer {name} already has a weight parametrisation; PaLoRA adapters "
                                            "cannot be stacked on it")
            delta = LowRankPreferenceDelta(module, spec.n_tasks, spec.rank, spec.alpha, self.state, spec.factorization)
            parametrize.register_parametrization(module, "weight", delta)
            self.deltas[name] = delta

    @classmethod
    def inject(cls, model: nn.Module, n_tasks: int, rank: int, alpha: float, layers: str = "trunk",
               factorization: str = "matrix") -> PreferenceAdapters:
        """Put adapters on the selected Conv2d/Linear layers of ``model`` (see :func:`select_layers`)."""
        return cls(model, AdapterSpec(n_tasks, rank, alpha, tuple(select_layers(model, layers)), factorization))

    def parameters(self) -> list[nn.Parameter]:
        """The adapter factors A_t, B_t of every layer."""
        return [p for delta in self.deltas.values() for p in (delta.A, delta.B)]

    @property
    def centre(self) -> Tensor:
        return self._centre.clone()

    def _as_preference(self, preference: Sequence[float] | Tensor) -> Tensor:
        lam = torch.as_tensor(preference, dtype=torch.float64)
        if lam.shape != (self.spec.n_tasks,) or not bool(torch.isfinite(lam).all()):
            raise InvalidParameterError(f"a preference must be {self.spec.n_tasks} finite numbers (one per task), "
                                        f"got {[float(v) for v in lam.reshape(-1)]}")
        return lam.to(device=self._centre.device, dtype=self._centre.dtype)

    def set_preference(self, preference: Sequence[float] | Tensor) -> None:
        self.state.value = self._as_preference(preference)

    @contextlib.contextmanager
    def preference(self, preference: Sequence[float] | Tensor) -> Iterator[None]:
        """Run the network with ``preference`` inside the block, then restore the previous one."""
        previous = self.state.value
        self.set_preference(preference)
        try:
            yield
        finally:
            self.state.value = previous

    def merged_state_dict(self, preference: Sequence[float] | Tensor) -> dict[str, Tensor]:
        """State dict of the plain network for ``preference``: W + (α/r) Σ_t λ_t A_t B_t merged into
        every adapted weight, no adapter entries (loads into the benchmark's unadapted model)."""
        lam = self._as_preference(preference)
        state = self.model.state_dict()
        prefixes = tuple(f"{name}.parametrizations.weight." for name in self.deltas)
        merged = {k: v.detach().clone() for k, v in state.items() if not k.startswith(prefixes)}
        with torch.no_grad():
            for name, delta in self.deltas.items():
                base = state[f"{name}.parametrizations.weight.original"]
                merged[f"{name}.weight"] = base + delta.delta(lam).view_as(base)
        return merged


def parameter_overhead(model: nn.Module, n_tasks: int, rank: int, layers: str = "trunk",
                       factorization: str = "matrix") -> dict[str, Any]:
    """PaLoRA's parameter count (Sec. 4.1): a layer of mn weights gains T·r·(m + n) adapter parameters
    (``kernel`` factorisation of a k × k convolution: T·r·k²(n + c)).

    ``overhead_percent`` relates the adapters to every parameter of the plain multi-task model (trunk,
    heads, biases, normalisation), the paper's "additional trainable parameters compared to the base
    multi-task model"; ``adapted_weights_overhead_percent`` relates them to Σ mn of the adapted layers.
    """
    rows = []
    for name in select_layers(model, layers):
        module = model.get_submodule(name)
        (rows_a, cols_a), (_, cols_b) = factor_shapes(module, rank, factorization)
        n, m = int(module.weight.shape[0]), int(module.weight[0].numel())
        rows.append({"layer": name, "type": type(module).__name__, "n": n, "m": m, "base": n * m,
                     "adapters": n_tasks * (rows_a * cols_a + cols_a * cols_b)})
    adapters = sum(r["adapters"] for r in rows)
    adapted = sum(r["base"] for r in rows)
    total = sum(p.numel() for p in model.parameters())
    return {"n_tasks": n_tasks, "rank": rank, "factorization": factorization, "layers": rows,
            "adapter_parameters": adapters,
            "adapted_weight_parameters": adapted, "model_parameters": total,
            "overhead_percent": 100.0 * adapters / total,
            "adapted_weights_overhead_percent": 100.0 * adapters / adapted}
