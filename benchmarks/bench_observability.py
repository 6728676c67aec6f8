"""What watching a run costs: the step-time breakdown, heartbeats and loss-health check (always on,
"profiling off"), and the straggler exchange, against a bare step, in one run.

Two ranks (gloo on CPU, NCCL on a GPU; data parallel 2) train the same GPT on the same random
batches. Steps go round-robin through three loops so that load from other processes hits all
of them alike:

  bare       ``TrainStep.step`` with a timer that times nothing, every update accepted, no progress
             reported (the watchdog thread runs throughout, idle here)
  observed   what ``training.train`` runs with profiling off: the phase timer (CUDA syncs on a GPU),
             heartbeats from the watchdog thread, the loss-health check, the straggler monitor's
             per-step record, but no exchange (train.straggler_every 0)
  exchange   observed + the straggler all-gather every ``--every`` steps (default 10, the default)

Each loop's figure per repeat is its mean step time (the exchange happens on one step in
``every``); the ratios are per repeat (bare / observed, observed / exchange: below 1 is a cost),
reported as the median and [min, max] over ``--repeats`` repeats. Goals (issue 16): each ≥ 0.99 (≤ 1 % added).

Last line: one JSON object with "ratios" and "spread" (and the mean step times, the machine).

  python benchmarks/bench_observability.py [--repeats 5] [--steps 40] [--every 10] [--size medium|small|tiny]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import time
import warnings

import torch
from machine_info import machine  # benchmarks/ (the script's folder)

from training.config import ModelConfig, ParallelConfig, TrainConfig
from training.launch import launch

SIZES = {
    "tiny": dict(num_layers=2, hidden_size=64, num_attention_heads=4, vocab=384, seq=64),
    "medium": dict(num_layers=4, hidden_size=256, num_attention_heads=4, vocab=2048, seq=128),  # ~0.1-0.2 s a step
    "small": dict(num_layers=4, hidden_size=256, num_attention_heads=4, vocab=8192, seq=256),  # bench_train's CPU shape
}
LOOPS = ("bare", "observed", "exchange")


class NullTimer:
    """A timer that times nothing: the bare loop."""

    step = 0

    def phase(self, name: str) -> contextlib.AbstractContextManager:
        return contextlib.nullcontext()


def _ranks(size: str, repeats: int, steps: int, every: int) -> dict:
    """Runs on each rank; returns {loop: [per-repeat mean step seconds]} (rank 0's is reported)."""
    import torch.distributed as dist

    from training.distributed import init_distributed
    from training.model.step import accept_all, build_step
    from training.observe.health import LossHealth
    from training.observe.stragglers import StragglerMonitor
    from training.observe.timing import StepTimer
    from training.observe.watchdog import Progress, Watchdog

    warnings.filterwarnings("ignore")
    shape = SIZES[size]
    model_cfg = ModelConfig(
        num_layers=shape["num_layers"], hidden_size=shape["hidden_size"], num_attention_heads=shape["num_attention_heads"]
    )
    parallel = ParallelConfig(tensor_parallel=1, collective_timeout_s=600)
    cfg = TrainConfig(micro_batch_size=4, global_batch_size=8, straggler_every=every)
    torch.set_num_threads(1)
    init_distributed(parallel, cfg.seed)
    rank = dist.get_rank()
    trainer = build_step(model_cfg, parallel, cfg, shape["vocab"], shape["seq"])
    device = next(trainer.model.parameters()).device
    generator = torch.Generator().manual_seed(rank)
    batches = [torch.randint(0, shape["vocab"], (4, shape["seq"] + 1), generator=generator) for _ in range(8)]

    progress = Progress()
    progress.world_size = dist.get_world_size()
    watchdog = Watchdog(progress, rank).start()
    health = LossHealth(cfg)
    loops = {
        "bare": (NullTimer(), lambda step: accept_all, None),
        "observed": (StepTimer(device, on_phase=progress.at), lambda step: lambda loss: health.judge(step, loss, dict), None),
        "exchange": (
            StepTimer(device, on_phase=progress.at),
            lambda step: lambda loss: health.judge(step, loss, dict),
            StragglerMonitor(cfg, device),
        ),
    }
    observer = StragglerMonitor(TrainConfig(straggler_every=0), device)  # records only
    step = 0
    for _ in range(3):  # warm-up
        step += 1
        trainer.step(batches[step % len(batches)], 1e-4, NullTimer())
    medians: dict[str, list[float]] = {name: [] for name in LOOPS}
    counts = dict.fromkeys(LOOPS, 0)  # each loop's own step count: the exchange comes every ``every`` of its steps
    for _ in range(repeats):
        times: dict[str, list[float]] = {name: [] for name in LOOPS}
        for _ in range(steps):
            for name in LOOPS:  # round-robin, step by step: drifts in machine load hit all three alike
                timer, accept, monitor = loops[name]
                step += 1
                counts[name] += 1
                t0 = time.perf_counter()
                if isinstance(timer, StepTimer):
                    progress.enter(f"step {step}", 0)
                    timer.start(step)
                trainer.step(batches[step % len(batches)], 1e-4, timer, accept(step))
                if isinstance(timer, StepTimer):
                    breakdown = timer.breakdown()
                    (monitor or observer).record(counts[name], timer.elapsed(), breakdown)
                    if monitor is not None and monitor.due(counts[name]):
                        monitor.exchange()
                observer.rows.clear()
                times[name].append(time.perf_counter() - t0)
        for name in LOOPS:  # the mean, not the median: the exchange costs one step in ``every``, which a median hides
            medians[name].append(sum(times[name]) / len(times[name]))
    watchdog.stop()
    dist.barrier()
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", choices=sorted(SIZES), default="medium")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--steps", type=int, default=40, help="steps of each loop per repeat")
    parser.add_argument("--every", type=int, default=10, help="train.straggler_every of the exchange loop")
    args = parser.parse_args()

    os.environ.setdefault("OMP_NUM_THREADS", "1")
    started = time.perf_counter()
    medians = launch(_ranks, 2, args.size, args.repeats, args.steps, args.every)
    ratios = {
        "observed_vs_bare": [b / o for b, o in zip(medians["bare"], medians["observed"], strict=True)],
        "exchange_vs_observed": [o / e for o, e in zip(medians["observed"], medians["exchange"], strict=True)],
    }
    for name in LOOPS:
        ms = [1e3 * s for s in medians[name]]
        print(f"{name:>9}: mean step {statistics.median(ms):7.2f} ms (repeats {min(ms):.2f} … {max(ms):.2f})")
    for name, values in ratios.items():
        print(f"{name:>21}: {statistics.median(values):.4f} [{min(values):.4f}, {max(values):.4f}] (goal ≥ 0.99)")
    result = {
        "benchmark": "observability",
        "size": args.size,
        "ranks": 2,
        "repeats": args.repeats,
        "steps_per_repeat": args.steps,
        "straggler_every": args.every,
        "step_ms": {name: statistics.median(medians[name]) * 1e3 for name in LOOPS},
        "ratios": {name: statistics.median(values) for name, values in ratios.items()},
        "spread": {name: [min(values), max(values)] for name, values in ratios.items()},
        "machine": machine(["torch"], threads_per_rank=1),
        "seconds": time.perf_counter() - started,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
