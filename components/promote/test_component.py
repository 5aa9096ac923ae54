"""compare_to_champion and promote on real trained runs (the tiny_runs fixture) and a real model store."""

import json
from pathlib import Path

import pytest
from kfp import dsl

from mtlflow.components.evaluate.component import evaluate
from mtlflow.components.promote.component import compare_to_champion, promote
from mtlflow.ops import model_store


def _evaluated(tiny_runs, tiny_dataset, tmp_path, name):
    data, _ = tiny_dataset
    evaluation = dsl.Artifact(uri=str(tmp_path / f"{name}-evaluation.json"))
    evaluate.python_func(data=data, run=tiny_runs[name]["run"], split="test", evaluation=evaluation,
                         metrics=dsl.Metrics(uri=str(tmp_path / f"{name}-metrics.json")),
                         confusion=dsl.ClassificationMetrics(uri=str(tmp_path / f"{name}-confusion.json")),
                         summary=dsl.Markdown(uri=str(tmp_path / f"{name}-evaluation.md")))
    return tiny_runs[name]["run"], evaluation


def test_first_model_becomes_champion_then_only_a_better_one_replaces_it(tiny_runs, tiny_dataset, tmp_path):
    data, _ = tiny_dataset
    store = tmp_path / "store"
    scored = {name: _evaluated(tiny_runs, tiny_dataset, tmp_path, name) for name in ("ls", "mgda")}
    errors = {name: model_store.candidate(run.path, json.loads(Path(ev.path).read_text()))["error"]
              for name, (run, ev) in scored.items()}
    worse, better = sorted(errors, key=errors.get, reverse=True)
    # the tiny runs are seeded, so their scores are fixed; LS and MGDA differ on them
    assert errors[worse] > errors[better], errors

    run, ev = scored[worse]
    assert compare_to_champion.python_func(run=run, evaluation=ev, model_store=str(store), min_improvement=0.0)
    path = promote.python_func(run=run, evaluation=ev, data=data, model_store=str(store), min_improvement=0.0)
    champion = model_store.read_champion(store, "multimnist")
    assert champion["path"] == path and champion["method"] == worse and champion["previous"] is None
    first = champion["version"]
    assert champion["data"]["content_hash"] == data.metadata["content_hash"]
    assert champion["data"]["dvc_hash"] == data.metadata["dvc_hash"]
    assert {p.name for p in Path(path).iterdir()} == {"model.pt", "run.json", "metrics.json", "evaluation.json",
                                                      "metadata.json"}
    # the same model again is not better than itself
    assert not compare_to_champion.python_func(run=run, evaluation=ev, model_store=str(store), min_improvement=0.0)
    assert promote.python_func(run=run, evaluation=ev, data=data, model_store=str(store), min_improvement=0.0) == ""

    run, ev = scored[better]
    gain = errors[worse] - errors[better]
    assert not compare_to_champion.python_func(run=run, evaluation=ev, model_store=str(store),
                                               min_improvement=gain + 1e-9)
    assert compare_to_champion.python_func(run=run, evaluation=ev, model_store=str(store), min_improvement=0.0)
    path = promote.python_func(run=run, evaluation=ev, data=data, model_store=str(store), min_improvement=0.0)
    champion = model_store.read_champion(store, "multimnist")
    assert champion["method"] == better and champion["previous"] == first and champion["path"] == path
    assert len(list((store / "multimnist" / "versions").iterdir())) == 2


def test_champion_with_other_tasks_is_not_comparable(tiny_runs, tiny_dataset, tmp_path):
    from mtlflow.core.errors import DataError

    run, ev = _evaluated(tiny_runs, tiny_dataset, tmp_path, "ls")
    cand = model_store.candidate(run.path, json.loads(Path(ev.path).read_text()))
    with pytest.raises(DataError, match="another model store"):
        model_store.compare(cand, {**cand, "tasks": ["left"], "version": "v0"})
