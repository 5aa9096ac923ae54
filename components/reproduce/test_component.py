import json
from pathlib import Path

from kfp import dsl

from mtlflow.components.reproduce.component import combine_claim, plan_claim, reproduce_seed
from mtlflow.experiments import claims

CLAIM = "palora-overhead-nyuv2"  # a parameter count: one seed, no training, a second


def test_plan_measure_and_combine_write_the_result_file_and_its_metrics(tmp_path):
    seeds = plan_claim.python_func(claim=CLAIM, scale="ci", seeds=[], settings="{}")
    assert seeds == [0]
    part = dsl.Artifact(uri=str(tmp_path / "part"))
    seconds = reproduce_seed.python_func(claim=CLAIM, scale="ci", seed=0, part=part,
                                         work_root=str(tmp_path / "work"))
    assert seconds >= 0 and part.metadata == {"claim": CLAIM, "scale": "ci", "seed": 0}
    result = dsl.Artifact(uri=str(tmp_path / "result"))
    metrics = dsl.Metrics(uri=str(tmp_path / "metrics.json"))
    verdict = combine_claim.python_func(claim=CLAIM, scale="ci", seeds=seeds, parts=[part], result=result,
                                        metrics=metrics, command="mtlflow reproduce x --pipeline")
    record = json.loads(Path(result.path).read_text())
    # the count itself, as the claim's runner computes it in `mtlflow reproduce`
    expected = claims.reproduce(CLAIM, "ci", tmp_path / "cli", work_dir=tmp_path / "work", progress=False)
    assert record["values"] == expected["values"] and record["estimate"] == expected["estimate"]
    assert verdict == record["verdict"] == expected["verdict"] == result.metadata["verdict"]
    assert record["command"] == "mtlflow reproduce x --pipeline"
    assert metrics.metadata["mean"] == record["values"][0] and metrics.metadata["paper_value"] == 6.3
    assert metrics.metadata[f"verdict_{verdict.replace(' ', '_')}"] == 1.0
