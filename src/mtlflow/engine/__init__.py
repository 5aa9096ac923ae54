"""Training: the trainer (loop and step), run directories, distributed data parallelism and schedulers, and
library mode (:class:`~mtlflow.engine.library.MTLBackward`, :func:`~mtlflow.engine.library.mtl_backward`: a
method inside the user's own training loop).
"""

from typing import Any

__all__ = ["BackwardResult", "MTLBackward", "mtl_backward"]


def __getattr__(name: str) -> Any:
    # imported on first use: `import mtlflow.engine.rundir` and friends stay free of the library's imports
    if name in __all__:
        from mtlflow.engine import library  # noqa: PLC0415

        return getattr(library, name)
    raise AttributeError(f"module 'mtlflow.engine' has no attribute {name!r}")
