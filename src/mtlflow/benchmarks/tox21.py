"""Tox21 (MoleculeNet): 12 toxicity assays with missing labels, from ``shared/realdata/chem/tox21.csv``.

7,831 molecules; 17 % of the labels are missing (empty cells) and count in neither the loss nor the
metrics: masked binary cross-entropy per assay, ROC-AUC per assay over the present labels (the
MoleculeNet metric). Graphs: heavy-atom graphs from the SMILES with torch_geometric's ``from_smiles``
features; model: the MPNN of :mod:`mtlflow.models.mpnn` with categorical atom/bond embeddings and one
logit per assay. Split: seeded random 80/10/10. No MTL paper fixes a recipe for Tox21 here; the
defaults (Adam 1e-3, batch 128, 50 epochs) are mtlflow's.
"""

from __future__ import annotations

from mtlflow.benchmarks._molnet import MoleculeNetBenchmark
from mtlflow.metrics.classification import BinaryAccuracy, RocAuc
from mtlflow.metrics.task_types import BINARY

ASSAYS = ("NR-AR", "NR-AR-LBD", "NR-AhR", "NR-Aromatase", "NR-ER", "NR-ER-LBD", "NR-PPAR-gamma", "SR-ARE",
          "SR-ATAD5", "SR-HSE", "SR-MMP", "SR-p53")


class Tox21(MoleculeNetBenchmark):
    name = "tox21"
    description = "Tox21 (7,831 molecules, 12 assays, 17% labels missing): masked BCE, ROC-AUC; 2-D graph MPNN"
    task_options = {"metrics": (RocAuc, BinaryAccuracy)}
    realdata_file = ("chem", "tox21.csv")
    task_type, label_columns = BINARY, ASSAYS
    train_defaults = {**MoleculeNetBenchmark.train_defaults, "epochs": 50}
