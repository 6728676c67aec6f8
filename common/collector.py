"""How often Python's cyclic garbage collector runs in our processes: seldom enough that loading torch,
megatron-core, flytekit, Great Expectations and MLflow does not pay for it a second time.

CPython collects its youngest generation each time 700 more container objects exist than were freed, the
middle one every 10th time, and the oldest (every object the process holds) every 10th time after that, once a
quarter of the objects are new since its last pass. Imports create hundreds of thousands of objects and little
garbage: under those defaults the collector was 17 % of the CPU of loading what ``pretrain run`` loads
(``import torch, flytekit, great_expectations, mlflow, pandas, workflows.pretrain, megatron.core``: 12.6 and
12.0 CPU-s, 10.5 and 10.1 with these thresholds, alternated, on the 2-core VM on 2026-12-07).

``collect_less_often`` sets them for the rest of the process; the entry points call it first (the ``pretrain``
CLI, the ``tasks`` package that every Flyte task process imports, the ranks' fork server). Garbage in reference
cycles is found later (after 10,000 allocations rather than 700); everything else is freed by reference counting
at once, as before. A training loop collects less often too (torchtitan and Megatron-LM go further: they turn
the collector off and collect every N steps).
"""

from __future__ import annotations

import gc

THRESHOLDS = (10_000, 50, 100)
"""Youngest generation every 10,000 net allocations; the middle one every 50th time; the oldest every 100th."""


def collect_less_often() -> None:
    gc.set_threshold(*THRESHOLDS)
