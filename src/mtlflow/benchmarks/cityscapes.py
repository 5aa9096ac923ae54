"""CityScapes (Cordts et al. 2016) in the MTAN setting: 7-class segmentation and (inverse) depth.

Data: the MTAN preprocessed ``.npy`` folder (2,975 train / 500 val images, 128x256; labels in
``label_7``) mounted at ``--data-dir``; see :mod:`mtlflow.benchmarks._scene`. Model: SegNet-MTAN
(default) or SegNet. Recipe of Nash-MTL/FAMO/FairGrad/COST (methods-cost.md §3.1): Adam 1e-4,
StepLR(100, 0.5), 200 epochs, batch 8, augmentation on, the mean of the last 10 epochs reported.
Paper STL references: the ``BASE`` of their code (methods-cost.md §3.2).
"""

from __future__ import annotations

from mtlflow.benchmarks._scene import SceneBenchmark
from mtlflow.benchmarks.base import PublishedReferences

PAPER_STL = {"segmentation": {"miou": 0.7401, "pix_acc": 0.9316}, "depth": {"abs_err": 0.0125, "rel_err": 27.77}}


class CityScapes(SceneBenchmark):
    name = "cityscapes"
    description = "CityScapes (MTAN .npy layout, mounted data): segmentation (7 classes), depth; SegNet-MTAN"
    n_classes = 7
    task_dirs = {"segmentation": "label_7", "depth": "depth"}
    depth_hv_reference = 0.1
    train_defaults = {"epochs": 200, "batch_size": 8, "lr": 1e-4, "optimizer": "adam", "select": "last-k:10",
                      "scheduler": "step", "scheduler_options": {"step_size": 100, "gamma": 0.5},
                      "per_method": {"ldcmtl": {"lr": 3e-4}}}  # LDC-MTL Table 5's step size
    cpu_smoke = {"options": {"max_items": 4, "width_divisor": 8}, "train": {"epochs": 1, "batch_size": 2, "select": "last"}}

    def method_defaults(self, method: str) -> dict:
        # LDC-MTL Table 5 / App. A.1: λ = 0.1, τ = 1, no normalisation,
        # a 3-layer MLP router (128 -> 64 -> 32 -> 2 with biases)
        if method == "ldcmtl":
            # Table 5's λ multiplies the discrepancy in the authors' code: form="code" (see methods/ldcmtl.py)
            return {"penalty": 0.1, "form": "code",
                    "tau": "one", "normalization": "none", "router": "mlp", "router_bias": True}
        if method == "palora":  # PaLoRA Table 1: rank 4 on scene understanding
            return {"rank": 4}
        return {}

    def published_references(self) -> PublishedReferences:
        return PublishedReferences(label="paper STL", metrics={t: dict(v) for t, v in PAPER_STL.items()},
                                   source="BASE of the Nash-MTL/FAMO/COST CityScapes code (methods-cost.md §3.2)")
