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
    for name in ("tasks.register.find_base_model", "tasks.data.fingerprint_corpus"):
        (node,) = [nodes[i] for i, n in names.items() if n == name]
        assert first in [u.id for u in node.upstream_nodes], name


def test_a_config_that_does_not_fit_the_train_task_stops_at_the_first_node() -> None:
    check_settings(config=PipelineConfig(), world_size=2)  # the local profile: fits
    with pytest.raises(Exception) as raised:
        check_settings(config=PipelineConfig(), world_size=16)  # 2 nodes × 8: DP 8, 16 < 8 × 8
    error = user_error_in(raised.value)
    assert isinstance(error, ConfigError)
    assert "train.global_batch_size=16 is not a multiple of train.micro_batch_size × data-parallel size = 8 × 8" in str(error)
