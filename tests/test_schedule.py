"""The learning-rate schedules (issue 48) against their formulas, token budgets, and the settings a cooldown
or a WSD run refuses before anything runs. No training here: tests/test_cooldown.py trains."""

from __future__ import annotations

import math

import pytest

from common.contracts import prunable
from common.errors import ConfigError
from pipeline.config import load_config, parse_config
from storage import open_store
from training.config import TrainConfig, cooldown_point
from training.cooldown import cooldown_checkpoint, plan_steps
from training.schedule import budget_text, decay_start, lr_at, schedule_change

LR, MIN, WARMUP = 1e-3, 1e-4, 4


def cfg(schedule: str, steps: int = 40, **kw) -> TrainConfig:
    return TrainConfig(steps=steps, lr=LR, min_lr=MIN, warmup_steps=WARMUP, lr_schedule=schedule, **kw)


@pytest.mark.parametrize("schedule", ["cosine", "wsd", "linear", "inverse_sqrt", "constant"])
def test_every_schedule_warms_up_linearly(schedule):
    c = cfg(schedule)
    assert [lr_at(s, c) for s in range(WARMUP)] == [LR * (s + 1) / WARMUP for s in range(WARMUP)]


def test_cosine_and_linear_fall_from_lr_toward_min_lr_over_the_steps_after_warmup():
    cos, lin = cfg("cosine"), cfg("linear")
    for step in (4, 10, 22, 39):
        progress = (step - WARMUP) / (40 - WARMUP)
        assert lr_at(step, cos) == pytest.approx(MIN + 0.5 * (LR - MIN) * (1 + math.cos(math.pi * progress)), rel=1e-12)
        assert lr_at(step, lin) == pytest.approx(LR - (LR - MIN) * progress, rel=1e-12)
    assert lr_at(400, cos) == pytest.approx(MIN) and lr_at(400, lin) == pytest.approx(MIN)


@pytest.mark.parametrize(
    ("shape", "fraction_left"),
    [("linear", lambda p: 1 - p), ("cosine", lambda p: 0.5 * (1 + math.cos(math.pi * p))), ("sqrt", lambda p: 1 - math.sqrt(p))],
)
def test_wsd_holds_lr_then_decays_over_its_last_fraction_in_its_shape(shape, fraction_left):
    c = cfg("wsd", decay_fraction=0.25, decay_shape=shape)  # 40 steps: 10 of decay, after step 30
    assert c.decay_steps() == 10 and decay_start(c) == 30
    assert {lr_at(s, c) for s in range(WARMUP, 30)} == {LR}  # the stable phase, exactly lr
    for step in range(30, 40):
        p = (step - 30 + 1) / 10
        assert lr_at(step, c) == pytest.approx(MIN + (LR - MIN) * fraction_left(p), rel=1e-12, abs=1e-15)
    assert lr_at(39, c) == pytest.approx(MIN)  # the last step trains at min_lr


def test_inverse_sqrt_uses_the_warmup_as_its_timescale_and_min_lr_as_its_floor():
    c = cfg("inverse_sqrt", steps=10_000)
    assert lr_at(WARMUP - 1, c) == LR
    for step in (WARMUP, 15, 99):
        assert lr_at(step, c) == pytest.approx(LR * math.sqrt(WARMUP / (step + 1)), rel=1e-12)
    assert lr_at(9_999, c) == MIN  # 1e-3 × sqrt(4 / 10000) = 2e-5 < min_lr


def test_constant_holds_lr_after_the_warmup():
    assert {lr_at(s, cfg("constant")) for s in range(WARMUP, 400)} == {LR}


def test_a_wsd_run_is_named_without_its_length_the_others_with_it():
    assert cfg("wsd", steps=40).identity() == cfg("wsd", steps=80).identity()
    assert cfg("cosine", steps=40).identity() != cfg("cosine", steps=80).identity()
    # Extending a WSD run in its stable phase changes no trained step's rate; after its decay began it does.
    assert schedule_change(cfg("wsd", steps=40, decay_fraction=0.25), cfg("wsd", steps=80, decay_fraction=0.25), 30) == 0
    assert schedule_change(cfg("wsd", steps=40, decay_fraction=0.25), cfg("wsd", steps=80, decay_fraction=0.25), 40) == 31


def test_a_token_budget_becomes_steps_and_reads_scientific_notation():
    config = load_config("configs/tiny-cpu.yaml", launch=False, overrides=["train.tokens=2e6"])
    train, seq_len = config.train, config.data.seq_len
    assert (train.steps, train.tokens) == (0, 2_000_000)
    steps = math.ceil(2_000_000 / (train.global_batch_size * seq_len))
    planned = plan_steps(open_store("/nonexistent-unused"), train, seq_len)
    assert (planned.steps, planned.tokens) == (steps, 0)
    assert planned.identity() == TrainConfig(**{**vars(train), "steps": steps, "tokens": 0}).identity()
    assert f"train.tokens=2,000,000 → {steps:,} steps" in budget_text(train, seq_len)
    yaml_style = parse_config({"train": {"tokens": "3e6"}}, launch=False).train  # YAML reads 3e6 as a string
    assert (yaml_style.tokens, yaml_style.steps) == (3_000_000, 0)


@pytest.mark.parametrize(
    ("train", "expected"),
    [
        ({"steps": 10, "tokens": 1000}, "train.steps=10 and train.tokens=1000 are both set"),
        ({"steps": 0}, "train.steps and train.tokens are both 0"),
        ({"tokens": 2.5}, "train.tokens must be int, got 2.5"),
        ({"lr_schedule": "wsd", "steps": 100, "warmup_steps": 90, "decay_fraction": 0.2}, "makes a decay of 20 steps, longer"),
        ({"lr_schedule": "wsd", "decay_fraction": 0}, "train.decay_fraction is 0.0: must be in (0, 1]"),
        ({"lr_schedule": "cosine", "cooldown_from": "abc@3", "cooldown_steps": 2}, "a cooldown continues a WSD run"),
        ({"lr_schedule": "wsd", "cooldown_from": "abc@x", "cooldown_steps": 2}, "write RUN or RUN@STEP"),
        ({"lr_schedule": "wsd", "cooldown_from": "abc"}, "a cooldown needs its length in steps"),
        ({"cooldown_steps": 5}, "without train.cooldown_from"),
        ({"lr_schedule": "warmup-stable-decay"}, "train.lr_schedule"),
    ],
)
def test_bad_schedule_settings_fail_before_anything_runs_in_one_line(train, expected):
    with pytest.raises(ConfigError) as e:
        parse_config({"train": train}, launch=False)
    problems = [line for line in str(e.value).splitlines() if line.startswith("  - ")]
    assert len(problems) == 1 and expected in problems[0], str(e.value)


def committed_checkpoint(store, run: str, step: int, train: TrainConfig) -> None:
    import dataclasses

    prefix = f"{run}/checkpoints/step-{step:07d}"
    store.put_json(f"{prefix}/meta.json", {"step": step, "train": dataclasses.asdict(train)})
    store.commit(prefix)


def test_a_cooldown_is_pinned_to_a_stable_checkpoint_of_a_wsd_run_or_refused_in_one_line(tmp_path):
    store = open_store(str(tmp_path))
    wsd = cfg("wsd", steps=100, decay_fraction=0.2)  # decays after step 80
    for step in (40, 80, 90):
        committed_checkpoint(store, "runs/aaa", step, wsd)
    committed_checkpoint(store, "runs/ccc", 40, cfg("cosine", steps=100))
    cooldown = cfg("wsd", steps=0, cooldown_from="aaa@40", cooldown_steps=10)
    assert cooldown.problems() == [] and cooldown_point("runs/aaa@40") == ("aaa", 40)

    planned = plan_steps(store, cooldown, 128)
    assert (planned.cooldown_from, planned.steps) == ("aaa@40", 50)
    assert cooldown_checkpoint(store, cooldown) == ("runs/aaa", 40)
    assert plan_steps(store, cfg("wsd", steps=0, cooldown_from="aaa@80", cooldown_steps=5), 128).steps == 85

    refusals = {
        "aaa": "its learning rate at step 81 differs",  # its latest checkpoint, 90, is in its decay
        "aaa@90": "its learning rate at step 81 differs",
        "aaa@50": "has no committed checkpoint at step 50 (it has steps [40, 80, 90])",
        "bbb": "holds no committed checkpoint",
        "ccc@40": "was trained with lr_schedule cosine, not wsd",
    }
    for named, expected in refusals.items():
        with pytest.raises(ConfigError) as e:
            plan_steps(store, cfg("wsd", steps=0, cooldown_from=named, cooldown_steps=10), 128)
        assert expected in str(e.value) and "\n" not in str(e.value), str(e.value)
    with pytest.raises(ConfigError, match="at step 1 differs"):  # another peak rate than the run's
        plan_steps(store, TrainConfig(**{**vars(cooldown), "lr": 2e-3}), 128)


def test_keep_every_spares_the_cooldown_points_from_pruning():
    steps = [10, 20, 30, 40, 50, 60]
    assert prunable(steps, keep=2) == [10, 20, 30, 40]
    assert prunable(steps, keep=2, keep_every=20) == [10, 30]
    assert prunable(steps, keep=0, keep_every=20) == []  # keep 0: nothing deleted, as before
