"""reproduce: one seed paper's claim (`mtlflow reproduce CLAIM`) with each seed as a task of its own. The claims,
their papers' tables and the verdict rules are in `mtlflow.experiments.claims` (the ledger:
`docs/research/claims.md`); these components are the steps of `pipelines/reproduce.py`, and the result file the
last one writes is the one `mtlflow reproduce CLAIM` writes, value for value. Their work is
:mod:`mtlflow.experiments.claim_pipeline` (above :mod:`mtlflow.jobs` in the layers: a claim runs jobs).

Settings and data options travel as JSON strings rather than structs: a struct stores every number as a double,
and the result file records the configuration exactly as `mtlflow reproduce` does.

```bash
mtlflow reproduce asmg-synthetic --pipeline --local                      # kfp.local; writes docs/research/claims/asmg-synthetic.json
mtlflow reproduce cost-nyuv2 --scale paper --device cuda --pipeline \\
    --compile build/reproduce-cost-nyuv2.yaml --profile k8s/overlays/prod/profile.yaml
mtlflow reproduce cost-nyuv2 --scale paper --device cuda --pipeline --host https://kubeflow.example.com/pipeline
```
"""

from typing import List

from kfp import dsl

from mtlflow.components.image import IMAGE

#: run end to end under kfp.local (tests/integration/test_reproduce_pipeline.py)
STABILITY = "stable"


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def plan_claim(claim: str, scale: str, seeds: List[int], settings: str = "{}") -> List[int]:
    """The seeds of ``claim`` at ``scale`` (``seeds``, or the scale's when empty); an unknown claim, scale or
    setting fails here, before any seed runs.

    Args:
        claim: claim key (``mtlflow reproduce --list``)
        scale: ``ci`` or ``paper``
        seeds: seeds to run; empty: the scale's (a claim without seeds runs the first only)
        settings: JSON object of settings of the scale's configuration to override (``--set KEY=VALUE``)

    Returns:
        the seeds the loop runs
    """
    import json

    from mtlflow.experiments import claim_pipeline

    return claim_pipeline.plan(claim, scale, [int(s) for s in seeds], json.loads(settings))


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def reproduce_seed(claim: str, scale: str, seed: int, part: dsl.Output[dsl.Artifact], device: str = "cpu",
                   settings: str = "{}", data_options: str = "{}", work_root: str = "") -> float:
    """Run one seed of ``claim`` at ``scale`` on ``device`` and write its measurement (the runner's part, its
    seconds and hardware) as ``part``. Its runs live under ``work_root`` (a PVC on the cluster; empty: the
    task's working directory), where a retried or preempted task finds the finished ones. Returns the seed's
    wall-clock seconds.

    Args:
        claim: claim key
        scale: ``ci`` or ``paper``
        seed: the seed (a loop item of ``plan_claim``'s output)
        part: the seed's measurement (JSON: ``claim``, ``scale``, ``seed``, ``part``, ``seconds``,
            ``cpu_seconds``, ``hardware``)
        device: ``cpu`` or ``cuda`` (the pipeline's compile-time device)
        settings: JSON object of overridden settings
        data_options: JSON object of data options (``--data-dir``, ``--data-option``) for claims on data we
            cannot ship
        work_root: where the seed's runs are kept (``<root>/<scale>-<digest of the configuration>``); empty:
            ``runs/claims``

    Returns:
        the seed's wall-clock seconds
    """
    import json

    from mtlflow.experiments import claim_pipeline
    from mtlflow.experiments.claims import WORK_DIR

    measured = claim_pipeline.measure(part.path, claim, scale, int(seed), device=device,
                                      settings=json.loads(settings), data_options=json.loads(data_options),
                                      work_root=work_root or WORK_DIR)
    part.metadata.update({"claim": claim, "scale": scale, "seed": int(seed)})
    return float(measured["seconds"])


@dsl.component(base_image=IMAGE, install_kfp_package=False)
def combine_claim(claim: str, scale: str, seeds: List[int], parts: dsl.Input[List[dsl.Artifact]],
                  result: dsl.Output[dsl.Artifact], metrics: dsl.Output[dsl.Metrics], device: str = "cpu",
                  settings: str = "{}", data_options: str = "{}", command: str = "") -> str:
    """Combine the seeds' ``parts`` into the claim's result file ``result`` (the JSON `mtlflow reproduce`
    writes: every seed's value, mean and 95 % interval, the verdict, configuration, hardware, command) and log
    its mean, interval, n, the baseline's and the difference's for a gain, the paper's number and the verdict
    (a 0/1 indicator per verdict) as ``metrics``. Returns the verdict.

    Args:
        claim: claim key
        scale: ``ci`` or ``paper``
        seeds: ``plan_claim``'s seeds: the record lists the values in this order, whatever order the loop's
            outputs come in
        parts: the seeds' ``part`` artifacts (``dsl.Collected``)
        result: the claim's result file (``docs/research/claims/<claim>.json`` at ci scale)
        metrics: ``mean``, ``low``, ``high``, ``n`` (and ``baseline_*``, ``difference*``,
            ``probability_of_improvement`` for a gain), ``paper_value``, ``verdict_reproduced`` /
            ``verdict_within_interval`` / ``verdict_not_reproduced``
        device: recorded with the result
        settings: JSON object of overridden settings
        data_options: JSON object of data options
        command: the command recorded in the result (default ``mtlflow reproduce CLAIM --scale SCALE
            --pipeline``)

    Returns:
        the verdict
    """
    import json

    from mtlflow.experiments import claim_pipeline

    record = claim_pipeline.combine([p.path for p in parts], result.path, claim, scale, [int(s) for s in seeds],
                                    device=device, settings=json.loads(settings),
                                    data_options=json.loads(data_options), command=command)
    result.metadata.update({"claim": claim, "scale": scale, "verdict": record["verdict"]})
    for name, value in claim_pipeline.metrics(record).items():
        metrics.log_metric(name, value)
    return record["verdict"]
