"""A WSD cooldown (``train.cooldown_from: RUN[@STEP]``): the checkpoint it starts from, checked and pinned.

A cooldown is a run of its own that starts from another run's committed checkpoint with everything a resume
restores (weights, optimizer state, RNG, the data position) and decays over ``train.cooldown_steps``, so
it trains exactly what an uninterrupted WSD run decaying at that step would. ``plan_steps`` pins the
checkpoint before anything runs (a moving "latest" would otherwise name another cooldown on a rerun) and
refuses one line for a checkpoint that is missing, from a run that is not WSD, or past its stable phase.
"""

from __future__ import annotations

import dataclasses

from common.contracts import CHECKPOINT_META, checkpoint_prefix, committed_steps
from common.errors import ConfigError
from storage import Store
from training.config import LrSchedule, TrainConfig, cooldown_point
from training.schedule import decay_start, schedule_change


def trained_config(meta: dict) -> TrainConfig:
    """The train section a checkpoint's meta.json recorded (settings added since read as their defaults)."""
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    return TrainConfig(**{k: v for k, v in meta["train"].items() if k in known})


def cooldown_checkpoint(store: Store, cfg: TrainConfig) -> tuple[str, int]:
    """The run (``runs/<id>``) and step that ``cfg.cooldown_from`` names, checked: a committed checkpoint of a
    WSD run, taken in its stable phase (the cooldown trains its steps 1..STEP at the same rates)."""
    named = cooldown_point(cfg.cooldown_from)
    setting = f"train.cooldown_from is {cfg.cooldown_from!r}"
    if named is None:
        raise ConfigError(f"{setting}: write RUN or RUN@STEP")
    run, step = f"runs/{named[0]}", named[1]
    steps = committed_steps(store, run)
    if not steps:
        raise ConfigError(f"{setting}: {store.url(run)} holds no committed checkpoint; `pretrain runs list` shows the runs")
    if step == 0:
        step = steps[-1]
    elif step not in steps:
        raise ConfigError(
            f"{setting}: run {named[0]} has no committed checkpoint at step {step} (it has steps {steps}); "
            "keep stable-phase checkpoints with train.keep_every"
        )
    source = trained_config(store.get_json(f"{checkpoint_prefix(run, step)}/{CHECKPOINT_META}"))
    if source.lr_schedule != LrSchedule.WSD:
        raise ConfigError(
            f"{setting}: run {named[0]} was trained with lr_schedule {source.lr_schedule}, not wsd; only a WSD run's "
            "stable phase can be cooled down"
        )
    changed = schedule_change(source, dataclasses.replace(cfg, steps=step + cfg.cooldown_steps), step)
    if changed:
        raise ConfigError(
            f"{setting}: its learning rate at step {changed} differs from this config's (run {named[0]} decays after "
            f"step {decay_start(source)}, or lr/min_lr/warmup_steps differ); cool down from a stable-phase "
            f"checkpoint at or before step {decay_start(source)} with the run's own lr settings"
        )
    return run, step


def pinned_checkpoint(cfg: TrainConfig) -> str:
    """The key prefix of the checkpoint a pinned cooldown (``RUN@STEP``) starts from, or '' (not a cooldown)."""
    named = cooldown_point(cfg.cooldown_from) if cfg.cooldown_from else None
    return checkpoint_prefix(f"runs/{named[0]}", named[1]) if named and named[1] else ""


def plan_steps(store: Store, cfg: TrainConfig, seq_len: int) -> TrainConfig:
    """``cfg`` with the steps it trains in ``steps``: a token budget converted (``seq_len``-token sequences), a
    cooldown pinned to its checkpoint (``RUN@STEP``) and ending ``cooldown_steps`` after it."""
    if cfg.cooldown_from:
        run, step = cooldown_checkpoint(store, cfg)
        return dataclasses.replace(cfg, cooldown_from=f"{run.removeprefix('runs/')}@{step}", steps=step + cfg.cooldown_steps)
    # Steps from here on (tokens 0): the same budget given either way names the same run.
    return dataclasses.replace(cfg, steps=cfg.steps_for(seq_len), tokens=0)
