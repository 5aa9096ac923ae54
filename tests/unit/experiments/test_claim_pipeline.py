"""A claim seed by seed (`mtlflow.experiments.claim_pipeline`, the `reproduce` pipeline's steps): the same result
record as `mtlflow reproduce`, whatever order the seeds' artifacts come in."""

from __future__ import annotations

import pytest

from mtlflow.core.errors import InvalidParameterError
from mtlflow.experiments import claim_pipeline, claims
from mtlflow.metrics.intervals import mean_interval

pytestmark = pytest.mark.usefixtures("one_torch_thread")

#: ASMG's synthetic table at a size that runs in about a second (ci settings: dim, sample_sizes, iterations); its
#: values differ between the seeds (1/3 and 0), so a record in the wrong seed order differs too
TINY = {"dim": 5, "sample_sizes": [10], "iterations": 200}
SEEDS = [1, 2]
#: what differs between two runs of the same claim: when and how fast they ran, and the command line
TIMING = {"date", "seconds", "cpu_seconds", "load_average", "hardware", "command"}


def _without_timing(record):
    out = {k: v for k, v in record.items() if k not in TIMING}
    out["details"] = {"cells": [{k: v for k, v in c.items() if k != "seconds"} for c in record["details"]["cells"]]}
    return out


def _asmg_share(seed: int) -> float:
    """The claim's value of one seed computed here from the experiment itself: the share of (problem, N) cells
    whose final ℰ curve reaches the target."""
    from mtlflow.benchmarks.asmg_synthetic import PROBLEMS
    from mtlflow.experiments.asmg_synthetic import METHODS, run_one

    config = {**claims.get("asmg-synthetic").scales["ci"].config, **TINY}
    hits = 0
    for problem in PROBLEMS:
        for n in config["sample_sizes"]:
            run = run_one(problem, n, seed, config["dim"], config["iterations"], 0.1, "normalized", METHODS["asmg"],
                          25, 1e-6)
            hits += any(error <= config["target"] for _, error in run["curve"])
    return hits / (len(PROBLEMS) * len(config["sample_sizes"]))


def test_seeds_measured_apart_and_combined_give_what_reproduce_writes(tmp_path):
    record = claims.reproduce("asmg-synthetic", "ci", tmp_path / "cli", seeds=SEEDS, config_override=TINY,
                              work_dir=tmp_path / "work", progress=False)
    assert record["values"][0] == _asmg_share(1) and len(set(record["values"])) == 2

    paths = []
    for seed in SEEDS:
        path = tmp_path / "parts" / f"{seed}.json"
        path.parent.mkdir(exist_ok=True)
        claim_pipeline.measure(path, "asmg-synthetic", "ci", seed, settings=TINY, work_root=tmp_path / "work2")
        paths.append(path)
    # the loop's outputs in another order than the plan's: the record follows the plan
    combined = claim_pipeline.combine(list(reversed(paths)), tmp_path / "result.json", "asmg-synthetic", "ci",
                                      claim_pipeline.plan("asmg-synthetic", "ci", SEEDS, TINY), settings=TINY)
    assert _without_timing(combined) == _without_timing(record)
    assert (tmp_path / "result.json").is_file()

    metrics = claim_pipeline.metrics(combined)
    assert (metrics["mean"], metrics["n"]) == (record["estimate"]["mean"], 2.0)
    indicators = {name: metrics[name] for name in claim_pipeline.VERDICT_METRICS.values()}
    assert sum(indicators.values()) == 1.0
    assert indicators[claim_pipeline.VERDICT_METRICS[record["verdict"]]] == 1.0


def test_the_plan_is_the_scale_seeds_or_the_given_ones_and_one_seed_for_a_count():
    assert claim_pipeline.plan("asmg-synthetic", "ci") == list(claims.get("asmg-synthetic").scales["ci"].seeds)
    assert claim_pipeline.plan("asmg-synthetic", "paper", [4, 7]) == [4, 7]
    assert claim_pipeline.plan("palora-overhead-nyuv2", "ci", [0, 1, 2]) == [0]
    for args, message in ((("nope", "ci"), "unknown claim 'nope'"), (("asmg-synthetic", "huge"), "--scale"),
                          (("asmg-synthetic", "ci", [], {"dimm": 3}), "--set dimm")):
        with pytest.raises(InvalidParameterError, match=message):
            claim_pipeline.plan(*args)


def test_every_registered_claim_can_run_seed_by_seed():
    for claim in claims.CLAIMS.values():
        assert isinstance(claim.runner, claims.SeedwiseRunner), claim.key


def test_a_registered_runner_is_measured_seed_by_seed_and_judged_on_its_values(tmp_path, monkeypatch):
    measured_seeds = []

    def measure(config, seed, ctx):
        measured_seeds.append(seed)
        return {"value": float(config["x"] + seed)}

    def combine(config, parts, ctx):
        return {"values": [p["value"] for p in parts], "details": {"parts": len(parts)}}

    claim = claims.Claim(key="joint", paper="P", source="T1", statement="s", paper_text="≥ 1", paper_value=1.0,
                         metric="m", rule="at_least", lower_is_better=False,
                         runner=claims.SeedwiseRunner(measure, combine),
                         scales={"ci": claims.Scale("tiny", {"x": 1.0})})
    monkeypatch.setitem(claims.CLAIMS, "joint", claim)
    assert claim_pipeline.plan("joint", "ci") == [0, 1, 2]
    record = claims.reproduce("joint", "ci", tmp_path, work_dir=tmp_path / "work", progress=False)
    assert measured_seeds == [0, 1, 2] and record["details"] == {"parts": 3}
    # the whole 95 % interval of the values (x + seed) is at or above the bound 1.0: reproduced
    assert mean_interval([1.0, 2.0, 3.0]).low >= 1.0
    assert record["values"] == [1.0, 2.0, 3.0] and record["verdict"] == claims.REPRODUCED


def test_combine_refuses_seeds_that_were_not_planned_and_parts_of_another_claim(tmp_path):
    part = tmp_path / "0.json"
    claim_pipeline.measure(part, "asmg-synthetic", "ci", 0, settings=TINY, work_root=tmp_path / "work")
    with pytest.raises(InvalidParameterError, match=r"measured seeds \[0\] are not the planned \[0, 1\]"):
        claim_pipeline.combine([part], tmp_path / "r.json", "asmg-synthetic", "ci", [0, 1], settings=TINY)
    with pytest.raises(InvalidParameterError, match="of asmg-synthetic at scale ci was given to asmg-synthetic at "
                                                    "scale paper"):
        claim_pipeline.combine([part], tmp_path / "r.json", "asmg-synthetic", "paper", [0], settings=TINY)
    assert not (tmp_path / "r.json").exists()
