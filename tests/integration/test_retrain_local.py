"""retrain end to end with kfp.local: prepare + version data, train, evaluate, compare with the model
store's champion on the new test split and promote through dsl.If; a second retrain of the same method
with another seed on the same store is kept (the gate's other cases are in
components/promote/test_component.py on real runs)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from mtlflow.pipelines import runner

TINY = {"data_options": {"n_train": 300, "n_val": 100, "n_test": 100}, "method": "fairgrad",
        "hparams": {"alpha": 2.0}, "epochs": 1, "train_options": {"batch_size": 100}}


@pytest.mark.slow
def test_retrain_promotes_the_first_model_then_keeps_it_against_another_seed(tmp_path):
    store_root = tmp_path / "shared-storage"
    result = json.loads(runner.run_local(TINY, workdir=tmp_path / "run", pipeline="retrain",
                                         storage_root=store_root).read_text())
    assert result["promoted"] is True and result["status"]["state"] == "SUCCEEDED"
    champion = result["champion"]
    assert champion["method"] == "fairgrad" and champion["label"] == "fairgrad(alpha=2.0)"
    assert champion["data"]["dvc_hash"].endswith(".dir") and champion["data"]["content_hash"] == champion["data_hash"]
    version = Path(champion["path"])
    assert version.parent.parent == store_root / "models" / "multimnist"
    assert {p.name for p in version.iterdir()} == {"model.pt", "run.json", "metrics.json", "evaluation.json",
                                                   "metadata.json", "seen_rows.npy"}
    assert result["outcome"] == f"promoted as {champion['version']}"
    stored = json.loads((version / "evaluation.json").read_text())
    assert stored["metrics"] == champion["metrics"] and stored["split"] == "test"
    assert 0.0 <= champion["error"] <= 1.0
    assert champion["decision"]["promote"] and champion["decision"]["champion"] is None

    again = json.loads(runner.run_local({**TINY, "seed": 1}, workdir=tmp_path / "again", pipeline="retrain",
                                        storage_root=store_root).read_text())
    assert again["promoted"] is False and again["status"]["state"] == "SUCCEEDED"
    assert again["outcome"].startswith("kept: ")
    assert again["champion"]["version"] == champion["version"]
    decisions = sorted((store_root / "models" / "multimnist" / "decisions").iterdir())
    assert len(decisions) == 2
    second = json.loads(decisions[-1].read_text())
    # the champion was evaluated by the gate on the same split as the candidate, not read from the store
    assert second["champion"]["version"] == champion["version"] and second["champion"]["split"] == "test"
    assert second["champion"]["data_hash"] == second["candidate"]["data_hash"] == second["data_hash"]
    # the same split settings: the new test split holds none of the champion's rows
    assert second["overlap"]["checked"] and second["overlap"]["rows"] == 0
    assert second["gate"]["combined"]["n"] == 100 and not second["promote"] and second["promoted"] is False
    assert second["gate"]["combined"]["verdict"] != "better", second["reason"]
