"""The Katib Experiment manifest (mtlflow.ops.katib) and the metric lines its trials print
(mtlflow.jobs.katib_metrics): the search space as Katib parameters whose values the real `mtlflow train` parser
reads back into the range's values, the trial as the project's TrainJob with no Istio sidecar, and lines the
StdOut collector's format reads back into the printed values. No Katib here: the lifecycle against a fake API
server is in tests/deploy/test_katib_launcher.py, the schema checks in tests/deploy/test_katib_experiments.py."""

from __future__ import annotations

import io
import json
import math
import re

import pytest

from mtlflow.cli import build_parser
from mtlflow.cli.common import parse_value
from mtlflow.cli.runs import train_request
from mtlflow.config.cluster import ClusterProfile
from mtlflow.core.errors import InvalidParameterError
from mtlflow.core.hparams import SearchRange
from mtlflow.jobs import katib_metrics
from mtlflow.jobs.tune_trial import Scorer
from mtlflow.methods.search import SHARED_SPACE
from mtlflow.metrics.selection import validation_score
from mtlflow.ops import k8s_jobs, katib

SPACE = {"lr": SearchRange("log", 1e-4, 1e-2), "weight_decay": SearchRange("categorical", choices=(0.0, 1e-5, 1e-4)),
         "alpha": SearchRange("linear", 0.5, 5.0), "rank": SearchRange("int", 2, 8),
         "mode": SearchRange("categorical", choices=("mean", "sum")), "clip": SearchRange("categorical",
                                                                                         choices=(True, False))}
SEARCH = katib.Search(max_trials=20, parallel_trials=2, seed=7, startup_trials=10, ei_candidates=24,
                      median_min_trials=3, median_start_step=3, max_failed_trials=3)


def trainjob(space=SPACE, profile=None):
    command = k8s_jobs.train_command("/mnt/data/d", "/mnt/ckpt/katib/x/ls/" + katib.placeholder(katib.TRIAL_NAME),
                                     json.dumps({"method": "fairgrad", "seed": 0, "hparams": {}}), 5, {})
    command += katib.trial_arguments(space, list(SHARED_SPACE))
    job = k8s_jobs.DistributedTraining(name="mtlflow-katib-ls-abc", namespace="ml", image="reg/mtlflow:1",
                                       command=command, profile=profile or ClusterProfile())
    return k8s_jobs.trainjob_manifest(job)


def experiment(**kw):
    args = {"name": "mtlflow-katib-ls-abc", "namespace": "ml", "space": SPACE, "trainjob": trainjob(),
            "search": SEARCH, "metrics": ["val_left_accuracy", "val_left_loss"], **kw}
    return katib.experiment_manifest(**args)


def substitute(command, values):
    """What Katib's controller does to the trial template: ${trialParameters.x} -> the assigned string."""
    return [re.sub(r"\$\{trialParameters\.(.+?)\}", lambda m: values[m.group(1)], part) for part in command]


def test_parameters_map_each_scale_to_katibs_type_and_distribution():
    params = {p["name"]: p for p in experiment()["spec"]["parameters"]}
    assert params["lr"] == {"name": "lr", "parameterType": "double",
                            "feasibleSpace": {"min": "0.0001", "max": "0.01", "distribution": "logUniform"}}
    assert params["alpha"]["feasibleSpace"]["distribution"] == "uniform"
    assert params["rank"] == {"name": "rank", "parameterType": "int",
                              "feasibleSpace": {"min": "2", "max": "8", "distribution": "uniform"}}
    for name in ("weight_decay", "mode", "clip"):
        assert params[name]["parameterType"] == "categorical"
        values = params[name]["feasibleSpace"]["list"]
        assert all(isinstance(v, str) for v in values)  # Katib's categorical takes strings only
        assert [parse_value(v) for v in values] == list(SPACE[name].choices)  # the CLI reads back each choice


def test_the_trial_command_gives_mtlflow_train_the_trials_values():
    """Substitute one assignment as Katib does and parse the command with the real CLI: training options become
    RunConfig fields, the others method hyper-parameters, with the range's types."""
    command = experiment()["spec"]["trialTemplate"]["trialSpec"]["spec"]["trainer"]["command"]
    values = {"lr": "0.00123", "weight_decay": "1e-05", "alpha": "2.5", "rank": "4", "mode": "sum", "clip": "false",
              katib.TRIAL_NAME: "mtlflow-katib-ls-abc-x7k2p9qd"}
    args = build_parser().parse_args(substitute(command, values)[3:])
    request = train_request(args)
    assert request["lr"] == 0.00123 and request["weight_decay"] == 1e-5
    assert request["hparams"] == {"alpha": 2.5, "rank": 4, "mode": "sum", "clip": False}
    assert args.out == "/mnt/ckpt/katib/x/ls/mtlflow-katib-ls-abc-x7k2p9qd" and args.resume


def test_algorithm_early_stopping_and_metrics_collector():
    spec = experiment()["spec"]
    assert spec["algorithm"] == {"algorithmName": "multivariate-tpe", "algorithmSettings": [
        {"name": "random_state", "value": "7"}, {"name": "n_startup_trials", "value": "10"},
        {"name": "n_ei_candidates", "value": "24"}]}
    assert spec["earlyStopping"] == {"algorithmName": "medianstop", "algorithmSettings": [
        {"name": "min_trials_required", "value": "3"}, {"name": "start_step", "value": "3"}]}
    assert (spec["maxTrialCount"], spec["parallelTrialCount"], spec["maxFailedTrialCount"]) == (20, 2, 3)
    assert spec["metricsCollectorSpec"]["collector"] == {"kind": "StdOut"}
    objective = spec["objective"]
    assert objective["type"] == "minimize" and objective["objectiveMetricName"] == "val_score"
    assert objective["additionalMetricNames"] == ["val_left_accuracy", "val_left_loss"]
    assert {"name": "val_score", "value": "min"} in objective["metricStrategies"]
    template = spec["trialTemplate"]
    assert template["primaryContainerName"] == k8s_jobs.TRAINER_NODE
    assert {"name": katib.TRIAL_NAME, "reference": "${trialSpec.Name}"} in template["trialParameters"]


def test_trial_pods_never_get_an_istio_sidecar_and_katib_names_the_trainjob():
    spec = experiment(trainjob=trainjob(profile=ClusterProfile(trainjob={"istio_sidecar": True})))["spec"]
    trial = spec["trialTemplate"]["trialSpec"]
    assert trial["kind"] == "TrainJob" and set(trial["metadata"]) == {"labels"}
    (patch,) = trial["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    assert node["template"]["spec"]["template"]["metadata"]["labels"][k8s_jobs.ISTIO_INJECT] == "false"


def test_spec_digest_follows_the_inputs_and_bad_requests_are_one_line():
    digest = experiment()["metadata"]["annotations"][katib.SPEC_DIGEST]
    assert experiment(owner={"kind": "Pod", "name": "p", "uid": "u"})["metadata"]["annotations"][katib.SPEC_DIGEST] \
        == digest  # the owner is not an input: a retried launcher in another pod re-attaches
    other = katib.Search(**{**SEARCH.__dict__, "seed": 8})
    assert experiment(search=other)["metadata"]["annotations"][katib.SPEC_DIGEST] != digest
    with pytest.raises(InvalidParameterError, match="does not use extra"):
        experiment(space={**SPACE, "extra": SearchRange("linear", 0.0, 1.0)})
    with pytest.raises(InvalidParameterError, match=r"parallel trials must be in \[1, max trials = 2\]"):
        experiment(search=katib.Search(**{**SEARCH.__dict__, "max_trials": 2, "parallel_trials": 3}))


def test_experiment_names_leave_room_for_katibs_trial_suffix():
    name = katib.experiment_name("very-long-method-name-" * 4 + "0123456789abcdef")
    assert len(name) <= 54 and name.endswith("-0123456789abcdef")
    assert re.fullmatch(r"[a-z]([-a-z0-9]*[a-z0-9])?", name)
    assert len(name + "-x7k2p9qd") <= 63  # Katib's trial (and TrainJob) name


def test_best_trial_reads_the_optimal_trial_of_the_status():
    obj = {"status": {"conditions": [{"type": "Succeeded", "status": "True"}], "trials": 5, "trialsSucceeded": 4,
                      "trialsEarlyStopped": 1, "currentOptimalTrial": {
                          "bestTrialName": "e-abc", "parameterAssignments": [{"name": "lr", "value": "0.002"}],
                          "observation": {"metrics": [{"name": "val_score", "min": "-0.25", "max": "0.0",
                                                       "latest": "-0.2"}]}}}}
    assert katib.experiment_state(obj) == "succeeded"
    best = katib.best_trial(obj)
    assert best["trial"] == "e-abc" and best["parameters"] == {"lr": "0.002"}
    assert best["metrics"] == {"val_score": {"min": -0.25, "max": 0.0, "latest": -0.2}}
    assert best["trials"]["trialsEarlyStopped"] == 1
    assert katib.experiment_state({"status": {"conditions": [{"type": "Failed", "status": "True"}]}}) == "failed"
    assert katib.experiment_state({}) == "running"


class _Task:
    def __init__(self, name, metrics):
        self.name, self._metrics = name, metrics

    def metric_specs(self):
        return {m: {"higher_is_better": m == "accuracy", "unit_interval": m == "accuracy"} for m in self._metrics}


def test_epoch_lines_parse_with_katibs_format_into_the_printed_values():
    """The lines the trial prints, read by the StdOut collector's own regular expression, give back the study's
    validation score (computed independently here) and every val metric; a non-finite value is left out."""
    tasks = [_Task("left", ["accuracy", "loss"]), _Task("right.digit", ["accuracy", "loss"])]
    reference = {"left": {"accuracy": 0.1, "loss": 2.3}, "right.digit": {"accuracy": 0.2, "loss": 2.2}}
    scorer = Scorer(reference, {"left": "accuracy", "right.digit": "accuracy"},
                    {t.name: t.metric_specs() for t in tasks})
    val = {"left": {"accuracy": 0.55, "loss": 1.25e-5}, "right.digit": {"accuracy": 0.6, "loss": math.nan}}
    stream = io.StringIO()
    callback = katib_metrics.KatibMetrics(scorer, stream)
    callback.on_epoch_end(type("T", (), {"tasks": tasks})(), {"epoch": 1, "splits": {"val": val}})
    parsed = {m.group(1): float(m.group(2)) for m in re.finditer(katib.METRICS_FORMAT, stream.getvalue())}
    expected_score = ((1 - 0.55) - 0.9) / 0.9 / 2 + ((1 - 0.6) - 0.8) / 0.8 / 2
    assert parsed.pop("val_score") == pytest.approx(expected_score)
    assert expected_score == pytest.approx(validation_score(val, reference, scorer.primary, scorer.specs))
    assert parsed == {"val_left_accuracy": 0.55, "val_left_loss": 1.25e-5, "val_right_digit_accuracy": 0.6}
    assert katib_metrics.metric_names(tasks) == ["val_left_accuracy", "val_left_loss", "val_right_digit_accuracy",
                                                 "val_right_digit_loss"]


def test_a_missing_or_foreign_scorer_file_is_one_line(tmp_path):
    from mtlflow.core.errors import DataError

    with pytest.raises(DataError, match="Katib scorer not found"):
        katib_metrics.callbacks(str(tmp_path / "absent.json"))
    (tmp_path / "other.json").write_text("{}")
    with pytest.raises(InvalidParameterError, match="is not a scorer file"):
        katib_metrics.callbacks(str(tmp_path / "other.json"))
    assert katib_metrics.callbacks(None) == []
