"""Data-parallel training with ``torchrun`` (DDP) for every method family.

Launch ``torchrun --nproc_per_node N -m mtlflow train ...`` (or ``mtlflow train --nproc N ...``, which
runs that command). Every process trains the same model on its shard of each global batch; the
global batch is ``N x --batch-size``. torchrun's ``RANK``, ``WORLD_SIZE`` and ``LOCAL_RANK`` select
this process's shard and GPU; the backend is NCCL when training on CUDA, Gloo on the CPU.

**Why explicit collectives and not ``torch.nn.parallel.DistributedDataParallel``.** DDP all-reduces
``.grad`` bucket by bucket from hooks that fire while ``loss.backward()`` *accumulates* into
``.grad``, and it reduces one vector per parameter: the gradient of the sum of the task losses. The
trainer's gradient methods need the opposite: per-task gradients from ``torch.autograd.grad`` (which
never accumulates into ``.grad``, so DDP's hooks do not fire) kept apart as the rows of ``J [K, P]``,
averaged over the ranks *before* the non-linear ``combine`` -- ``combine(mean_r J_r)`` is the
single-process direction, ``mean_r combine(J_r)`` is not. DDP also needs every forward pass to go
through its wrapper, while the trainer calls ``model.features``/``forward_heads`` and
``torch.func.functional_call`` directly. So the trainer stays unwrapped and this module reduces, once
per step and in one flat buffer per dtype, exactly what each step needs:

* the K task losses (always): every rank sees the global-batch losses; they replace the local ones
  "straight through" (value = rank mean, gradient = the local graph), so a loss-weighting objective
  ``f(L)`` back-propagates ``Σ_i ∂f/∂L_i(L_global) ∇L_i^local``, whose rank average is the
  single-process gradient for every ``f`` (LS, FAMO, UW, ...), and hooks (FAMO's
  ``after_optimizer_step``) re-evaluate the global losses;
* Jacobian mode: ``J`` and the heads' plain gradients, before ``combine`` -- every rank then computes
  the same direction (one all-reduce of K x P numbers: the K-fold DDP traffic these methods need);
* representation mode (Gramian weighting, MGDA-UB): the Gramian of the per-sample feature gradients
  is ``Σ_r Z_r Z_rᵀ / R²`` (the global batch's rows are the ranks' rows scaled by 1/R), so only K x K
  numbers are reduced before the weights are solved;
* every other gradient written by a local backward pass (loss weighting, amortised steps,
  representation mode) is averaged after the update is written and before clipping.

The Gramian-only backend ``autogram`` is refused: the Gramian of the rank-averaged Jacobian has
cross-rank terms ``J_r J_sᵀ`` that local Gramians do not give. Methods that own their step
(``custom_step``) and COST's teleport (it optimises adapters on the local batch) are refused until
they synchronise themselves.

The data order of epoch e is the single-process order (it depends only on (seed, e)), cut into
rank shards by :class:`EpochShardSampler`, so ``torchrun`` with R processes and batch B sees the
same global batches as one process with batch R x B, and the parameters agree up to float rounding.
Every rank seeds its RNGs with the same seed: random choices of a method (RLW's weights, PCGrad's
task order) must agree across ranks. Only rank 0 evaluates (the results are broadcast, so
schedulers step identically), writes ``run.json``/``metrics.json``/``checkpoint.pt``/``model.pt``, and
reads the checkpoint on ``--resume`` (broadcast to the others). Ranks meet at a barrier after every
epoch's checkpoint, and their parameters are compared with rank 0's at the start and after every
epoch (:class:`RanksDivergedError` when they drifted apart, e.g. a callback that changed them with
per-rank data).
"""

from __future__ import annotations

import atexit
import datetime
import logging
import math
import os
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch import Tensor
from torch.utils.data import DataLoader, Dataset, DistributedSampler, Subset

from mtlflow.core.errors import InvalidParameterError, MtlflowError
from mtlflow.core.numerics import gramian_float64
from mtlflow.core.seeding import epoch_generator
from mtlflow.engine.step import GradientMode
from mtlflow.methods.base import GramianWeighting

log = logging.getLogger(__name__)

T = TypeVar("T")

#: Collective timeout: long enough for rank 0 to evaluate a large validation split while the others wait.
COLLECTIVE_TIMEOUT = datetime.timedelta(minutes=60)
#: Largest parameter deviation from rank 0 (relative to max(1, max |θ|)) treated as float rounding.
DRIFT_TOLERANCE = 1e-3


class RanksDivergedError(MtlflowError):
    """The ranks' parameters drifted apart: something changed them with per-rank data."""


@dataclass(frozen=True)
class TorchrunEnv:
    """The process topology torchrun exports to every worker."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0

    @classmethod
    def read(cls, environ: Mapping[str, str] | None = None) -> TorchrunEnv:
        env = os.environ if environ is None else environ
        values = {}
        for key, name in (("rank", "RANK"), ("world_size", "WORLD_SIZE"), ("local_rank", "LOCAL_RANK")):
            raw = env.get(name)
            try:
                values[key] = int(raw) if raw not in (None, "") else getattr(cls, key)
            except ValueError:
                raise InvalidParameterError(f"environment variable {name}={raw!r} is not an integer; launch "
                                            "with torchrun, which sets it") from None
        topo = cls(**values)
        if topo.world_size < 1 or not 0 <= topo.rank < topo.world_size:
            raise InvalidParameterError(f"RANK={topo.rank} / WORLD_SIZE={topo.world_size} is not a valid torchrun "
                                        "topology; launch with torchrun --nproc_per_node N")
        if topo.world_size > 1 and "RANK" not in env:
            raise InvalidParameterError(f"WORLD_SIZE={topo.world_size} but RANK is not set; launch with torchrun, "
                                        "which sets both")
        return topo


def is_main_process() -> bool:
    """True in a plain process and in torchrun's rank 0 (read from the environment, no process group)."""
    return TorchrunEnv.read().rank == 0


def epoch_order(n: int, seed: int, epoch: int) -> list[int]:
    """The order in which the single-process trainer visits the n training samples in ``epoch``.

    It is read from a ``DataLoader(shuffle=True, generator=epoch_generator(seed, epoch))`` over the
    indices -- the loader the trainer uses -- and not from ``torch.randperm`` directly, because the
    DataLoader draws its workers' base seed from the same generator before shuffling.
    """
    if n == 0:
        return []
    loader = DataLoader(range(n), batch_size=n, shuffle=True, generator=epoch_generator(seed, epoch))
    return [int(i) for batch in loader for i in batch]


class EpochShardSampler(DistributedSampler):
    """``DistributedSampler`` over the single-process order of each epoch (``set_epoch`` per epoch).

    Rank r takes positions r, r + R, r + 2R, ... of the padded order (DistributedSampler's rule), so
    batch j of every rank (batch size B) together are positions [jRB, (j+1)RB): the single-process
    batch j with batch size RB. The order is padded with its first samples to a multiple of R, as
    DistributedSampler does; only when n is not a multiple of R does the last global batch differ.
    """

    def __init__(self, dataset: Dataset, num_replicas: int, rank: int, seed: int):
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=True, seed=seed, drop_last=False)

    def __iter__(self) -> Iterator[int]:
        order = epoch_order(len(self.dataset), self.seed, self.epoch)
        padding = self.total_size - len(order)
        if padding > 0:
            order += (order * math.ceil(padding / len(order)))[:padding]
        return iter(order[self.rank:self.total_size:self.num_replicas])


def unsupported_reason(method: Any, gradient_mode: GradientMode, teleport: str | None = None) -> str | None:
    """Why a method (with this gradient mode and teleport wrapper) cannot train under torchrun, or ``None``."""
    if method.custom_step:
        return (f"method {method.name!r} owns its training step (custom_step) and does not support torchrun/DDP "
                "yet; train it in one process (without torchrun or --nproc)")
    if gradient_mode == GradientMode.GRAMIAN:
        return ("grad_backend 'autogram' computes only this rank's Gramian, but the Gramian of the rank-averaged "
                "Jacobian needs cross-rank products; use --grad-backend loop (or auto) under torchrun")
    if gradient_mode == GradientMode.REPRESENTATION and not isinstance(method, GramianWeighting):
        return (f"method {method.name!r} combines per-sample feature gradients, which differ in size across ranks; "
                "use grad_wrt=parameters under torchrun")
    if teleport:
        return (f"--teleport {teleport} optimises its adapters on this rank's batch only, so the ranks would move "
                "apart; train teleported runs in one process (without torchrun or --nproc)")
    return None


class Distributed:
    """The trainer's view of data parallelism; this base class is one process (every call is a no-op)."""

    rank = 0
    world_size = 1
    backend: str | None = None

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    def describe(self) -> dict[str, Any]:
        """What ``run.json`` records about the topology."""
        return {"world_size": self.world_size, "backend": self.backend}

    def check_supported(self, trainer: Any) -> None:
        """Refuse (before training) what cannot run on this topology."""

    def training_split(self, dataset: Dataset, seed: int, epoch: int) -> tuple[Dataset, bool]:
        """``(dataset, shuffle)`` for this rank's training loader in ``epoch``."""
        return dataset, True

    def steps_per_epoch(self, n_samples: int, batch_size: int) -> int:
        """Optimizer steps of a full epoch (every rank takes the same number)."""
        return math.ceil(n_samples / (batch_size * self.world_size))

    def synchronize_work(self, work: Any, head_params: Sequence[Tensor]) -> None:
        """Make the step's losses (and Jacobian and head gradients) the global-batch ones, in place."""

    def mean_losses(self, losses: Tensor) -> Tensor:
        """The global-batch value of per-rank batch-mean losses ``[K]``."""
        return losses

    def representation_gramian(self, rows: Tensor) -> Tensor:
        """Gramian of the per-task gradients w.r.t. the shared features (rows ``[K, numel(z)]``), in float64
        (:mod:`mtlflow.core.numerics`: a low-precision Gramian is not PSD to working precision)."""
        return gramian_float64(rows)

    def average_gradients(self, params: Sequence[Tensor], gradient_mode: GradientMode) -> None:
        """Average the ``.grad`` that this rank's own backward passes wrote."""

    def sync_parameters(self, model: torch.nn.Module, when: str) -> None:
        """Check that every rank holds rank 0's parameters; copy rank 0's parameters and buffers."""

    def from_rank0(self, compute: Callable[[], T]) -> T:
        """Run ``compute`` on rank 0 only and give every rank its result (or its error)."""
        return compute()

    def load(self, path: Path, map_location: torch.device) -> dict[str, Any]:
        """``torch.load`` a checkpoint onto ``map_location`` (under torchrun rank 0 reads it and broadcasts it)."""
        return _place(torch.load(path, map_location="cpu", weights_only=False), map_location)

    def check_checkpoint(self, checkpoint: Mapping[str, Any], path: Path) -> None:
        """Refuse a checkpoint written by another number of processes (another global batch)."""
        written = int(checkpoint.get("world_size", 1))
        if written != self.world_size:
            launch = "one process" if written == 1 else f"torchrun --nproc_per_node {written} (or --nproc {written})"
            raise InvalidParameterError(
                f"checkpoint {path} was written by {written} process(es) but this run has {self.world_size}; the "
                f"global batch would change -- resume with {launch}")

    def barrier(self) -> None:
        """Wait until every rank gets here."""


class TorchrunGroup(Distributed):
    """R processes launched by torchrun, one per GPU (NCCL) or CPU share (Gloo)."""

    def __init__(self, topology: TorchrunEnv, backend: str, device: torch.device):
        self.rank, self.world_size, self.local_rank = topology.rank, topology.world_size, topology.local_rank
        self.backend, self.device = backend, device
        self._sampler: EpochShardSampler | None = None

    def _dist(self):
        return dist

    def check_supported(self, trainer: Any) -> None:
        reason = unsupported_reason(trainer.method, trainer.gradient_mode, getattr(trainer.config, "teleport", None))
        if reason:
            raise InvalidParameterError(reason)

    def training_split(self, dataset: Dataset, seed: int, epoch: int) -> tuple[Dataset, bool]:
        if self._sampler is None or self._sampler.dataset is not dataset or self._sampler.seed != seed:
            self._sampler = EpochShardSampler(dataset, self.world_size, self.rank, seed)
        self._sampler.set_epoch(epoch)
        return Subset(dataset, list(self._sampler)), False

    # -- collectives ------------------------------------------------------------------------------
    def _all_reduce_mean(self, values: Sequence[Tensor | None], like: Sequence[Tensor]) -> list[Tensor | None]:
        """Rank mean of every entry in one flat buffer per (dtype, device). ``None`` counts as zero and
        stays ``None`` only where every rank has ``None``; a presence flag per entry travels in front."""
        groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
        for i, ref in enumerate(like):
            groups.setdefault((ref.dtype, ref.device), []).append(i)
        out: list[Tensor | None] = list(values)
        for (dtype, device), index in groups.items():  # same insertion order on every rank
            flags = torch.tensor([values[i] is not None for i in index], dtype=dtype, device=device)
            parts = [flags] + [(values[i] if values[i] is not None else torch.zeros_like(like[i]))
                               .detach().reshape(-1).to(dtype) for i in index]
            buffer = torch.cat(parts)
            self._dist().all_reduce(buffer)
            counts = buffer[:len(index)].tolist()
            buffer.div_(self.world_size)
            offset = len(index)
            for count, i in zip(counts, index, strict=True):
                n = like[i].numel()
                out[i] = buffer[offset:offset + n].view_as(like[i]) if count > 0 else None
                offset += n
        return out

    def mean_losses(self, losses: Tensor) -> Tensor:
        reduced = losses.detach().to(torch.float64).clone()
        self._dist().all_reduce(reduced)
        return (reduced / self.world_size).to(losses.dtype)

    def synchronize_work(self, work: Any, head_params: Sequence[Tensor]) -> None:
        losses = work.forward.losses
        global_losses = self.mean_losses(torch.stack([loss.detach() for loss in losses]))
        # value = the global loss exactly, gradient = this rank's graph (loss - loss.detach() is 0)
        work.forward = replace(work.forward,
                               losses=[g + (loss - loss.detach())
                                       for g, loss in zip(global_losses, losses, strict=True)])
        values: list[Tensor | None] = []
        like: list[Tensor] = []
        if work.jacobian is not None:
            values.append(work.jacobian)
            like.append(work.jacobian)
        heads = list(head_params) if work.mode == GradientMode.JACOBIAN else []
        values += [p.grad for p in heads]
        like += heads
        if not like:
            return
        reduced = self._all_reduce_mean(values, like)
        if work.jacobian is not None:
            work.jacobian, reduced = reduced[0], reduced[1:]
        for p, grad in zip(heads, reduced, strict=True):
            p.grad = grad

    def representation_gramian(self, rows: Tensor) -> Tensor:
        gramian = gramian_float64(rows).contiguous()
        self._dist().all_reduce(gramian)
        return gramian / self.world_size ** 2

    def average_gradients(self, params: Sequence[Tensor], gradient_mode: GradientMode) -> None:
        if gradient_mode == GradientMode.JACOBIAN:  # the direction came from the averaged J; heads were averaged before
            return
        params = list(params)
        for p, grad in zip(params, self._all_reduce_mean([p.grad for p in params], params), strict=True):
            p.grad = grad

    def _broadcast(self, tensors: Sequence[Tensor]) -> list[Tensor]:
        """Rank 0's values of ``tensors`` (one broadcast per dtype/device)."""
        groups: dict[tuple[torch.dtype, torch.device], list[int]] = {}
        for i, t in enumerate(tensors):
            groups.setdefault((t.dtype, t.device), []).append(i)
        out: list[Tensor] = list(tensors)
        for index in groups.values():
            buffer = torch.cat([tensors[i].detach().reshape(-1) for i in index])
            self._dist().broadcast(buffer, src=0)
            offset = 0
            for i in index:
                n = tensors[i].numel()
                out[i] = buffer[offset:offset + n].view_as(tensors[i])
                offset += n
        return out

    def sync_parameters(self, model: torch.nn.Module, when: str) -> None:
        params = [p for p in model.parameters()]
        buffers = [b for b in model.buffers() if b.numel()]
        reference = self._broadcast([*params, *buffers])
        deviation = torch.zeros((), dtype=torch.float64, device=self.device)
        scale = torch.ones((), dtype=torch.float64, device=self.device)
        for p, ref in zip(params, reference, strict=True):
            if p.numel():
                deviation = torch.maximum(deviation, (p.detach() - ref).abs().max().to(deviation))
                scale = torch.maximum(scale, ref.abs().max().to(scale))
        self._dist().all_reduce(deviation, op=self._dist().ReduceOp.MAX)
        drift = float(deviation) / float(scale)
        if drift > DRIFT_TOLERANCE:
            raise RanksDivergedError(
                f"the ranks' parameters differ from rank 0's by {drift:.3g} (relative) at {when}: something changed "
                "them with per-rank data (a callback or a method with its own update); train it in one process")
        if drift > 0:
            log.warning("ranks differ from rank 0 by %.3g (relative, float rounding) at %s; using rank 0's values",
                        drift, when)
        with torch.no_grad():
            for t, ref in zip([*params, *buffers], reference, strict=True):
                t.copy_(ref)

    def from_rank0(self, compute: Callable[[], T]) -> T:
        payload: list[Any] = [None]
        failure: BaseException | None = None
        if self.rank == 0:
            try:
                payload[0] = ("ok", compute())
            except BaseException as exc:  # every rank must leave the broadcast, then all raise
                failure = exc
                payload[0] = ("error", type(exc) if isinstance(exc, MtlflowError) else None,
                              f"{type(exc).__name__}: {exc}" if not isinstance(exc, MtlflowError) else str(exc))
        self._dist().broadcast_object_list(payload, src=0)
        if failure is not None:
            raise failure
        if payload[0][0] == "error":
            _, cls, message = payload[0]
            if cls is None:
                raise RanksDivergedError(f"rank 0 failed: {message}")
            error = cls.__new__(cls)
            Exception.__init__(error, message)
            raise error
        return payload[0][1]

    def load(self, path: Path, map_location: torch.device) -> dict[str, Any]:
        # broadcast on the CPU: a pickled CUDA tensor would arrive on rank 0's GPU
        return _place(self.from_rank0(lambda: torch.load(path, map_location="cpu", weights_only=False)), map_location)

    def barrier(self) -> None:
        if self.backend == "nccl":
            self._dist().barrier(device_ids=[self.local_rank])
        else:
            self._dist().barrier()


def _place(checkpoint: dict[str, Any], device: torch.device) -> dict[str, Any]:
    """A checkpoint loaded on the CPU moved like ``torch.load(map_location=device)`` would, except its RNG
    states: ``torch.set_rng_state`` accepts only a CPU tensor."""
    return {key: value if key == "rng" else _to_device(value, device) for key, value in checkpoint.items()}


def _to_device(value: Any, device: torch.device) -> Any:
    """``value`` with every tensor inside dicts, lists and tuples moved to ``device``."""
    if isinstance(value, Tensor):
        return value.to(device)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    if isinstance(value, tuple) and hasattr(value, "_fields"):  # a named tuple
        return type(value)(*(_to_device(v, device) for v in value))
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    return value


def from_env(device: torch.device) -> Distributed:
    """The topology of this process: :class:`TorchrunGroup` under torchrun (the default process group is
    created once, NCCL for a CUDA ``device``, else Gloo), else a single process."""
    topology = TorchrunEnv.read()
    if topology.world_size == 1:
        return Distributed()

    if device.type == "cuda":
        if device.index is not None and device.index != topology.local_rank:
            raise InvalidParameterError(f"under torchrun each process uses the GPU of its LOCAL_RANK "
                                        f"({topology.local_rank}), not {device}; use --device cuda or auto")
        if topology.local_rank >= torch.cuda.device_count():
            raise InvalidParameterError(f"LOCAL_RANK {topology.local_rank} but only {torch.cuda.device_count()} GPU(s) "
                                        "are visible; start at most that many processes per node (--nproc_per_node)")
        torch.cuda.set_device(topology.local_rank)
    elif device.type != "cpu":
        raise InvalidParameterError(f"torchrun training supports cpu and cuda devices, not {device.type!r}")
    backend = "nccl" if device.type == "cuda" else "gloo"
    if not dist.is_initialized():
        dist.init_process_group(backend, timeout=COLLECTIVE_TIMEOUT)
        atexit.register(_destroy_process_group)
    elif dist.get_backend() != backend:
        raise InvalidParameterError(f"the process group uses {dist.get_backend()} but training on {device.type} "
                                    f"needs {backend}; train every run of this process on the same device type")
    return TorchrunGroup(topology, backend, device)


def _destroy_process_group() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def torchrun_command(nproc: int, argv: Sequence[str]) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc_per_node N -m mtlflow ARGV`` with the
    ``--nproc`` option removed from ``argv`` (the command ``mtlflow train --nproc N`` runs)."""
    if nproc < 1:
        raise InvalidParameterError(f"--nproc must be >= 1, got {nproc}")
    kept: list[str] = []
    skip = False
    for arg in argv:
        if skip:
            skip = False
        elif arg == "--nproc":
            skip = True
        elif not arg.startswith("--nproc="):
            kept.append(arg)
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", str(nproc),
            "-m", "mtlflow", *kept]
