"""What a run made, in words: the lines ``track_run`` prints at the end of every execution (``pretrain run``
and ``pyflyte run`` alike), read back from the store: the dataset, its validation, the training, the
evaluation, the registered version, and where to look next."""

from __future__ import annotations

import math
import os
import shutil
import sys
from pathlib import Path

from common.contracts import MANIFEST, VALIDATION_RESULT, ModelCard, ModelRef, dataset_prefix, validation_prefix
from registry.card import metric_text
from registry.registry import show
from reports.dataset_html import skipped_by_reason
from storage import Store, default_store_uri

SKIPS_SHOWN = 4


def _count(n: float) -> str:
    return f"{int(n):,}"


def _data_line(store: Store, version: str) -> str:
    stats = store.get_json(f"{dataset_prefix(version)}/{MANIFEST}", "manifest")["stats"]
    skips = skipped_by_reason(stats)
    why = ", ".join(f"{reason} {_count(n)}" for reason, n in skips[:SKIPS_SHOWN]) + (", …" if len(skips) > SKIPS_SHOWN else "")
    tokens = stats.get("train_tokens", 0) + stats.get("val_tokens", 0)
    return (
        f"  data        {_count(stats['documents_kept'])} of {_count(stats['documents_read'])} documents kept"
        + (f" (skipped: {why})" if why else "")
        + f", {_count(tokens)} tokens; dataset {version}"
    )


def _validation_line(store: Store, card: ModelCard) -> str:
    """The validation of the dataset, or of each component of a mixture (each was validated on its own)."""
    shares = card.lineage.mixture if len(card.lineage.mixture) > 1 else []
    parts = [(s.name, s.dataset_version) for s in shares] or [("", card.lineage.dataset_version)]
    verdicts = []
    for name, version in parts:
        key = f"{validation_prefix(dataset_prefix(version))}/{VALIDATION_RESULT}"
        if not store.exists(key):
            verdicts.append(f"{name}: not recorded" if name else "not recorded")
            continue
        result = store.get_json(key)
        outcomes = result.get("outcomes", [])
        met = sum(1 for o in outcomes if o.get("success", True))
        verdict = f"{'PASS' if result.get('success') else 'FAIL'}: {met} of {len(outcomes)} expectations met"
        verdicts.append(f"{name} {verdict}" if name else verdict)
    return "  validation  " + "; ".join(verdicts)


def _rows_evaluated(card: ModelCard) -> str:
    """`` on 32,768 tokens (8 batches of 16 sequences)``: what the evaluation's figures read (its ``val_tokens``)."""
    tokens = card.metrics.get("val_tokens")
    seq_len = card.config.get("data", {}).get("seq_len")
    batch = card.config.get("evaluation", {}).get("batch_size")
    if not tokens or not seq_len or not batch:
        return ""
    batches = math.ceil(int(tokens) // int(seq_len) / int(batch))
    return f" on {int(tokens):,} held-out tokens ({batches} batch{'es' if batches != 1 else ''} of {batch} sequences)"


def _when(iso: str) -> str:
    """``2026-12-07T03:09:17+00:00`` as ``2026-12-07 03:09 UTC``."""
    return iso[:16].replace("T", " ") + " UTC" if iso.endswith("+00:00") else iso


def _entry_name(prefix: str) -> str:
    """``models/<name>/<version>`` as ``<name>:<version>``."""
    _, name, version = prefix.rsplit("/", 2)
    return f"{name}:{version}"


def run_summary(
    store: Store, model: ModelRef, mlflow_run: str = "", stages: str = "", from_cache: bool = False, mlflow_page: str = ""
) -> list[str]:
    """The end-of-run summary of the execution that registered ``model`` (``mlflow_run``: its MLflow run id,
    '' when it has none; ``stages``: the line of the tasks that ran and came from cache, '' when unknown;
    ``from_cache``: the registration itself came from the cache, an earlier execution's; ``mlflow_page``: the run's
    page on a tracking server, '' for a local database, which ``pretrain ui`` serves)."""
    entry = show(store, f"{model.name}:{model.version}")
    card, m = entry.card, entry.card.metrics
    aliases = f" ({', '.join(entry.aliases)})" if entry.aliases else ""
    when = _when(card.registered_at)
    if from_cache:
        lines = [f"pretrain: {card.name}:{card.version}{aliases} again, from the cache (registered {when})"]
    else:
        lines = [f"pretrain: registered {card.name}:{card.version}{aliases}"]
    if stages:
        lines.append(stages)
    lines.append(_data_line(store, card.lineage.dataset_version))
    lines.append(_validation_line(store, card))
    train = f"  training    {card.lineage.training_steps} steps"
    if "tokens_trained" in m:  # the budget both ways (train.steps or train.tokens)
        train += f" ({_count(m['tokens_trained'])} tokens)"
    if "first_train_loss" in m and "final_train_loss" in m:
        train += f", loss {m['first_train_loss']:.3f} (step 1) → {m['final_train_loss']:.3f} (mean of the last 10 steps)"
    if "tokens_per_second" in m:
        train += f", {m['tokens_per_second']:,.0f} tokens/s (median step)"
    if "mfu" in m:
        train += f", MFU {m['mfu']:.1%}"
    lines.append(train + (f"; {card.layouts[-1].describe()}" if card.layouts else ""))
    if card.lineage.cooldown_from:
        lines.append(f"  cooldown    from {card.lineage.cooldown_from}")
    figures = [f"{k} {metric_text(k, m[k])}" for k in ("val_loss", "perplexity", "bits_per_byte") if k in m]
    lines.append(f"  evaluation  {', '.join(figures)}{_rows_evaluated(card)}")
    base = [f"{k} {metric_text(k, m['base.' + k])}" for k in ("val_loss", "perplexity", "bits_per_byte") if "base." + k in m]
    if card.lineage.base_model:  # what continuing changed: the base's figures on the same rows
        lines.append(f"  base        {_entry_name(card.lineage.base_model)}: {', '.join(base) or 'not comparable'}")
    lm_eval = [f"{k.removeprefix('lm_eval.')} {metric_text(k, v)}" for k, v in sorted(m.items()) if k.startswith("lm_eval.")]
    if lm_eval:
        lines.append(f"  lm-eval     {', '.join(lm_eval)}")
    if card.gate is not None:  # decided once, when the version was registered: a cached rerun says so
        lines.append(f"  gate        {card.gate.reason}" + (f" (decided {when}, at its registration)" if from_cache else ""))
    run_id = card.lineage.training_run.rsplit("/", 1)[-1]
    default = default_store_uri()  # the store the commands read without --store (not opened: nothing is made)
    store_flag = "" if store.uri in (default, os.path.abspath(os.path.expanduser(default))) else f" --store {store.uri}"
    cli, activate = pretrain_command()
    ui = mlflow_page or (f"{cli} ui --run {mlflow_run}" if mlflow_run else f"{cli} ui")
    lines += [
        "next:" + (f" (or `source {activate}` once, then `pretrain …`)" if activate else ""),
        f"  {cli} runs show {run_id}{store_flag}   (step times, ranks, health, traces)",
        f"  {cli} runs report {run_id}{store_flag}   (the run's Decks as one HTML page)",
        f"  {cli} registry show {card.name}:{card.version}{store_flag}   (the card, lineage, files)",
        f"  {ui}   (MLflow: this run, every run, comparisons)",
    ]
    return lines


def pretrain_command() -> tuple[str, str]:
    """How to call this installation's ``pretrain`` from the shell the run was started in: ``pretrain`` when
    that is the one on $PATH; else its path (relative to this folder when under it: ``.venv/bin/pretrain``
    after ``make demo``, whose venv is not active), and the activate script that would put it on $PATH."""
    bin_dir = Path(sys.executable).parent  # the venv's bin, not resolved: its python is a link out of it
    ours = bin_dir / "pretrain"
    found = shutil.which("pretrain")
    if not ours.exists() or (found and Path(found).resolve() == ours.resolve()):
        return "pretrain", ""
    return _shown(ours), _shown(bin_dir / "activate") if (bin_dir / "activate").exists() else ""


def _shown(path: Path) -> str:
    try:
        return str(path.absolute().relative_to(Path.cwd()))
    except ValueError:
        return str(path.absolute())
