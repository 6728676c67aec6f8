"""The megatron training step on one GPU (bf16 as shipped): megatron's DDP + distributed
optimizer (``MegatronStep``, fp32 main weights) against the plain step (``LocalStep``, torch
AdamW on bf16 weights) on the same data, and an interrupted distributed-optimizer run resumed
from its checkpoint against the uninterrupted one. One rank: NCCL cannot put two ranks on
one device, so pipeline stages and data-parallel sharding are covered by the CPU tests.

Prints one JSON object as the last line: the largest loss differences (bf16 and fp32 main
weights do not round alike, so the first is a sanity bound, not a tolerance) and whether the
resume reproduced the uninterrupted curve.

``--dry-run`` (``gpu_checks.sh --dry-run``) is ``--cpu`` at tiny sizes (60 documents, 2 layers,
4 steps, resumed from step 2), with CUDA hidden: the same three runs, to check the script only.

  python benchmarks/gpu_step_check.py [--steps N] [--cpu] [--dry-run]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

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


# The run's sizes: the GPU's (also --cpu's), and the dry run's (tests/helpers.py's tiny settings).
SIZES: dict[str, dict[str, Any]] = {
    "gpu": {
        "data": dict(max_documents=200, seq_len=256, workers=4),
        "vocab": 4096,
        "model": dict(num_layers=4, hidden_size=256, num_attention_heads=4),
        "train": dict(micro_batch_size=8, global_batch_size=16, warmup_steps=4),
        "steps": 20,
    },
    "dry_run": {
        "data": dict(max_documents=60, seq_len=32, sequences_per_sample=16, samples_per_shard=16, val_fraction=0.1, workers=2),
        "vocab": 384,
        "model": dict(num_layers=2, hidden_size=64, num_attention_heads=4),
        "train": dict(micro_batch_size=4, global_batch_size=8, warmup_steps=2),
        "steps": 4,
    },
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=0, help="optimizer steps (default: 20; dry run: 4)")
    parser.add_argument("--cpu", action="store_true", help="run without CUDA too (fp32): to check the script itself")
    parser.add_argument("--dry-run", action="store_true", help="--cpu at tiny sizes, CUDA hidden (no figures)")
    args = parser.parse_args()
    if args.dry_run:
        # The ranks put the model on the GPU whenever one exists: hide it from them (they inherit the
        # environment; CUDA is not initialised here yet).
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
        args.cpu = True
    if not torch.cuda.is_available() and not args.cpu:
        print(json.dumps({"cuda": False, "skipped": "no CUDA device"}))
        return
    size = SIZES["dry_run" if args.dry_run else "gpu"]
    args.steps = args.steps or size["steps"]
    with tempfile.TemporaryDirectory(prefix="gpu-step-") as tmp:
        root = Path(tmp)
        data = DataConfig(**size["data"])
        dataset = prepare_dataset(data, TokenizerConfig(vocab_size=size["vocab"]), open_store(str(root / "base")))

        def copy(name: str):  # the run id ignores the layout: one store per run
            shutil.copytree(Path(dataset.store) / dataset.prefix, root / name / dataset.prefix)
            return dataclasses.replace(dataset, store=str(root / name))

        model = ModelConfig(**size["model"])
        half = max(1, args.steps // 2)
        steps = TrainConfig(steps=args.steps, checkpoint_every=half, **size["train"])
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
        **({"dry_run": "tiny sizes on CPU: the figures mean nothing"} if args.dry_run else {}),
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
