"""Example mtlflow plug-ins: the ``churn`` benchmark, the ``unitsum`` method, the ``wide-mlp`` architecture."""
