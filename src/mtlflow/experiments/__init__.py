"""The papers' experiments built on the library: benchmarks of the step, toy trajectories, COST's ablation
and overhead tables, ASMG's synthetic study.
"""
