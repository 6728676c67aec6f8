"""The megatron training step on one GPU (bf16 as shipped): megatron's DDP + distributed
optimizer (``MegatronStep``, fp32 main weights) against the plain step (``LocalStep``, torch
AdamW on bf16 weights) on the same data, and an interrupted distributed-optimizer run resumed
from its checkpoint against the uninterrupted one. One rank: NCCL cannot put two ranks on
one device, so pipeline stages and data-parallel sharding are covered by the CPU tests.

Prints one JSON object as the last line: the largest loss differences (bf16 and fp32 main
weights do not round alike, so the first is a sanity bound, not a tolerance) and whether the
resume reproduced the uninterrupted curve.

  python benchmarks/gpu_step_check.py [--steps N] [--cpu]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import tempfile
from pathlib import Path

import torch

from data_prep.config import DataConfig, TokenizerConfig
from data_prep.prepare import prepare_dataset
from storage import open_store
from training.checkpointing import checkpoint
from training.config import ModelConfig, ParallelConfig, TrainConfig
from training.launch import launch
from training.train import train


def losses(ref) -> list[float]:
    lines = open_store(ref.store).get_bytes(f"{ref.run}/metrics.jsonl").decode().splitlines()
    return [json.loads(line)["loss"] for line in lines]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--cpu", action="store_true", help="run without CUDA too (fp32): to check the script itself")
    args = parser.parse_args()
    if not torch.cuda.is_available() and not args.cpu:
        print(json.dumps({"cuda": False, "skipped": "no CUDA device"}))
        return
    with tempfile.TemporaryDirectory(prefix="gpu-step-") as tmp:
        root = Path(tmp)
        data = DataConfig(max_documents=200, seq_len=256, workers=4)
        dataset = prepare_dataset(data, TokenizerConfig(vocab_size=4096), open_store(str(root / "base")))

        def copy(name: str):  # the run id ignores the layout: one store per run
            shutil.copytree(Path(dataset.store) / dataset.prefix, root / name / dataset.prefix)
            return dataclasses.replace(dataset, store=str(root / name))

        model = ModelConfig(num_layers=4, hidden_size=256, num_attention_heads=4)
        half = max(1, args.steps // 2)
        steps = TrainConfig(steps=args.steps, micro_batch_size=8, global_batch_size=16, warmup_steps=4, checkpoint_every=half)
        plain = losses(launch(train, 1, copy("plain"), model, ParallelConfig(tensor_parallel=1), steps))
        megatron_parallel = ParallelConfig(tensor_parallel=1, distributed_optimizer=True)
        done = launch(train, 1, copy("distopt"), model, megatron_parallel, steps)
        distopt = losses(done)
        again = copy("resume")
        shutil.copytree(Path(done.store) / done.run, Path(again.store) / done.run)
        open_store(again.store).delete_prefix(checkpoint.checkpoint_prefix(done.run, args.steps))
        resumed = losses(launch(train, 1, again, model, megatron_parallel, steps))
    result = {
        "device": torch.cuda.get_device_name() if torch.cuda.is_available() else "cpu",
        "first_loss": plain[0],
        "last_loss_plain": plain[-1],
        "last_loss_distributed_optimizer": distopt[-1],
        "max_diff_plain_vs_distributed_optimizer": max(abs(a - b) for a, b in zip(plain, distopt, strict=True)),
        "max_diff_resumed_vs_uninterrupted": max(abs(a - b) for a, b in zip(distopt, resumed, strict=True)),
        "learned": distopt[-1] < distopt[0] - 0.5,
    }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
