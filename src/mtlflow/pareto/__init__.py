"""Pareto-front learning building blocks (used by the ``palora`` method).

* :mod:`mtlflow.pareto.simplex` -- even grids on the preference simplex and PaLoRA's preference
  schedules (Eq. 3 and the ablation variants of its Sec. 6.1 / App. D);
* :mod:`mtlflow.pareto.adapters` -- task-specific low-rank adapters mixed by a preference (Eq. 2),
  merging into one plain network for a given preference, and the parameter overhead;
* :mod:`mtlflow.pareto.front` -- evaluation of a model on a preference grid, the front's hypervolume
  with a fixed reference point, selection over epochs, aggregation over seeds and the front plot.
"""
