"""NYUv2 (Silberman et al. 2012) in the MTAN setting: 13-class segmentation, depth, surface normals.

Data: the MTAN preprocessed ``.npy`` folder (795 train / 654 val images, 288x384) mounted at
``--data-dir``; see :mod:`mtlflow.benchmarks._scene` for the layout, the split protocol and the joint
augmentation. Model: SegNet-MTAN (default) or SegNet (``--data-option model=segnet``). Recipe of
Nash-MTL/FAMO/FairGrad/COST (methods-cost.md §3.1): Adam 1e-4, StepLR(100, 0.5), 200 epochs, batch 2,
augmentation on, the mean of the last 10 epochs reported. Paper STL references: the ``BASE`` of their
code (from CAGrad; methods-cost.md §3.2, anchors-mtl-libraries.md §6).
"""

from __future__ import annotations

from mtlflow.benchmarks._scene import SceneBenchmark, mtan_recipe


class NYUv2(SceneBenchmark):
    name = "nyuv2"
    description = "NYUv2 (MTAN .npy layout, mounted data): segmentation (13), depth, normals; SegNet-MTAN"
    n_classes = 13
    task_dirs = {"segmentation": "label", "depth": "depth", "normal": "normal"}
    depth_hv_reference = 2.0
    train_defaults = mtan_recipe(batch_size=2, ldcmtl_lr=8e-5)
    # LDC-MTL Table 5 / App. A.1: λ = 0.05, router 192 -> 96 -> 48 -> 3 without biases
    ldcmtl_penalty = 0.05
    ldcmtl_router_bias = False
    #: mIoU, pixel acc, abs err, rel err, angle mean, median, within 11.25/22.5/30 (fractions)
    paper_stl = {"segmentation": {"miou": 0.3830, "pix_acc": 0.6376},
                 "depth": {"abs_err": 0.6754, "rel_err": 0.2780},
                 "normal": {"angle_mean": 25.01, "angle_median": 19.21, "within_11.25": 0.3014, "within_22.5": 0.5720,
                            "within_30": 0.6915}}
    paper_stl_source = "BASE of the Nash-MTL/FAMO/COST NYUv2 code (from CAGrad; methods-cost.md §3.2)"
