"""Where a training step's time goes, per rank: data wait, forward+backward, collectives,
optimizer, checkpoint, and the rest.

Phases are measured, not inferred: each is timed around the code that does it, and on a GPU the
device is synchronised at the phase's edges so that queued kernels count where they were
launched (a few synchronisations per step; without them the time of the forward would show up
in whichever phase first waits for the GPU). Phases nest: megatron runs the gradient reduction
inside its pipeline schedule, and that time is the collective's, taken out of forward+backward.
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

PHASES = ("data", "forward_backward", "collective", "optimizer", "checkpoint")
"""What a step's time is split into; the rest of the step is 'other'. 'collective' is time spent
in the gradient reduction and the other collectives, including waiting for slower ranks."""


def phase_key(phase: str) -> str:
    """The metrics record key of a phase's seconds."""
    return f"time_{phase}_s"


BREAKDOWN_KEYS = tuple(phase_key(p) for p in (*PHASES, "other"))


class StepTimer:
    """Exclusive seconds per phase of the current step: a phase inside another counts only for
    itself, and the outer one gets its time less the inner one's.

    ``on_phase`` (if given) hears each phase's name as it starts, with the step, and the outer
    phase's name again when an inner one ends: the hang diagnostics use it to say what a rank was
    doing when it stopped.
    """

    def __init__(self, device: torch.device, on_phase: Callable[[int, str], None] | None = None) -> None:
        # The rank's own device: a bare torch.cuda.synchronize() waits on the *current* device.
        self.sync = functools.partial(torch.cuda.synchronize, device) if device.type == "cuda" else None
        self.on_phase = on_phase
        self.step = 0
        self.seconds: dict[str, float] = dict.fromkeys(PHASES, 0.0)
        self._started = time.perf_counter()
        self._open: list[tuple[str, list[float]]] = []  # per open phase: its name, the seconds its inner phases took

    def start(self, step: int) -> None:
        """Begin step ``step`` (1-based): every phase back to zero."""
        if self.sync:
            self.sync()
        self.step = step
        self.seconds = dict.fromkeys(PHASES, 0.0)
        self._open = []
        self._started = time.perf_counter()

    @contextmanager
    def phase(self, name: str) -> Iterator[None]:
        """Time the block as ``name`` (one of ``PHASES``)."""
        if name not in self.seconds:
            raise ValueError(f"unknown step phase {name!r}: use one of {', '.join(PHASES)}")
        if self.on_phase is not None:
            self.on_phase(self.step, name)
        if self.sync:
            self.sync()
        t0 = time.perf_counter()
        inner = [0.0]
        self._open.append((name, inner))
        try:
            yield
        finally:
            if self.sync:
                self.sync()
            elapsed = time.perf_counter() - t0
            self._open.pop()
            self.seconds[name] += elapsed - inner[0]
            if self._open:
                outer, outer_inner = self._open[-1]
                outer_inner[0] += elapsed
                if self.on_phase is not None:  # back in the outer phase
                    self.on_phase(self.step, outer)

    def elapsed(self) -> float:
        """Seconds since ``start``."""
        return time.perf_counter() - self._started

    def breakdown(self, total: float | None = None) -> dict[str, float]:
        """The step's seconds per phase, 'other' being what no phase covered (Python, logging).

        ``total`` is the step's time as the caller measured it (default: ``elapsed()`` now); the
        values then sum to exactly that.
        """
        total = self.elapsed() if total is None else total
        record = {phase_key(p): s for p, s in self.seconds.items()}
        record[phase_key("other")] = max(0.0, total - sum(self.seconds.values()))
        return record


def compile_seconds() -> float:
    """Seconds this process spent compiling so far (Dynamo's tracing and Inductor's code generation for the
    forward graphs, and the backward graphs compiled at the first backward), from torch's own timers."""
    from torch._dynamo.utils import compile_times

    names, seconds = compile_times(repr="csv", aggregate=True)
    spent = dict(zip(names, seconds, strict=True))
    return round(sum(float(spent.get(key, 0.0)) for key in ("_compile.compile_inner", "backward._backward_impl")), 3)
