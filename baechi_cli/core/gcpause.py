"""Pausing Python's cyclic garbage collector around the stages that build millions of objects."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def cyclic_gc_paused() -> Iterator[None]:
    """Pause Python's cyclic garbage collector meanwhile (a context manager and a decorator).

    Reference counting still frees every object; only reference cycles wait. The
    stages make millions of small lists, tuples and dicts on a large graph and no
    cycles worth collecting, while each full collection walks every live object,
    which on a million-op graph is a large share of the run. The workload reader
    pauses it likewise.
    """
    if not gc.isenabled():
        yield
        return
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
