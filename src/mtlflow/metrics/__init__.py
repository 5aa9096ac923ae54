"""Task metrics, the evaluation loop over a data split, scoring (Δm%, mean rank, hypervolume) and the
epoch-selection rule.
"""
