"""scm20d (Mulan multi-target regression, Spyromitros-Xioufis et al. 2016): 16 supply-chain targets.

8,966 rows, 61 features; the targets are the last 16 attributes of ``shared/realdata/mtr/scm20d.arff``
(the mean price of one product 20 days ahead, per product). Features and targets are standardised with
training statistics; MSE in standard units; MAE and RMSE in the original units. MLP trunk (two hidden
layers of 256) with one linear output per target; seeded random 70/10/20 split. Recipe defaults
(Adam 1e-3, batch 128, 100 epochs) are mtlflow's: the MTL papers do not use this set.
"""

from __future__ import annotations

from mtlflow.benchmarks._tabular import TabularBenchmark
from mtlflow.metrics.regression import MAE, RMSE
from mtlflow.metrics.task_types import REGRESSION

TARGETS = ("LBL",) + tuple(f"MTLp{i}A" for i in range(2, 17))


class SCM20D(TabularBenchmark):
    name = "scm20d"
    description = "scm20d multi-target regression (8,966 rows, 61 features, 16 targets): MSE, MAE/RMSE; MLP"
    # hypervolume reference: 1,000 price units, far above any fitted model's MAE
    task_options = {"metrics": (MAE, RMSE), "hv_reference": 1000.0}
    realdata_file = ("mtr", "scm20d.arff")
    task_type, label_names, n_features = REGRESSION, TARGETS, 61
