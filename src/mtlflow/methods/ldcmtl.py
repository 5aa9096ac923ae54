"""LDC-MTL: loss discrepancy control with a router, solved by a single-loop first-order bilevel step.

Anonymous authors, "LDC-MTL: Balancing Multi-Task Learning through Scalable Loss Discrepancy Control"
(under review; public implementation OptMN-Lab/LDC-MTL; ``shared/seeds/ldc-mtl-loss-discrepancy-control.txt``).

Bilevel problem, Eq. (1), with a router σ(W) ∈ Δ^{K-1} and upper-level weights τ ∈ {σ(W), 1}:

    f(W, x) = Σ_{i=1}^{K-1} |τ_i l̃_i(x) − τ_{i+1} l̃_{i+1}(x)|      (loss discrepancy, consecutive tasks)
    g(W, x) = Σ_{i=1}^{K}   σ_i(W) l̃_i(x)                          (lower level)

Penalty reformulation, Eq. (2): min_{W,x} f + λ (g(W, x) − g(W, x*)).

**λ: paper vs official code.** The paper puts λ on g (Eq. 2, Alg. 1: one step on f + λ g), and its
theory wants λ large (λ = L√(3μ/ε), Theorem 1). The official code (OptMN-Lab/LDC-MTL, e.g. the
Cityscapes and QM9 trainers) minimises g + λ f instead -- λ multiplies the *discrepancy* -- and the
values of Table 5 (0.01-0.1) are that coefficient. ``form="paper"`` (default) is f + λ g; ``form="code"``
is g + λ f. Under Adam the two agree for λ_paper = 1/λ_code (they differ by a constant factor), which is
why the default λ = 20 (= 1/0.05, the middle of the paper's "λ ∈ [0.02, 0.1]") and why the benchmarks'
Table 5 defaults use ``form="code"`` with the printed λ. With λ_paper = 0.05 the model barely trains
(measured on MultiMNIST, docs/research/ldc-mtl.md): f's subgradient, which pushes the smaller weighted loss *up*, then
dominates every step.

* ``loop="single"`` (default) is Algorithm 1: the g(W, x*) term is dropped, so x and W take one
  gradient step on f + λ g -- the trainer back-propagates that scalar **once** and both the model and
  the router receive their gradients from that single backward pass (O(1) time and memory).
* ``loop="double"`` is Algorithm 2 / Eqs. (3)-(4): from z_0 = x^t, N = ``inner_steps`` steps
  z_{n+1} = z_n − β ∇_z g(W^t, z_n) (β = ``inner_lr``; Alg. 2 writes the step as βλ, i.e. the same
  update with β/λ) on the same batch approximate x*; the router then also gets −λ ∇_W g(W^t, z_N), the
  model update is unchanged. The inner steps run on a functional copy of the parameters (the model and
  its BatchNorm statistics are untouched).

Loss normalisation l̃ (App. A.1), applied before f and g:
``none`` l̃ = l (CelebA); ``log`` l̃ = log(l / l_0) with l_0 the task loss at the first step of each
epoch (QM9, "the initial loss value ... at each epoch"); ``rescale`` l̃ = l / l'_0 with l'_0 the loss at
the first step of the run (Cityscapes/NYU-v2 with τ = σ, and the toy problem). ``loss_reference``
overrides which initial loss is used. ``min_losses`` shifts losses that can be ≤ 0 (l − l^min).

Router σ(W) (App. A.1 "Router model details"): ``router="vector"`` (default) is a trainable vector with a
softmax (QM9, CelebA); ``router="mlp"`` is a 3-layer MLP d → d/2 → d/4 → K
with a softmax output over the shared features (global-average-pooled when they have spatial
dimensions; for models whose features are stacked per task -- multi-input, MTAN -- the K task features
concatenated, ``router_features="concat"``, or averaged, ``"mean"``; the mean ODE state for NORMAL, see
:func:`batch_features_reader`) (Cityscapes, NYU-v2). The vector is
the default because on MultiMNIST the MLP router collapses onto one task within two epochs (the λ∇_W g
term of Alg. 1 moves σ towards the task with the smaller loss, and an MLP's outputs move much faster
than a vector's logits; measured, docs/research/ldc-mtl.md), while the vector trains as well as LS. Choices the paper
leaves open, made here [inferred]: the MLP's activation is ReLU; its input features are detached
(σ is a function of W only, as in the formulas); its per-sample outputs are averaged over the batch
(a mean of points of the simplex stays on the simplex); the router starts from a private generator
seeded from the run seed (the global RNG streams are untouched). On the shipped SegNet-MTAN the input
is the K = 2 / 3 task features of width 64 side by side, so the router reproduces the paper's parameter
counts: 128 → 64 → 32 → 2 with biases = 10,402 (Cityscapes), 192 → 96 → 48 → 3 without biases = 23,184
(NYU-v2, ``router_bias=false``) (tested). ``sigma_min`` / ``sigma_max`` clamp each σ_i (the official
code uses [0.2, 0.8]; off by default as in the paper): a weight at its bound gets no gradient, which stops
the MLP router's collapse onto one task.

The router has its own optimizer of the trainer's kind (Adam/AdamW/SGD) with the **same step size as
the model** unless ``router_lr`` is set (the paper uses one step size α for W and x; its scheduler's
current value is followed) and the model's weight decay (0 in every recipe; never AdamW's own 0.01 default),
and it steps after the trainer's ``optimizer.step()`` from the gradients of the same backward pass. The absolute value may be smoothed, √(x² + γ) with γ = ``smooth_abs``, as
the paper suggests for its theory (Sec. 6). Per-benchmark defaults (Table 5) come from each
benchmark's ``method_defaults`` (λ, τ, normalisation, router) and its ``train_defaults["per_method"]``
(the step size α: CelebA 1e-3, QM9 1e-3, CityScapes 3e-4, NYU-v2 8e-5 -- Table 5, not the text's 1e-4
for NYU-v2).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
from torch import Tensor, nn

from mtlflow.core.callbacks import TrainerView
from mtlflow.core.errors import InvalidParameterError, NonFiniteLossError
from mtlflow.core.hparams import HParam, SearchRange, non_negative, one_of, positive
from mtlflow.methods._moblo import FunctionalModel
from mtlflow.methods._support import min_losses_hparam
from mtlflow.methods.base import LossWeighting, StepContext
from mtlflow.models.base import MultiTaskModel

TAUS = ("sigma", "one")
NORMALISATIONS = ("none", "log", "rescale")
ROUTERS = ("mlp", "vector")
LOOPS = ("single", "double")
LOSS_REFERENCES = ("auto", "epoch", "run")
FORMS = ("paper", "code")
STACKED_FEATURES = ("concat", "mean")


def discrepancy(normalized: Tensor, tau: Tensor, smooth_abs: float = 0.0) -> Tensor:
    """f = Σ_{i<K} |τ_i l̃_i − τ_{i+1} l̃_{i+1}| (Eq. 1), or with √(x² + γ) instead of |x| when γ > 0."""
    weighted = tau * normalized
    gaps = weighted[:-1] - weighted[1:]
    if smooth_abs > 0:
        return torch.sqrt(gaps * gaps + smooth_abs).sum()
    return gaps.abs().sum()


def penalty(normalized: Tensor, sigma: Tensor) -> Tensor:
    """g = Σ_i σ_i l̃_i (the lower-level objective of Eq. 1)."""
    return (sigma * normalized).sum()


def normalize_losses(losses: Tensor, mode: str, reference: Tensor | None) -> Tensor:
    """l̃ of App. A.1: ``none`` l, ``log`` log(l / l_0), ``rescale`` l / l_0."""
    if mode == "none":
        return losses
    reference = reference.to(losses)
    return torch.log(losses / reference) if mode == "log" else losses / reference


def _average_over_ranks(grads: list[Tensor]) -> None:
    """Under torchrun the router is not in the trainer's optimizer, so its gradients are averaged here
    (every rank then takes the same router step); a no-op in one process."""
    if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
        return
    world = torch.distributed.get_world_size()
    for g in grads:
        torch.distributed.all_reduce(g)
        g.div_(world)


class Router(nn.Module):
    """σ(W): softmax over a trainable vector, or a 3-layer MLP over the (pooled) shared features."""

    def __init__(self, n_tasks: int, kind: str, in_features: int | None = None, bias: bool = True):
        super().__init__()
        self.kind, self.in_features = kind, in_features
        if kind == "vector":
            self.logits = nn.Parameter(torch.zeros(n_tasks))
        else:
            hidden = (max(in_features // 2, 1), max(in_features // 4, 1))
            self.mlp = nn.Sequential(nn.Linear(in_features, hidden[0], bias=bias), nn.ReLU(),
                                     nn.Linear(hidden[0], hidden[1], bias=bias), nn.ReLU(),
                                     nn.Linear(hidden[1], n_tasks, bias=bias))

    def forward(self, features: Tensor | None) -> Tensor:
        if self.kind == "vector":
            return torch.softmax(self.logits, dim=0)
        return torch.softmax(self.mlp(features), dim=-1).mean(dim=0)


def router_input(features: Any) -> Tensor:
    """The router's input ``[B, d]``: the detached shared features, spatial dimensions averaged."""
    if not isinstance(features, Tensor) or features.dim() < 2:
        raise InvalidParameterError("ldcmtl: router=mlp needs shared features of shape [B, d] or [B, C, ...] "
                                    "(this model's features are not); use --hp router=vector")
    flat = features.detach()
    return flat.flatten(2).mean(dim=2) if flat.dim() > 2 else flat


def batch_features_reader(model: Any, stacked: str) -> Callable[[Any], Any]:
    """How to get ``[B, ...]`` shared features from ``model.features(x)``: the model's own
    ``batch_features`` (NORMAL); for models whose features are stacked per task ``[K, B, C, ...]`` (those
    overriding ``forward_heads``: multi-input, MTAN) the K task features concatenated along the channels,
    ``[B, K·C, ...]`` (``stacked="concat"``: the width behind App. A.1's router parameter counts, 128 = 2 x 64
    on CityScapes, 192 = 3 x 64 on NYU-v2) or their mean ``[B, C, ...]`` (``stacked="mean"``); else the
    features as they are."""
    own = getattr(model, "batch_features", None)
    if callable(own):
        return own
    if isinstance(model, MultiTaskModel) and type(model).forward_heads is not MultiTaskModel.forward_heads:
        if stacked == "mean":
            return lambda z: z.mean(dim=0)
        return lambda z: z.movedim(0, 1).flatten(1, 2)
    return lambda z: z


class LDCMTL(LossWeighting):
    name = "ldcmtl"
    family = "bilevel"
    cost = "O(1)"
    needs_trainer = ("a bilevel method: its router reads the model and the run's configuration, and its double "
                     "loop re-runs the batch through the model")
    paper = ("LDC-MTL: Balancing Multi-Task Learning through Scalable Loss Discrepancy Control "
             "(anonymous, under review; OptMN-Lab/LDC-MTL)")
    equations = ("Eq. 1 f = Σ|τ_i l̃_i − τ_{i+1} l̃_{i+1}|, g = Σ σ_i(W) l̃_i; Eq. 2 penalty; Alg. 1 one step on "
                 "f + λg for (x, W); Alg. 2 / Eqs. 3-4 double loop; App. A.1 normalisations")
    hparams = {
        "penalty": HParam(20.0, "penalty constant λ: of g in form=paper (f + λg, Eq. 2), of f in form=code "
                          "(g + λf; Table 5's 0.01-0.1 are this one)", positive,
                          # the grids are for form=code's λ; form=paper's λ is their reciprocal (f + λg ∝ g + f/λ)
                          search=SearchRange("log", 10.0, 200.0,
                                             source="LDC-MTL Tables 4 and 8: λ grid 0.005-0.1 (code form), 1/λ here")),
        "form": HParam("paper", "'paper': f + λ g (Eq. 2, Alg. 1); 'code': g + λ f (the official implementation)",
                       one_of(*FORMS)),
        "tau": HParam("sigma", "upper-level weights τ: 'sigma' (τ = σ(W)) or 'one' (τ = 1)",
                      one_of(*TAUS)),
        "normalization": HParam("none", "loss normalisation before f and g (App. A.1): none, log, rescale",
                                one_of(*NORMALISATIONS)),
        "loss_reference": HParam("auto", "initial loss of log/rescale: 'epoch' (first step of each epoch), 'run' "
                                 "(first step of the run); auto = epoch for log, run for rescale (the paper)",
                                 one_of(*LOSS_REFERENCES)),
        "router": HParam("vector", "σ(W): 'vector' (trainable vector + softmax; QM9, CelebA) or 'mlp' (3-layer MLP "
                         "d→d/2→d/4→K over the shared features; Cityscapes, NYU-v2)", one_of(*ROUTERS)),
        "router_bias": HParam(True, "biases in the MLP router (NYU-v2's router has none)", kind=bool),
        "router_features": HParam("concat", "MLP router input for per-task features (MTAN, multi-input): 'concat' "
                                  "(the K task features side by side, App. A.1's counts) or 'mean' (their mean)",
                                  one_of(*STACKED_FEATURES)),
        "sigma_min": HParam(0.0, "lower clamp of each σ_i (official code: 0.2; 0 = the paper, no clamp)",
                            lambda v: 0 <= v < 1, "in [0, 1)"),
        "sigma_max": HParam(1.0, "upper clamp of each σ_i (official code: 0.8; 1 = the paper, no clamp)",
                            lambda v: 0 < v <= 1, "in (0, 1]"),
        "router_lr": HParam(None, "router step size (default: the model's current learning rate, as the paper)",
                            lambda v: v is None or v > 0, "> 0", kind=float),
        "loop": HParam("single", "'single' (Alg. 1) or 'double' (Alg. 2: N inner steps approximating x*)",
                       one_of(*LOOPS)),
        "inner_steps": HParam(50, "N: inner steps of the double loop (the paper's diagnostic uses 50)",
                              lambda v: v >= 1, "an integer >= 1", kind=int),
        "inner_lr": HParam(0.05, "β: step size of the inner SGD steps on g (double loop; not stated in the paper)",
                           positive),
        "smooth_abs": HParam(0.0, "γ of the smoothed |x| = √(x² + γ) (0 = exact |x|, the experiments)",
                             non_negative),
        "min_losses": min_losses_hparam(),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        hp = self.hp
        if hp["sigma_min"] >= hp["sigma_max"] or hp["sigma_min"] * n_tasks > 1 or hp["sigma_max"] * n_tasks < 1:
            raise InvalidParameterError(
                f"ldcmtl: sigma_min={hp['sigma_min']} and sigma_max={hp['sigma_max']} leave no weights summing to 1 "
                f"for {n_tasks} tasks; use sigma_min <= 1/{n_tasks} <= sigma_max")
        #: l_0 renewed at each epoch's first step ("epoch"), else kept from the run's first step ("run")
        self.renews_reference = (hp["loss_reference"] == "epoch" if hp["loss_reference"] != "auto"
                                 else hp["normalization"] == "log")
        self.router: Router | None = Router(n_tasks, "vector") if hp["router"] == "vector" else None
        self.router_optimizer: torch.optim.Optimizer | None = None
        #: l_0 of log/rescale and the epoch it was taken in (``None`` until the first step)
        self.reference_losses: Tensor | None = None
        self.reference_epoch: int | None = None
        #: g(W, z_N) terms of the double loop: l̃_i(z_N), constants for this step
        self._inner_losses: Tensor | None = None
        self._features: Any = None
        self._read_features: Callable[[Any], Any] = lambda z: z
        self._trainer: Any = None
        self._device = torch.device("cpu")
        self._seed = 0

    # -- trainer hooks ---------------------------------------------------------------------------
    def setup(self, trainer: TrainerView) -> None:
        self._trainer = trainer
        self._seed = int(trainer.config.seed)
        self._read_features = batch_features_reader(trainer.model, self.hp["router_features"])
        if self.router is not None:
            self._build_optimizer()

    def to(self, device: torch.device | str) -> LDCMTL:
        self._device = torch.device(device)
        if self.router is not None:
            self.router.to(self._device)
        return self

    def before_backward(self, ctx: StepContext) -> None:
        losses = ctx.losses.detach()
        if self._takes_reference(ctx.epoch):
            self.reference_losses = self._shifted(losses).clone()
            self.reference_epoch = ctx.epoch
        features = ctx.extra.get("features")
        wanted = features is not None and self.hp["router"] == "mlp"  # the vector router reads no features
        self._features = self._read_features(features) if wanted else None
        if self.router is None:
            self._build_router(self._features)
        if self.router_optimizer is None:
            self._build_optimizer()
        self.router_optimizer.zero_grad(set_to_none=True)
        self._inner_losses = None
        if self.hp["loop"] == "double":
            self._inner_losses = self._approximate_lower_optimum(ctx)

    def weights(self, losses: Tensor) -> Tensor:
        """σ(W) at the current router (detached)."""
        with torch.no_grad():
            return self._sigma().to(losses)

    def objective(self, losses: Tensor) -> Tensor:
        """f + λ g (Alg. 1), minus λ g(W, z_N) for the double loop (Alg. 2); one scalar for one backward."""
        if self.router is None:
            raise InvalidParameterError("ldcmtl: objective called before before_backward; the trainer calls both")
        normalized = self._normalized(losses)
        sigma = self._sigma().to(normalized)
        tau = sigma if self.hp["tau"] == "sigma" else torch.ones_like(sigma)
        upper, lower = self._coefficients()
        total = upper * discrepancy(normalized, tau, self.hp["smooth_abs"]) + lower * penalty(normalized, sigma)
        if self._inner_losses is not None:
            total = total - lower * penalty(self._inner_losses.to(normalized), sigma)
        self.last_weights = sigma.detach()
        return total

    def after_optimizer_step(self, ctx: StepContext) -> None:
        if self.router_optimizer is None:
            return
        if self.hp["router_lr"] is None:
            for group in self.router_optimizer.param_groups:
                group["lr"] = self._model_lr()
        if any(p.grad is not None for p in self.router.parameters()):
            grads = [p.grad for p in self.router.parameters() if p.grad is not None]
            _average_over_ranks(grads)  # first: every rank then sees the same (non-)finite values
            if not all(bool(torch.isfinite(g).all()) for g in grads):
                raise NonFiniteLossError(f"ldcmtl: non-finite router gradient at step {ctx.step}; lower --lr")
            self.router_optimizer.step()
        self._features, self._inner_losses = None, None

    # -- pieces ----------------------------------------------------------------------------------
    def _coefficients(self) -> tuple[float, float]:
        """(coefficient of f, coefficient of g): (1, λ) for the paper's form, (λ, 1) for the code's."""
        lam = float(self.hp["penalty"])
        return (1.0, lam) if self.hp["form"] == "paper" else (lam, 1.0)

    def _takes_reference(self, epoch: int) -> bool:
        """Whether this step's losses become l_0: the first step of the run, or of each epoch for ``epoch``."""
        if self.hp["normalization"] == "none":
            return False
        return self.reference_losses is None or (self.renews_reference and epoch != self.reference_epoch)

    def _shifted(self, losses: Tensor) -> Tensor:
        shifted = losses - self.min_losses.to(losses)
        if self.hp["normalization"] != "none" and bool((shifted.detach() <= 0).any()):
            raise InvalidParameterError(
                f"ldcmtl: normalization={self.hp['normalization']} needs losses above their lower bounds, got "
                f"{[round(float(v), 6) for v in losses.detach()]} with min_losses {self.min_losses.tolist()}; "
                "set --hp min_losses=[...] or normalization=none")
        return shifted

    def _normalized(self, losses: Tensor) -> Tensor:
        return normalize_losses(self._shifted(losses), self.hp["normalization"], self.reference_losses)

    def _sigma(self) -> Tensor:
        inputs = None if self.router.kind == "vector" else router_input(self._features).to(
            next(self.router.parameters()).dtype)
        sigma = self.router(inputs)
        if self.hp["sigma_min"] > 0 or self.hp["sigma_max"] < 1:
            # the official code's guard against router collapse: a weight at its bound gets no gradient, so
            # λ∇_W g stops pushing σ towards the smaller loss there (the clamped σ is not renormalised)
            sigma = sigma.clamp(self.hp["sigma_min"], self.hp["sigma_max"])
        return sigma

    def _build_router(self, features: Any) -> None:
        """The MLP router, built at the first step when the feature width is known (private seed)."""
        inputs = router_input(features)
        self._make_mlp(inputs.shape[1], inputs.dtype)
        self._build_optimizer()

    def _make_mlp(self, in_features: int, dtype: torch.dtype) -> None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(self._seed * 7919 + 17)
            router = Router(self.n_tasks, "mlp", in_features, bias=self.hp["router_bias"])
        self.router = router.to(device=self._device, dtype=dtype)

    def _model_lr(self) -> float:
        optimizer = getattr(self._trainer, "optimizer", None)
        if optimizer is not None:
            return float(optimizer.param_groups[0]["lr"])
        return float(self._trainer.config.lr) if self._trainer is not None else 1e-3

    def _build_optimizer(self) -> None:
        config = getattr(self._trainer, "config", None)
        kind = getattr(config, "optimizer", "adam")
        lr = self.hp["router_lr"] or self._model_lr()
        params = list(self.router.parameters())
        # The paper steps W and x with one optimizer (same α, same regularisation): the router takes the
        # model's weight decay explicitly, never torch's AdamW default of 0.01.
        decay = float(getattr(config, "weight_decay", 0.0))
        if kind == "sgd":
            self.router_optimizer = torch.optim.SGD(params, lr=lr, momentum=config.momentum, weight_decay=decay)
        else:
            self.router_optimizer = (torch.optim.AdamW if kind == "adamw" else torch.optim.Adam)(
                params, lr=lr, weight_decay=decay)

    def _approximate_lower_optimum(self, ctx: StepContext) -> Tensor:
        """l̃_i(z_N) with z_N from N steps z ← z − β ∇_z g(W^t, z) started at z_0 = x^t (Eq. 4)."""
        batch = ctx.extra.get("batch")
        if batch is None or self._trainer is None or not hasattr(self._trainer, "bench"):
            raise InvalidParameterError("ldcmtl: loop=double needs the trainer's batch (mtlflow train); the toy "
                                        "runner supports loop=single only")

        model = FunctionalModel(self._trainer)
        inputs, targets = model.inputs_targets(batch)
        with torch.no_grad():
            sigma = self._sigma()
        z = model.detached_copy()
        beta = self.hp["inner_lr"]

        def lower(params: dict[str, Tensor]) -> Tensor:
            return self._normalized(model.task_losses(model.predictions(params, inputs), targets))

        for _ in range(self.hp["inner_steps"]):
            g = penalty(lower(z), sigma.to(ctx.losses.dtype))
            grads = torch.autograd.grad(g, list(z.values()), allow_unused=True)
            z = {n: (p - beta * d if d is not None else p).detach().requires_grad_(True)
                 for (n, p), d in zip(z.items(), grads, strict=True)}
        with torch.no_grad():
            inner = lower(z)
        if not bool(torch.isfinite(inner).all()):
            raise NonFiniteLossError(f"ldcmtl: the inner loop diverged at step {ctx.step}; lower --hp inner_lr")
        return inner.detach()

    # -- state -----------------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        router = self.router
        # no router kind: it is the ``router`` hyper-parameter, which a resume must keep (the config fingerprint)
        return {
            "router": None if router is None else {"in_features": router.in_features,
                                                   "weights": {k: v.detach().clone()
                                                               for k, v in router.state_dict().items()}},
            "optimizer": None if self.router_optimizer is None else self.router_optimizer.state_dict(),
            "reference_losses": None if self.reference_losses is None else self.reference_losses.clone(),
            "reference_epoch": self.reference_epoch,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        saved = state["router"]
        if saved is not None:
            if self.router is None:
                weights = saved["weights"]
                self._make_mlp(int(saved["in_features"]), next(iter(weights.values())).dtype)
            self.router.load_state_dict(saved["weights"])
            self._build_optimizer()
            if state["optimizer"] is not None:
                self.router_optimizer.load_state_dict(state["optimizer"])
        self.reference_losses = None if state["reference_losses"] is None else state["reference_losses"].clone()
        self.reference_epoch = state["reference_epoch"]
