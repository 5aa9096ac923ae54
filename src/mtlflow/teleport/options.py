"""The options of COST teleportation, their documented defaults, and the released-code variant.

The paper (Zhou et al., NeurIPS 2025) fixes rank 5 (App. B.2), γ = 0.1 (Eq. 11) and the trigger rules
(Sec. 4.1); it gives no value for the number of LoRA steps, the batches they use, ñ, δ, the LoRA
learning rate, the delayed start E or the per-epoch cap (``methods-cost.md`` §1.1 item 7). mtlflow's
defaults for those were chosen so that a teleport costs at most ~15 % of a MultiMNIST epoch of its
base method and still moves the trunk measurably (docs/research/cost.md).

``variant="released"`` switches every default to what the released code (zzpustc/COST, CityScapes
path; ``methods-cost.md`` §1.2) does: loss 10·L_t − 0.5·L_g, R = K(1 − ‖g_i‖/Σ‖g‖), Gaussian noise
scaled to 1e-4 per parameter tensor, per-task max then mean over tasks divided by the noise scale,
perturbed losses without a gradient path to the adapter, L* = the mean loss over the training set,
two passes over the training set in eval mode, the LoRA learning rate = the model's, the trigger
"some task with cos ≤ 0", HTR's reference g′ = the previous update and no rescaling of Adam's moments after
the HTR step. Each of these is also a separate
option, so any single choice can be flipped on top of either variant.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from mtlflow.core.errors import InvalidParameterError
from mtlflow.teleport.triggers import RULES

VARIANTS = ("paper", "released")
ADAPTERS = ("lora", "loha", "oft")
BALANCES = ("softmax", "complement")
NOISES = ("sphere", "per-tensor")
REDUCTIONS = ("max-of-mean", "mean-of-max")
SHARPNESS_GRADIENTS = ("through-perturbations", "unperturbed-only")
HTR_REFERENCES = ("mean-gradient", "last-update")
HTR_NONPOSITIVE = ("restart", "zero-betas")
HTR_BIAS_CORRECTIONS = ("rescale", "none")
INVARIANCE_TARGETS = ("batch", "mean")

#: defaults of the options the variant decides (None in :class:`CostOptions` means "the variant's")
VARIANT_DEFAULTS: dict[str, dict[str, Any]] = {
    "paper": {
        "trigger": "dominated",          # Eq. 3
        "steps": 8,                      # not in the paper; see the module docstring
        "batches": 1,                    # the trigger batch only
        "passes": None,
        "batch_size": 64,                # samples of each batch the adapter sees; not in the paper
        "perturbations": 1,              # ñ; not in the paper
        "radius": 1.0,                   # δ (absolute, on the shared parameters); not in the paper
        "lr": 5e-3,                      # LoRA Adam learning rate; not in the paper
        "gamma": 0.1,                    # Eq. 11
        "invariance_weight": 1.0,        # Eq. 11: L_t - γ L_g
        "balance": "softmax",            # Eq. 10
        "noise": "sphere",               # Eq. 8: ε on the sphere ‖ε‖ = δ
        "reduction": "max-of-mean",      # Eq. 9
        "sharpness_gradient": "through-perturbations",
        "htr_reference": "mean-gradient",  # Eq. 12: g′ = the gradient at the pre-teleport point
        "htr_bias_correction": "rescale",  # not in the paper: Eq. 13's moments weighted as Adam's correction assumes
        "invariance_target": "batch",    # L_i* = the loss of the same batch before the teleport
        "eval_mode": False,
    },
    "released": {
        "trigger": "released",
        "steps": None,
        "batches": 0,                    # every training batch
        "passes": 2,                     # tele_round = 2
        "batch_size": 0,                 # whole batches
        "perturbations": 5,              # grad_sampling_times = 5
        "radius": 1e-4,                  # per-tensor noise norm
        "lr": None,                      # = the model's learning rate
        "gamma": 0.5,
        "invariance_weight": 10.0,
        "balance": "complement",
        "noise": "per-tensor",
        "reduction": "mean-of-max",
        "sharpness_gradient": "unperturbed-only",
        "htr_reference": "last-update",
        "htr_bias_correction": "none",   # PyTorch's moments and step count as the modified betas leave them
        "invariance_target": "mean",
        "eval_mode": True,
    },
}


@dataclass
class CostOptions:
    """Every COST option; ``None`` takes the variant's default (see :data:`VARIANT_DEFAULTS`)."""

    variant: str = "paper"
    #: trigger rule: dominated (Eq. 3), weak (Def. 1), many-task (Eq. 4), released, always
    trigger: str | None = None
    #: delayed start E (App. A.6): no teleport during the first E epochs
    delay_epochs: int = 0
    #: frequency control (App. A.6): at most this many teleports per epoch
    max_per_epoch: int = 1
    #: check the trigger every N-th step (per-task gradients are needed only on those steps: a saving
    #: for loss-weighting base methods, which otherwise do not compute them)
    check_every: int = 1
    #: PEFT adapter on the trunk's Conv2d/Linear layers: lora (paper), loha (Table 8), oft (Linear only)
    adapter: str = "lora"
    rank: int = 5
    #: adapter optimisation steps per teleport (or ``passes`` x ``batches``)
    steps: int | None = None
    #: batches the adapter is trained on: 1 = the trigger batch, N = it plus N-1 training batches, 0 = all
    batches: int | None = None
    passes: int | None = None
    #: the adapter sees the first N samples of each of those batches (0 = whole batches; tensor inputs only)
    batch_size: int | None = None
    #: ñ perturbations per step for the sharpness estimate (Eq. 9) and their radius δ (Eq. 8)
    perturbations: int | None = None
    radius: float | None = None
    lr: float | None = None
    gamma: float | None = None
    invariance_weight: float | None = None
    balance: str | None = None
    noise: str | None = None
    reduction: str | None = None
    sharpness_gradient: str | None = None
    htr_reference: str | None = None
    #: HTR where σ = cos(Δθ, g′) ≤ 0, which Eq. 13 does not define: restart Adam (the released code's new
    #: Adam) or Eq. 13 with σ clamped to 0; and whether Adam's moments are rescaled after the HTR step to the
    #: weight its bias correction assumes (:mod:`mtlflow.teleport.htr`)
    htr_nonpositive: str = "restart"
    htr_bias_correction: str | None = None
    invariance_target: str | None = None
    eval_mode: bool | None = None
    #: ablation switches (Table 4): drop L_t, drop L_g, drop HTR
    use_invariance: bool = True
    use_sharpness: bool = True
    htr: bool = True

    @classmethod
    def from_mapping(cls, options: Mapping[str, Any] | None) -> CostOptions:
        """Options from a user mapping (CLI ``--teleport-option``, pipeline ``teleport_options``), validated."""
        options = dict(options or {})
        names = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(options) - names)
        if unknown:
            raise InvalidParameterError(f"unknown COST option(s) {', '.join(unknown)}; valid: {', '.join(sorted(names))}")
        resolved = cls(**options)
        resolved.validate()
        return resolved

    def resolved(self) -> CostOptions:
        """A copy with every ``None`` replaced by the variant's default."""
        if self.variant not in VARIANTS:
            raise InvalidParameterError(f"COST variant must be one of {', '.join(VARIANTS)}, got {self.variant!r}")
        defaults = dict(VARIANT_DEFAULTS[self.variant])
        if self.steps is not None and self.passes is None:  # an explicit step count replaces the variant's passes
            defaults["passes"] = None
        values = {k: (defaults[k] if v is None and k in defaults else v) for k, v in dataclasses.asdict(self).items()}
        return CostOptions(**values)

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    def validate(self) -> None:
        r = self.resolved()

        def bad(msg: str) -> None:
            raise InvalidParameterError(f"COST option {msg}")

        def choice(name: str, value: Any, valid: tuple[str, ...]) -> None:
            if value not in valid:
                bad(f"{name} must be one of {', '.join(valid)}, got {value!r}")

        def integer(name: str, value: Any, low: int) -> None:
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                bad(f"{name} must be an integer >= {low}, got {value!r}")

        def number(name: str, value: Any, positive: bool = True) -> None:
            ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            if not ok or (value <= 0 if positive else value < 0):
                bad(f"{name} must be a {'positive' if positive else 'non-negative'} finite number, got {value!r}")

        choice("trigger", r.trigger, tuple(RULES))
        choice("adapter", r.adapter, ADAPTERS)
        choice("balance", r.balance, BALANCES)
        choice("noise", r.noise, NOISES)
        choice("reduction", r.reduction, REDUCTIONS)
        choice("sharpness_gradient", r.sharpness_gradient, SHARPNESS_GRADIENTS)
        choice("htr_reference", r.htr_reference, HTR_REFERENCES)
        choice("htr_nonpositive", r.htr_nonpositive, HTR_NONPOSITIVE)
        choice("htr_bias_correction", r.htr_bias_correction, HTR_BIAS_CORRECTIONS)
        choice("invariance_target", r.invariance_target, INVARIANCE_TARGETS)
        integer("delay_epochs", r.delay_epochs, 0)
        integer("max_per_epoch", r.max_per_epoch, 0)
        integer("check_every", r.check_every, 1)
        integer("rank", r.rank, 1)
        integer("batches", r.batches, 0)
        integer("batch_size", r.batch_size, 0)
        integer("perturbations", r.perturbations, 1)
        if self.steps is not None and self.passes is not None:
            bad("steps and passes exclude each other; give one (passes x batches = steps)")
        if r.passes is None:
            integer("steps", r.steps, 1)
        else:
            integer("passes", r.passes, 1)
        number("radius", r.radius)
        if r.lr is not None:
            number("lr", r.lr)
        number("gamma", r.gamma, positive=False)
        number("invariance_weight", r.invariance_weight, positive=False)
        for flag in ("eval_mode", "use_invariance", "use_sharpness", "htr"):
            if not isinstance(getattr(r, flag), bool):
                bad(f"{flag} must be true or false, got {getattr(r, flag)!r}")
        if not (r.use_invariance or r.use_sharpness):
            bad("use_invariance and use_sharpness cannot both be false: the adapter would have no objective")
