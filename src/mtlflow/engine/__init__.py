"""Training: the trainer (loop and step), run directories, distributed data parallelism and schedulers.
"""
