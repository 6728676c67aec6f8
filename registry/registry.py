"""A model registry on the object store: immutable versions, lineage, aliases.

``models/<name>/<version>/`` holds ``card.json``, ``card.md``, the checkpoint (model
weights and meta), the tokenizer and, when the evaluation produced them, its
``evaluation.json`` and the Hugging Face export ``hf/`` (``from_pretrained`` loads it).
A version is first *claimed* with a conditional create, so concurrent registrations
never write into the same directory; it becomes visible only when ``_COMMITTED`` is
written last. ``models/<name>/aliases/<alias>.json``
points at a version and is replaced in a single write.

The card is a ``common.contracts.ModelCard``, built here alone (``register``) and read back
through the type (``read_card``); a card.json that does not fit it is a RegistryError.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from common.contracts import (
    CARD_MARKDOWN,
    CHECKPOINT_DIGESTS,
    CHECKPOINT_META,
    CHECKPOINT_MODEL,
    ENTRY_CHECKPOINT,
    ENTRY_EVALUATION,
    EVAL_RESULTS,
    HF_EXPORT,
    MANIFEST,
    MODELS,
    TOKENIZER,
    CardFormatError,
    CodeRevision,
    EvalReport,
    GateDecision,
    Lineage,
    ModelCard,
    ModelRef,
    alias_key,
    aliases_prefix,
    card_key,
    describe_layouts,
    model_prefix,
    model_root,
)
from common.errors import ConfigError, UserError
from storage import AlreadyCommitted, Store, StoreError

CLAIM = "_CLAIMED"


class RegistryError(UserError, LookupError):
    """A model or version that does not exist, or a registration that cannot proceed."""


def _versions(store: Store, name: str, committed_only: bool = True) -> list[int]:
    found = []
    for child in store.children(model_root(name)):
        if child.isdigit() and (not committed_only or store.is_committed(model_prefix(name, int(child)))):
            found.append(int(child))
    return sorted(found)


def _claim_version(store: Store, name: str) -> int:
    version = (_versions(store, name, committed_only=False) or [0])[-1] + 1
    while True:
        try:
            store.put_json(f"{model_prefix(name, version)}/{CLAIM}", {"claimed": _now()}, if_absent=True)
            return version
        except AlreadyCommitted:
            version += 1


def _now() -> str:
    return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")


def code_revision() -> CodeRevision:
    """The git commit of the project and whether its tree had uncommitted changes."""
    root = Path(__file__).resolve().parent.parent
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, check=True).stdout.strip()
        dirty = bool(subprocess.run(["git", "status", "--porcelain"], cwd=root, capture_output=True, text=True).stdout.strip())
        return CodeRevision(commit=commit, dirty=dirty)
    except (OSError, subprocess.CalledProcessError):
        return CodeRevision()


def register(
    store: Store,
    name: str,
    report: EvalReport,
    *,
    config: dict[str, Any] | None = None,
    gate: GateDecision | None = None,
    execution_id: str = "",
    aliases: tuple[str, ...] = ("latest",),
) -> ModelRef:
    """Register the evaluated checkpoint of ``report`` as a new version of ``name``: copy its
    weights, the tokenizer and the evaluation outputs (``report.outputs``, when set), write the
    card, commit, move ``aliases``. ``config`` is the pipeline config as asked (a dict)."""
    ckpt = report.checkpoint
    for needed in filter(None, (ckpt.prefix, report.outputs)):
        if not store.is_committed(needed):
            raise RegistryError(f"{store.url(needed)} is not committed: nothing to register")
    version = _claim_version(store, name)
    prefix = model_prefix(name, version)
    manifest = store.get_json(f"{ckpt.dataset.prefix}/{MANIFEST}")
    hf_export = ""
    with tempfile.TemporaryDirectory(prefix="pretrain-register-") as tmp:
        staging = Path(tmp)
        copied = []
        for key in store.list(ckpt.prefix):
            rel = key[len(ckpt.prefix) + 1 :]
            if rel.startswith(f"{CHECKPOINT_MODEL}/") or rel == CHECKPOINT_META:
                store.download(key, staging / ENTRY_CHECKPOINT / rel)
                copied.append(rel)
        store.download(f"{ckpt.dataset.prefix}/{TOKENIZER}", staging / TOKENIZER)
        if report.outputs:
            for key in store.list(report.outputs):
                rel = key[len(report.outputs) + 1 :]
                if rel == EVAL_RESULTS:
                    store.download(key, staging / ENTRY_EVALUATION)
                elif rel.startswith(f"{HF_EXPORT}/"):
                    store.download(key, staging / rel)
                    hf_export = HF_EXPORT
        store.upload_dir(staging, prefix)
    if store.exists(f"{ckpt.prefix}/{CHECKPOINT_DIGESTS}"):
        # The copy's own list: the files it holds, with the digests committed with the run (a
        # file that is not listed there stays unlisted, and loading the entry refuses it).
        digests = store.get_json(f"{ckpt.prefix}/{CHECKPOINT_DIGESTS}")
        digests["files"] = {rel: digests["files"][rel] for rel in copied if rel in digests["files"]}
        store.put_json(f"{prefix}/{ENTRY_CHECKPOINT}/{CHECKPOINT_DIGESTS}", digests)
    card = ModelCard(
        name=name,
        version=version,
        registered_at=_now(),
        metrics={
            "val_loss": report.val_loss,
            "perplexity": report.perplexity,
            "bits_per_byte": report.bits_per_byte,
            "val_tokens": report.tokens_evaluated,
            **ckpt.summary,
        },
        sample=report.sample,
        sampled=report.sampled,
        lineage=Lineage(
            dataset_version=ckpt.dataset.version,
            dataset=f"{ckpt.dataset.store.rstrip('/')}/{ckpt.dataset.prefix}",
            dataset_manifest=store.url(f"{ckpt.dataset.prefix}/{MANIFEST}"),
            tokenizer_sha256=manifest["tokenizer"]["sha256"],
            training_run=ckpt.run,
            training_steps=ckpt.step,
            checkpoint=store.url(ckpt.prefix),
            base_model=ckpt.base_model,
            evaluation=store.url(report.outputs) if report.outputs else "",
            flyte_execution_id=execution_id,
        ),
        layouts=list(ckpt.layouts),
        config=config or {},
        code=code_revision(),
        gate=gate,
        hf_export=hf_export,
    )
    store.put_json(card_key(prefix), card.to_dict())
    store.put_bytes(f"{prefix}/{CARD_MARKDOWN}", card_markdown(card).encode())
    store.commit(prefix, {"version": version})
    for alias in aliases:
        set_alias(store, name, alias, version)
    return ModelRef(store=store.uri, name=name, version=version, prefix=prefix)


def set_alias(store: Store, name: str, alias: str, version: int) -> None:
    if not store.is_committed(model_prefix(name, version)):
        raise RegistryError(f"{name}:{version} is not a committed version")
    store.put_json(alias_key(name, alias), {"version": version, "updated_at": _now()})


def read_card(store: Store, entry: str) -> ModelCard:
    """The card of the registry entry at key prefix ``entry``."""
    try:
        return ModelCard.from_dict(store.get_json(card_key(entry)))
    except CardFormatError as e:
        raise RegistryError(f"{store.url(card_key(entry))}: {e}; register the model again with this release") from e


def check_continuable(store: Store, entry: str, model: dict[str, Any]) -> None:
    """Refuse, before any work, to continue ``entry`` with another model section."""
    problem = read_card(store, entry).continuation_problem(model)
    if problem:
        raise ConfigError(problem)


def list_models(store: Store) -> list[dict[str, Any]]:
    """One row per committed version: name, version, aliases, key metrics."""
    rows = []
    for name in store.children(MODELS):
        aliases = _aliases(store, name)
        for version in _versions(store, name):
            card = read_card(store, model_prefix(name, version))
            rows.append(
                {
                    "name": name,
                    "version": version,
                    "aliases": sorted(a for a, v in aliases.items() if v == version),
                    "registered_at": card.registered_at,
                    "dataset": card.lineage.dataset_version,
                    "metrics": card.metrics,
                    "trained_by": describe_layouts(card.layouts),
                    "uri": store.url(model_prefix(name, version)),
                }
            )
    return rows


def _aliases(store: Store, name: str) -> dict[str, int]:
    out = {}
    for key in store.list(aliases_prefix(name)):
        if key.endswith(".json"):
            out[Path(key).stem] = store.get_json(key)["version"]
    return out


def resolve(store: Store, spec: str) -> tuple[str, int]:
    """``NAME``, ``NAME:VERSION`` or ``NAME:ALIAS`` → (name, version); NAME alone means latest."""
    name, _, which = spec.partition(":")
    which = which or "latest"
    if which.isdigit():
        version = int(which)
    else:
        try:
            version = store.get_json(alias_key(name, which))["version"]
        except StoreError as e:
            raise RegistryError(f"model {name!r} has no alias {which!r} in {store.uri}") from e
    if not store.is_committed(model_prefix(name, version)):
        raise RegistryError(f"model {name}:{version} does not exist in {store.uri}")
    return name, version


@dataclass
class Entry:
    """A committed version as ``show`` finds it: its card, and what is true of it now."""

    card: ModelCard
    aliases: list[str]
    """The aliases pointing at it now (not at registration)."""
    uri: str
    files: list[str]
    """URIs of every file of the entry."""

    def to_dict(self) -> dict[str, Any]:
        return {**self.card.to_dict(), "aliases": self.aliases, "uri": self.uri, "files": self.files}


def show(store: Store, spec: str) -> Entry:
    name, version = resolve(store, spec)
    prefix = model_prefix(name, version)
    return Entry(
        card=read_card(store, prefix),
        aliases=sorted(a for a, v in _aliases(store, name).items() if v == version),
        uri=store.url(prefix),
        files=[store.url(k) for k in store.list(prefix)],
    )


def gate_decision(candidate_bpb: float, baseline: str, baseline_bpb: float, tolerance: float) -> tuple[bool, str]:
    """Whether the candidate takes the gate alias, and why (recorded on its card)."""
    if not baseline:
        return True, "no model holds the alias yet: the candidate takes it"
    if baseline_bpb < 0:
        return False, f"{baseline} uses another tokenizer or model shape: not comparable, alias kept"
    if candidate_bpb <= baseline_bpb + tolerance:
        return True, f"{candidate_bpb:.4f} bits/byte ≤ {baseline_bpb:.4f} + tolerance {tolerance}: promoted"
    return False, f"{candidate_bpb:.4f} bits/byte > {baseline_bpb:.4f} + tolerance {tolerance}: alias kept"


def gate(report: EvalReport, alias: str, tolerance: float) -> GateDecision:
    """The quality gate's decision on ``report`` for ``alias``, as its card records it."""
    promoted, reason = gate_decision(report.bits_per_byte, report.baseline, report.baseline_bits_per_byte, tolerance)
    return GateDecision(
        alias=alias,
        baseline=report.baseline,
        baseline_bits_per_byte=report.baseline_bits_per_byte if report.baseline_bits_per_byte >= 0 else None,
        candidate_bits_per_byte=report.bits_per_byte,
        tolerance=tolerance,
        promoted=promoted,
        reason=reason,
    )


def promote(store: Store, spec: str, alias: str) -> int:
    """Point ``alias`` at the version ``spec`` names; returns that version."""
    if not alias or "/" in alias or alias.isdigit():
        raise RegistryError(f"invalid alias {alias!r}: use a name such as production")
    name, version = resolve(store, spec)
    set_alias(store, name, alias, version)
    return version


def download(store: Store, spec: str, dest: str | Path) -> Path:
    """Copy a committed version's files to ``dest``; returns the folder."""
    name, version = resolve(store, spec)
    prefix = model_prefix(name, version)
    target = Path(dest)
    for key in store.list(prefix):
        if not key.endswith(("/_COMMITTED", f"/{CLAIM}")):
            store.download(key, target / key[len(prefix) + 1 :])
    return target


def card_markdown(card: ModelCard) -> str:
    lines = [
        f"# {card.name} v{card.version}",
        "",
        f"Registered {card.registered_at} from commit `{card.code.commit}`" + (" (dirty tree)" if card.code.dirty else ""),
        "",
        "## Metrics",
        *[f"- {k}: {v:.4f}" if isinstance(v, float) else f"- {k}: {v}" for k, v in sorted(card.metrics.items())],
        "",
        "## Trained by",
        *([f"- {span.describe()}" for span in card.layouts] or ["- not recorded"]),
        "",
        "## Lineage",
        *[f"- {k}: {v}" for k, v in sorted(dataclasses.asdict(card.lineage).items()) if v != ""],
    ]
    if card.gate is not None:
        lines += ["", "## Quality gate", f"`{card.gate.alias}`: {card.gate.reason}"]
    lines += [
        "",
        "## Samples",
        "Greedy:",
        "```",
        card.sample,
        "```",
        "Sampled:",
        "```",
        card.sampled,
        "```",
    ]
    if card.hf_export:
        lines += [
            "",
            "## Hugging Face",
            f"`{card.hf_export}/` holds safetensors weights, a Llama `config.json` and the tokenizer.",
            f"After `pretrain registry download {card.name}:{card.version} DEST`:",
            "```python",
            "from transformers import AutoModelForCausalLM, AutoTokenizer",
            f'model = AutoModelForCausalLM.from_pretrained("DEST/{card.hf_export}")',
            f'tokenizer = AutoTokenizer.from_pretrained("DEST/{card.hf_export}")',
            "```",
        ]
    return "\n".join(lines) + "\n"
