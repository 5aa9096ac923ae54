"""torchrun data parallelism: 2 CPU processes (Gloo) with batch B reach the parameters of 1 process with
batch 2B (up to float rounding) for a loss-weighting method (LS), a gradient method (FairGrad: the
per-task Jacobian is averaged across ranks before combine) and a stateful one (FAMO: weights from the
global losses, logits from the re-evaluated global losses); resume, rank-0-only outputs and refusals
included.

The file is also the torchrun worker: ``torchrun --nproc_per_node 2 tests/integration/test_ddp.py DATA OUT`` runs
:func:`worker` in each process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mtlflow import jobs
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.outputs import LOCK_NAME
from mtlflow.engine import distributed

PER_RANK_BATCH = 16
#: SGD: its step is linear in the gradient, so the comparison sees the gradients' float rounding only
#: (Adam divides by sqrt(v) and magnifies the rounding of near-zero gradients up to the learning rate)
RUN = {"epochs": 1, "max_steps_per_epoch": 3, "optimizer": "sgd", "lr": 0.05, "seed": 3, "device": "cpu",
       "progress": False}
#: float rounding of a mean of 2 batch means vs one mean of 2B samples, accumulated over a few steps
ATOL = 1e-5


def worker(data: Path, out: Path) -> None:
    """Each rank: LS and FAMO for one epoch, FairGrad through the CLI, LS resumed to a second epoch, and
    the refusals."""
    import contextlib
    import io

    from mtlflow import cli

    for method in ("ls", "famo"):
        jobs.train(data, out / method, method=method, batch_size=PER_RANK_BATCH, **RUN)
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        code = cli.main(["train", "--data", str(data), "--out", str(out / "fairgrad"), "--method", "fairgrad",
                         "--hp", "alpha=2.0", "--batch-size", str(PER_RANK_BATCH), "--epochs", "1",
                         "--max-steps-per-epoch", "3", "--optimizer", "sgd", "--lr", "0.05", "--seed", "3",
                         "--device", "cpu", "--no-progress"])
    jobs.train(data, out / "ls", method="ls", batch_size=PER_RANK_BATCH, resume=True, **{**RUN, "epochs": 2})
    refusals = {}
    for method, options in (("moml", {}), ("fairgrad", {"grad_backend": "autogram"})):
        try:
            jobs.train(data, out / f"refused-{method}", method=method, batch_size=PER_RANK_BATCH, **{**RUN, **options})
        except InvalidParameterError as exc:
            refusals[method] = str(exc)
    rank = int(os.environ["RANK"])
    (out / f"rank-{rank}.json").write_text(json.dumps({"refusals": refusals, "cli_exit": code,
                                                       "cli_stdout": printed.getvalue()}))


def _env() -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}


def _state(run: Path) -> dict[str, torch.Tensor]:
    return torch.load(run / "model.pt", weights_only=False)["state_dict"]


def _max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


@pytest.fixture(scope="module")
def ddp_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    """(data, single-process runs, torchrun runs): torchrun is started first and works while the
    single-process references train in this process."""
    root = tmp_path_factory.mktemp("ddp")
    data = root / "data"
    jobs.prepare("multimnist", data, n_train=96, n_val=16, n_test=16)
    ddp, single = root / "ddp", root / "single"
    workers = subprocess.Popen([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                                str(Path(__file__).resolve()), str(data), str(ddp)],
                               env=_env(), cwd=Path(__file__).resolve().parents[2], stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True)
    try:
        for method, hparams, epochs in (("ls", None, 2), ("famo", None, 1), ("fairgrad", {"alpha": 2.0}, 1)):
            jobs.train(data, single / method, method=method, hparams=hparams, batch_size=2 * PER_RANK_BATCH,
                       **{**RUN, "epochs": epochs})
        jobs.train(data, single / "ls-per-rank-batch", method="ls", batch_size=PER_RANK_BATCH, **RUN)
        log, _ = workers.communicate(timeout=300)
    finally:
        if workers.poll() is None:
            workers.kill()
    assert workers.returncode == 0, log[-4000:]
    return data, single, ddp


@pytest.mark.parametrize("method", ["ls", "famo", "fairgrad"])
def test_two_processes_match_one_process_on_the_global_batch(ddp_runs, method):
    _, single, ddp = ddp_runs
    assert _max_difference(_state(ddp / method), _state(single / method)) < ATOL
    run = json.loads((ddp / method / "run.json").read_text())
    assert run["status"] == "completed" and run["distributed"] == {"world_size": 2, "backend": "gloo"}
    a = json.loads((ddp / method / "metrics.json").read_text())
    b = json.loads((single / method / "metrics.json").read_text())
    assert [e["steps"] for e in a["epochs"]] == [e["steps"] for e in b["epochs"]]
    for task, values in b["final"]["test"].items():
        assert a["final"]["test"][task]["loss"] == pytest.approx(values["loss"], abs=1e-4)
    if method == "famo":  # the task-weight logits follow the global losses
        logits = [torch.load(root / "famo" / "checkpoint.pt", weights_only=False)["method"]["logits"]
                  for root in (ddp, single)]
        # FAMO's own Adam on ξ magnifies the losses' rounding (its gradient is z(1-z)(δ1-δ2), a cancelling
        # difference) to ~1e-5; every step moves ξ by about w_lr = 2.5e-2
        assert torch.allclose(logits[0], logits[1], atol=1e-4) and logits[1].abs().max() > 1e-2


def test_the_comparison_can_fail(ddp_runs):
    """One process on only a rank's share of the batch ends far outside the tolerance."""
    _, single, _ = ddp_runs
    assert _max_difference(_state(single / "ls-per-rank-batch"), _state(single / "ls")) > 50 * ATOL


def test_resume_continues_a_two_process_run(ddp_runs):
    """LS was trained one epoch with torchrun, then resumed to two: same as two epochs in one process."""
    _, single, ddp = ddp_runs
    assert _max_difference(_state(ddp / "ls"), _state(single / "ls")) < ATOL
    assert len(json.loads((ddp / "ls" / "metrics.json").read_text())["epochs"]) == 2
    assert torch.load(ddp / "ls" / "checkpoint.pt", weights_only=False)["world_size"] == 2


def test_resuming_with_another_process_count_is_refused(ddp_runs):
    data, _, ddp = ddp_runs
    with pytest.raises(InvalidParameterError, match="written by 2 process.*torchrun --nproc_per_node 2"):
        jobs.train(data, ddp / "famo", method="famo", batch_size=2 * PER_RANK_BATCH, resume=True, **RUN)


def test_unsupported_setups_fail_on_every_rank_with_one_clear_line(ddp_runs):
    _, _, ddp = ddp_runs
    for rank in (0, 1):
        refusals = json.loads((ddp / f"rank-{rank}.json").read_text())["refusals"]
        assert "custom_step" in refusals["moml"] and "one process" in refusals["moml"]
        assert "autogram" in refusals["fairgrad"] and "--grad-backend loop" in refusals["fairgrad"]
        assert all("\n" not in message for message in refusals.values())


def test_cli_under_torchrun_prints_once_and_writes_one_run(ddp_runs):
    _, _, ddp = ddp_runs
    ranks = [json.loads((ddp / f"rank-{rank}.json").read_text()) for rank in (0, 1)]
    assert [r["cli_exit"] for r in ranks] == [0, 0]
    assert json.loads(ranks[0]["cli_stdout"])["run_dir"] == str(ddp / "fairgrad") and ranks[1]["cli_stdout"] == ""
    names = {p.name for p in (ddp / "fairgrad").iterdir()}
    assert {"checkpoint.pt", "metrics.json", "model.pt", "run.json"} <= names
    # the run directory's lock file stays (the kernel releases its flock when the writer exits)
    assert not [n for n in names if n.startswith(".") and n != LOCK_NAME], "no half-written temporary file is left behind"


def test_rank_shards_of_a_global_batch_are_the_single_process_batch():
    """Batch j of every rank together is batch j of the single-process loader (n not a multiple of R·B)."""
    from torch.utils.data import DataLoader, TensorDataset

    from mtlflow.core.seeding import epoch_generator

    n, ranks, batch, seed, epoch = 37, 2, 4, 5, 3
    dataset = TensorDataset(torch.arange(n))
    single = [b[0].tolist() for b in DataLoader(dataset, batch_size=ranks * batch, shuffle=True,
                                                generator=epoch_generator(seed, epoch))]
    per_rank = []
    for rank in range(ranks):
        sampler = distributed.EpochShardSampler(dataset, ranks, rank, seed)
        sampler.set_epoch(epoch)
        order = list(sampler)  # the dataset holds its own indices
        per_rank.append([order[i:i + batch] for i in range(0, len(order), batch)])
    assert len(per_rank[0]) == len(per_rank[1]) == len(single)
    for j, expected in enumerate(single[:-1]):
        assert sorted(per_rank[0][j] + per_rank[1][j]) == sorted(expected)
    # the last global batch is padded with the epoch's first sample, as DistributedSampler does
    assert sorted(per_rank[0][-1] + per_rank[1][-1]) == sorted(single[-1] + [single[0][0]])


def test_torchrun_environment_and_launch_command():
    assert distributed.TorchrunEnv.read({}) == distributed.TorchrunEnv(0, 1, 0)
    assert distributed.TorchrunEnv.read({"RANK": "1", "WORLD_SIZE": "2", "LOCAL_RANK": "1"}).rank == 1
    with pytest.raises(InvalidParameterError, match="RANK is not set"):
        distributed.TorchrunEnv.read({"WORLD_SIZE": "2"})
    with pytest.raises(InvalidParameterError, match="not a valid torchrun topology"):
        distributed.TorchrunEnv.read({"RANK": "2", "WORLD_SIZE": "2"})
    command = distributed.torchrun_command(2, ["train", "--nproc", "2", "--data", "d", "--nproc=2", "--out", "o"])
    assert command[1:] == ["-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
                           "-m", "mtlflow", "train", "--data", "d", "--out", "o"]
    with pytest.raises(InvalidParameterError, match="--nproc must be >= 1"):
        distributed.torchrun_command(0, ["train"])


def test_what_cannot_be_synchronised_is_named_with_its_fix():
    from mtlflow import methods

    assert distributed.unsupported_reason(methods.build("famo", 2), "losses") is None
    assert distributed.unsupported_reason(methods.build("mgdaub", 2), "representation") is None
    assert "grad_wrt=parameters" in distributed.unsupported_reason(methods.build("imtl", 2), "representation")
    assert "--teleport cost" in distributed.unsupported_reason(methods.build("fairgrad", 2), "jacobian", "cost")


def test_train_nproc_relaunches_itself_under_torchrun(monkeypatch, tmp_path):
    """``mtlflow train --nproc 2`` runs the torchrun command (launching it for real is what the
    torchrun worker above does with the same module entry point)."""
    from mtlflow import cli
    from mtlflow.cli import runs

    launched = []
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.setattr(runs.subprocess, "run", lambda command: launched.append(command) or
                        subprocess.CompletedProcess(command, 7))
    argv = ["train", "--benchmark", "toy", "--nproc", "2", "--out", str(tmp_path / "run"), "--epochs", "1"]
    assert cli.main(argv) == 7
    assert launched == [distributed.torchrun_command(2, argv)]
    assert not (tmp_path / "run").exists()


if __name__ == "__main__":  # one torchrun worker
    worker(Path(sys.argv[1]), Path(sys.argv[2]))
