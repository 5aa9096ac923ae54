"""Office-Home (Venkateswara et al. 2017): 65-class object classification in 4 domains, one task each.

15,500 images; layout ``<data_dir>/{Art,Clipart,Product,Real_World}/<class>/*.jpg`` (the official
archive's ``Real World`` with a space is accepted too), mounted at ``--data-dir``; LibMTL's list files
are ``Art_{train,val,test}.txt`` etc. See :mod:`mtlflow.benchmarks._office`.
"""

from __future__ import annotations

from mtlflow.benchmarks._office import OfficeBenchmark


class OfficeHome(OfficeBenchmark):
    name = "officehome"
    description = "Office-Home (mounted data): art, clipart, product, real_world, 65 classes; multi-input ResNet-18"
    domains = {"art": ("Art", ("Art",)), "clipart": ("Clipart", ("Clipart",)), "product": ("Product", ("Product",)),
               "real_world": ("Real_World", ("Real_World", "Real World"))}
    n_classes = 65
