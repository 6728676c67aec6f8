"""Pipeline parallelism and megatron's DDP + distributed optimizer: real two-rank gloo runs
whose loss curves must match a single-rank (TP=1, PP=1) run of the same data."""

import math
import shutil
from pathlib import Path

import pytest
import torch

from common.errors import ConfigError
from evaluation.config import EvalConfig
from evaluation.evaluate import evaluate
from storage import open_store
from tests.helpers import fresh_copy, losses, records, tiny_model
from training import cpu_compat
from training.checkpointing import checkpoint
from training.config import ModelConfig, ParallelConfig, TrainConfig
from training.distributed import check_parallel
from training.launch import launch
from training.train import train

MODEL = tiny_model()
# 10 steps, 2 micro-batches per step at data-parallel 1 (two 1F1B micro-batches on the pipeline).
STEPS = TrainConfig(steps=10, micro_batch_size=4, global_batch_size=8, warmup_steps=2, lr=3e-3, checkpoint_every=5)
TOLERANCE = 1e-5


@pytest.fixture(scope="module")
def single_rank(tiny_dataset, tmp_path_factory):
    dataset = fresh_copy(tiny_dataset, tmp_path_factory.mktemp("tp1"))
    return launch(train, 1, dataset, MODEL, ParallelConfig(tensor_parallel=1), STEPS)


@pytest.fixture(scope="module")
def pipeline_run(tiny_dataset, tmp_path_factory):
    parallel = ParallelConfig(tensor_parallel=1, pipeline_parallel=2)
    return launch(train, 2, fresh_copy(tiny_dataset, tmp_path_factory.mktemp("pp2")), MODEL, parallel, STEPS)


@pytest.fixture(scope="module")
def distopt_run(tiny_dataset, tmp_path_factory):
    parallel = ParallelConfig(tensor_parallel=1, distributed_optimizer=True)
    return launch(train, 2, fresh_copy(tiny_dataset, tmp_path_factory.mktemp("dp2-distopt")), MODEL, parallel, STEPS)


@pytest.mark.slow
def test_pipeline_parallel_matches_single_rank_curve(single_rank, pipeline_run):
    curve = losses(pipeline_run)
    assert len(curve) == STEPS.steps and curve[-1] < curve[0] - 0.3, curve
    assert curve == pytest.approx(losses(single_rank), abs=TOLERANCE)
    assert pipeline_run.summary["parameters"] == single_rank.summary["parameters"]
    assert checkpoint.committed_steps(open_store(pipeline_run.store), pipeline_run.run) == [5, 10]


def test_evaluation_loads_pipeline_checkpoint_at_one_stage(single_rank, pipeline_run):
    cfg = EvalConfig(max_batches=2, batch_size=4, sample_tokens=4, prompt="def ", lm_eval_tasks=[])
    report = evaluate(pipeline_run, MODEL, cfg)
    assert math.isfinite(report.val_loss) and report.sample.startswith("def ")
    # Same weights as the single-rank run up to float noise: the same validation loss.
    assert report.val_loss == pytest.approx(evaluate(single_rank, MODEL, cfg).val_loss, abs=1e-4)


@pytest.mark.slow
def test_distributed_optimizer_matches_single_rank_curve(single_rank, distopt_run):
    assert losses(distopt_run) == pytest.approx(losses(single_rank), abs=TOLERANCE)
    assert checkpoint.committed_steps(open_store(distopt_run.store), distopt_run.run) == [5, 10]


@pytest.mark.parametrize(
    "run,parallel",
    [
        ("pipeline_run", ParallelConfig(tensor_parallel=1, pipeline_parallel=2)),
        ("distopt_run", ParallelConfig(tensor_parallel=1, distributed_optimizer=True)),
    ],
    ids=["pipeline-parallel-2", "distributed-optimizer"],
)
@pytest.mark.slow
def test_megatron_optimizer_resumes_exactly(tiny_dataset, tmp_path, request, run, parallel):
    # Weights, AdamW moments and step count (megatron's sharded optimizer state) all come back.
    done = request.getfixturevalue(run)
    dataset = fresh_copy(tiny_dataset, tmp_path / "store")
    store = open_store(dataset.store)
    shutil.copytree(Path(done.store) / done.run, Path(dataset.store) / done.run)
    store.delete_prefix(checkpoint.checkpoint_prefix(done.run, 10))  # as if it crashed after step 5
    ref = launch(train, 2, dataset, MODEL, parallel, STEPS)
    assert checkpoint.committed_steps(store, ref.run) == [5, 10]
    assert records(ref)[:5] == records(done)[:5]  # resumed, not retrained: the first run's own records
    # Fresh moments would be off by ~5e-5 from step 7 on (the other-layout test below).
    assert losses(ref) == pytest.approx(losses(done), abs=1e-6)


@pytest.mark.slow
def test_distributed_optimizer_checkpoint_resumes_weights_at_another_layout(tiny_dataset, distopt_run, tmp_path):
    # One process without the distributed optimizer: the weights reshard, the optimizer starts afresh.
    dataset = fresh_copy(tiny_dataset, tmp_path / "store")
    store = open_store(dataset.store)
    shutil.copytree(Path(distopt_run.store) / distopt_run.run, Path(dataset.store) / distopt_run.run)
    store.delete_prefix(checkpoint.checkpoint_prefix(distopt_run.run, 10))
    ref = launch(train, 1, dataset, MODEL, ParallelConfig(tensor_parallel=1), STEPS)
    assert checkpoint.committed_steps(store, ref.run) == [5, 10]
    assert records(ref)[:5] == records(distopt_run)[:5]  # resumed: steps 1-5 are the first run's own records
    # Step 6's loss is computed by the weights of step 5, before any optimizer update; from
    # step 7 on, fresh AdamW moments take another path.
    assert losses(ref)[:6] == pytest.approx(losses(distopt_run)[:6], abs=TOLERANCE)
    assert max(abs(a - b) for a, b in zip(losses(ref)[6:], losses(distopt_run)[6:], strict=True)) > TOLERANCE


@pytest.mark.parametrize(
    "model,parallel,message",
    [
        (ModelConfig(num_layers=3), ParallelConfig(tensor_parallel=1, pipeline_parallel=2), "num_layers=3 is not divisible"),
        (MODEL, ParallelConfig(tensor_parallel=1, sequence_parallel=True), "sequence_parallel needs"),
        (MODEL, ParallelConfig(tensor_parallel=1, pipeline_parallel=0), "must be ≥ 1"),
    ],
)
def test_invalid_parallel_layouts_are_named(model, parallel, message):
    with pytest.raises(ConfigError, match=message):
        check_parallel(parallel, model)


def test_cpu_factories_and_type_names_are_scoped():
    if cpu_compat.cuda_available():
        pytest.skip("the shims apply only without CUDA")
    fake = cpu_compat.TorchOnCpu()
    assert fake.zeros(2, device="cuda").device.type == "cpu" and fake.tensor([1.0], device="cuda:0").device.type == "cpu"
    assert fake.float32 is torch.float32 and fake.distributed is torch.distributed
    x = torch.zeros(1)
    with cpu_compat.cuda_type_names():
        assert x.type() == "torch.cuda.FloatTensor" and x.type(torch.float64).dtype == torch.float64
    assert x.type() == "torch.FloatTensor"
