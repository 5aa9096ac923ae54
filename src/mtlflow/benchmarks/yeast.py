"""yeast (Mulan multi-label classification, Elisseeff & Weston 2001): 14 gene functional classes.

2,417 genes, 103 features, 14 binary labels; the label names come from ``yeast.xml.gz`` and their
columns from ``yeast.orig.arff.gz`` (``shared/realdata/mlc``). Features standardised with training
statistics; binary cross-entropy per label; F1, ROC-AUC and accuracy per label. MLP trunk (two hidden
layers of 256) with one logit per label; seeded random 70/10/20 split. Recipe defaults (Adam 1e-3,
batch 128, 100 epochs) are mtlflow's.
"""

from __future__ import annotations

import gzip
import xml.etree.ElementTree as ElementTree
from collections.abc import Sequence
from pathlib import Path

from mtlflow.benchmarks._tabular import TabularBenchmark
from mtlflow.core.errors import DataError
from mtlflow.metrics.classification import BinaryAccuracy, BinaryF1, RocAuc
from mtlflow.metrics.task_types import BINARY

#: Label names in the order of ``yeast.xml`` (Mulan's label file).
LABELS = ("Class1", "Class2", "Class3", "Class6", "Class4", "Class10", "Class11", "Class5", "Class7", "Class8",
          "Class9", "Class12", "Class13", "Class14")


def read_label_names(xml_path: Path) -> list[str]:
    """Label names of a Mulan ``.xml`` (optionally gzipped) label file, in file order."""
    try:
        opener = gzip.open if xml_path.suffix == ".gz" else open
        with opener(xml_path, "rb") as fh:
            root = ElementTree.parse(fh).getroot()
    except (OSError, ElementTree.ParseError) as exc:
        raise DataError(f"cannot read the label file {xml_path} ({exc}); restore the shared realdata folder") from None
    return [el.attrib["name"] for el in root.iter() if el.tag.endswith("label") and "name" in el.attrib]


class Yeast(TabularBenchmark):
    name = "yeast"
    description = "yeast multi-label classification (2,417 genes, 103 features, 14 labels): BCE, F1/ROC-AUC; MLP"
    task_options = {"metrics": (BinaryF1, RocAuc, BinaryAccuracy), "primary": "f1"}
    realdata_file = ("mlc", "yeast.orig.arff.gz")
    task_type, label_names, n_features = BINARY, LABELS, 103

    def target_columns(self, names: Sequence[str]) -> list[int]:
        xml_path = self._source().with_name("yeast.xml.gz")
        labels = read_label_names(xml_path)
        if tuple(labels) != LABELS:
            raise DataError(f"{xml_path} names labels {labels}, expected {list(LABELS)}; restore the realdata folder")
        return super().target_columns(names)
