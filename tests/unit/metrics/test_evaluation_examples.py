"""Per-example values of an evaluation (mtlflow.metrics.evaluation.evaluate_examples): each example's
loss and error computed independently, missing labels as NaN, the pooled metrics recovered from them,
and the atomic round trip of the file kept beside evaluation.json."""

import math

import numpy as np
import pytest
import torch
from torch.nn import functional as F
from torch.utils.data import DataLoader, TensorDataset

from mtlflow.core.errors import DataError
from mtlflow.metrics import evaluation
from mtlflow.metrics.regression import with_scale
from mtlflow.metrics.task_types import BINARY, MULTICLASS, REGRESSION

N, CLASSES, SCALE = 23, 4, 7.5  # 23 examples in batches of 5: a short last batch


class FixedPredictions(torch.nn.Module):
    """Returns stored outputs for the examples' indices (the input is the index)."""

    def __init__(self, outputs):
        super().__init__()
        self.outputs = outputs

    def forward(self, index):
        return [out[index] for out in self.outputs]


class IndexBench:
    def make_loader(self, dataset, batch_size, shuffle):
        assert not shuffle
        return DataLoader(dataset, batch_size=5, shuffle=False)

    def unpack(self, batch):
        index, *targets = batch
        return index, targets


@pytest.fixture(scope="module")
def case():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(N, CLASSES, generator=gen)
    classes = torch.randint(0, CLASSES, (N,), generator=gen)
    classes[[2, 11]] = -1  # missing class labels
    binary_logit = torch.randn(N, 1, generator=gen)
    binary = (torch.rand(N, generator=gen) < 0.5).float()
    binary[[0, 7]] = float("nan")
    regression_pred = torch.randn(N, 1, generator=gen)
    value = torch.randn(N, generator=gen)
    value[[4, 19]] = float("nan")
    targets = [classes, binary, with_scale(value, torch.tensor(SCALE))]
    tasks = [MULTICLASS.task("kind"), BINARY.task("flag"), REGRESSION.task("mass", hv_reference=10.0)]
    model = FixedPredictions([logits, binary_logit, regression_pred])
    dataset = TensorDataset(torch.arange(N), *targets)
    metrics, examples = evaluation.evaluate_examples(model, IndexBench(), dataset, tasks, [0, 1, 2])
    return {"metrics": metrics, "examples": examples, "tasks": tasks, "logits": logits, "classes": classes,
            "binary_logit": binary_logit, "binary": binary, "regression_pred": regression_pred, "value": value}


def test_classification_error_is_each_examples_0_1_error_and_nan_without_a_label(case):
    error = case["examples"]["kind"]["error"]
    for i in range(N):
        label = int(case["classes"][i])
        if label < 0:
            assert math.isnan(error[i]) and math.isnan(case["examples"]["kind"]["loss"][i])
        else:
            assert error[i] == float(int(case["logits"][i].argmax()) != label)
            expected = float(F.cross_entropy(case["logits"][i:i + 1], case["classes"][i:i + 1]))
            assert case["examples"]["kind"]["loss"][i] == pytest.approx(expected, rel=1e-6)
    # the mean of the per-example 0/1 errors is the pooled accuracy's error
    assert np.nanmean(error) == pytest.approx(1.0 - case["metrics"]["kind"]["acc"], abs=1e-12)


def test_regression_error_is_the_absolute_error_in_original_units(case):
    error = case["examples"]["mass"]["error"]
    pred, value = case["regression_pred"][:, 0].double(), case["value"].double()
    expected = ((pred - value).abs() * SCALE).numpy()
    missing = np.isnan(value.numpy())
    assert np.isnan(error[missing]).all() and missing.sum() == 2
    np.testing.assert_allclose(error[~missing], expected[~missing], rtol=1e-6)
    assert np.nanmean(error) == pytest.approx(case["metrics"]["mass"]["mae"], rel=1e-9)
    np.testing.assert_allclose(case["examples"]["mass"]["loss"][~missing],
                               ((pred - value) ** 2).numpy()[~missing], rtol=1e-5)


def test_a_primary_metric_without_per_example_values_pairs_on_the_loss(case):
    flag = case["tasks"][1]
    assert flag.primary == "roc_auc" and evaluation.paired_statistic(flag) == "loss"
    assert [evaluation.paired_statistic(t) for t in case["tasks"]] == ["acc_error", "loss", "mae"]
    error, loss = case["examples"]["flag"]["error"], case["examples"]["flag"]["loss"]
    labels = case["binary"].numpy()
    expected = F.binary_cross_entropy_with_logits(case["binary_logit"][:, 0], torch.nan_to_num(case["binary"]),
                                                  reduction="none").numpy()
    present = ~np.isnan(labels)
    assert np.isnan(error[~present]).all() and np.isnan(loss[~present]).all()
    np.testing.assert_allclose(error[present], expected[present], rtol=1e-6)
    np.testing.assert_array_equal(error, loss)


def test_per_example_values_round_trip_atomically_beside_the_evaluation(case, tmp_path):
    target = evaluation.examples_path(tmp_path / "evaluation.json")
    assert target == tmp_path / "evaluation.per_example.npz"
    assert evaluation.examples_path(tmp_path / "evaluation") == tmp_path / "evaluation.per_example.npz"
    evaluation.write_examples(target, case["examples"])
    back = evaluation.read_examples(target)
    assert sorted(back) == sorted(case["examples"])
    for task, values in case["examples"].items():
        for name, array in values.items():
            np.testing.assert_array_equal(back[task][name], array)
    assert [p.name for p in tmp_path.iterdir()] == [target.name]  # no temporary file left
    with pytest.raises(DataError, match="not found"):
        evaluation.read_examples(tmp_path / "missing.npz")
    (tmp_path / "broken.npz").write_bytes(b"not a zip")
    with pytest.raises(DataError, match="unreadable"):
        evaluation.read_examples(tmp_path / "broken.npz")


def test_the_metrics_are_those_of_evaluate_model(case):
    model = FixedPredictions([case["logits"], case["binary_logit"], case["regression_pred"]])
    targets = [case["classes"], case["binary"], with_scale(case["value"], torch.tensor(SCALE))]
    dataset = TensorDataset(torch.arange(N), *targets)
    plain = evaluation.evaluate_model(model, IndexBench(), dataset, case["tasks"], [0, 1, 2])
    assert plain == case["metrics"]
