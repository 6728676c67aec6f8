"""Per-step training metrics: the FLOP formula, MFU, and the JSONL/TensorBoard files of a real run."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from storage import open_store
from tests.helpers import fresh_copy, run_decks, run_metrics, tiny_model, view_of
from training.config import ModelConfig, ParallelConfig, TrainConfig
from training.launch import launch
from training.model.gpt import _padded_vocab
from training.observe.metrics import TENSORBOARD_TAGS, flops_per_token, mfu, non_embedding_params, table_peak
from training.train import train

ROOT = Path(__file__).resolve().parent.parent


def test_flops_per_token_of_the_350m_shape():
    # hidden 1024, 24 layers, ffn 2752 (8/3·h rounded up to 64), seq 2048, worked out by hand:
    # per layer 4·1024² (QKV + proj) + 3·1024·2752 (fc1 gate|up + fc2) + 2·1024 (norms).
    cfg = ModelConfig(num_layers=24, hidden_size=1024, num_attention_heads=16)
    assert non_embedding_params(cfg) == 24 * (4_194_304 + 8_454_144 + 2048) + 1024 == 303_612_928
    assert flops_per_token(303_612_928, 24, 1024, 2048) == 6 * 303_612_928 + 12 * 24 * 1024 * 2048 == 2_425_657_344


def test_grouped_query_attention_shrinks_the_key_value_projections():
    cfg = ModelConfig(num_layers=1, hidden_size=256, num_attention_heads=8, num_query_groups=2, ffn_hidden_size=512)
    # QKV: 256 × (256 + 2·2 heads·32); proj 256²; MLP 3·256·512; two norms; final norm.
    assert non_embedding_params(cfg) == 256 * (256 + 128) + 256 * 256 + 3 * 256 * 512 + 2 * 256 + 256


def test_mfu_against_the_data_sheet_peak():
    assert table_peak("NVIDIA H200", torch.bfloat16) == 989e12
    assert table_peak("NVIDIA H100 80GB HBM3", torch.bfloat16) == 989e12
    assert table_peak("NVIDIA H100 PCIe", torch.bfloat16) == 756e12
    assert table_peak("NVIDIA L4", torch.float32) == 30.3e12 and table_peak("NVIDIA L40S", torch.bfloat16) == 362e12
    assert table_peak("Some Future GPU", torch.bfloat16) is None
    # 8 H200s at 400 TFLOP/s of model FLOPs each: 3.2 PFLOP/s over 7.912 PFLOP/s of peak.
    assert mfu(8 * 400e12, 989e12, 8) == pytest.approx(400 / 989)


@pytest.mark.slow
def test_training_writes_metrics_jsonl_and_tensorboard(tiny_dataset, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = tiny_model()
    steps = TrainConfig(steps=4, micro_batch_size=4, global_batch_size=8, warmup_steps=1, checkpoint_every=2)
    ref = launch(train, 2, fresh_copy(tiny_dataset, tmp_path / "store"), model, ParallelConfig(tensor_parallel=1), steps)
    store = open_store(ref.store)
    records = run_metrics(store, ref.run)
    assert [r["step"] for r in records] == [1, 2, 3, 4]
    per_token = flops_per_token(non_embedding_params(model), model.num_layers, model.hidden_size, 32)
    for r in records:
        assert {"loss", "lr", "grad_norm", "tokens_per_s"} <= r.keys()
        assert r["model_flops_per_s"] == pytest.approx(per_token * r["tokens_per_s"])
        assert r["peak_flops_source"].startswith("measured") and r["peak_flops"] > 1e8  # CPU: a measured matmul rate
        assert r["mfu"] == pytest.approx(r["model_flops_per_s"] / (2 * r["peak_flops"]))
        assert 0 < r["mfu"] < 1 and r["peak_memory_mib"] > 100 and 0 <= r["data_wait_fraction"] < 1
    # The formula's N is the model's parameter count less the (tied) embedding table.
    assert ref.summary["parameters"] - _padded_vocab(384, 1) * model.hidden_size == non_embedding_params(model)

    events = store.list(f"{ref.run}/tensorboard")
    assert events and all(Path(key).name.startswith("events.out.tfevents") for key in events)
    local = store.download_dir(f"{ref.run}/tensorboard", tmp_path / "tb")
    scalars = EventAccumulator(str(local)).Reload()
    assert set(scalars.Tags()["scalars"]) == {f"train/{tag}" for tag in TENSORBOARD_TAGS} | {"heldout/loss"}
    # The held-out loss the training measured (train.val_every; at the last step at least) is its own curve.
    held_out = [(r["step"], r["heldout_loss"]) for r in records if "heldout_loss" in r]
    assert all(r["heldout_batches"] >= 1 and "val_loss" not in r for r in records if "heldout_loss" in r)
    assert held_out and held_out[-1][0] == records[-1]["step"]
    assert [(e.step, e.value) for e in scalars.Scalars("heldout/loss")] == [(s, pytest.approx(v)) for s, v in held_out]
    assert [e.step for e in scalars.Scalars("train/loss")] == [1, 2, 3, 4]
    assert [e.value for e in scalars.Scalars("train/loss")] == pytest.approx([r["loss"] for r in records])

    deck = run_decks(view_of(records))["Training curves"]
    # The loss (its learning rate on a second axis), gradient norm, tokens/s, MFU.
    assert deck.count("<svg") == 4 and "model FLOPs utilisation" in deck and "measured" in deck
    assert "learning rate" in deck


@pytest.mark.slow
def test_bench_train_runs(tmp_path):
    out = subprocess.run(
        # Dynamo traces the compiled variants; Inductor's code generation (tested by the compiled layout) is left out.
        [sys.executable, str(ROOT / "benchmarks" / "bench_train.py"), "--size", "tiny", "--steps", "2", "--device", "cpu"]
        + ["--compile-backend", "eager"],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["ours"]["tokens_per_s"] > 0 and result["plain"]["tokens_per_s"] > 0
    assert result["compile_backend"] == "eager" and result["ours"]["compiled"] and not result["ours_eager"]["compiled"]
    ratio = result["ours"]["tokens_per_s"] / result["plain"]["tokens_per_s"]
    assert result["ratio_ours_vs_plain"] == pytest.approx(ratio, abs=1e-3)  # the JSON rounds to 3 places
    assert abs(result["plain"]["parameters"] / result["ours"]["parameters"] - 1) < 0.01
    assert result["loader"]["tokens_per_s"] > 0 and result["ratio_loader_vs_consumption"] > 0
    stall = result["checkpoint"]  # (e), the smoke run's small model: the figures are there and consistent
    assert result["ratios"]["async_stall_vs_sync_save"] == stall["ratios"]["async_stall_vs_sync_save"] > 0
    assert 0 < stall["async_stall_s"]["median"] <= stall["async_complete_s"]["median"]
