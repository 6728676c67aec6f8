"""A fork without exec from a process with threads, whose child's garbage collector leaves alone
what it inherited.

The checkpoint results manager (``training.cpu_compat``) and the data-prep workers
(``data_prep.parallel``) are forked from processes that run threads (torch, flytekit's event loop,
a test runner's). A forked child has only the thread that forked; its collector, traversing the
parent's objects, can meet one that another thread was changing at the fork: a suite run on
2026-12-06 ended a forked manager with a segmentation fault "Garbage-collecting", and the rank's
checkpoint save with an EOFError. ``gc.freeze()`` before the fork moves every object into the
permanent generation, which a collection never visits (the practice the ``gc`` documentation gives
for a fork without exec; it also keeps the child from copying the pages it would touch): the child
keeps them frozen, the parent unfreezes them at once.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def inherited_objects_frozen() -> Iterator[None]:
    """Around the calls that fork: the children never collect what exists here now."""
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
