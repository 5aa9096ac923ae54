"""Two retrains promoted at once against one model store, with the real lock (two threads, each with its own
lock file handle, so ``flock`` serialises them as it does two processes): one champion, and the loser's
outcome -- its decision record, its UI metrics, its Prometheus gauge and the pipeline's retrain.json -- says
kept, naming the winner."""

from __future__ import annotations

import json
import threading
from pathlib import Path
from types import SimpleNamespace

import pytest

from mtlflow import jobs
from mtlflow.jobs import pipeline_steps
from mtlflow.ops import model_store
from mtlflow.pipelines.runner import _collect_retrain
from prometheus_support import parse_samples, sample


@pytest.fixture(scope="module")
def two_runs(tmp_path_factory):
    """LS seeds 0 and 1 trained for a few steps on a tiny MultiMNIST, each with its evaluation file."""
    root = tmp_path_factory.mktemp("race")
    data = root / "data"
    jobs.prepare("multimnist", data, n_train=128, n_val=32, n_test=64)
    runs = []
    for seed in (0, 1):
        run = root / f"run{seed}"
        jobs.train(data, run, method="ls", seed=seed, epochs=1, batch_size=64, max_steps_per_epoch=2, progress=False)
        jobs.evaluate(run, data, out_file=root / f"evaluation{seed}.json")
        runs.append((run, root / f"evaluation{seed}.json"))
    return data, runs


def test_a_lost_race_is_reported_as_kept_everywhere(two_runs, tmp_path, pushgateway):
    data, runs = two_runs
    store = tmp_path / "store"
    decisions = []
    for i, (run, _) in enumerate(runs):  # both gates decide against the same (empty) store
        out = tmp_path / f"decision{i}.json"
        gated = pipeline_steps.compare_to_champion(str(run), str(data), str(store), 0.0, str(out))
        assert gated["promote"] and "promoted" not in gated["metrics"]  # pending: the promote step decides
        assert json.loads(out.read_text())["promoted"] is None
        decisions.append(out)

    barrier, outcomes = threading.Barrier(2), [None, None]

    def promote(i: int) -> None:
        run, evaluation = runs[i]
        barrier.wait()
        outcomes[i] = pipeline_steps.promote(str(run), str(evaluation), str(decisions[i]), {}, str(store),
                                             data=str(data), pushgateway=pushgateway.url, pipeline_name="retrain",
                                             run_name=f"retrain-{i}")

    threads = [threading.Thread(target=promote, args=(i,)) for i in (0, 1)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()

    assert sorted(o["promoted"] for o in outcomes) == [False, True]
    winner, loser = (0, 1) if outcomes[0]["promoted"] else (1, 0)
    champion = model_store.read_champion(store, "multimnist")
    assert champion["path"] == outcomes[winner]["path"] and outcomes[loser]["path"] == ""
    assert (Path(champion["path"]) / model_store.SEEN_ROWS).is_file()
    said = f"kept: another retrain promoted {champion['label']} ({champion['version']}) first"
    assert outcomes[loser]["outcome"].startswith(said)
    assert outcomes[winner]["metrics"]["promoted"] == 1.0 and outcomes[loser]["metrics"]["promoted"] == 0.0

    # the decision records under decisions/ are settled with the outcome decided under the lock
    records = {json.loads(d.read_text())["record"]: i for i, d in enumerate(decisions)}
    for path in (store / "multimnist" / "decisions").iterdir():
        settled, i = json.loads(path.read_text()), records[path.name]
        assert settled["gate_promote"] is True and settled["promote"] is settled["promoted"] is (i == winner)
        assert settled["outcome"] == (f"promoted as {champion['version']}" if i == winner else
                                      outcomes[loser]["outcome"])

    # Prometheus: the loser's gauge is 0, the winner's 1
    samples = parse_samples(pushgateway.metrics_text())
    for i in (0, 1):
        group = {"job": "mtlflow_retrain_gate", "pipeline": "retrain", "benchmark": "multimnist", "run": f"retrain-{i}"}
        assert sample(samples, "mtlflow_retrain_promoted", **group) == float(i == winner)

    # retrain.json reads the settled record, not the gate's verdict
    for i in (0, 1):
        task = tmp_path / f"kfp-run{i}" / "compare-to-champion"
        task.mkdir(parents=True)
        (task / "decision").write_text(decisions[i].read_text())
        written = _collect_retrain(task.parent, tmp_path / f"work{i}", SimpleNamespace(models=str(store)),
                                   "multimnist", {"status": {"state": "SUCCEEDED"}})
        result = json.loads(written.read_text())
        assert result["promoted"] is (i == winner) and result["champion"]["version"] == champion["version"]
        assert result["outcome"].startswith(said) if i == loser else result["outcome"].startswith("promoted as")
