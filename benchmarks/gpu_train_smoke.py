"""A short real training run on one GPU through the pipeline's own code: prepare a small
dataset from the standard library, ``training.train`` (megatron-core as shipped, bf16, our
Triton kernels), evaluate at TP=1, then load the Hugging Face export with ``transformers``
and compare its validation loss with ours.

This is the GPU path of `make demo` without Flyte. Prints one JSON object as the last line.

  python benchmarks/gpu_train_smoke.py [--steps N]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path

import torch

from data_prep.config import DataConfig, TokenizerConfig
from data_prep.prepare import prepare_dataset
from evaluation.config import EvalConfig
from evaluation.evaluate import evaluate
from storage import open_store
from training.config import ModelConfig, ParallelConfig, TrainConfig
from training.launch import launch
from training.train import train


def hf_loss(hf_dir: Path, rows: torch.Tensor) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir).cuda().eval()
    with torch.no_grad():
        logits = model(rows[:, :-1].cuda()).logits.float()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), rows[:, 1:].cuda().flatten()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=60)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        print(json.dumps({"cuda": False, "skipped": "no CUDA device"}))
        return
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
        store = open_store(tmp)
        started = time.perf_counter()
        data = DataConfig(max_documents=300, seq_len=512, workers=4)
        dataset = prepare_dataset(data, TokenizerConfig(vocab_size=8192), store)
        prepared = time.perf_counter() - started
        model = ModelConfig(num_layers=8, hidden_size=512, num_attention_heads=8, num_query_groups=4)
        steps = TrainConfig(
            steps=args.steps, micro_batch_size=16, global_batch_size=32, warmup_steps=10, checkpoint_every=args.steps
        )
        started = time.perf_counter()
        ckpt = launch(train, 1, dataset, model, ParallelConfig(tensor_parallel=1), steps)
        trained = time.perf_counter() - started
        lines = store.get_bytes(f"{ckpt.run}/metrics.jsonl").decode().splitlines()
        metrics = [json.loads(line) for line in lines]
        report = evaluate(ckpt, model, EvalConfig(max_batches=2, batch_size=8, sample_tokens=16))
        from data_prep.manifest import load_manifest, shard_urls
        from data_prep.shards import read_rows

        rows = read_rows(shard_urls(store, dataset, load_manifest(store, dataset), "val"))[:16]
        exported = Path(tmp) / "hf"
        store.download_dir(f"{report.outputs}/hf", exported)
        result = {
            "device": torch.cuda.get_device_name(),
            "prepare_s": round(prepared, 1),
            "train_s": round(trained, 1),
            "first_loss": metrics[0]["loss"],
            "last_loss": metrics[-1]["loss"],
            "tokens_per_s_last": metrics[-1].get("tokens_per_s"),
            "mfu_last": metrics[-1].get("mfu"),
            "val_loss": report.val_loss,
            "hf_val_loss": hf_loss(exported, torch.from_numpy(rows.astype("int64"))),
            "sample": report.sample,
        }
    print(json.dumps(result))


if __name__ == "__main__":
    main()
