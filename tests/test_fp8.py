"""``train.precision: fp8``: the transformer layers' linears multiply as torchao's Float8Linear does, and a run
refuses where no GPU can run FP8 before anything starts.

The model checks run the FP8 casts and ``torch._scaled_mm`` on the CPU, in this process (a world of one).
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from cli.main import main
from common.contracts import DatasetRef
from common.errors import ConfigError
from pipeline.config import parse_config
from tests.helpers import fp8_linears_against_torchao, tiny_model, torchao_float8_linear
from training.config import ModelConfig, ParallelConfig, TrainConfig
from training.distributed import init_distributed, shutdown_distributed
from training.launch import launch
from training.model.fp8 import fp8_linears
from training.model.gpt import build_gpt, mean_loss

MODEL = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4, kernels="torch")
VOCAB, SEQ = 128, 32
LINEARS = ("self_attention.linear_qkv", "self_attention.linear_proj", "mlp.linear_fc1", "mlp.linear_fc2")


@pytest.fixture
def world_of_one():
    init_distributed(ParallelConfig(tensor_parallel=1), seed=0, standalone=True)
    yield
    shutdown_distributed()


def _model(fp8_recipe: str = ""):
    torch.manual_seed(5)
    return build_gpt(MODEL, VOCAB, SEQ, tensor_parallel=1, init_seed=5, fp8_recipe=fp8_recipe)


def _tokens() -> torch.Tensor:
    return torch.randint(0, VOCAB, (4, SEQ + 1), generator=torch.Generator().manual_seed(1))


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_each_linear_computes_what_torchaos_float8linear_computes_output_and_gradients(world_of_one, recipe):
    model = _model(recipe)
    column, row = fp8_linears()
    layer = model.decoder.layers[0]
    for name in LINEARS:
        ours = layer.get_submodule(name)
        assert isinstance(ours, column if name.endswith(("qkv", "fc1")) else row), name
        peer = torchao_float8_linear(ours.weight, recipe)
        x = torch.randn(SEQ, 4, ours.weight.shape[1], generator=torch.Generator().manual_seed(2))
        x_ours, x_peer = x.clone().requires_grad_(), x.clone().requires_grad_()
        out, _ = ours(x_ours)
        expected = peer(x_peer)
        grad = torch.randn(out.shape, generator=torch.Generator().manual_seed(3))
        out.backward(grad)
        expected.backward(grad)
        assert torch.equal(out, expected), name
        assert torch.equal(x_ours.grad, x_peer.grad), name
        assert torch.equal(ours.weight.grad, peer.weight.grad), name
        assert not torch.equal(out, x @ ours.weight.t()), name  # FP8's rounding, not a full-precision matmul


def test_an_fp8_model_is_the_plain_model_with_its_linears_rounded_to_fp8(world_of_one):
    plain, fp8 = _model(), _model("tensorwise")
    assert type(fp8.output_layer) is type(plain.output_layer)  # the output layer and loss stay as they are
    assert [n for n, _ in fp8.named_parameters()] == [n for n, _ in plain.named_parameters()]  # one checkpoint layout
    for a, b in zip(plain.parameters(), fp8.parameters(), strict=True):
        assert torch.equal(a, b)  # the same initialisation
    tokens = _tokens()
    losses = []
    for model in (plain, fp8):
        loss = mean_loss(model, tokens)
        loss.backward()
        losses.append(loss.item())
    assert losses[0] != losses[1] and abs(losses[1] - losses[0]) < 0.01 * losses[0], losses
    for (name, a), b in zip(plain.named_parameters(), fp8.parameters(), strict=True):
        # FP8's rounding (e5m2 gradients: two mantissa bits) moves each gradient by 2-10 % here, not its direction.
        error = ((b.grad - a.grad).norm() / a.grad.norm()).item()
        cosine = torch.nn.functional.cosine_similarity(a.grad.flatten(), b.grad.flatten(), dim=0).item()
        assert error < 0.15 and cosine > 0.99, (name, error, cosine)
        if any(f"{linear}.weight" in name for linear in LINEARS):
            assert error > 0.01, (name, error)  # their weight gradients came from FP8 GEMMs


@pytest.mark.slow
def test_at_tp2_with_sequence_parallelism_each_rank_computes_what_torchao_computes_on_its_shard():
    # Megatron's regions around the FP8 matmul: the sequence gathered before fc1, its gradient reduce-scattered; fc2's
    # output reduce-scattered. Each rank compares with torchao on its own weight shard (tensorwise scales are per shard).
    assert launch(fp8_linears_against_torchao, 2, MODEL, "tensorwise", VOCAB, SEQ, 4) == {"rank": 0, "checked": 6}


def _parse(tmp_path: Path, monkeypatch, profile: str | None, precision: str = "fp8", **train) -> None:
    if profile is None:
        monkeypatch.delenv("PRETRAIN_CLUSTER", raising=False)  # the local profile
    else:
        monkeypatch.setenv("PRETRAIN_CLUSTER", profile)
    parse_config({"store": str(tmp_path / "store"), "train": {"precision": precision, **train}})


def test_fp8_is_refused_at_launch_where_no_gpu_can_run_it(tmp_path, monkeypatch, capsys):
    with pytest.raises(ConfigError) as cpu_profile:
        _parse(tmp_path, monkeypatch, None)
    lines = [line for line in str(cpu_profile.value).splitlines() if "precision" in line]
    assert len(lines) == 1 and "cluster profile local trains on CPUs (gpus_per_node: 0)" in lines[0], lines
    assert "compute capability 8.9" in lines[0] and "set train.precision: bf16" in lines[0]

    # One GPU, on this machine (which has none): the profile passes; `pretrain check` and `pretrain run` look here.
    here = tmp_path / "workstation.yaml"
    here.write_text("nnodes: 1\nnproc_per_node: 2\ngpus_per_node: 2\n")
    _parse(tmp_path, monkeypatch, str(here))
    status = main(["check", "--set", "train.precision=fp8", "--store", str(tmp_path / "store")])
    stderr = capsys.readouterr().err.strip()
    assert status == 2 and "\n" not in stderr, stderr
    assert stderr.startswith(
        "error: train.precision is 'fp8' but this machine (cluster profile workstation trains here) cannot run it: "
        "this machine has no CUDA GPU; FP8 needs NVIDIA GPUs of compute capability 8.9"
    ), stderr

    # A remote cluster's GPUs are checked where they are (each rank, below); bf16 passes everywhere.
    gpus = str(Path(__file__).parents[1] / "configs/cluster/gpu-2x8.yaml")
    _parse(tmp_path, monkeypatch, gpus, global_batch_size=64)  # its data-parallel size is 8
    _parse(tmp_path, monkeypatch, None, precision="bf16")
    with pytest.raises(ConfigError, match=r"train\.precision.*'fp16'"):
        _parse(tmp_path, monkeypatch, None, precision="fp16")


def test_a_rank_without_fp8_gpus_refuses_before_it_joins_the_job():
    from training.train import train

    cfg = TrainConfig(steps=2, micro_batch_size=2, global_batch_size=2, precision="fp8")
    dataset = DatasetRef(store="/nonexistent-store", version="v", prefix="datasets/v")
    with pytest.raises(ConfigError) as refused:
        train(dataset, tiny_model(), ParallelConfig(tensor_parallel=1), cfg)
    message = str(refused.value)
    assert "\n" not in message and message.startswith("train.precision is 'fp8' but rank 0 on "), message
    assert "cannot run it: this machine has no CUDA GPU" in message
    assert not dist.is_initialized()  # no process group was joined, nothing was read or written
