"""Office-31 (Saenko et al. 2010): 31-class object classification in 3 domains, one task per domain.

4,110 images; layout ``<data_dir>/{amazon,dslr,webcam}/images/<class>/*.jpg`` (mounted at
``--data-dir``); LibMTL's list files are ``amazon_{train,val,test}.txt`` etc. See
:mod:`mtlflow.benchmarks._office` for the multi-input batching, the split and the model.
"""

from __future__ import annotations

from mtlflow.benchmarks._office import OfficeBenchmark


class Office31(OfficeBenchmark):
    name = "office31"
    description = "Office-31 (mounted data): amazon, dslr, webcam, 31 classes each; multi-input ResNet-18"
    domains = {"amazon": ("amazon", ("amazon/images", "amazon")), "dslr": ("dslr", ("dslr/images", "dslr")),
               "webcam": ("webcam", ("webcam/images", "webcam"))}
    n_classes = 31
