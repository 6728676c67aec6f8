"""Held-out evaluation of a committed checkpoint, in one process (any TP size loads at TP=1).

Besides the report it commits ``<run>/eval/<key>/``: ``results.json``, the model in Hugging Face
layout (``hf/``), which registration copies into the registry entry, and the examples of the
lm-evaluation-harness tasks (``lm_eval/<task>.jsonl``, see ``evaluation.lm_eval_suite``), on which
the export (and the baseline's export, for the quality gate) was scored. Its figures also go to the
run's TensorBoard (``evaluation.tensorboard_log``: ``eval/*`` at the checkpoint's step, the run's hparams).
"""

from __future__ import annotations

import dataclasses
import json
import math
import tempfile
import time
from dataclasses import asdict
from pathlib import Path

import numpy as np
import torch
from tokenizers import Tokenizer

from common.contracts import (
    ENTRY_CHECKPOINT,
    ENTRY_EVALUATION,
    EOD_TOKEN,
    EVAL_RESULTS,
    HF_EXPORT,
    CheckpointRef,
    EvalReport,
    ModelCard,
    card_key,
    eval_prefix,
)
from common.digests import file_sha256, folder_digests, require_digests
from common.errors import local_space
from common.hashing import config_hash
from data_prep.manifest import read_recorded
from evaluation import lm_eval_suite
from evaluation.components import component_figures, component_rows
from evaluation.config import EvalConfig
from evaluation.tensorboard_log import log_evaluation
from hf_interop.export import export_hf
from hf_interop.folder import TOKENIZER_FILES
from storage import AlreadyCommitted, open_store
from training.checkpointing import checkpoint
from training.config import ModelConfig, ParallelConfig
from training.data import load_split
from training.distributed import init_distributed, shutdown_distributed
from training.model.gpt import build_gpt, mean_loss


def evaluate(ckpt: CheckpointRef, model_cfg: ModelConfig, cfg: EvalConfig, baseline: str = "") -> EvalReport:
    """Score the checkpoint on the validation split; with ``baseline`` (a registry entry),
    score that model on the very same rows too, for the quality gate."""
    init_distributed(ParallelConfig(tensor_parallel=1), seed=0, standalone=True)
    try:
        return _evaluate(ckpt, model_cfg, cfg, baseline)
    finally:
        shutdown_distributed()


def _load_tp1(store, prefix: str, model_cfg: ModelConfig, manifest: dict, committed_at: str | None = None):
    """The model of a committed checkpoint (saved at any layout), whole on this one process."""
    model = build_gpt(model_cfg, manifest["vocab_size"], manifest["seq_len"], tensor_parallel=1)
    with tempfile.TemporaryDirectory(prefix="pretrain-eval-") as tmp:
        checkpoint.load_model(model, checkpoint.fetch(store, prefix, Path(tmp), committed_at=committed_at))
    return model


def _mean_loss(model, rows, cfg: EvalConfig) -> tuple[float, int]:
    batches = torch.from_numpy(rows.astype("int64")).split(cfg.batch_size)
    if cfg.max_batches:
        batches = batches[: cfg.max_batches]
    total, count = 0.0, 0
    model.eval()
    with torch.no_grad():
        for batch in batches:
            tokens = batch.shape[0] * (batch.shape[1] - 1)
            total += mean_loss(model, batch).item() * tokens
            count += tokens
    return total / count, count


def _entry_figures(store, entry: str, model_cfg: ModelConfig, manifest: dict, rows, cfg: EvalConfig) -> dict[str, float]:
    """Registry ``entry``'s figures on the same rows (``val_loss``, ``perplexity``, ``bits_per_byte``), or {}
    when it cannot read them (another tokenizer or model shape: its numbers would not be about the same text)."""
    card = ModelCard.from_dict(store.get_json(card_key(entry)))
    if card.lineage.tokenizer_sha256 != manifest["tokenizer"]["sha256"] or card.continuation_problem(
        asdict(model_cfg), asdict(ModelConfig())
    ):
        return {}
    model = _load_tp1(store, f"{entry}/{ENTRY_CHECKPOINT}", model_cfg, manifest, committed_at=entry)
    loss, _ = _mean_loss(model, rows, cfg)
    return {"val_loss": loss, "perplexity": math.exp(loss), "bits_per_byte": bits_per_byte(loss, manifest["stats"])}


def bits_per_byte(loss: float, stats: dict) -> float:
    return loss / math.log(2) * stats["val_doc_tokens"] / stats["val_bytes"]


def baseline_for(store, ckpt: CheckpointRef, holder: str) -> str:
    """The entry to compare ``ckpt`` with, given the gate alias's ``holder``: the holder, unless it was
    registered from this very checkpoint. Then comparing says nothing, and it is the twin of an identical
    execution that registered while this one waited for the run's lease: this evaluation is its
    registration's evaluation, against the baseline that one had, so both compute the same outputs and
    register the same version."""
    if not holder:
        return holder
    card = ModelCard.from_dict(store.get_json(card_key(holder)))
    if card.lineage.checkpoint not in (ckpt.prefix, store.url(ckpt.prefix)):  # a key; a URL on cards of before
        return holder
    key = f"{holder}/{ENTRY_EVALUATION}"
    return store.get_json(key).get("baseline", "") if store.exists(key) else ""


def _evaluate(ckpt: CheckpointRef, model_cfg: ModelConfig, cfg: EvalConfig, baseline: str) -> EvalReport:
    started = time.monotonic()
    store = open_store(ckpt.store)
    baseline = baseline_for(store, ckpt, baseline)
    rows, manifest = load_split(ckpt.dataset, "val")
    model = _load_tp1(store, ckpt.prefix, model_cfg, manifest)
    parts = component_rows(manifest, rows, cfg)
    if parts:  # a mixture: each component scored on its own rows; the overall figure is over all of them
        scored = {name: _mean_loss(model, part, cfg) for name, part in parts.items()}
        count = sum(n for _, n in scored.values())
        val_loss = sum(loss * n for loss, n in scored.values()) / count
        rows, cfg_all = np.concatenate(list(parts.values())), dataclasses.replace(cfg, max_batches=0)
        components = component_figures(manifest, {name: loss for name, (loss, _) in scored.items()})
    else:
        val_loss, count = _mean_loss(model, rows, cfg)
        cfg_all, components = cfg, {}
    # What the quiet seconds after the last step are doing: each part of the evaluation says it is done.
    print(f"evaluation: val_loss {val_loss:.4f} on {count:,} held-out tokens ({time.monotonic() - started:.1f} s)", flush=True)
    tokenizer_json = read_recorded(store, ckpt.dataset, "tokenizer", manifest).decode()
    tokenizer = Tokenizer.from_str(tokenizer_json)
    shape = (manifest["seq_len"], manifest["vocab_size"])
    # The gate's baseline and the base continued from, each scored once on these rows (often the same entry).
    entries = {baseline, ckpt.base_model} - {""}
    figures = {entry: _entry_figures(store, entry, model_cfg, manifest, rows, cfg_all) for entry in entries}
    for entry, theirs in figures.items():
        if theirs:
            print(f"evaluation: {entry} (to compare) bits_per_byte {theirs['bits_per_byte']:.4f} on the same rows", flush=True)
    report = EvalReport(
        checkpoint=ckpt,
        val_loss=val_loss,
        perplexity=math.exp(val_loss),
        tokens_evaluated=count,
        bits_per_byte=bits_per_byte(val_loss, manifest["stats"]),
        sample=generate(model, tokenizer, cfg.prompt, cfg.sample_tokens, *shape),
        sampled=generate(model, tokenizer, cfg.prompt, cfg.sample_tokens, *shape, cfg.temperature, cfg.seed),
        baseline=baseline,
        baseline_bits_per_byte=figures.get(baseline, {}).get("bits_per_byte", -1.0),
        base=figures.get(ckpt.base_model, {}),
        components=components,
    )
    key = config_hash(ckpt.prefix, cfg, baseline)
    outputs = eval_prefix(ckpt.run, key)
    # A rerun of the same evaluation, or an identical execution evaluating at the same moment,
    # computes the same files: whoever commits first, each writer uploaded a whole set before its
    # commit and nothing is deleted here, so the committed outputs are complete.
    if store.is_committed(outputs):
        # The lm-eval figures and export digests of the committed evaluation: not run again (they would be the same).
        done = store.get_json(f"{outputs}/{EVAL_RESULTS}")
        report = dataclasses.replace(report, **{k: done.get(k, {}) for k in COMMITTED_FIELDS})
    else:
        with tempfile.TemporaryDirectory(prefix="pretrain-eval-out-") as tmp, local_space(tmp, "the evaluation outputs' staging"):
            staging = Path(tmp)
            export_hf(
                model,
                model_cfg,
                tokenizer_json,
                max_positions(store, ckpt.base_model, manifest["seq_len"]),
                staging / HF_EXPORT,
                eod_token=manifest.get("eod_token", EOD_TOKEN),
                original_files=base_tokenizer_files(store, ckpt.base_model),
            )
            report = dataclasses.replace(report, export_digests=folder_digests(staging / HF_EXPORT))
            extra = {}
            if cfg.lm_eval_tasks:
                report, extra["lm_eval_results"] = _lm_eval(report, store, cfg, rows, tokenizer, manifest, staging)
            (staging / EVAL_RESULTS).write_text(json.dumps(results_json(report, store, cfg) | extra, indent=2))
            store.upload_dir(staging, outputs)
        try:
            store.commit(outputs)
        except AlreadyCommitted:
            pass  # the identical evaluation committed first
    figures = {"val_loss": report.val_loss, "perplexity": report.perplexity, "bits_per_byte": report.bits_per_byte}
    log_evaluation(store, ckpt, figures, key)  # eval/* at this step and the run's hparams, in its TensorBoard
    return dataclasses.replace(report, outputs=outputs)


LM_EVAL_FIELDS = ("lm_eval", "baseline_lm_eval", "lm_eval_examples")
"""The EvalReport fields that lm-evaluation-harness fills."""
COMMITTED_FIELDS = (*LM_EVAL_FIELDS, "export_digests")
"""The EvalReport fields read back from a committed evaluation's results.json."""


LM_EVAL_DIR = "lm_eval"
"""The folder of the evaluation outputs that holds each lm-eval task's examples (``<task>.jsonl``)."""


def _lm_eval(report: EvalReport, store, cfg: EvalConfig, rows, tokenizer: Tokenizer, manifest: dict, staging: Path):
    """Run the lm-eval tasks on the export in ``staging/hf`` and, when the baseline registry entry
    has one, on the baseline's export, over the same examples (written to ``staging/lm_eval/``).
    Returns the report with its lm-eval figures and the full per-task results for results.json."""
    started = time.monotonic()
    files = lm_eval_suite.build_task_files(
        rows,
        tokenizer,
        manifest["seq_len"],
        cfg.lm_eval_tasks,
        cfg.lm_eval_examples,
        cfg.lm_eval_seed,
        staging / LM_EVAL_DIR,
        eod_id=manifest["eod_id"],
    )
    models = {"candidate": staging / HF_EXPORT}
    with tempfile.TemporaryDirectory(prefix="pretrain-eval-baseline-") as tmp:
        if report.baseline and (baseline := baseline_export(store, report.baseline, Path(tmp) / HF_EXPORT)):
            models["baseline"] = baseline
        print(f"lm-eval: {', '.join(cfg.lm_eval_tasks)} on {' and '.join(models)} (a process of its own)…", flush=True)
        scored = lm_eval_suite.run_suite(models, files, cfg.batch_size, cfg.lm_eval_seed)
    seconds = time.monotonic() - started
    print(f"lm-eval: {', '.join(cfg.lm_eval_tasks)} on {' and '.join(models)} in {seconds:.1f}s", flush=True)
    examples = {task: file_sha256(path) for task, path in files.items()}
    report = dataclasses.replace(
        report,
        lm_eval=lm_eval_suite.flatten(scored["candidate"]),
        baseline_lm_eval=lm_eval_suite.flatten(scored.get("baseline", {})),
        lm_eval_examples=examples,
    )
    details = {
        "seconds": round(seconds, 1),
        "examples": {task: f"{LM_EVAL_DIR}/{path.name}" for task, path in files.items()},
        **scored,
    }
    return report, details


def baseline_export(store, entry: str, into: Path) -> Path | None:
    """The Hugging Face export of the registry ``entry``, downloaded into ``into`` and checked against the
    digests its evaluation recorded before anything reads it (a mismatch raises IntegrityError); None for an
    entry without an export, or one registered before exports had digests (a warning says so)."""
    where = f"{entry}/{HF_EXPORT}"
    if not store.list(f"{where}/"):
        return None
    recorded = store.get_json(f"{entry}/{ENTRY_EVALUATION}").get("export_digests", {})
    if not recorded:  # registered before exports had digests: unchecked bytes are not run, and that is said
        print(f"warning: {store.url(where)} has no recorded digests (registered by an older release): not scored", flush=True)
        return None
    store.download_dir(where, into)
    require_digests(into, recorded, f"the Hugging Face export {store.url(where)}", f"export_digests of {ENTRY_EVALUATION}")
    return into


def max_positions(store, base_model: str, seq_len: int) -> int:
    """The context the export declares (``max_position_embeddings``): the rows trained here, or a base's own
    when longer (an imported Llama 3 keeps its 131,072: continuing it on shorter rows shortens nothing)."""
    if not base_model:
        return seq_len
    base = ModelCard.from_dict(store.get_json(card_key(base_model))).config.get("data", {}).get("seq_len", 0)
    return max(seq_len, int(base or 0))


def base_tokenizer_files(store, base_model: str) -> dict[str, str] | None:
    """The tokenizer files of the base model's Hugging Face export (an imported model's are the original's),
    which a continued model exports with: it loads as its base does. None: trained from scratch."""
    if not base_model:
        return None
    files = {}
    for name in TOKENIZER_FILES:
        key = f"{base_model}/{HF_EXPORT}/{name}"
        if store.exists(key):
            files[name] = store.get_bytes(key, "tokenizer").decode()
    return files or None


def results_json(report: EvalReport, store, cfg: EvalConfig) -> dict:
    """The evaluation's figures and samples, with what they were computed on."""
    fields = {k: v for k, v in asdict(report).items() if k not in ("checkpoint", "outputs")}
    ckpt = report.checkpoint
    return {
        "checkpoint": store.url(ckpt.prefix),
        "step": ckpt.step,
        "dataset_version": ckpt.dataset.version,
        "config": asdict(cfg),
        **fields,
    }


def generate(
    model,
    tokenizer: Tokenizer,
    prompt: str,
    new_tokens: int,
    seq_len: int,
    vocab_size: int,
    temperature: float = 0.0,
    seed: int = 0,
) -> str:
    """Continue ``prompt``: greedy at temperature 0, else sampled with a seeded generator."""
    ids = tokenizer.encode(prompt).ids
    device = next(model.parameters()).device
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _ in range(new_tokens):
            window = torch.tensor([ids[-seq_len:]], device=device)
            positions = torch.arange(window.shape[1], device=device).unsqueeze(0)
            logits = model(window, positions, None)[0, -1, :vocab_size].float().cpu()  # TP=1: the whole vocabulary
            if temperature > 0:
                probs = torch.softmax(logits / temperature, dim=-1)
                ids.append(int(torch.multinomial(probs, 1, generator=generator)))
            else:
                ids.append(int(logits.argmax()))
    return tokenizer.decode(ids)
