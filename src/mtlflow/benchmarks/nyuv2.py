"""NYUv2 (Silberman et al. 2012) in the MTAN setting: 13-class segmentation, depth, surface normals.

Data: the MTAN preprocessed ``.npy`` folder (795 train / 654 val images, 288x384) mounted at
``--data-dir``; see :mod:`mtlflow.benchmarks._scene` for the layout, the split protocol and the joint
augmentation. Model: SegNet-MTAN (default) or SegNet (``--option model=segnet``). Recipe of
Nash-MTL/FAMO/FairGrad/COST (methods-cost.md §3.1): Adam 1e-4, StepLR(100, 0.5), 200 epochs, batch 2,
augmentation on, the mean of the last 10 epochs reported. Paper STL references: the ``BASE`` of their
code (from CAGrad; methods-cost.md §3.2, anchors-mtl-libraries.md §6).
"""

from __future__ import annotations

from mtlflow.benchmarks._scene import SceneBenchmark
from mtlflow.benchmarks.base import PublishedReferences

#: mIoU, pixel acc, abs err, rel err, angle mean, median, within 11.25/22.5/30 (fractions)
PAPER_STL = {"segmentation": {"miou": 0.3830, "pix_acc": 0.6376},
             "depth": {"abs_err": 0.6754, "rel_err": 0.2780},
             "normal": {"angle_mean": 25.01, "angle_median": 19.21, "within_11.25": 0.3014, "within_22.5": 0.5720,
                        "within_30": 0.6915}}


class NYUv2(SceneBenchmark):
    name = "nyuv2"
    description = "NYUv2 (MTAN .npy layout, mounted data): segmentation (13), depth, normals; SegNet-MTAN"
    n_classes = 13
    task_dirs = {"segmentation": "label", "depth": "depth", "normal": "normal"}
    depth_hv_reference = 2.0
    train_defaults = {"epochs": 200, "batch_size": 2, "lr": 1e-4, "optimizer": "adam", "select": "last-k:10",
                      "scheduler": "step", "scheduler_options": {"step_size": 100, "gamma": 0.5},
                      "per_method": {"ldcmtl": {"lr": 8e-5}}}  # LDC-MTL Table 5's step size
    cpu_smoke = {"options": {"max_items": 4, "width_divisor": 8}, "train": {"epochs": 1, "batch_size": 2, "select": "last"}}

    def method_defaults(self, method: str) -> dict:
        # LDC-MTL Table 5 / App. A.1: λ = 0.05, τ = 1, no normalisation,
        # a 3-layer MLP router (192 -> 96 -> 48 -> 3 without biases)
        if method == "ldcmtl":
            # Table 5's λ multiplies the discrepancy in the authors' code: form="code" (see methods/ldcmtl.py)
            return {"penalty": 0.05, "form": "code",
                    "tau": "one", "normalization": "none", "router": "mlp", "router_bias": False}
        if method == "palora":  # PaLoRA Table 1: rank 4 on scene understanding
            return {"rank": 4}
        return {}

    def published_references(self) -> PublishedReferences:
        return PublishedReferences(label="paper STL", metrics={t: dict(v) for t, v in PAPER_STL.items()},
                                   source="BASE of the Nash-MTL/FAMO/COST NYUv2 code (from CAGrad; "
                                          "methods-cost.md §3.2)")
