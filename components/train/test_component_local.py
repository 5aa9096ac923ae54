"""train under kfp.local's SubprocessRunner: kfp.local has no task cache, so the reuse of a finished training
across pipeline runs is the run key's on the checkpoint root, which two runs of the same pipeline check."""

import pytest
from kfp import dsl, local

from mtlflow.components.train.component import train
from mtlflow.components.train.test_component import FAST, SPEC

pytestmark = pytest.mark.integration


def test_a_second_identical_local_pipeline_run_reuses_the_finished_training(toy_dataset, tmp_path, capfd):
    data = toy_dataset
    root = tmp_path / "checkpoints"

    @dsl.pipeline(name="train-twice")
    def train_once(checkpoint_root: str):
        imported = dsl.importer(artifact_uri=data.uri, artifact_class=dsl.Dataset, metadata=dict(data.metadata))
        train(data=imported.output, run_spec=SPEC, epochs=1, train_options=FAST, checkpoint_root=checkpoint_root)

    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "artifacts"),
               raise_on_error=True)
    train_once(checkpoint_root=str(root))
    (run_dir,) = root.iterdir()
    trained = {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()}
    assert "a finished run of the same inputs, reused" not in capfd.readouterr().out
    train_once(checkpoint_root=str(root))
    assert [p.name for p in root.iterdir()] == [run_dir.name]
    assert {p.name: p.stat().st_mtime_ns for p in run_dir.iterdir()} == trained  # not trained, not rewritten
    assert "a finished run of the same inputs, reused" in capfd.readouterr().out
    runs = sorted((tmp_path / "artifacts").rglob("train/run"))
    assert len(runs) == 2 and (runs[0] / "metrics.json").read_text() == (runs[1] / "metrics.json").read_text()
