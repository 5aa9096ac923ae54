"""PaLoRA end to end on real (tiny) MultiMNIST: Algorithm 1's step, the recorded front, evaluate,
aggregate, Pareto expansion, resume and the CLI."""

from __future__ import annotations

import json

import pytest
import torch

from conftest import TINY_RUN
from mtlflow import cli, jobs, methods
from mtlflow.config.run import RunConfig
from mtlflow.core.callbacks import Callback
from mtlflow.core.errors import DataError, InvalidParameterError, NonFiniteLossError
from mtlflow.engine.rundir import load_model
from mtlflow.engine.trainer import Trainer
from mtlflow.metrics.scoring import hypervolume

#: a 3-point evaluation grid and no per-epoch front keep the plumbing tests fast
FAST = {"eval_subdivisions": 2, "front_every": 0}


def _close(a: dict, b: dict) -> bool:
    """Nested {task: {metric: value}} dictionaries equal up to float rounding."""
    return a.keys() == b.keys() and all(a[t] == pytest.approx(b[t]) for t in a)


@pytest.fixture(scope="module")
def ls_run(multimnist_small, tmp_path_factory):
    """A tiny linear-scalarisation run: the single-point method beside the front, and the start of expansion."""
    out = tmp_path_factory.mktemp("palora-ls") / "ls"
    jobs.train(multimnist_small, out, method="ls", epochs=1, **TINY_RUN)
    return out


def test_step_minimises_the_sum_over_rays_of_the_preference_weighted_losses(multimnist_small, tmp_path):
    """Algorithm 1: for every ray λ_m the network is W + (α/r) Σ λ_t A_t B_t and its loss λ_mᵀ L; one
    update follows the gradient of Σ_m λ_mᵀ L_m w.r.t. base weights, adapters and heads."""
    bench, data = jobs.load_prepared(multimnist_small)
    config = RunConfig(method="palora", hparams={"rays": 3, "alpha": 2.0, **FAST}, epochs=1, batch_size=32,
                         optimizer="sgd", lr=1.0)
    trainer = Trainer(bench, data, config, tmp_path / "run", progress=False)
    method = trainer.method
    method.total_steps = 11
    trainer.global_step = 5  # τ = 0.5
    with torch.no_grad():  # non-zero adapters, so that λ changes the network
        for p in method.adapters.parameters():
            p.normal_(0, 0.1)
    batch = next(iter(trainer._loader(1)))
    # by hand: at τ = 0.5 each ray is halfway from the centre (½, ½) to its grid point (0, 1), (½, ½), (1, 0);
    # rays the schedule has moved, so a step that used the grid (or the centre) would not match
    rays = torch.tensor([[0.25, 0.75], [0.5, 0.5], [0.75, 0.25]], dtype=torch.float64)
    assert torch.allclose(method.schedule.rays(method.progress(trainer.global_step)), rays)
    params = [p for p in trainer.model.parameters() if p.requires_grad]
    total = 0.0
    for lam in rays:
        with method.adapters.preference(lam):
            losses, _ = trainer.forward_losses(batch)
        total = total + (lam.float() * losses).sum()
    expected = torch.autograd.grad(total, params)
    captured = {}
    trainer.optimizer.step = lambda: captured.update(grads=[p.grad.clone() for p in params])
    info = trainer.train_step(batch, 1)
    assert all(torch.allclose(g, e, atol=1e-5, rtol=1e-4) for g, e in zip(captured["grads"], expected, strict=True))
    assert torch.allclose(info["weights"], rays.mean(dim=0))
    assert any(p.grad.abs().sum() > 0 for p in method.adapters.parameters())
    assert torch.equal(method.adapters.state.value, method.adapters.centre)  # evaluation runs at the centre


def test_the_step_reports_the_mean_loss_over_its_rays_and_hands_it_to_the_step_rules(multimnist_small, tmp_path):
    """The step's losses are the mean of the rays' losses; the state the callbacks see carries them, the
    trainer's step, the epoch the step was called with and the batch."""

    class StepLog(Callback):
        def __init__(self) -> None:
            self.states: list = []

        def before_optimizer_step(self, trainer, state) -> None:
            self.states.append((state.epoch, state.step, state.batch, state.losses.clone()))

    log = StepLog()
    bench, data = jobs.load_prepared(multimnist_small)
    config = RunConfig(method="palora", hparams={"rays": 3, "alpha": 2.0, **FAST}, epochs=1, batch_size=32)
    trainer = Trainer(bench, data, config, tmp_path / "run", callbacks=[log], progress=False)
    method = trainer.method
    method.total_steps = 11
    trainer.global_step = 5
    with torch.no_grad():  # non-zero adapters: each ray's network, and so its losses, differ
        for p in method.adapters.parameters():
            p.normal_(0, 0.1)
    batch = next(iter(trainer._loader(1)))
    per_ray = []
    with torch.no_grad():
        for lam in method.schedule.rays(method.progress(5)):
            with method.adapters.preference(lam):
                per_ray.append(trainer.forward_losses(batch)[0])
    expected = torch.stack(per_ray).mean(dim=0)
    assert float((per_ray[0] - per_ray[2]).abs().min()) > 1e-4
    info = trainer.train_step(batch, 3)
    torch.testing.assert_close(info["losses"], expected)
    ((epoch, step, seen_batch, seen_losses),) = log.states
    assert (epoch, step, seen_batch is batch) == (3, 5, True)
    torch.testing.assert_close(seen_losses, expected)


def test_a_non_finite_loss_names_its_preference_epoch_and_step(multimnist_small, tmp_path):
    bench, data = jobs.load_prepared(multimnist_small)
    config = RunConfig(method="palora", hparams={"rays": 3, **FAST}, epochs=1, batch_size=8)
    trainer = Trainer(bench, data, config, tmp_path / "run", progress=False)
    trainer.method.total_steps = 10
    trainer.global_step = 5  # τ = 5/9: the first ray is 5/9 of the way from (½, ½) to (0, 1)
    images, targets = next(iter(trainer._loader(1)))
    images = images.clone()
    images[0] = float("nan")
    with pytest.raises(NonFiniteLossError) as error:
        trainer.train_step([images, targets], 2)
    assert str(error.value) == ("palora: non-finite loss [nan, nan] for preference [0.2222, 0.7778] at epoch 2, "
                                "step 5; lower --lr or alpha, or set --clip-grad-norm")


def test_palora_records_its_front_and_every_job_reads_it(multimnist_small, ls_run, tmp_path):
    run = tmp_path / "palora"
    result = jobs.train(multimnist_small, run, method="palora", epochs=1, **TINY_RUN)
    metrics = json.loads((run / "metrics.json").read_text())
    for record in metrics["epochs"]:  # the paper's 11-point grid after every epoch (front_every = 1)
        front = record["preference_front"]
        assert len(front["preferences"]) == 11 and front["preferences"][3] == pytest.approx([0.3, 0.7])
        assert front["reference_point"] == [1.0, 1.0]
        for split in ("val", "test"):
            values = front["splits"][split]
            assert len(values["metrics"]) == 11 and 1 <= values["non_dominated"] <= 11
            assert values["hypervolume"] == pytest.approx(hypervolume(values["errors"], [1.0, 1.0]))
    selected = metrics["preference_front"]
    assert selected["selection"] == {"rule": "last", "epochs": [1]}
    assert selected["splits"]["test"]["errors"] == metrics["epochs"][-1]["preference_front"]["splits"]["test"]["errors"]
    assert result["preference_front"] == selected
    assert (run / "pareto_front.png").read_bytes().startswith(b"\x89PNG")
    # the centre point of the grid is the run's single-point result
    assert selected["splits"]["test"]["metrics"][5] == metrics["final"]["test"]

    # model.pt: the merged centre network for every consumer, and the adapters for the front
    _, plain, blob = load_model(run / "model.pt")
    assert "palora" in blob and not any("parametrizations" in k for k in plain.state_dict())
    assert blob["palora"]["merged_preference"] == [0.5, 0.5]
    assert blob["palora"]["hparams"] == methods.build("palora", 2).hp        # every hyper-parameter, defaults too
    evaluation = jobs.evaluate(run, multimnist_small)
    assert _close(evaluation["metrics"], metrics["final"]["test"])
    assert all(_close(a, b) for a, b in zip(evaluation["preference_front"]["splits"]["test"]["metrics"],
                                            selected["splits"]["test"]["metrics"], strict=True))
    # one preference exported as a plain network evaluates like that point of the front
    merged = tmp_path / "merged"
    assert cli.main(["palora", "merge", str(run), "--preference", "1,0", "--out", str(merged / "model.pt")]) == 0
    vertex = jobs.evaluate(merged, multimnist_small)
    assert "preference_front" not in vertex
    assert _close(vertex["metrics"], selected["splits"]["test"]["metrics"][10])

    summary = jobs.aggregate([run, ls_run], tmp_path / "report")
    assert summary.preference_front_methods == ("palora",)
    front = summary.methods["palora"].preference_front
    assert [list(e) for e in front.errors] == selected["splits"]["test"]["errors"]
    assert list(front.hypervolume_per_seed) == [pytest.approx(selected["splits"]["test"]["hypervolume"])]
    assert summary.methods["ls"].preference_front is None
    html = (tmp_path / "report" / "report.html").read_text()
    assert "Learned Pareto fronts" in html and "palora: front on the preference grid" in html
    assert "| 0.30, 0.70 |" in (tmp_path / "report" / "results.md").read_text()


def test_pareto_expansion_trains_only_the_adapters(multimnist_small, ls_run, tmp_path):
    ls = ls_run
    start = torch.load(ls / "model.pt", weights_only=False)["state_dict"]
    run = tmp_path / "expand"
    jobs.train(multimnist_small, run, method="palora", epochs=1, hparams={"init_from": str(ls / "model.pt"), **FAST},
               **TINY_RUN)
    adapted = torch.load(run / "model.pt", weights_only=False)["palora"]["state_dict"]
    for key, value in start.items():  # base weights and heads are the LS model's
        name = key.replace(".weight", ".parametrizations.weight.original") if key not in adapted else key
        assert torch.equal(adapted[name], value), key
    assert any(adapted[k].abs().sum() > 0 for k in adapted if k.endswith(".A"))  # the adapters moved
    with pytest.raises(InvalidParameterError, match="is a PaLoRA model"):
        jobs.train(multimnist_small, tmp_path / "x", method="palora", epochs=1,
                   hparams={"init_from": str(run / "model.pt"), **FAST}, **TINY_RUN)
    with pytest.raises(DataError, match="not found"):
        jobs.train(multimnist_small, tmp_path / "y", method="palora", epochs=1,
                   hparams={"init_from": str(tmp_path / "none.pt"), **FAST}, **TINY_RUN)


def test_random_schedule_resumes_exactly(multimnist_small, tmp_path):
    hp = {"schedule": "dirichlet", "rays": 2, **FAST, "eval_subdivisions": 1}
    tiny = {**TINY_RUN, "max_steps_per_epoch": 1}
    full = jobs.train(multimnist_small, tmp_path / "full", method="palora", epochs=2, hparams=hp, **tiny)
    jobs.train(multimnist_small, tmp_path / "part", method="palora", epochs=1, hparams=hp, **tiny)
    resumed = jobs.train(multimnist_small, tmp_path / "part", method="palora", epochs=2, hparams=hp, resume=True,
                         **tiny)
    assert resumed["final"] == full["final"]
    assert resumed["preference_front"]["splits"] == full["preference_front"]["splits"]


def test_cli_trains_palora_and_lists_it(multimnist_small, tmp_path, capsys):
    """`mtlflow train --method palora` (in-process: the same parser and command, without a second
    interpreter's imports), `mtlflow methods`, a bad hyper-parameter and `mtlflow palora overhead`."""
    assert cli.main(["train", "--data", str(multimnist_small), "--method", "palora", "--hp", "rays=3",
                     "--hp", "eval_subdivisions=2", "--epochs", "1", "--batch-size", "64", "--max-steps-per-epoch",
                     "2", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    printed = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert printed["run_dir"] == str(tmp_path / "run") and set(printed["test"]) == {"left", "right"}
    assert len(json.loads((tmp_path / "run" / "metrics.json").read_text())["preference_front"]["preferences"]) == 3
    assert cli.main(["methods"]) == 0
    line = next(l for l in capsys.readouterr().out.splitlines() if l.startswith("palora "))
    assert "pareto-front" in line and "O(M)" in line
    # bad hyper-parameters: one line, exit 2, before any data work
    assert cli.main(["train", "--data", str(multimnist_small), "--method", "palora", "--hp", "rays=1",
                     "--out", str(tmp_path / "bad")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "at least 2 rays" in err[0] and not (tmp_path / "bad").exists()
    assert cli.main(["palora", "overhead", "--benchmark", "multimnist"]) == 0
    assert "1.96 %" in capsys.readouterr().out


def test_setup_builds_the_adapters_the_hyper_parameters_ask_for(multimnist_small, tmp_path):
    bench, data = jobs.load_prepared(multimnist_small)
    hparams = {"rank": 2, "alpha": 3.0, "layers": "all", "factorization": "kernel", **FAST}
    trainer = Trainer(bench, data, RunConfig(method="palora", hparams=hparams, epochs=1, batch_size=8),
                      tmp_path / "run", progress=False)
    spec = trainer.method.adapters.spec
    assert (spec.n_tasks, spec.rank, spec.alpha, spec.factorization) == (2, 2, 3.0, "kernel")
    assert trainer.method.frozen_base is False                     # no init_from: the whole network trains
    trunk_only = Trainer(bench, data, RunConfig(method="palora", hparams=FAST, epochs=1, batch_size=8),
                         tmp_path / "trunk", progress=False).method.adapters.spec
    assert len(spec.layers) > len(trunk_only.layers) and trunk_only.factorization == "matrix"


def test_setup_sizes_the_annealing_horizon_and_seeds_random_rays_from_the_run(multimnist_small, tmp_path):
    """τ runs over epochs x steps per epoch (here 3 x ⌈n_train / 8⌉); a Dirichlet schedule draws its rays from
    the run's seed: the same seed, the same rays; another seed, others."""
    bench, data = jobs.load_prepared(multimnist_small)

    def method(seed: int, name: str):
        config = RunConfig(method="palora", hparams={"schedule": "dirichlet", **FAST}, epochs=3, batch_size=8, seed=seed)
        return Trainer(bench, data, config, tmp_path / name, progress=False).method

    first, again, other = method(1, "a"), method(1, "b"), method(2, "c")
    assert first.total_steps == 3 * -(-len(data.splits["train"]) // 8)
    rays = [m.schedule.rays(0.0) for m in (first, again, other)]
    assert torch.equal(rays[0], rays[1]) and not torch.equal(rays[0], rays[2])
