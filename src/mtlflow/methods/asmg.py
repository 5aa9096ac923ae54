"""ASMG and ASMG-EW as trainer methods: black-box multi-task training from loss evaluations only.

Ye, PhD thesis UTS 2024, Chapter 4, Algorithm 3 (Ye, Lyu, Wang, Zhang & Tsang, ICLR 2024); the
algorithm itself is :mod:`mtlflow.methods._blackbox`. The chosen parameter subset (``params``) is the
mean μ of a Gaussian search distribution with diagonal covariance Σ (Σ_0 = sigma0 · I). Every step
evaluates the K task losses of the step's batch at μ_t and at N samples μ_t + Σ^{1/2} z_j (N + 1
forward passes, no backward pass: ``.grad`` is never written), then applies Eqs. 4.12–4.17 (λ from the
QP of Eq. 4.10 with momentum γ_t = 1/(t+1); the rank/scale transformation of App. A.2.5 by default,
``update=raw`` for Eq. 4.14 as printed) and writes μ_{t+1} back into the model. The trainer's optimizer
and ``--lr`` are unused: β is the step size.

``params``: ``all`` (every trainable parameter; for tiny models and the synthetic problems),
``heads`` or ``head-last`` (the last parametrised layer of each head). With a frozen trunk the shared
features are computed once per step and only the heads are re-evaluated. ``init_from`` starts from a
trained run's ``model.pt`` (e.g. a frozen MultiMNIST trunk) and ``reinit`` re-initialises the tuned
layers first -- the black-box tuning example of docs/research/thesis.md.

Defaults are the thesis' black-box MTL setting (Section 4.6.2): β = 0.5, Σ_0 = I, N = 20 (Office-31).
``asmg-ew`` is the thesis' ASMG-EW ablation (λ^t fixed to 1/m).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn
from torch.nn.utils import parameters_to_vector, vector_to_parameters

from mtlflow.core.callbacks import TrainerView
from mtlflow.core.errors import DataError, InvalidParameterError
from mtlflow.core.hparams import HParam, one_of, positive
from mtlflow.methods._blackbox import ASMG, UPDATES, ASMGConfig
from mtlflow.methods._support import method_seed
from mtlflow.methods.base import Method

PARAM_SUBSETS = ("all", "heads", "head-last")


def _owns_parameters(module: nn.Module) -> bool:
    """Whether ``module`` holds parameters itself (not only through its children)."""
    return any(True for _ in module.parameters(recurse=False))


def _owning_modules(model: nn.Module, subset: str) -> list[nn.Module]:
    """Modules whose own parameters are tuned (for ``reinit``); the whole model for ``all``."""
    if subset == "all":
        return [model]
    if subset == "heads":
        return list(model.heads)
    lasts = []
    for head in model.heads:
        owners = [m for m in head.modules() if _owns_parameters(m)]
        if owners:
            lasts.append(owners[-1])
    return lasts


def tuned_parameters(model: nn.Module, subset: str) -> list[nn.Parameter]:
    modules = _owning_modules(model, subset)
    recurse = subset != "head-last"
    params = [p for m in modules for p in m.parameters(recurse=recurse) if p.requires_grad]
    if not params:
        raise InvalidParameterError(f"asmg: params={subset!r} selects no trainable parameter of this model; "
                                    "use params=all")
    return params


class ASMGMethod(Method):
    name = "asmg"
    family = "black-box"
    cost = "N evals/step"
    paper = ("Ye, Multi-Task Learning: Effective Weighting Algorithms and Model Parameterization, PhD thesis UTS "
             "2024, ch. 4 (ASMG: Ye et al., ICLR 2024)")
    equations = ("Alg. 3: p̂, ĥ (Eqs. 4.12-4.13), λ QP (Eq. 4.10-4.11), momentum (Eq. 4.17), ĝ, Ĝ (Eqs. 4.15-4.16), "
                 "update Eq. 4.14 or App. A.2.5 (A.152-A.153)")
    custom_step = True
    needs_trainer = ("a black-box method: every step re-evaluates the losses at N sampled parameter vectors, "
                     "so it runs the model on the batch itself")
    weighting = "adaptive"
    hparams = {
        "beta": HParam(0.5, "step size β (thesis: 0.5 black-box MTL, 0.1 synthetic)", positive),
        "n_samples": HParam(20, "N: sampled parameter vectors per step (N + 1 loss evaluations)", lambda v: v >= 2,
                            "an integer >= 2", kind=int),
        "sigma0": HParam(1.0, "initial variance: Σ_0 = sigma0 · I (thesis: I)", positive),
        "update": HParam("normalized", "'normalized' (App. A.2.5, A.152-A.153) or 'raw' (Eq. 4.14)",
                         one_of(*UPDATES)),
        "min_precision_ratio": HParam(0.1, "floor of the per-step precision ratio Σ⁻¹_{t+1}/Σ⁻¹_t (guard against an "
                                      "overshooting covariance step; 0 = none, an overshoot is an error)",
                                      lambda v: 0 <= v < 1, "in [0, 1)"),
        "params": HParam("all", "tuned parameters: 'all', 'heads' or 'head-last' (last layer of each head)",
                         one_of(*PARAM_SUBSETS)),
        "init_from": HParam(None, "model.pt of a trained run to start from (same benchmark and tasks)",
                            lambda v: v is None or isinstance(v, str), "a path", kind=str),
        "reinit": HParam(False, "re-initialise the tuned layers before tuning (with init_from)", kind=bool),
    }

    def __init__(self, n_tasks: int, **hparams: Any):
        super().__init__(n_tasks, **hparams)
        if self.hp["reinit"] and self.hp["params"] == "all":
            raise InvalidParameterError(f"{self.name}: reinit=true with params=all re-initialises the whole model; "
                                        "choose params=heads or head-last")
        self.params: list[nn.Parameter] = []
        self.optimizer: ASMG | None = None
        self.frozen_trunk = self.hp["params"] != "all"

    def setup(self, trainer: TrainerView) -> None:
        model = trainer.model
        if self.hp["init_from"]:
            self._load_weights(model, Path(self.hp["init_from"]), trainer.device)
        if self.hp["reinit"]:
            # every module that owns tuned parameters itself resets them (a head is a container of layers)
            for owner in _owning_modules(model, self.hp["params"]):
                for module in owner.modules():
                    if not _owns_parameters(module):
                        continue
                    if not hasattr(module, "reset_parameters"):
                        raise InvalidParameterError(f"{self.name}: cannot re-initialise {type(module).__name__} "
                                                    "(it has no reset_parameters); choose params=head-last")
                    module.reset_parameters()
        self.params = tuned_parameters(model, self.hp["params"])
        config = ASMGConfig(beta=self.hp["beta"], n_samples=self.hp["n_samples"], sigma0=self.hp["sigma0"],
                            update=self.hp["update"], weighting=self.weighting,
                            min_precision_ratio=self.hp["min_precision_ratio"])
        self.optimizer = ASMG(parameters_to_vector(self.params).detach(), self.n_tasks, config,
                              seed=method_seed(self.name, trainer.config.seed))

    def _load_weights(self, model: nn.Module, path: Path, device: torch.device) -> None:
        if not path.is_file():
            raise DataError(f"{self.name}: init_from file not found: {path}; give a run's model.pt")
        blob = torch.load(path, map_location=device, weights_only=False)
        try:
            model.load_state_dict(blob["state_dict"] if isinstance(blob, dict) and "state_dict" in blob else blob)
        except (RuntimeError, KeyError) as exc:
            raise InvalidParameterError(f"{self.name}: {path} does not match this model ({type(exc).__name__}); "
                                        "train it on the same benchmark and tasks") from None

    @torch.no_grad()
    def training_step(self, trainer: TrainerView, batch: Any, epoch: int) -> dict[str, Any]:
        model, optimizer = trainer.model, self.optimizer
        inputs, targets = trainer.bench.unpack(batch)
        inputs = inputs.to(trainer.device) if hasattr(inputs, "to") else inputs
        targets = [targets[idx].to(trainer.device) for idx in trainer.task_index]
        features = model.features(inputs) if self.frozen_trunk else None

        def losses_at(point: Tensor) -> Tensor:
            vector_to_parameters(point.to(self.params[0].dtype), self.params)
            preds = model.forward_heads(features) if features is not None else model(inputs)
            return torch.stack([task.loss(pred, target)
                                for task, pred, target in zip(trainer.tasks, preds, targets, strict=True)])

        samples = optimizer.ask().to(trainer.device)
        center = losses_at(optimizer.mean.to(trainer.device))
        values = torch.stack([losses_at(x) for x in samples])
        step = optimizer.tell(values.cpu(), center.cpu())
        vector_to_parameters(optimizer.mean.to(device=trainer.device, dtype=self.params[0].dtype), self.params)
        self.last_weights = step.lam.clone()
        return {"losses": center.detach(), "weights": self.last_weights}

    def state_dict(self) -> dict[str, Any]:
        return {"asmg": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.optimizer.load_state_dict(state["asmg"])


class ASMGEqualWeights(ASMGMethod):
    name = "asmg-ew"
    equations = "Alg. 3 with λ^t = 1/m (the thesis' ASMG-EW ablation, Section 4.6.2)"
    weighting = "equal"
