"""CityScapes (Cordts et al. 2016) in the MTAN setting: 7-class segmentation and (inverse) depth.

Data: the MTAN preprocessed ``.npy`` folder (2,975 train / 500 val images, 128x256; labels in
``label_7``) mounted at ``--data-dir``; see :mod:`mtlflow.benchmarks._scene`. Model: SegNet-MTAN
(default) or SegNet. Recipe of Nash-MTL/FAMO/FairGrad/COST (methods-cost.md §3.1): Adam 1e-4,
StepLR(100, 0.5), 200 epochs, batch 8, augmentation on, the mean of the last 10 epochs reported.
Paper STL references: the ``BASE`` of their code (methods-cost.md §3.2).
"""

from __future__ import annotations

from mtlflow.benchmarks._scene import SceneBenchmark, mtan_recipe


class CityScapes(SceneBenchmark):
    name = "cityscapes"
    description = "CityScapes (MTAN .npy layout, mounted data): segmentation (7 classes), depth; SegNet-MTAN"
    n_classes = 7
    task_dirs = {"segmentation": "label_7", "depth": "depth"}
    depth_hv_reference = 0.1
    train_defaults = mtan_recipe(batch_size=8, ldcmtl_lr=3e-4)
    # LDC-MTL Table 5 / App. A.1: λ = 0.1, router 128 -> 64 -> 32 -> 2 with biases
    ldcmtl_penalty = 0.1
    ldcmtl_router_bias = True
    paper_stl = {"segmentation": {"miou": 0.7401, "pix_acc": 0.9316}, "depth": {"abs_err": 0.0125, "rel_err": 27.77}}
    paper_stl_source = "BASE of the Nash-MTL/FAMO/COST CityScapes code (methods-cost.md §3.2)"
