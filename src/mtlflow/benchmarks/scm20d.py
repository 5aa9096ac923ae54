"""scm20d (Mulan multi-target regression, Spyromitros-Xioufis et al. 2016): 16 supply-chain targets.

8,966 rows, 61 features; the targets are the last 16 attributes of ``shared/realdata/mtr/scm20d.arff``
(the mean price of one product 20 days ahead, per product). Features and targets are standardised with
training statistics; MSE in standard units; MAE and RMSE in the original units. MLP trunk (two hidden
layers of 256) with one linear output per target; seeded random 70/10/20 split. Recipe defaults
(Adam 1e-3, batch 128, 100 epochs) are mtlflow's: the MTL papers do not use this set.
"""

from __future__ import annotations

from typing import Sequence

from mtlflow.benchmarks._tabular import TabularBenchmark
from mtlflow.metrics.regression import MAE, RMSE, standardised_mse
from mtlflow.metrics.task import TaskSpec

N_TARGETS = 16
TARGETS = ("LBL",) + tuple(f"MTLp{i}A" for i in range(2, 17))


class SCM20D(TabularBenchmark):
    name = "scm20d"
    description = "scm20d multi-target regression (8,966 rows, 61 features, 16 targets): MSE, MAE/RMSE; MLP"
    realdata_file = ("mtr", "scm20d.arff")
    regression = True
    n_features = 61

    @property
    def tasks(self) -> list[TaskSpec]:
        # hypervolume reference: 1,000 price units, far above any fitted model's MAE
        return [TaskSpec(name, standardised_mse, (MAE, RMSE), primary="mae", hv_reference=1000.0) for name in TARGETS]

    def target_columns(self, names: Sequence[str]) -> list[int]:
        if tuple(names[-N_TARGETS:]) != TARGETS:
            raise_unexpected(names[-N_TARGETS:])
        return list(range(len(names) - N_TARGETS, len(names)))


def raise_unexpected(found: Sequence[str]) -> None:
    from mtlflow.core.errors import DataError

    raise DataError(f"scm20d.arff's last {N_TARGETS} attributes are {list(found)}, expected {list(TARGETS)}; "
                    "restore the shared realdata file")
