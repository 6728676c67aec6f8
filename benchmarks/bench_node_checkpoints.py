"""What checkpoints kept on the node cost a run that nobody kills: the same training with and without them.

    python benchmarks/bench_node_checkpoints.py [--repeats 3] [--steps 400] [--checkpoint-every 100] [--every 25]

``train.local_checkpoint_every`` (``training/checkpointing/local_copy.py``) saves a checkpoint to the node's disk
between the store's: a restart in place goes back fewer steps (``make soak-goodput`` measures that gain), and every
such save stalls the step loop for its snapshot and writes and hashes its files in the background. This benchmark
measures that price. Each repeat trains the same run twice, in rotated order, each in a store of its own: two ranks
(tensor parallel, as the soak's run), the soak's model shape (2 layers, hidden 64, sequences of 64 tokens, a
vocabulary of 1,024), a checkpoint to the store every ``--checkpoint-every`` steps (asynchronous, as the default),
and

- ``plain``: no node checkpoints (``local_checkpoint_every=0``);
- ``node``: one every ``--every`` steps (``keep_local_checkpoints=1``).

Timed, after one untimed short run (the fork server's start): the training call's wall time (the launch of the
ranks included, the same for both) and the goodput ledger's fraction of the run (``runs.ledger``: productive
seconds over the run's wall time). Checked before anything is
reported (``BenchmarkCheckError``): both runs have the same run id, committed the same steps, and end with the same
weights and optimizer moments bit for bit (a node checkpoint changes no result); the node run saved its node
checkpoints (their steps in the ledger's record) and the plain run none. The last line of stdout is one JSON
object: ``ratios.node_vs_plain_wall`` (≥ 1: what node checkpoints cost) and ``ratios.node_vs_plain_goodput``
(≤ 1), with their ``spread`` ([min, max] over the repeats).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

from machine_info import machine, ratio_keys, require  # noqa: E402  benchmarks/ (the script's folder)


def train_once(dataset, cfg, root: Path) -> dict:
    """One training run of ``cfg`` in a store of its own under ``root``: its wall time, goodput and final state."""
    from common.contracts import committed_steps
    from runs.ledger import load_goodput, read_attempts
    from storage import open_store
    from tests.helpers import checkpoint_state, fresh_copy, tiny_model
    from training.config import ParallelConfig
    from training.launch import launch
    from training.train import train

    copy = fresh_copy(dataset, root)
    parallel = ParallelConfig(tensor_parallel=2)
    started = time.perf_counter()
    ref = launch(train, 2, copy, tiny_model(), parallel, cfg)
    wall = time.perf_counter() - started
    store = open_store(ref.store)
    goodput = load_goodput(store, ref.run)
    require(goodput is not None and goodput.fraction is not None, f"{ref.run} has no goodput ledger")
    attempts = read_attempts(store, ref.run)
    require(len(attempts) == 1, f"{ref.run}: {len(attempts)} attempts, not 1")
    (root / "state").mkdir()
    return {
        "run": ref.run,
        "wall_s": wall,
        "goodput": goodput.fraction,
        "checkpoint_save_s": goodput.parts["checkpoint_save"],
        "committed": committed_steps(store, ref.run),
        "saved_steps": sorted(attempts[0]["productive_at_step"]),
        "tensors": checkpoint_state(ref.store, ref.prefix, root / "state")["tensors"],
    }


def check(plain: dict, node: dict, cfg) -> None:
    """The two runs trained the same thing (refusing to time a node checkpoint that changed a result)."""
    require(plain["run"] == node["run"], f"run ids differ: {plain['run']} and {node['run']}")
    require(plain["committed"] == node["committed"], f"committed steps differ: {plain['committed']} {node['committed']}")
    require(plain["tensors"].keys() == node["tensors"].keys(), "the final checkpoints hold different tensors")
    differ = [k for k in plain["tensors"] if not plain["tensors"][k].equal(node["tensors"][k])]
    require(not differ, f"weights or moments differ after node checkpoints: {differ[:5]}")
    expected = [s for s in range(cfg.local_checkpoint_every, cfg.steps, cfg.local_checkpoint_every) if s % cfg.checkpoint_every]
    node_only = [s for s in node["saved_steps"] if s % cfg.checkpoint_every and s != cfg.steps]
    require(node_only == expected, f"the node run saved node checkpoints at {node_only}, not {expected}")
    require(all(s % cfg.checkpoint_every == 0 or s == cfg.steps for s in plain["saved_steps"]), "the plain run saved on the node")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--checkpoint-every", type=int, default=100)
    parser.add_argument("--every", type=int, default=25, help="train.local_checkpoint_every of the node run")
    args = parser.parse_args()

    from data_prep.prepare import prepare_dataset
    from storage import open_store
    from tests.helpers import tiny_data, tiny_tokenizer
    from training.config import TrainConfig

    plain_cfg = TrainConfig(
        steps=args.steps,
        micro_batch_size=4,
        global_batch_size=8,
        warmup_steps=4,
        checkpoint_every=args.checkpoint_every,
        keep_checkpoints=2,
        log_every=args.steps,
        val_every=0,
        seed=5150,
    )
    node_cfg = dataclasses.replace(plain_cfg, local_checkpoint_every=args.every, keep_local_checkpoints=1)
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-node-checkpoints-") as tmp:
        work = Path(tmp)
        dataset = prepare_dataset(tiny_data(seq_len=64), tiny_tokenizer(vocab_size=1024), open_store(str(work / "dataset")))
        # Untimed: the first launch starts the fork server and warms the imports every later one finds ready.
        train_once(dataset, dataclasses.replace(plain_cfg, steps=10, checkpoint_every=10), work / "warm-up")
        for repeat in range(args.repeats):
            order = [("plain", plain_cfg), ("node", node_cfg)]
            if repeat % 2:
                order.reverse()
            got = {name: train_once(dataset, cfg, work / f"{repeat}-{name}") for name, cfg in order}
            check(got["plain"], got["node"], node_cfg)
            row = {name: {k: v for k, v in got[name].items() if k != "tensors"} for name in got}
            rows.append(row)
            print(json.dumps({"repeat": repeat, "order": [n for n, _ in order], **row}), flush=True)

    keys = ratio_keys(
        {
            f"node_vs_plain_{name}": [row["node"][key] / row["plain"][key] for row in rows]
            for name, key in (("wall", "wall_s"), ("goodput", "goodput"))
        }
    )
    print(
        json.dumps(
            {
                "steps": args.steps,
                "checkpoint_every": args.checkpoint_every,
                "local_checkpoint_every": args.every,
                "repeats": args.repeats,
                "plain_wall_s": statistics.median(r["plain"]["wall_s"] for r in rows),
                "node_wall_s": statistics.median(r["node"]["wall_s"] for r in rows),
                "plain_goodput": statistics.median(r["plain"]["goodput"] for r in rows),
                "node_goodput": statistics.median(r["node"]["goodput"] for r in rows),
                "plain_checkpoint_save_s": statistics.median(r["plain"]["checkpoint_save_s"] for r in rows),
                "node_checkpoint_save_s": statistics.median(r["node"]["checkpoint_save_s"] for r in rows),
                "ratios": {k: round(v, 3) for k, v in keys["ratios"].items()},
                "spread": {k: [round(x, 3) for x in v] for k, v in keys["spread"].items()},
                "machine": machine(),
            }
        )
    )


if __name__ == "__main__":
    main()
