"""The seed papers' headline claims, each with the configuration that measures it and the rule that judges it.

* :mod:`.model`: :class:`Claim` (the paper's number, its table or figure, the rule, a :class:`Scale` per scale:
  ``paper`` and ``ci``) and :class:`SeedwiseRunner`, the runner that measures it one seed at a time;
* :mod:`.runners`: the runners, each over an existing experiment or job (nothing here trains by itself);
* :mod:`.catalog`: the claims of COST, PaLoRA, LDC-MTL and Ye's thesis (:data:`CLAIMS`, :func:`get`);
* :mod:`.verdict`: :func:`judge`, the verdict rules (*reproduced* / *within interval* / *not reproduced*);
* :mod:`.reproduce`: :func:`reproduce` runs one claim and writes its result file (every seed's value, the mean and
  95 % interval of :mod:`mtlflow.metrics.intervals`, the verdict, scale, date, hardware, command), as
  :func:`measure_seed` per seed then :func:`combine_seeds`, which the ``reproduce`` pipeline runs a task per seed
  (``pipelines/reproduce.py``, :mod:`mtlflow.experiments.claim_pipeline`), so both write the same file;
* :mod:`.ledger`: :func:`ledger_markdown` renders ``docs/research/claims.md`` from the stored result files only.
"""

from mtlflow.experiments.claims.catalog import CLAIMS, get
from mtlflow.experiments.claims.ledger import LEDGER_PATH, ledger_markdown, read_results, write_ledger
from mtlflow.experiments.claims.model import RULES, SCALES, Claim, Scale, SeedwiseRunner
from mtlflow.experiments.claims.reproduce import (
    RESULTS_DIR,
    WORK_DIR,
    combine_seeds,
    measure_seed,
    reproduce,
    resolve,
    result_path,
    runs_digest,
)
from mtlflow.experiments.claims.verdict import NOT_REPRODUCED, REPRODUCED, WITHIN, judge

__all__ = [
    "CLAIMS", "LEDGER_PATH", "NOT_REPRODUCED", "REPRODUCED", "RESULTS_DIR", "RULES", "SCALES", "WITHIN", "WORK_DIR",
    "Claim", "Scale", "SeedwiseRunner", "combine_seeds", "get", "judge", "ledger_markdown", "measure_seed",
    "read_results", "reproduce", "resolve", "result_path", "runs_digest", "write_ledger",
]
