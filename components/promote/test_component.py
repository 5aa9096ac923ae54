"""compare_to_champion and promote on real trained runs (the tiny_runs fixture) and a real model store:
the gate evaluates the candidate AND the champion on the candidate's test split and promotes only a
candidate better with confidence."""

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
from kfp import dsl

from mtlflow import jobs
from mtlflow.components.conftest import TINY, train_artifacts
from mtlflow.components.evaluate.component import evaluate
from mtlflow.components.prepare_data.component import prepare_data
from mtlflow.components.promote.component import compare_to_champion, promote
from mtlflow.components.train.component import train
from mtlflow.core.errors import DataError
from mtlflow.jobs.champion import evaluate_on
from mtlflow.metrics.evaluation import read_examples
from mtlflow.ops import model_store


def _evaluated(run, data, tmp_path, name):
    evaluation = dsl.Artifact(uri=str(tmp_path / f"{name}-evaluation.json"))
    evaluate.python_func(data=data, run=run, split="test", evaluation=evaluation,
                         metrics=dsl.Metrics(uri=str(tmp_path / f"{name}-metrics.json")),
                         confusion=dsl.ClassificationMetrics(uri=str(tmp_path / f"{name}-confusion.json")),
                         summary=dsl.Markdown(uri=str(tmp_path / f"{name}-evaluation.md")))
    return evaluation


def _gate(run, data, store, tmp_path, name, min_improvement=0.0):
    """compare_to_champion then, when it says so, promote; returns (decision record, version path)."""
    decision = dsl.Artifact(uri=str(tmp_path / f"{name}-decision.json"))
    metrics = dsl.Metrics(uri=str(tmp_path / f"{name}-gate-metrics.json"))
    better = compare_to_champion.python_func(run=run, data=data, model_store=str(store),
                                             min_improvement=min_improvement, decision=decision, metrics=metrics)
    record = json.loads(Path(decision.path).read_text())
    assert better is record["promote"] and decision.metadata["promote"] is better
    # the UI's promoted is the outcome: logged here only when the champion is kept, else by promote
    assert metrics.metadata.get("promoted") == (None if better else 0.0)
    path = ""
    if better:
        outcome = dsl.Metrics(uri=str(tmp_path / f"{name}-promote-metrics.json"))
        path = promote.python_func(run=run, evaluation=_evaluated(run, data, tmp_path, name), decision=decision,
                                   data=data, model_store=str(store), metrics=outcome)
        assert outcome.metadata["promoted"] == float(bool(path))
    return record, path


@pytest.fixture(scope="module")
def seed_runs(tiny_dataset, tmp_path_factory):
    """LS trained like tiny_runs' "ls" but with seeds 1-3: the same model up to the seed."""

    data, _ = tiny_dataset
    root = tmp_path_factory.mktemp("seed-runs")
    runs = {}
    for seed in (1, 2, 3):
        arts = train_artifacts(root, f"ls-seed{seed}")
        train.python_func(data=data, run_spec=json.dumps({"method": "ls", "seed": seed, "hparams": {}}), epochs=1,
                          train_options={"batch_size": 64}, **arts)
        runs[seed] = arts["run"]
    return runs


def test_first_model_is_promoted_then_other_seeds_of_it_are_not(tiny_runs, tiny_dataset, seed_runs, tmp_path):
    data, _ = tiny_dataset
    store = tmp_path / "store"
    first, path = _gate(tiny_runs["ls"]["run"], data, store, tmp_path, "ls")
    assert first["promote"] and first["champion"] is None and first["gate"] is None
    champion = model_store.read_champion(store, "multimnist")
    assert champion["path"] == path and champion["method"] == "ls" and champion["previous"] is None
    # the decision record is stored with the champion, settled with the outcome decided under the lock
    settled = {**first, "promote": True, "promoted": True, "outcome": f"promoted as {champion['version']}",
               "version": champion["version"], "settled_unix": champion["decision"]["settled_unix"]}
    assert champion["decision"] == settled
    assert champion["data"]["content_hash"] == data.metadata["content_hash"]
    assert {p.name for p in Path(path).iterdir()} == {"model.pt", "run.json", "metrics.json", "evaluation.json",
                                                      "metadata.json", model_store.SEEN_ROWS}
    assert json.loads((Path(path) / "metadata.json").read_text())["decision"] == settled

    # the same model again: every paired difference is 0, so the interval is [0, 0] and nothing changes
    again, _ = _gate(tiny_runs["ls"]["run"], data, store, tmp_path, "ls-again")
    combined = again["gate"]["combined"]
    assert not again["promote"] and combined["mean_difference"] == combined["low"] == combined["high"] == 0.0
    assert combined["verdict"] == "indistinguishable at 95 %" and combined["n"] == TINY["n_test"]
    assert again["candidate"]["metrics"] == again["champion"]["metrics"]

    # the same model trained with other seeds, one after the other against the store: no flip-flop
    for seed, run in seed_runs.items():
        record, _ = _gate(run, data, store, tmp_path, f"seed{seed}")
        assert not record["promote"], record["reason"]
        assert record["champion"]["version"] == champion["version"]
        # the difference the gate saw is the difference of the two models' mean errors on the same split
        score_change = np.mean([record["candidate"]["paired_error"][t] - record["champion"]["paired_error"][t]
                                for t in record["tasks"]])
        assert record["gate"]["combined"]["mean_difference"] == pytest.approx(score_change, abs=1e-12)
    assert model_store.read_champion(store, "multimnist")["version"] == champion["version"]
    decisions = sorted((store / "multimnist" / "decisions").iterdir())
    assert len(decisions) == 2 + len(seed_runs)


@pytest.fixture(scope="module")
def trained_run(tiny_dataset, tmp_path_factory):
    """LS trained properly on the tiny data (4 epochs of batch 32: 28 steps, against tiny_runs' 4)."""

    data, _ = tiny_dataset
    arts = train_artifacts(tmp_path_factory.mktemp("trained"), "ls-trained")
    train.python_func(data=data, run_spec=json.dumps({"method": "ls", "seed": 0, "hparams": {}}), epochs=4,
                      train_options={"batch_size": 32}, **arts)
    return arts["run"]


def _damage(model_file: Path) -> None:
    """Zero every weight of a stored model: constant logits, the first class everywhere."""
    blob = torch.load(model_file, weights_only=False)
    blob["state_dict"] = {k: torch.zeros_like(v) for k, v in blob["state_dict"].items()}
    torch.save(blob, model_file)


def test_a_clearly_better_candidate_replaces_a_damaged_champion(tiny_runs, tiny_dataset, trained_run, tmp_path):
    data, _ = tiny_dataset
    store = tmp_path / "store"
    _, path = _gate(tiny_runs["mgda"]["run"], data, store, tmp_path, "mgda")
    _damage(Path(path) / "model.pt")
    record, new_path = _gate(trained_run, data, store, tmp_path, "ls")
    assert record["promote"], record["reason"]
    assert record["gate"]["combined"]["verdict"] == "better" and record["gate"]["combined"]["high"] < 0
    # the champion's numbers are those of the damaged model on the split, not the ones stored at promotion
    assert record["champion"]["error"] != pytest.approx(record["champion"]["stored_error"])
    champion = model_store.read_champion(store, "multimnist")
    assert champion["path"] == new_path and champion["method"] == "ls" and champion["previous"] == Path(path).name
    assert champion["decision"]["gate"] == record["gate"]

    # a min_improvement above the gain keeps the champion although the candidate is better with confidence
    _damage(Path(new_path) / "model.pt")
    gain = -record["gate"]["combined"]["mean_difference"]
    strict, _ = _gate(trained_run, data, store, tmp_path, "ls-strict", min_improvement=gain + 1e-9)
    assert strict["gate"]["combined"]["verdict"] == "better" and not strict["promote"]
    assert "below min_improvement" in strict["reason"] and strict["gate"]["failed"] == ["too small"]


def test_champion_of_an_older_data_version_is_re_evaluated_on_the_new_test_split(tiny_runs, tiny_dataset,
                                                                                tmp_path):
    old, _ = tiny_dataset
    store = tmp_path / "store"
    _, path = _gate(tiny_runs["ls"]["run"], old, store, tmp_path, "old")
    # the stored numbers are made up: a gate reading them would see a perfect champion
    record_file = store / "multimnist" / "champion.json"
    stored = json.loads(record_file.read_text())
    record_file.write_text(json.dumps({**stored, "error": 0.0, "metrics": {
        t: {**m, "acc": 1.0} for t, m in stored["metrics"].items()}}))

    new = dsl.Dataset(uri=str(tmp_path / "new-data"))
    prepare_data.python_func(benchmark="multimnist", data=new,
                             data_options={"n_train": 200, "n_val": 64, "n_test": 96, "seed": 1})
    assert new.metadata["content_hash"] != old.metadata["content_hash"]
    arts = train_artifacts(tmp_path, "new")
    train.python_func(data=new, run_spec=json.dumps({"method": "ls", "seed": 0, "hparams": {}}), epochs=1,
                      train_options={"batch_size": 64}, **arts)
    record, _ = _gate(arts["run"], new, store, tmp_path, "new")

    held = record["champion"]
    assert held["trained_on"] == old.metadata["content_hash"] != held["data_hash"] == new.metadata["content_hash"]
    assert record["gate"]["combined"]["n"] == 96  # the new test split, not the old one's 64 examples
    # the champion's metrics are a fresh evaluation of its model.pt on the new split
    fresh = evaluate_on(Path(path) / "model.pt", new.path)
    assert held["metrics"] == fresh["metrics"] and held["error"] != 0.0
    assert held["stored_error"] == 0.0


def test_promote_refuses_a_decision_made_against_another_champion(tiny_runs, tiny_dataset, tmp_path):
    data, _ = tiny_dataset
    store = tmp_path / "store"
    decision = dsl.Artifact(uri=str(tmp_path / "decision.json"))
    assert compare_to_champion.python_func(run=tiny_runs["ls"]["run"], data=data, model_store=str(store),
                                           min_improvement=0.0, decision=decision,
                                           metrics=dsl.Metrics(uri=str(tmp_path / "m.json")))
    # another run is promoted meanwhile (a concurrent retrain): the first decision no longer applies
    _, path = _gate(tiny_runs["mgda"]["run"], data, store, tmp_path, "mgda")
    run = tiny_runs["ls"]["run"]
    outcome = dsl.Metrics(uri=str(tmp_path / "outcome.json"))
    assert promote.python_func(run=run, evaluation=_evaluated(run, data, tmp_path, "ls"), decision=decision,
                               data=data, model_store=str(store), metrics=outcome) == ""
    champion = model_store.read_champion(store, "multimnist")
    assert champion["path"] == path and outcome.metadata["promoted"] == 0.0
    # its decision record says so: kept, because another retrain promoted first
    record = model_store.decisions_dir(store, "multimnist") / json.loads(Path(decision.path).read_text())["record"]
    settled = json.loads(record.read_text())
    assert settled["promoted"] is False and settled["gate_promote"] is True
    assert settled["outcome"].startswith(f"kept: another retrain promoted {champion['label']} "
                                         f"({champion['version']}) first")


def test_champion_with_other_tasks_is_not_comparable(tiny_runs, tiny_dataset, tmp_path):
    data, _ = tiny_dataset
    store = tmp_path / "store"
    _gate(tiny_runs["ref-left"]["run"], data, store, tmp_path, "left")
    with pytest.raises(DataError, match="another model store"):
        _gate(tiny_runs["ls"]["run"], data, store, tmp_path, "ls")
    shutil.rmtree(store)


def test_evaluate_keeps_per_example_errors_the_gate_pairs_on(tiny_runs, tiny_dataset, tmp_path):
    data, _ = tiny_dataset
    run = Path(tiny_runs["ls"]["run"].path)
    result = jobs.evaluate(run, data.path, out_file=tmp_path / "evaluation.json", per_example=True)
    assert result["per_example"] == {"file": "evaluation.per_example.npz", "examples": TINY["n_test"],
                                     "statistics": {"left": "acc_error", "right": "acc_error"}}
    kept = read_examples(tmp_path / result["per_example"]["file"])
    gate_view = evaluate_on(run / "model.pt", data.path)
    for task in ("left", "right"):
        np.testing.assert_array_equal(kept[task]["error"], gate_view["errors"][task])
        assert kept[task]["error"].mean() == pytest.approx(1 - result["metrics"][task]["acc"], abs=1e-12)
