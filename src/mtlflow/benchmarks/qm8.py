"""QM8 (MoleculeNet): 12 electronic-spectrum regressions, from ``shared/realdata/chem/qm8.csv.gz``.

21,786 molecules; targets: the first two excitation energies (E1, E2, Hartree) and oscillator
strengths (f1, f2) computed with CC2, PBE0 and CAM-B3LYP. Targets are standardised with training
statistics (MSE in standard units); MAE is reported in the original units (MoleculeNet's metric).
Graphs, model and split as :mod:`mtlflow.benchmarks.tox21`. Recipe defaults (Adam 1e-3, batch 128,
100 epochs) are mtlflow's.
"""

from __future__ import annotations

from mtlflow.benchmarks._molnet import MoleculeNetBenchmark
from mtlflow.metrics.regression import MAE
from mtlflow.metrics.task_types import REGRESSION

TARGETS = ("E1-CC2", "E2-CC2", "f1-CC2", "f2-CC2", "E1-PBE0", "E2-PBE0", "f1-PBE0", "f2-PBE0", "E1-CAM", "E2-CAM",
           "f1-CAM", "f2-CAM")


class QM8(MoleculeNetBenchmark):
    name = "qm8"
    description = "QM8 (21,786 molecules, 12 spectrum targets): MSE on standardised targets, MAE; 2-D graph MPNN"
    # hypervolume reference: an error of 1 (Hartree, or oscillator strength) is far beyond any model's
    task_options = {"metrics": (MAE,), "hv_reference": 1.0}
    realdata_file = ("chem", "qm8.csv.gz")
    task_type, label_columns = REGRESSION, TARGETS
