"""The learning rate of each step: a linear warm-up, then ``train.lr_schedule``'s shape.

``cosine`` and ``linear`` fall from ``lr`` to ``min_lr`` over the steps after the warm-up; ``wsd``
(warmup-stable-decay: MiniCPM, DeepSeek, SmolLM3) holds ``lr`` and decays over its last
``decay_steps()`` only, so any stable-phase checkpoint can be cooled down later (``train.cooldown_from``)
and the run extended; ``inverse_sqrt`` decays as 1/sqrt(step) with the warm-up as its timescale;
``constant`` holds ``lr``.

Pure functions of the step and the config: every rank, a resumed run and a cooldown compute the same
rate, and ``schedule_change`` says whether two configs trained some steps alike.
"""

from __future__ import annotations

import dataclasses
import math

from training.config import DecayShape, LrSchedule, TrainConfig


def decay_start(cfg: TrainConfig) -> int:
    """The number of steps a WSD run trains before it decays (its stable phase ends after this step)."""
    return cfg.steps - cfg.decay_steps()


def lr_at(step: int, cfg: TrainConfig) -> float:
    """The learning rate of 0-based ``step`` (training step ``step + 1``)."""
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    schedule = cfg.lr_schedule
    if schedule == LrSchedule.CONSTANT:
        return cfg.lr
    if schedule == LrSchedule.INVERSE_SQRT:
        return max(cfg.min_lr, cfg.lr * math.sqrt(max(1, cfg.warmup_steps) / (step + 1)))
    if schedule == LrSchedule.WSD:
        start = decay_start(cfg)
        if step < start:
            return cfg.lr
        return _decayed(cfg, min(1.0, (step - start + 1) / cfg.decay_steps()), cfg.decay_shape)
    progress = min(1.0, (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps))
    if schedule == LrSchedule.LINEAR:
        return _decayed(cfg, progress, DecayShape.LINEAR)
    return cfg.min_lr + 0.5 * (cfg.lr - cfg.min_lr) * (1 + math.cos(math.pi * progress))


def _decayed(cfg: TrainConfig, progress: float, shape: DecayShape) -> float:
    """From ``lr`` (progress 0) to ``min_lr`` (progress 1)."""
    span = cfg.lr - cfg.min_lr
    if shape == DecayShape.COSINE:
        return cfg.min_lr + 0.5 * span * (1 + math.cos(math.pi * progress))
    if shape == DecayShape.SQRT:
        return cfg.lr - span * math.sqrt(progress)
    return cfg.lr - span * progress


def budget_text(cfg: TrainConfig, seq_len: int) -> str:
    """The run's budget both ways and its schedule, as ``pretrain check`` prints them."""
    if cfg.cooldown_from:
        decay = f"{cfg.decay_shape} decay to min_lr {cfg.min_lr:g}"
        return f"a cooldown of {cfg.cooldown_steps} steps from {cfg.cooldown_from}, {decay}"
    steps = cfg.steps_for(seq_len)
    tokens = steps * cfg.global_batch_size * seq_len
    given = f"train.tokens={cfg.tokens:,} → " if cfg.tokens else ""
    planned = dataclasses.replace(cfg, steps=steps)
    shape = f"{cfg.lr_schedule} schedule, {cfg.warmup_steps} warm-up steps"
    if cfg.lr_schedule == LrSchedule.WSD:
        shape += f", stable to step {decay_start(planned)}, {planned.decay_steps()} {cfg.decay_shape} decay steps"
    return f"{given}{steps:,} steps of {cfg.global_batch_size} × {seq_len} tokens = {tokens:,} tokens; {shape}"


def schedule_change(trained: TrainConfig, now: TrainConfig, steps: int) -> int:
    """The first training step (1-based) among ``1..steps`` whose learning rate differs between the config that
    ``trained`` them and the one continuing them (``now``), or 0 if every one is the same."""
    for step in range(steps):
        if lr_at(step, trained) != lr_at(step, now):
            return step + 1
    return 0
