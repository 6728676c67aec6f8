"""The workflow checks its input first: a launch from the console or a launch plan, which no
command line checked, stops at the first node with one line per problem."""

from __future__ import annotations

import pytest

from common.errors import ConfigError, user_error_in
from pipeline.config import PipelineConfig
from tasks.settings import check_settings
from workflows.pretrain import pretrain


@pytest.mark.slow
def test_every_task_of_the_data_stage_waits_for_the_settings_check() -> None:
    nodes = {n.id: n for n in pretrain.nodes}
    names = {n.id: n.flyte_entity.name for n in pretrain.nodes}
    (first,) = [i for i, name in names.items() if name == "tasks.settings.check_settings"]
    assert nodes[first].upstream_nodes == []
    for name in ("tasks.register.find_base_model", "tasks.data.prepare_mixture", "tasks.train.plan_training"):
        (node,) = [nodes[i] for i, n in names.items() if n == name]
        assert first in [u.id for u in node.upstream_nodes], name
    # The training's plan (a cooldown's checkpoint, a token budget) is checked before the corpus is read.
    (plan,) = [i for i, name in names.items() if name == "tasks.train.plan_training"]
    (listing,) = [nodes[i] for i, n in names.items() if n == "tasks.data.prepare_mixture"]  # the data stage, listing first
    assert plan in [u.id for u in listing.upstream_nodes]


def test_the_training_plan_pins_a_cooldown_and_refuses_one_that_cannot_run(tmp_path) -> None:
    import dataclasses

    from storage import open_store
    from tasks.train import plan_training
    from training.config import TrainConfig

    store = open_store(str(tmp_path))
    wsd = TrainConfig(steps=100, lr_schedule="wsd", decay_fraction=0.2, warmup_steps=10)
    for step in (40, 100):
        prefix = f"runs/abc/checkpoints/step-{step:07d}"
        store.put_json(f"{prefix}/meta.json", {"step": step, "train": dataclasses.asdict(wsd)})
        store.commit(prefix)
    cooldown = dataclasses.replace(wsd, steps=0, cooldown_from="abc@40", cooldown_steps=20)
    planned = plan_training(store=store.uri, train_cfg=cooldown, seq_len=128)
    assert (planned.cooldown_from, planned.steps) == ("abc@40", 60)
    with pytest.raises(Exception) as raised:  # its latest checkpoint is past the decay's start (step 80)
        plan_training(store=store.uri, train_cfg=dataclasses.replace(cooldown, cooldown_from="abc"), seq_len=128)
    error = user_error_in(raised.value)
    assert isinstance(error, ConfigError) and "cool down from a stable-phase checkpoint at or before step 80" in str(error)


def test_a_config_that_does_not_fit_the_train_task_stops_at_the_first_node() -> None:
    check_settings(config=PipelineConfig(), world_size=2)  # the local profile: fits
    with pytest.raises(Exception) as raised:
        check_settings(config=PipelineConfig(), world_size=16)  # 2 nodes × 8: DP 8, 16 < 8 × 8
    error = user_error_in(raised.value)
    assert isinstance(error, ConfigError)
    assert "train.global_batch_size=16 is not a multiple of train.micro_batch_size × data-parallel size = 8 × 8" in str(error)
