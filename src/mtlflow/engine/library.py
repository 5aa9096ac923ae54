"""Library mode: mtlflow's methods inside the user's own training loop (plain PyTorch, Lightning, Accelerate).

One call takes the K task losses of a forward pass and writes ``.grad`` the way the trainer's step
does (:mod:`mtlflow.engine.trainer`), so that the user's optimizer can step::

    mtl = MTLBackward("upgrad", shared_params=model.trunk, task_params=[h.parameters() for h in model.heads])
    optimizer = torch.optim.Adam([*model.parameters(), *mtl.parameters()], lr=1e-3)
    for x, ys in loader:
        optimizer.zero_grad()
        z = model.trunk(x)
        losses = [loss_fn(head(z), y) for head, y in zip(model.heads, ys)]
        mtl(losses)                    # instead of sum(losses).backward()
        optimizer.step()
        mtl.after_optimizer_step()     # the stateful methods' hook (FAMO also wants recompute_losses=...)
    mtl.epoch_end()                    # after every epoch (DWA, STCH, ExcessMTL)

What the call computes depends on the method's family (:class:`~mtlflow.methods.base.GradInput`):

* loss weighting: one backward pass of ``method.objective(losses)`` (Σ_i w_i L_i for most), so every
  parameter, heads included, gets the weighted gradient;
* gradient methods: the per-task gradients ``J [K, P]`` of the shared parameters from a Jacobian backend
  of :mod:`mtlflow.grad_engine` (the K-loop by default), the method's ``combine(J, losses)`` as the shared
  parameters' gradient, and every head its plain gradient ``∇L_i``; MGDA-UB differentiates w.r.t. the
  shared features instead (pass ``features=z``); a Gramian-weighting method with
  ``update_weights_every`` = N > 1 solves its weights every N optimizer steps and reuses them in
  between (one backward pass).

The update is scaled as in the trainer (:func:`mtlflow.engine.step.update_scale`: x K for methods whose
weights sum to 1, unless ``rescale=False``). ``.grad`` accumulates like autograd: the call adds to
what the parameters already hold, so gradient accumulation over micro-batches works. TorchJD's
``torchjd.autojac.mtl_backward(losses, features=z)`` followed by ``jac_to_grad(shared, UPGrad())`` is the
same computation for UPGrad with ``rescale=False`` (``tests/unit/engine/test_library_mode.py``).

Methods that need more than the losses and the gradients -- the bilevel and black-box methods that run
the model on the batch themselves, PaLoRA's Pareto front, LDC-MTL's router -- declare why in
``Method.needs_trainer`` and are refused with that reason. ``docs/guides/library.md`` is the guide.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast

import torch
from torch import Tensor, nn

from mtlflow import methods as method_registry
from mtlflow.core.callbacks import TrainerView
from mtlflow.core.errors import InvalidParameterError, NonFiniteLossError
from mtlflow.core.numerics import blas_on_one_thread
from mtlflow.engine import step as step_rules
from mtlflow.grad_engine import (
    ForwardPass,
    backward_heads,
    backward_shared_weighted,
    jacobian_backend,
    representation_jacobian,
    resolve_backend,
    write_flat_grad,
)
from mtlflow.methods.base import GradientMethod, GradInput, GramianWeighting, Method, StepContext

__all__ = ["BackwardResult", "MTLBackward", "mtl_backward"]

#: Parameters given as a module (all its parameters) or as tensors.
ParamSource = nn.Module | Iterable[Tensor]
#: The K task losses: scalar tensors, or one tensor of K entries.
Losses = Sequence[Tensor] | Tensor


@dataclass(frozen=True)
class BackwardResult:
    """What one call applied."""

    #: the K task losses, detached
    losses: Tensor
    #: the weights the method applied to the losses or gradients (``Method.last_weights``), if it has any
    weights: Tensor | None
    #: the factor of the update (:func:`mtlflow.engine.step.update_scale`)
    scale: float
    #: the shared parameters' update ``[P]`` (after scaling) when the method combined a Jacobian, else None
    direction: Tensor | None


def _trainable(source: ParamSource) -> list[Tensor]:
    params = source.parameters() if isinstance(source, nn.Module) else source
    return [p for p in params if p.requires_grad]


class _SetupModel:
    """What the methods' ``setup`` hooks read of a model: the heads (IMTL and DB-MTL rescale their gradients)
    and the trunk (GradNorm's W is its last layer), which library mode has only when the shared
    parameters came as one module."""

    def __init__(self, method: str, trunk: nn.Module | None, heads: list[list[Tensor]]):
        self._method, self._trunk, self.heads = method, trunk, heads

    @property
    def trunk(self) -> nn.Module:
        if self._trunk is None:
            raise InvalidParameterError(f"{self._method} reads the layers of the shared part of the model; pass it "
                                        "as one module: shared_params=model.trunk")
        return self._trunk

    def shared_parameters(self) -> list[Tensor]:
        """The shared module's trainable parameters (in library mode every one of them is shared)."""
        return [p for p in self.trunk.parameters() if p.requires_grad]

    def task_parameters(self, task: int) -> list[Tensor]:
        return self.heads[task]


@contextmanager
def _accumulating(params: Sequence[Tensor]) -> Iterator[None]:
    """Run the step on empty ``.grad`` and add back what the parameters held before, as autograd would
    have accumulated: IMTL and DB-MTL rescale the heads' gradients in place, which must not touch
    gradients of earlier micro-batches. On an error ``.grad`` is left as it was."""
    held = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield
    except BaseException:
        for p, before in zip(params, held, strict=True):
            p.grad = before
        raise
    for p, before in zip(params, held, strict=True):
        if before is not None:
            p.grad = before if p.grad is None else before.add_(p.grad)


class MTLBackward:
    """A multi-task method applied to the losses of the user's own training loop; see the module doc.

    ``method``: a registered name (built with ``hparams`` and ``seed``, which seeds the method's own
    generator if it draws random numbers, like ``--seed`` in the trainer) or a :class:`Method`
    instance, used as it is. ``shared_params``: the parameters every task depends on (a module or
    tensors). ``task_params``: one module or list of tensors per task (its head); K is their number.
    ``rescale``: the trainer's ``--rescale`` (x K for methods whose weights sum to 1).
    ``grad_backend``: the Jacobian backend of gradient methods (``loop``, ``batched``, ``autojac``;
    ``auto`` = ``loop``).

    Hooks, for the methods that keep state: :meth:`after_optimizer_step` once after every
    ``optimizer.step()`` and :meth:`epoch_end` after every epoch; :meth:`parameters` are the method's
    learned tensors (UW, IMTL, GradNorm), which the user's optimizer must update;
    :meth:`state_dict`/:meth:`load_state_dict` checkpoint the method (the continuation is bit-identical).
    """

    def __init__(self, method: str | Method, shared_params: ParamSource, task_params: Sequence[ParamSource], *,
                 seed: int = 0, rescale: bool = True, grad_backend: str = "loop", **hparams: Any):
        self.heads = [_trainable(params) for params in task_params]
        self.shared = _trainable(shared_params)
        n_tasks = len(self.heads)
        if n_tasks < 1:
            raise InvalidParameterError("task_params is empty; give one module or parameter list per task")
        if not self.shared:
            raise InvalidParameterError("shared_params holds no tensor that requires grad; give the parameters "
                                        "every task depends on (e.g. model.trunk)")
        #: the shared parameters, then every head's: what the call writes
        self.model_params = [*self.shared, *(p for head in self.heads for p in head)]
        ids = [id(p) for p in self.shared]
        if len(set(ids)) != len(ids) or set(ids) & {id(p) for p in self.model_params[len(ids):]}:
            raise InvalidParameterError("a tensor appears twice in shared_params or in both shared_params and "
                                        "task_params; each parameter is either shared or task-specific")
        if isinstance(method, Method):
            if hparams:
                raise InvalidParameterError(f"hyper-parameters {sorted(hparams)} given with a built method; "
                                            "pass the method's name instead, or build it with them")
            if method.n_tasks != n_tasks:
                raise InvalidParameterError(f"{method.name} was built for {method.n_tasks} tasks but task_params "
                                            f"has {n_tasks}")
            self.method = method
        else:
            self.method = method_registry.build(method, n_tasks, seed, **hparams)
        name = self.method.name
        reason = self.method.needs_trainer or ("it owns the whole training step" if self.method.custom_step else None)
        if reason is not None:
            raise InvalidParameterError(f"{name} cannot run in library mode: {reason}; train it with "
                                        "`mtlflow train`")
        self.n_tasks = n_tasks
        self.rescale = rescale
        self.mode = self._mode()
        self.backend = jacobian_backend(resolve_backend(grad_backend)) if self.mode == "jacobian" else None
        if self.backend is not None and self.backend.runs_forward:
            raise InvalidParameterError(f"grad_backend {grad_backend!r} runs the model's forward pass itself, "
                                        "which library mode does not own; use loop, batched or autojac")
        self.method.to(self.shared[0].device)
        trunk = shared_params if isinstance(shared_params, nn.Module) else None
        view = SimpleNamespace(model=_SetupModel(name, trunk, self.heads),
                               config=SimpleNamespace(seed=seed, grad_wrt="parameters"))
        self.method.setup(cast(TrainerView, view))
        #: N of a Gramian-weighting method's ``update_weights_every``, and the weights solved last
        self.update_weights_every = (self.method.update_weights_every()
                                     if isinstance(self.method, GramianWeighting) else 1)
        self.reused_weights: Tensor | None = None
        #: optimizer steps taken (counted by :meth:`after_optimizer_step`) and the current epoch (from 1)
        self.step = 0
        self.epoch = 1
        self._context: StepContext | None = None

    def _mode(self) -> str:
        if not isinstance(self.method, GradientMethod):
            return "losses"
        return "representation" if self.method.requires is GradInput.REPRESENTATION else "jacobian"

    def parameters(self) -> list[Tensor]:
        """The method's learned tensors (UW's log-variances, IMTL's log-scales, GradNorm's weights); add them
        to your optimizer (the trainer uses ``--method-lr`` and no weight decay for them)."""
        return self.method.parameters()

    def to(self, device: torch.device | str) -> MTLBackward:
        """Move the method's tensors to ``device``, for a model moved after this object was built (Lightning
        moves it before ``configure_optimizers``); the learned tensors are new leaves, so call it before
        building the optimizer."""
        self.method.to(device)
        return self

    @property
    def scale(self) -> float:
        return step_rules.update_scale(self.method.natural_scale, self.n_tasks, self.rescale)

    def __call__(self, losses: Losses, features: Tensor | None = None) -> BackwardResult:
        """Write the method's update into ``.grad`` (added to what is there); ``features``: the shared
        features z (the heads' input), needed by MGDA-UB and the ``autojac`` backend."""
        loss_list = self._checked(losses)
        stacked = torch.stack(loss_list)
        detached = stacked.detach()
        context = StepContext(step=self.step, epoch=self.epoch, losses=detached,
                              recompute_losses=self._no_recompute, extra={"features": features})
        mode = self.mode
        if mode == "representation" and not isinstance(features, Tensor):
            raise InvalidParameterError(f"{self.method.name} takes per-task gradients w.r.t. the shared features: "
                                        "pass features=z (the output of the shared part, the heads' input)")
        if self.backend is not None and self.backend.name == "autojac" and not isinstance(features, Tensor):
            raise InvalidParameterError("grad_backend 'autojac' needs features=z (the heads' input)")
        if mode != "losses" and step_rules.reuses_weights(self.update_weights_every, self.step,
                                                          self.reused_weights is not None):
            mode = "reuse"
        scale = self.scale
        direction = None
        with _accumulating(self.model_params):
            if mode == "losses":
                self.method.before_backward(context)
                objective = self.method.objective(stacked)
                (objective * scale).backward(inputs=[*self.model_params, *self.method.parameters()])
            elif mode == "reuse":
                self.method.before_backward(context)
                self.method.last_weights = self.reused_weights
                backward_heads(loss_list, self.heads)
                backward_shared_weighted(loss_list, self.reused_weights * scale, self.shared)
            else:
                forward = ForwardPass(loss_list, features)
                if mode == "jacobian":
                    grads = self.backend.differentiate(forward, self.shared, self.heads, retain_graph=False)
                else:
                    grads = representation_jacobian(forward, self.heads)
                self.method.before_backward(context)
                with blas_on_one_thread():  # the trainer's rule for every method's K x K solves
                    direction = self.method.combine(grads, detached)
                step_rules.check_finite_update(self.method.name, direction, self.step)
                if self.update_weights_every > 1:
                    self.reused_weights = self.method.last_weights.detach().clone()
                direction = direction * scale
                if mode == "jacobian":
                    write_flat_grad(self.shared, direction)
                else:
                    features.backward(direction.view_as(features).to(features.dtype), inputs=self.shared)
        self._context = context
        weights = self.method.last_weights
        return BackwardResult(detached, None if weights is None else weights.detach(), scale,
                              direction if mode == "jacobian" else None)

    def _checked(self, losses: Losses) -> list[Tensor]:
        loss_list = self._per_task(losses)
        for i, loss in enumerate(loss_list):
            if not isinstance(loss, Tensor) or loss.dim() != 0:
                shape = tuple(loss.shape) if isinstance(loss, Tensor) else type(loss).__name__
                raise InvalidParameterError(f"loss {i} is {shape}, not a scalar tensor; reduce it (e.g. .mean())")
            if not loss.requires_grad:
                raise InvalidParameterError(f"loss {i} does not require grad: it was computed without autograd "
                                            "(torch.no_grad?) or from no trainable parameter")
        bad = [f"loss {i}={float(loss)}" for i, loss in enumerate(loss.detach() for loss in loss_list)
               if not torch.isfinite(loss)]
        if bad:
            raise NonFiniteLossError(f"non-finite {', '.join(bad)} at step {self.step}; lower the learning rate, "
                                     "clip the gradients or check the data")
        return loss_list

    def _per_task(self, losses: Losses) -> list[Tensor]:
        per_task = list(losses.unbind()) if isinstance(losses, Tensor) and losses.dim() == 1 else list(losses)
        if len(per_task) != self.n_tasks:
            raise InvalidParameterError(f"got {len(per_task)} losses for {self.n_tasks} tasks; give one scalar "
                                        "loss per task, in the order of task_params")
        return per_task

    def _no_recompute(self) -> Tensor:
        raise InvalidParameterError(f"{self.method.name} compares the losses before and after the optimizer step "
                                    "on the same batch: call after_optimizer_step(recompute_losses=<a function "
                                    "returning the K losses of that batch>)")

    def clip_gradients(self, max_norm: float | None = None) -> None:
        """Optional, between the call and ``optimizer.step()``: clip all the parameters' gradient to
        ``max_norm`` (when given), then the shared parameters' to the method's own norm (Nash-MTL's
        ``max_norm``), in the trainer's order (:func:`mtlflow.engine.step.clip_gradients`)."""
        step_rules.clip_gradients(self.model_params, self.shared, max_norm, self.method)

    def after_optimizer_step(self, recompute_losses: Callable[[], Losses] | None = None) -> None:
        """Call once after every ``optimizer.step()``. ``recompute_losses``: a function returning the K
        losses of the step's batch at the new parameters; FAMO needs it (it is evaluated without autograd
        and only when the method asks)."""
        if self._context is None:
            raise InvalidParameterError("after_optimizer_step was called without a call of the losses since the "
                                        "last optimizer step; call it once after every optimizer.step()")
        if recompute_losses is not None:
            def recompute() -> Tensor:
                with torch.no_grad():
                    return torch.stack(self._per_task(recompute_losses()))

            self._context.recompute_losses = recompute
        self.method.after_optimizer_step(self._context)
        self._context = None
        self.step += 1

    def epoch_end(self) -> None:
        """Call after every epoch: DWA's loss ratios, STCH's nadir and ExcessMTL's scores are per epoch."""
        self.method.on_epoch_end(self.epoch)
        self.epoch += 1

    def state_dict(self) -> dict[str, Any]:
        """The method's state and the step and epoch counters; save it with your model and optimizer."""
        return {"method": self.method.state_dict(), "step": self.step, "epoch": self.epoch,
                "reused_weights": None if self.reused_weights is None else self.reused_weights.clone()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.method.load_state_dict(state["method"])
        self.step, self.epoch = int(state["step"]), int(state["epoch"])
        self.reused_weights = state["reused_weights"]


def mtl_backward(losses: Losses, shared_params: ParamSource, task_params: Sequence[ParamSource],
                 method: str = "upgrad", *, features: Tensor | None = None, rescale: bool = True,
                 grad_backend: str = "loop", **hparams: Any) -> BackwardResult:
    """One call of a method that keeps no state between steps (UPGrad, MGDA, CAGrad, IMTL-G, Aligned-MTL,
    LS, ...): ``MTLBackward(method, ...)(losses, features)``. Stateful methods are refused: build an
    :class:`MTLBackward` once and call it every step."""
    engine = MTLBackward(method, shared_params, task_params, rescale=rescale, grad_backend=grad_backend, **hparams)
    if engine.method.state_dict():
        raise InvalidParameterError(f"{engine.method.name} keeps state between steps; build MTLBackward({method!r}, "
                                    "...) once and call it every step")
    return engine(losses, features=features)
