"""``parallel.fsdp`` and the overlap switches, in-process: where each setting applies, FSDP's check that every
parameter splits evenly, the gradient buckets a megatron optimizer's resume depends on, and the layout's name in
``pretrain runs show`` and the runs table. The training itself (losses, gradient norms, weights and Adam moments
against the TP=2 run, and checkpoints resharding to and from it) is proven by real runs in tests/test_training.py.
"""

from dataclasses import asdict
from types import SimpleNamespace

import pytest
import torch

from common.contracts import Layout
from reports.run_text import span_text
from runs.view import layout_short
from training.checkpointing import optimizer_state
from training.checkpointing.checkpoint import restores_optimizer
from training.config import ParallelConfig


@pytest.mark.parametrize(
    "settings,message",
    [
        (dict(fsdp=True), "parallel.fsdp needs parallel.tensor_parallel 1 (it is 2): FSDP here shards whole layers"),
        (dict(fsdp=True, tensor_parallel=1, pipeline_parallel=2), "parallel.fsdp needs parallel.pipeline_parallel 1 (it is 2)"),
        (
            dict(fsdp=True, tensor_parallel=1, distributed_optimizer=True),
            "parallel.fsdp and parallel.distributed_optimizer are both on: FSDP already shards the optimizer state",
        ),
        (
            dict(fsdp=True, tensor_parallel=1, overlap_grad_reduce=True),
            "parallel.overlap_grad_reduce does not apply with parallel.fsdp: FSDP2 always gathers",
        ),
        (dict(tensor_parallel=1, overlap_grad_reduce=True), "parallel.overlap_grad_reduce needs megatron's DDP"),
        (
            dict(tensor_parallel=1, pipeline_parallel=2, overlap_param_gather=True),
            "parallel.overlap_param_gather needs parallel.distributed_optimizer: true",
        ),
    ],
)
def test_a_sharding_setting_where_it_cannot_apply_says_what_to_change(settings, message):
    problems = ParallelConfig(**settings).problems()
    assert len(problems) == 1 and problems[0].startswith(message), problems


@pytest.mark.parametrize(
    "settings",
    [
        dict(tensor_parallel=1, fsdp=True),
        dict(tensor_parallel=1, distributed_optimizer=True, overlap_grad_reduce=True, overlap_param_gather=True),
        dict(tensor_parallel=1, pipeline_parallel=2, overlap_grad_reduce=True),
    ],
)
def test_sharding_settings_where_they_apply_have_no_problems(settings):
    assert ParallelConfig(**settings).problems() == []


def test_a_parameter_fsdp_cannot_split_evenly_is_named():
    from training.model.fsdp import unshardable_parameters

    model = torch.nn.Module()
    model.even = torch.nn.Parameter(torch.zeros(4, 3))
    model.odd = torch.nn.Parameter(torch.zeros(5))
    assert unshardable_parameters(model, 1) == []
    (problem,) = unshardable_parameters(model, 2)
    assert problem.startswith("parallel.fsdp splits every parameter's first dimension over the 2 data-parallel ranks, ")
    assert "odd has shape (5,) (5 rows)" in problem and problem.endswith("or set parallel.fsdp: false")


def _megatron_optimizer(bucket_size: int | None) -> SimpleNamespace:
    """What restores_optimizer reads of a megatron optimizer: that it has one, and its DDP's bucket size."""
    chunk = SimpleNamespace(ddp_config=SimpleNamespace(bucket_size=bucket_size))
    return SimpleNamespace(sharded_state_dict=lambda *a, **k: {}, model_chunks=[chunk])


def test_a_megatron_optimizer_state_resumes_only_into_the_gradient_buckets_it_was_saved_with():
    # overlap_grad_reduce splits megatron's gradient buffers into buckets (off: one); the distributed optimizer's
    # shards follow the bucket boundaries, so its saved state fits only the same bucketing.
    layout = asdict(Layout(2, tensor_parallel=1, distributed_optimizer=True))
    saved = {"optimizer_format": optimizer_state.FORMAT, "optimizer_step": 4.0, "layout": layout}
    one_bucket, buckets = _megatron_optimizer(None), _megatron_optimizer(40_000_000)
    assert restores_optimizer(saved, one_bucket, layout)  # recorded before buckets were: one bucket, as then
    assert not restores_optimizer(saved, buckets, layout)
    assert restores_optimizer({**saved, "optimizer_bucket_size": 40_000_000}, buckets, layout)
    assert not restores_optimizer({**saved, "optimizer_bucket_size": 40_000_000}, one_bucket, layout)


def test_a_layout_recorded_before_fsdp_is_the_same_layout_without_it():
    old = {"world_size": 2, "tensor_parallel": 1, "pipeline_parallel": 1, "distributed_optimizer": True}
    saved = {"optimizer_format": optimizer_state.FORMAT, "optimizer_step": 4.0, "layout": old}
    assert restores_optimizer(saved, _megatron_optimizer(None), asdict(Layout(**old)))


def test_runs_show_and_the_runs_table_name_fsdp_and_read_old_records_as_without_it():
    span = {"first_step": 1, "last_step": 8, "layout": asdict(Layout(2, tensor_parallel=1, fsdp=True))}
    assert span_text(span) == (
        "steps 1-8: 2 ranks, tensor_parallel=1, pipeline_parallel=1, data_parallel=2, distributed_optimizer=false, fsdp=true"
    )
    assert layout_short(span) == "TP1 PP1 DP2 fsdp"
    old = {"first_step": 1, "last_step": 8, "layout": {"world_size": 2, "tensor_parallel": 1, "pipeline_parallel": 1}}
    assert span_text(old).endswith("distributed_optimizer=false, fsdp=false") and layout_short(old) == "TP1 PP1 DP2"
