"""Black-box (derivative-free) multi-objective optimisation: ASMG (:mod:`mtlflow.blackbox.asmg`) and its
experiments (:mod:`mtlflow.blackbox.experiments`). Everything here works from function values only."""
