"""How long a checkpoint stops the step loop: an asynchronous save against a synchronous one of the same state.

    python benchmarks/bench_checkpoint.py [--repeats 3] [--layers 8] [--hidden 640] [--store s3|local] [--min-parameters N]
                                          [--device cpu|cuda]

A world of one rank (``training.distributed.init_distributed(standalone=True)``) holds a GPT of ≥ 50 M
parameters built by ``training.model.step.build_step`` (the trainer's own model and torch AdamW, with
moments: weights + two moments, fp32 on the CPU, are what each checkpoint writes). ``--device cuda``: the
model is built on the GPU, in bf16 as the trainer builds it there (its moments too), the world's default
group is NCCL, and the stall includes the device-to-host copy of every tensor; the default, ``cpu``, hides
CUDA from the process. Each repeat saves the same state
twice, in rotated order, to the project's SeaweedFS S3 server on 127.0.0.1 (``--store local``: a file
store), through ``training.checkpointing.saving.start_save``:

- ``sync``: ``background=False``: the step loop waits for the whole save (plan, write, digests, upload,
  commit), as it did before asynchronous checkpoints;
- ``async``: ``background=True``: the stall is the time ``start_save`` takes (the plan and the copy of every
  tensor to host memory); the rest completes in a thread, timed as ``complete_s`` until ``wait`` returns.

Checked before anything is reported (``BenchmarkCheckError``): every save committed, and the two saves of a
repeat hold byte-identical tensor files (the digests of ``model/*.distcp`` equal): a fast save of the wrong
bytes is not timed. The last line of stdout is one JSON object: ``sync_save_s``, ``async_stall_s``,
``async_complete_s`` (median, min, max), ``parameters``, ``checkpoint_mb``, and ``ratios`` /
``spread``: ``async_stall_vs_sync_save`` (goal ≤ 0.15), the median and [min, max] of the per-repeat ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from machine_info import machine, ratio_keys, require, spread  # noqa: E402  benchmarks/ (the script's folder)

BUCKET = "bench-checkpoint"
GOAL = 0.15


@contextlib.contextmanager
def checkpoint_store(kind: str, folder: Path) -> Iterator[str]:
    """The store URI the saves go to: a SeaweedFS S3 server of its own (its AWS variables set meanwhile), or a folder."""
    if kind == "local":
        yield str(folder / "store")
        return
    from bench_loader import s3_environment  # benchmarks/ (the script's folder)

    from storage.s3server import S3Server

    with S3Server(data_dir=folder / "s3", bucket=BUCKET) as server, s3_environment(server):
        yield f"s3://{BUCKET}/store"


def tensor_digests(store, prefix: str) -> dict[str, str]:
    digests = store.get_json(f"{prefix}/digests.json")["files"]
    return {name: d for name, d in digests.items() if name.endswith(".distcp")}


def measure(
    repeats: int = 3,
    layers: int = 8,
    hidden: int = 640,
    store_kind: str = "s3",
    vocab: int = 32000,
    min_parameters: int = 50_000_000,
) -> dict:
    """Per-repeat sync and async saves of one state (see the module docstring); the result dict."""
    import torch

    from storage import open_store
    from training.checkpointing import checkpoint
    from training.checkpointing.saving import start_save
    from training.config import ModelConfig, ParallelConfig, TrainConfig
    from training.distributed import init_distributed, shutdown_distributed
    from training.model.step import build_step

    parallel = ParallelConfig(tensor_parallel=1)
    cfg = TrainConfig(steps=1, micro_batch_size=1, global_batch_size=1, seed=1)
    model_cfg = ModelConfig(num_layers=layers, hidden_size=hidden, num_attention_heads=max(1, hidden // 64), kernels="torch")
    init_distributed(parallel, cfg.seed, standalone=True)
    times: dict[str, list[float]] = {"sync": [], "async": [], "complete": []}
    try:
        step = build_step(model_cfg, parallel, cfg, vocab, 256)
        parameters = step.num_parameters()
        require(parameters >= min_parameters, f"the model has {parameters:,} parameters, fewer than {min_parameters:,}")
        checkpoint._init_adam_state(step.optimizer)
        with torch.no_grad():
            for p in checkpoint._optimizer_params(step.optimizer):
                step.optimizer.state[p]["exp_avg"].normal_()
                step.optimizer.state[p]["exp_avg_sq"].uniform_()
        first = next(step.model.parameters())
        if first.device.type == "cuda":
            torch.cuda.synchronize(first.device)  # the moments' initialisation is not timed in the first save
        with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as tmp, checkpoint_store(store_kind, Path(tmp)) as uri:
            store = open_store(uri)
            save_step = 0
            for repeat in range(repeats):
                order = ("sync", "async") if repeat % 2 == 0 else ("async", "sync")
                prefixes = {}
                for mode in order:
                    save_step += 1
                    run = f"runs/bench-{mode}"
                    t0 = time.perf_counter()
                    pending = start_save(
                        store, run, save_step, step.model, step.optimizer, {}, keep=1, background=mode == "async"
                    )
                    stall = time.perf_counter() - t0
                    prefixes[mode] = pending.wait()
                    total = time.perf_counter() - t0
                    require(store.is_committed(prefixes[mode]), f"{mode} save {prefixes[mode]} is not committed")
                    if mode == "sync":
                        times["sync"].append(total)
                    else:
                        times["async"].append(stall)
                        times["complete"].append(total)
                    print(f"repeat {repeat + 1}: {mode:<5} stall {stall:7.3f} s, committed after {total:7.3f} s", flush=True)
                mine, theirs = tensor_digests(store, prefixes["async"]), tensor_digests(store, prefixes["sync"])
                require(mine and mine == theirs, f"repeat {repeat + 1}: the async save's tensor files differ from the sync one's")
            size = sum(info.size for info in store.list_info(prefixes["sync"]))
    finally:
        shutdown_distributed()
    ratios = [a / s for a, s in zip(times["async"], times["sync"], strict=True)]
    keys = ratio_keys({"async_stall_vs_sync_save": ratios})
    return {
        "parameters": parameters,
        "shape": {"num_layers": layers, "hidden_size": hidden, "vocab": vocab},
        "checkpoint_mb": round(size / 1e6, 1),
        "store": store_kind,
        "device": first.device.type,
        "dtype": str(first.dtype).removeprefix("torch."),
        "repeats": repeats,
        "sync_save_s": {k: round(v, 3) for k, v in spread(times["sync"]).items()},
        "async_stall_s": {k: round(v, 3) for k, v in spread(times["async"]).items()},
        "async_complete_s": {k: round(v, 3) for k, v in spread(times["complete"]).items()},
        "ratios": {k: round(v, 3) for k, v in keys["ratios"].items()},
        "spread": {k: [round(x, 3) for x in v] for k, v in keys["spread"].items()},
        "goal": {"async_stall_vs_sync_save": f"<= {GOAL}", "met": keys["ratios"]["async_stall_vs_sync_save"] <= GOAL},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--hidden", type=int, default=640)
    parser.add_argument("--store", choices=("s3", "local"), default="s3")
    parser.add_argument("--min-parameters", type=int, default=50_000_000, help="refuse a smaller model (the goal's size)")
    parser.add_argument(
        "--device", choices=("cpu", "cuda"), default="cpu", help="cuda: the model on the GPU (bf16) and NCCL as the default group"
    )
    args = parser.parse_args()
    import torch

    if args.device == "cpu":
        torch.cuda.is_available = lambda: False  # type: ignore[assignment]  # a CPU measurement, as bench_train's
    else:
        require(torch.cuda.is_available(), "--device cuda: torch sees no CUDA device")
    result = measure(args.repeats, args.layers, args.hidden, args.store, min_parameters=args.min_parameters)
    require(result["device"] == args.device, f"the model was built on {result['device']}, not {args.device}")
    result["machine"] = machine(["torch", "megatron-core"])
    print(json.dumps(result))


if __name__ == "__main__":
    main()
