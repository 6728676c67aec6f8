"""Evaluation suites through EleutherAI's lm-evaluation-harness, on the Hugging Face export.

The tasks are lm-eval YAML kept beside this module (``evaluation/lm_eval_tasks/<task>.yaml``), over
local JSONL that evaluation builds from the dataset's own held-out (validation) split: the packed
rows are joined back into their token stream, cut into documents at the end-of-document token,
and each document into passages of ``seq_len`` tokens (what the model was trained to read),
decoded with the dataset's tokenizer. A builder per task (``BUILDERS``) turns passages into
examples; a seeded shuffle picks at most ``evaluation.lm_eval_examples`` of them, so the same
dataset and settings give the same JSONL bytes.

lm-eval runs in a child process (``python -m evaluation.lm_eval_suite``) with the Hugging Face hub
and datasets switched offline (``OFFLINE_ENV``): those libraries read the switches when they are
imported, so a fresh interpreter is the one place they are sure to hold. The child loads each model
with lm-eval's ``HFLM`` from a local folder and scores the same JSONL files for each, so a
candidate and the model it is compared with are judged on the same examples.

Importing this module is cheap (no torch, no lm-eval): the config checks list the shipped tasks.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import re
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import yaml

from evaluation.lm_eval_catalog import CONTINUATION_CHOICES, TASKS_DIR, metric_name

if TYPE_CHECKING:
    import numpy as np
    from tokenizers import Tokenizer

__data__ = ("lm_eval_tasks",)
"""Folders beside this module whose files its results depend on (``common.codeversion`` hashes them)."""
CHOICES = CONTINUATION_CHOICES
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
"""Set in the child that runs lm-eval: nothing is downloaded, every file is local."""
_WORD = re.compile(r"[^\W\d]\w{2,}")
"""A cloze target: a word (identifier) of three characters or more, not starting with a digit."""


def task_config(task: str, data_file: Path, cache_dir: Path) -> dict[str, Any]:
    """The task's YAML as lm-eval reads it, over ``data_file``; ``datasets`` keeps its Arrow cache
    in ``cache_dir`` (not in the user's home)."""
    spec = yaml.safe_load((TASKS_DIR / f"{task}.yaml").read_text())
    kwargs = dict(spec.get("dataset_kwargs") or {})
    kwargs["data_files"] = {spec["test_split"]: str(data_file)}
    kwargs["cache_dir"] = str(cache_dir)
    return {**spec, "dataset_kwargs": kwargs}


# -- building the examples from the held-out split ------------------------------------------------
@dataclass(frozen=True)
class Passage:
    """``seq_len`` consecutive tokens of held-out document ``doc``."""

    doc: int
    ids: tuple[int, ...]


def heldout_documents(rows: np.ndarray, eod_id: int) -> list[list[int]]:
    """The validation documents as token ids: the packed rows are consecutive pieces of one stream
    in which every document is followed by ``eod_id`` (``data_prep.shards.pack``); the last one
    may be cut short where the rows end."""
    import numpy as np

    stream = rows.reshape(-1)
    pieces = np.split(stream, np.flatnonzero(stream == eod_id))
    # Every piece but the first starts with the end-of-document token that closed the one before.
    docs = [piece[1:] if i else piece for i, piece in enumerate(pieces)]
    return [doc.tolist() for doc in docs if len(doc)]


def passages(docs: list[list[int]], span: int) -> list[Passage]:
    """Every document cut into non-overlapping passages of ``span`` tokens (a shorter tail is left out)."""
    return [Passage(d, tuple(ids[i : i + span])) for d, ids in enumerate(docs) for i in range(0, len(ids) - span + 1, span)]


def build_cloze(pool: list[Passage], tokenizer: Tokenizer, examples: int, rng: random.Random) -> list[dict]:
    """Last-word cloze: a passage cut before its last whole word; the word is the target.

    A word that touches the end of the passage may continue past it, so the last word followed by
    another character inside the passage is used."""
    out = []
    for passage in _shuffled(pool, rng):
        text = tokenizer.decode(list(passage.ids))
        words = [m for m in _WORD.finditer(text) if m.end() < len(text)]
        if not words or not text[: words[-1].start()].strip():
            continue
        last = words[-1]
        out.append({"doc": passage.doc, "context": text[: last.start()], "target": last.group()})
        if len(out) == examples:
            break
    return out


def build_continuation(pool: list[Passage], tokenizer: Tokenizer, examples: int, rng: random.Random) -> list[dict]:
    """The true ending of a passage (about its last quarter, starting at a word: a token that begins
    with whitespace) among ``CHOICES - 1`` endings of passages of OTHER documents, in a seeded order.
    Every ending starts with whitespace, so none is told apart by how it joins the context."""
    split: list[tuple[Passage, str, str]] = []
    for passage in _shuffled(pool, rng):
        cut = _word_start(passage.ids, len(passage.ids) - max(4, len(passage.ids) // 4), tokenizer)
        context, ending = tokenizer.decode(list(passage.ids[:cut])), tokenizer.decode(list(passage.ids[cut:]))
        # A cut inside a multi-byte character decodes differently in two pieces: not this passage.
        if cut > 0 and context.strip() and ending.strip() and context + ending == tokenizer.decode(list(passage.ids)):
            split.append((passage, context, ending))
        if len(split) == examples + 4 * CHOICES:  # enough endings to draw distractors from
            break
    out = []
    for i, (passage, context, ending) in enumerate(split[:examples]):
        others = [(p.doc, e) for j, (p, _, e) in enumerate(split) if j != i and p.doc != passage.doc and e != ending]
        distinct = list({e: (d, e) for d, e in others}.values())
        if len(distinct) < CHOICES - 1:
            continue
        chosen = rng.sample(distinct, CHOICES - 1)
        label = rng.randrange(CHOICES)
        chosen.insert(label, (passage.doc, ending))
        out.append(
            {
                "doc": passage.doc,
                "context": context,
                "choices": [e for _, e in chosen],
                "choice_docs": [d for d, _ in chosen],
                "label": label,
            }
        )
    return out


def _word_start(ids: tuple[int, ...], cut: int, tokenizer: Tokenizer) -> int:
    """The last token at or before ``cut`` (but after the first half) that starts with whitespace; 0 if none."""
    for k in range(cut, len(ids) // 2, -1):
        if tokenizer.decode([ids[k]])[:1].isspace():
            return k
    return 0


def _shuffled(pool: list[Passage], rng: random.Random) -> Iterator[Passage]:
    order = list(range(len(pool)))
    rng.shuffle(order)
    return (pool[i] for i in order)


BUILDERS: dict[str, Callable[[list[Passage], Tokenizer, int, random.Random], list[dict]]] = {
    "heldout_cloze": build_cloze,
    "heldout_continuation": build_continuation,
}
"""How each shipped task's examples are made from held-out passages (a new task: a YAML and a builder)."""


def build_task_files(
    rows: np.ndarray,
    tokenizer: Tokenizer,
    seq_len: int,
    tasks: list[str],
    examples: int,
    seed: int,
    out_dir: Path,
    eod_id: int | None = None,
) -> dict[str, Path]:
    """``<out_dir>/<task>.jsonl`` for each task, from the validation ``rows`` (documents ending in ``eod_id``;
    None: ``<|endoftext|>``'s): deterministic (the same rows, tokenizer and settings give the same bytes) and
    at most ``examples`` lines each."""
    from common.contracts import EOD_TOKEN

    eod = tokenizer.token_to_id(EOD_TOKEN) if eod_id is None else eod_id
    pool = passages(heldout_documents(rows, eod), seq_len)
    out_dir.mkdir(parents=True, exist_ok=True)
    files = {}
    for task in tasks:
        records = BUILDERS[task](pool, tokenizer, examples, random.Random(f"{seed}:{task}"))
        path = out_dir / f"{task}.jsonl"
        path.write_text("".join(json.dumps(r, sort_keys=True) + "\n" for r in records))
        files[task] = path
    return files


# -- running lm-eval ------------------------------------------------------------------------------
class SuiteError(RuntimeError):
    """lm-eval failed in its child process; the message holds the end of its output."""


def run_suite(models: dict[str, Path], files: dict[str, Path], batch_size: int, seed: int) -> dict[str, dict[str, Any]]:
    """Score every model of ``models`` (label → Hugging Face folder) on every task of ``files``
    (task → JSONL), offline, in a child process: ``{label: {task: result}}`` (``task_result``).
    A task without examples is left out (nothing to score)."""
    tasks = {t: p for t, p in files.items() if p.stat().st_size}
    if not tasks or not models:
        return {label: {} for label in models}
    root = Path(__file__).resolve().parent.parent
    env = {**os.environ, **OFFLINE_ENV, "PYTHONPATH": os.pathsep.join(filter(None, [str(root), os.environ.get("PYTHONPATH")]))}
    with tempfile.TemporaryDirectory(prefix="pretrain-lm-eval-") as tmp:
        out = Path(tmp) / "results.json"
        args = [sys.executable, "-m", "evaluation.lm_eval_suite", "--out", str(out), "--cache", tmp]
        args += ["--batch-size", str(batch_size), "--seed", str(seed)]
        args += [a for label, path in models.items() for a in ("--model", f"{label}={path}")]
        args += [a for task, path in tasks.items() for a in ("--task", f"{task}={path}")]
        done = subprocess.run(args, env=env, cwd=tmp, capture_output=True, text=True)
        if done.returncode != 0:
            raise SuiteError(f"lm-evaluation-harness failed (exit {done.returncode}):\n{(done.stderr or done.stdout)[-3000:]}")
        return json.loads(out.read_text())


def task_result(results: dict[str, Any], task: str) -> dict[str, Any]:
    """One task's part of ``simple_evaluate``'s results: every figure with its stderr (keys as
    lm-eval writes them, ``acc,none``), the number of examples, which way is better, the version."""
    return {
        "results": results["results"][task],
        "n_samples": results.get("n-samples", {}).get(task, {}),
        "higher_is_better": results.get("higher_is_better", {}).get(task, {}),
        "version": results.get("versions", {}).get(task),
    }


def flatten(per_task: dict[str, dict[str, Any]]) -> dict[str, float]:
    """``{task: task_result}`` → ``{"lm_eval.<task>.<metric>": value}``: the main figures, without
    their stderr (which stays in results.json)."""
    out = {}
    for task, result in per_task.items():
        for key, value in result["results"].items():
            metric, _, _filter = key.partition(",")
            if _filter and not metric.endswith("_stderr") and isinstance(value, int | float):
                out[metric_name(task, metric)] = float(value)
    return out


def _child(argv: list[str]) -> None:
    """The child process: HFLM on each local model folder, ``simple_evaluate`` on the task files."""
    parser = argparse.ArgumentParser(prog="python -m evaluation.lm_eval_suite")
    parser.add_argument("--out", required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--model", action="append", default=[], help="LABEL=HF_FOLDER")
    parser.add_argument("--task", action="append", default=[], help="TASK=JSONL")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    missing = [k for k, v in OFFLINE_ENV.items() if os.environ.get(k) != v]
    if missing:
        raise SystemExit(f"refusing to run lm-eval with the hub online ({', '.join(missing)} unset)")

    import torch
    from lm_eval import simple_evaluate
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    device = "cuda" if torch.cuda.is_available() else "cpu"
    configs = [task_config(t, Path(p), Path(args.cache) / "datasets") for t, _, p in (a.partition("=") for a in args.task)]
    manager = TaskManager(include_defaults=False)  # our tasks only: indexing lm-eval's thousands costs seconds
    scored = {}
    for label, _, folder in (a.partition("=") for a in args.model):
        lm = HFLM(pretrained=folder, device=device, batch_size=args.batch_size, dtype="auto")
        results = simple_evaluate(
            model=lm,
            tasks=configs,
            task_manager=manager,
            bootstrap_iters=1000,  # perplexity's stderr is bootstrapped; acc's is analytic
            log_samples=False,
            random_seed=args.seed,
            numpy_random_seed=args.seed,
            torch_random_seed=args.seed,
            fewshot_random_seed=args.seed,
        )
        scored[label] = {task: task_result(results, task) for task in results["results"]}
        del lm
    Path(args.out).write_text(json.dumps(scored, indent=2, default=str))


if __name__ == "__main__":
    _child(sys.argv[1:])
