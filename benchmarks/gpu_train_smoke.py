"""A short real training run on one GPU through the pipeline's own code: prepare a small
dataset from the standard library, ``training.train`` (megatron-core as shipped, bf16, our
Triton kernels), evaluate at TP=1, then load the Hugging Face export with ``transformers``
and compare its validation loss with ours.

This is the GPU path of `make demo` without Flyte. Prints one JSON object as the last line.

``--fp8`` then trains the same run with ``train.precision: fp8`` (tensorwise) on the same data and reports its
losses beside bf16's (``fp8``: first and last loss, ``last_loss_vs_bf16``, tokens/s). Where no GPU has FP8
GEMMs (the dry run's CPU) that run must be refused with one line naming the rank before it starts
(``fp8.refused``); any other outcome fails the step.

``--dry-run`` runs the same code on CPU (fp32, gloo) at tiny sizes (60 documents, 2 layers, 4 steps
unless --steps says otherwise), for ``gpu_checks.sh --dry-run``: its figures mean nothing.

  python benchmarks/gpu_train_smoke.py [--steps N] [--fp8] [--dry-run]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

from common.contracts import metrics_key
from common.errors import UserError
from data_prep.config import DataConfig, TokenizerConfig
from data_prep.prepare import prepare_dataset
from evaluation.config import EvalConfig
from evaluation.evaluate import evaluate
from runs.records import read_jsonl
from storage import open_store
from training.config import ModelConfig, ParallelConfig, TrainConfig
from training.launch import launch
from training.model.fp8 import hardware_problem
from training.train import train

# The run's sizes: the GPU's, and the dry run's (tests/helpers.py's tiny settings, the same shape of
# run: two micro-batches per step, grouped-query attention, a checkpoint at the last step). No lm-eval
# suites: lm-evaluation-harness brings datasets, pandas, pyarrow and scipy, over 100 MB of wheels where a
# GPU run carries 64 MiB (benchmarks/gpu_wheels.py); they run on the same export in CI (tests/test_lm_eval.py).
SIZES: dict[str, dict[str, Any]] = {
    "gpu": {
        "data": dict(max_documents=300, seq_len=512, workers=4),
        "vocab": 8192,
        "model": dict(num_layers=8, hidden_size=512, num_attention_heads=8, num_query_groups=4),
        "train": dict(micro_batch_size=16, global_batch_size=32, warmup_steps=10),
        "eval": dict(max_batches=2, batch_size=8, sample_tokens=16, lm_eval_tasks=[]),
        "steps": 60,
    },
    "dry_run": {
        "data": dict(max_documents=60, seq_len=32, sequences_per_sample=16, samples_per_shard=16, val_fraction=0.1, workers=2),
        "vocab": 384,
        "model": dict(num_layers=2, hidden_size=64, num_attention_heads=4, num_query_groups=2),
        "train": dict(micro_batch_size=4, global_batch_size=8, warmup_steps=2),
        "eval": dict(max_batches=2, batch_size=8, sample_tokens=16, lm_eval_tasks=[]),
        "steps": 4,
    },
}


def hf_loss(hf_dir: Path, rows: torch.Tensor, device: str) -> float:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(hf_dir).to(device).eval()
    with torch.no_grad():
        logits = model(rows[:, :-1].to(device)).logits.float()
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), rows[:, 1:].to(device).flatten()).item()


def fp8_run(dataset, model: ModelConfig, steps: TrainConfig, bf16_metrics: list[dict], store) -> dict:
    """The same run in FP8 (its own run id: precision is part of it); refused with one line without FP8 GEMMs."""
    fp8 = replace(steps, precision="fp8", fp8_recipe="tensorwise")
    expected_refusal = hardware_problem()
    try:
        ckpt = launch(train, 1, dataset, model, ParallelConfig(tensor_parallel=1), fp8)
    except UserError as refused:
        line = str(refused)
        # The launcher's one line: the rank that failed first, while starting, with the rank's own refusal.
        refusal = "rank 0 failed first, while starting: ConfigError: train.precision is 'fp8' but rank 0 on "
        if not expected_refusal or "\n" in line or not line.startswith(refusal):
            raise
        return {"refused": line}
    if expected_refusal:
        raise RuntimeError(f"train.precision: fp8 ran where it must be refused ({expected_refusal})")
    metrics = read_jsonl(store, metrics_key(ckpt.run))
    return {
        "recipe": "tensorwise",
        "first_loss": metrics[0]["loss"],
        "last_loss": metrics[-1]["loss"],
        "last_loss_vs_bf16": round(metrics[-1]["loss"] / bf16_metrics[-1]["loss"], 4),
        "tokens_per_s_last": metrics[-1].get("tokens_per_s"),
        "tokens_per_s_last_vs_bf16": round(metrics[-1]["tokens_per_s"] / bf16_metrics[-1]["tokens_per_s"], 3)
        if metrics[-1].get("tokens_per_s") and bf16_metrics[-1].get("tokens_per_s")
        else None,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=0, help="optimizer steps (default: 60; dry run: 4)")
    parser.add_argument("--fp8", action="store_true", help="then the same run in FP8 (refused, in one line, without FP8 GEMMs)")
    parser.add_argument("--dry-run", action="store_true", help="on CPU at tiny sizes, to check the script (no figures)")
    args = parser.parse_args()
    if args.dry_run:
        # training.train and the evaluation put the model on the GPU whenever one exists: hide it, from
        # the ranks too (they inherit the environment; CUDA is not initialised here yet).
        os.environ["CUDA_VISIBLE_DEVICES"] = ""
    elif not torch.cuda.is_available():
        print(json.dumps({"cuda": False, "skipped": "no CUDA device"}))
        return
    size = SIZES["dry_run" if args.dry_run else "gpu"]
    device = "cpu" if args.dry_run else "cuda"
    n_steps = args.steps or size["steps"]
    with tempfile.TemporaryDirectory(prefix="gpu-smoke-") as tmp:
        store = open_store(tmp)
        started = time.perf_counter()
        data = DataConfig(**size["data"])
        dataset = prepare_dataset(data, TokenizerConfig(vocab_size=size["vocab"]), store)
        prepared = time.perf_counter() - started
        model = ModelConfig(**size["model"])
        steps = TrainConfig(steps=n_steps, checkpoint_every=n_steps, **size["train"])
        started = time.perf_counter()
        ckpt = launch(train, 1, dataset, model, ParallelConfig(tensor_parallel=1), steps)
        trained = time.perf_counter() - started
        metrics = read_jsonl(store, metrics_key(ckpt.run))
        report = evaluate(ckpt, model, EvalConfig(**size["eval"]))
        from data_prep.manifest import load_manifest, shard_urls
        from data_prep.shards import read_rows

        rows = read_rows(shard_urls(store, dataset, load_manifest(store, dataset), "val"))[:16]
        exported = Path(tmp) / "hf"
        store.download_dir(f"{report.outputs}/hf", exported)
        result = {
            "device": "cpu (dry run: the figures mean nothing)" if args.dry_run else torch.cuda.get_device_name(),
            "prepare_s": round(prepared, 1),
            "train_s": round(trained, 1),
            "first_loss": metrics[0]["loss"],
            "last_loss": metrics[-1]["loss"],
            "tokens_per_s_last": metrics[-1].get("tokens_per_s"),
            "mfu_last": metrics[-1].get("mfu"),
            "val_loss": report.val_loss,
            "hf_val_loss": hf_loss(exported, torch.from_numpy(rows.astype("int64")), device),
            "sample": report.sample,
        }
        if args.fp8:
            result["fp8"] = fp8_run(dataset, model, steps, metrics, store)
    print(json.dumps(result))


if __name__ == "__main__":
    main()
