"""A model registry on the object store: immutable versions, lineage, aliases.

``models/<name>/<version>/`` holds ``card.json``, ``card.md``, the checkpoint (model
weights and meta), the tokenizer and, when the evaluation produced them, its
``evaluation.json`` and the Hugging Face export ``hf/`` (``from_pretrained`` loads it).
A version is first *claimed* with a conditional create, so concurrent registrations of
different models never write into the same directory; it becomes visible only when
``_COMMITTED`` is written last. Every object of a version is created only if absent (S3
``If-None-Match: *``), so nothing committed is ever overwritten.

A registration is idempotent: replayed (killed after its commit but before Flyte cached its
output, then rerun) or run twice at once (two identical executions), it gives exactly one
version. Its identity (``registration_identity``: what is registered, from which checkpoint
and evaluation, with which config and aliases) names ``models/<name>/registrations/<id>.json``,
created only if absent with the version claimed for it; the registration that loses that race
uses the winner's version. The version's claim names the identity too, so a twin that looks
between the winner's two creates takes the winner's number instead of claiming the next one
(``_claim_version``): twins leave no number skipped. Then a committed version only has its aliases moved again; an
uncommitted one (its writer died, or is writing at this moment) gets every object that is not
there yet (one that is was written by the identical registration: the same bytes, and its card
is the card) and is committed, a commit that finds the marker already there counting as done.
``models/<name>/aliases/<alias>.json`` points at a version; it is created only if absent and
replaced only if unchanged since it was read (its ETag: S3 ``If-Match``, a locked
compare-and-swap locally). A move that loses a race reads the alias again and decides again:
``latest`` only moves forward, and the quality gate's alias moves only while the holder the
candidate was compared with still holds it (``register``).

Names and aliases follow ``common.names`` (1-64 letters, digits, ``._-``, starting with a
letter or digit; an alias is not all digits), checked before the store is touched; every key
that becomes a local path is checked to stay inside its folder (``Store.relative``).

The card is a ``common.contracts.ModelCard``, built here alone (``register``) and read back
through the type (``read_card``); a card.json that does not fit it is a RegistryError.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from common.contracts import (
    CARD_MARKDOWN,
    CHECKPOINT_DIGESTS,
    CHECKPOINT_META,
    CHECKPOINT_MODEL,
    ENTRY_CHECKPOINT,
    ENTRY_EVALUATION,
    EOD_TOKEN,
    EVAL_RESULTS,
    HF_EXPORT,
    MANIFEST,
    MODELS,
    TOKENIZER,
    CheckpointRef,
    DatasetRef,
    EvalReport,
    GateDecision,
    Lineage,
    MixtureShare,
    ModelCard,
    ModelRef,
    card_key,
    describe_layouts,
    model_prefix,
    model_root,
    registration_key,
)
from common.digests import require_digests
from common.errors import did_you_mean, local_space
from common.hashing import config_hash
from common.names import VERSION, name_problem
from common.redact import redacted
from data_prep.blend import mixture_of
from data_prep.manifest import load_manifest, read_recorded
from registry.aliases import aliases_of, move_alias, read_alias
from registry.card import card_markdown, code_revision, lineage_urls, metric_text, read_card, store_key, utc_now
from registry.config import DEFAULT_GATE_METRIC, LATEST
from registry.gate import gate_decision, gate_direction, gate_for_holder
from registry.names import RegistryError, check_alias, check_name, parse_spec
from storage import COMMIT_MARKER, AlreadyCommitted, Store, StoreError

CLAIM = "_CLAIMED"
MARKERS = (COMMIT_MARKER, CLAIM)
"""The registry's own files in a version's folder: not the model's (``show`` lists, ``download`` copies, neither)."""

log = logging.getLogger(__name__)


def _versions(store: Store, name: str, committed_only: bool = True) -> list[int]:
    found = []
    for child in store.children(model_root(name)):
        if VERSION.fullmatch(child) and (not committed_only or store.is_committed(model_prefix(name, int(child)))):
            found.append(int(child))
    return sorted(found)


def _claim_version(store: Store, name: str, identity: str) -> int:
    """A version for registration ``identity``: the one an identical registration in flight
    claimed (its claim names the identity), else the next number, claimed by a conditional
    create that names ``identity``, so versions stay 1, 2, 3... when twin executions register
    at the same moment.

    A twin's claim is newer than every version committed before it: the claims are read from
    the newest down to the newest committed version (one or two reads in a registry of any
    size, not one per version). Only a third registration committing between the twins' two
    claims makes a twin claim a number of its own, which then stays an invisible, skipped
    claim: never a wrong version."""
    claimed = _versions(store, name, committed_only=False)
    for version in reversed(claimed):
        if _claimant(store, name, version) == identity:
            return version
        if store.is_committed(model_prefix(name, version)):
            break
    version = (claimed or [0])[-1] + 1
    while True:
        try:
            claim = {"claimed": utc_now(), "registration": identity}
            store.put_json(f"{model_prefix(name, version)}/{CLAIM}", claim, if_absent=True)
            return version
        except AlreadyCommitted:
            if _claimant(store, name, version) == identity:  # the twin claimed this number a moment before
                return version
            version += 1


def _claimant(store: Store, name: str, version: int) -> str | None:
    """The registration identity that claimed ``version`` (None: an older claim, or none)."""
    key = f"{model_prefix(name, version)}/{CLAIM}"
    try:
        record = store.get_json(key)
    except (StoreError, ValueError):  # no claim (a version folder being made), or not JSON: not ours
        return None
    return record.get("registration") if isinstance(record, dict) else None


def registration_identity(
    store: Store,
    name: str,
    report: EvalReport,
    config: dict[str, Any] | None,
    aliases: tuple[str, ...],
    gate_alias: str,
    gate_tolerance: float,
    gate_metric: str = "",
) -> str:
    """What makes two registrations the same one: the model name, the checkpoint (store and
    prefix), the evaluation (its committed outputs, which name the checkpoint, the evaluation
    settings and the baseline; a report without outputs by its figures), the pipeline config,
    the aliases and the gate. Not the Flyte execution: a replay or a twin execution is the same
    registration."""
    evaluation: Any = report.outputs
    if not evaluation:  # no files to name it: what it measured
        evaluation = {k: v for k, v in dataclasses.asdict(report).items() if k not in ("checkpoint", "outputs")}
    ckpt = report.checkpoint
    return config_hash(
        {
            "name": name,
            "store": store.uri,
            "checkpoint": {"store": ckpt.store, "prefix": ckpt.prefix},
            "evaluation": evaluation,
            "config": config or {},
            "aliases": list(aliases),
            "gate_alias": gate_alias,
            "gate_tolerance": gate_tolerance,
            # Only a gate on another figure than bits per byte adds a key: identities of before stay.
            **({"gate_metric": gate_metric} if gate_metric and gate_metric != DEFAULT_GATE_METRIC else {}),
        }
    )


def _claim_registration(store: Store, name: str, identity: str) -> int:
    """The version of the registration ``identity``: the one an identical registration claimed
    (replayed, or running at this moment), else a new one."""
    key = registration_key(name, identity)
    if store.exists(key):
        return _claimed_version(store, key)
    version = _claim_version(store, name, identity)
    try:
        store.put_json(key, {"version": version, "claimed": utc_now()}, if_absent=True)
    except AlreadyCommitted:
        # An identical registration claimed first: its version is the one. The number claimed
        # above stays an uncommitted claim, invisible (``_versions`` lists committed ones only).
        return _claimed_version(store, key)
    return version


def _check_same_registration(store: Store, prefix: str, identity: str) -> None:
    """AlreadyCommitted unless the committed entry ``prefix`` was committed by registration
    ``identity`` (its marker says which): a writer aimed at someone else's version fails loudly."""
    marker = store.get_json(f"{prefix}/{COMMIT_MARKER}")
    theirs = marker.get("registration") if isinstance(marker, dict) else None
    if theirs != identity:
        raise AlreadyCommitted(
            f"{store.url(prefix)} already exists, committed by another registration ({theirs or 'unrecorded'}, "
            f"not {identity}): nothing was written to it"
        )


def _claimed_version(store: Store, key: str) -> int:
    record = store.get_json(key)
    version = record.get("version") if isinstance(record, dict) else None
    if type(version) is not int or version < 1:
        raise RegistryError(f"{store.url(key)} does not name a version ({record!r}): delete it and register again")
    return version


def _create(store: Store, key: str, data: bytes | None = None, path: Path | None = None) -> bool:
    """Create ``key`` from ``data`` or the file ``path`` if it is absent; False if it exists (an
    identical registration wrote it: never overwritten)."""
    try:
        if path is not None:
            store.put_file(key, path, if_absent=True)
        else:
            store.put_bytes(key, data or b"", if_absent=True)
        return True
    except AlreadyCommitted:
        return False


def _json(obj: Any) -> bytes:
    return json.dumps(obj, indent=2, sort_keys=True).encode()  # as Store.put_json writes it


def register(
    store: Store,
    name: str,
    report: EvalReport,
    *,
    config: dict[str, Any] | None = None,
    gate_alias: str = "",
    gate_tolerance: float = 0.0,
    execution_id: str = "",
    aliases: tuple[str, ...] = (LATEST,),
    gate_metric: str | None = None,
    run_name: str = "",
) -> ModelRef:
    """Register the evaluated checkpoint of ``report`` as a new version of ``name``: copy its
    weights, the tokenizer and the evaluation outputs (``report.outputs``, when set), write the
    card, commit, move ``aliases`` (``latest`` only forward). ``config`` is the pipeline config
    as asked (a dict).

    With ``gate_alias`` the quality gate decides whether the candidate takes that alias too
    (``gate_for_holder``), against the holder read again here, just before the card records
    the decision: the figures measured by the evaluation when the holder is still the one it
    compared with, else the new holder's recorded bits per byte when they are on the same
    validation rows, else the alias is kept. The alias is then moved only if that holder still
    holds it (conditional on its ETag); if another registration moved it in between, the
    decision is taken again against the new holder and the alias moves only if the candidate
    passes against it as well (the card keeps the first decision; the log says so).

    ``gate_metric`` is the figure the gate compares (``bits_per_byte``, lower is better, or
    ``lm_eval.<task>.<metric>``: ``gate_direction``); None: ``config``'s ``registry.gate_metric``,
    else bits per byte.

    Idempotent (see the module's docstring): the same registration replayed, or made twice at
    once, returns the same ModelRef and leaves one version, whose card's gate decision is the one
    its aliases follow."""
    check_name(name)
    if gate_metric is None:
        gate_metric = ((config or {}).get("registry") or {}).get("gate_metric") or DEFAULT_GATE_METRIC
    for alias in (*aliases, *filter(None, [gate_alias])):
        check_alias(alias)
    if gate_alias in aliases:
        raise RegistryError(f"alias {gate_alias!r} is moved by every registration: the quality gate cannot guard it")
    ckpt = report.checkpoint
    for needed in filter(None, (ckpt.prefix, report.outputs)):
        if not store.is_committed(needed):
            raise RegistryError(f"{store.url(needed)} is not committed: nothing to register")
    identity = registration_identity(store, name, report, config, aliases, gate_alias, gate_tolerance, gate_metric)
    version = _claim_registration(store, name, identity)
    prefix = model_prefix(name, version)
    replay = store.is_committed(prefix)
    if replay:  # the entry is there: only its aliases may lag (killed between the commit and the moves)
        _check_same_registration(store, prefix, identity)
        card = read_card(store, prefix)
    else:
        card = _write_entry(store, name, version, report, config, gate_alias, gate_tolerance, execution_id, gate_metric, run_name)
        try:
            store.commit(prefix, {"version": version, "registration": identity})
        except AlreadyCommitted:
            _check_same_registration(store, prefix, identity)  # the identical registration committed first
    _move_aliases(store, name, version, aliases, replay)
    if gate_alias and card.gate is not None and card.gate.promoted:
        _move_gated_alias(store, name, version, report, config, gate_alias, gate_tolerance, gate_metric, card.gate.baseline)
    return ModelRef(store=store.uri, name=name, version=version, prefix=prefix)


def _move_aliases(store: Store, name: str, version: int, aliases: tuple[str, ...], replay: bool) -> None:
    """Point ``aliases`` at ``version``: ``latest`` (and every alias of a replay) only forward."""
    for alias in aliases:
        if alias == LATEST or replay:
            # Never back to an older version: a slower registration's, or a replay's long after a
            # later registration took the alias.
            move_alias(store, name, alias, lambda holder: version if holder is None or holder < version else None)
        else:
            move_alias(store, name, alias, lambda holder: version)


def _move_gated_alias(
    store: Store,
    name: str,
    version: int,
    report: EvalReport,
    config: dict[str, Any] | None,
    gate_alias: str,
    gate_tolerance: float,
    gate_metric: str,
    compared_with: str,
) -> None:
    """Move ``gate_alias`` to ``version``, which passed the gate against ``compared_with``, if that holder still
    holds it; else decide again against the new holder and move it only if the candidate passes there too."""

    def still_passes(holder: int | None) -> int | None:
        entry = model_prefix(name, holder) if holder is not None else ""
        if entry == compared_with or holder == version:
            return version
        evaluation = (config or {}).get("evaluation")
        again = gate_for_holder(store, name, report, gate_alias, gate_tolerance, holder, evaluation, gate_metric)
        if again.promoted:
            return version
        log.warning(
            "%s:%s moved to %s while %s:%s was registered (the card records the decision against %s): %s",
            name, gate_alias, entry, name, version, compared_with or "no holder", again.reason,
        )  # fmt: skip
        return None

    move_alias(store, name, gate_alias, still_passes)


def _write_entry(
    store: Store,
    name: str,
    version: int,
    report: EvalReport,
    config: dict[str, Any] | None,
    gate_alias: str,
    gate_tolerance: float,
    execution_id: str,
    gate_metric: str = "",
    run_name: str = "",
) -> ModelCard:
    """Every object of the uncommitted entry ``version`` that is not there yet; returns its card
    (the one already there, if an identical registration wrote it first)."""
    ckpt = report.checkpoint
    prefix = model_prefix(name, version)
    manifest = load_manifest(store, ckpt.dataset)  # digest-checked: the tokenizer copied and the card's lineage
    copied, hf_export = _copy_entry_files(store, prefix, report, manifest)
    if store.exists(f"{ckpt.prefix}/{CHECKPOINT_DIGESTS}"):
        # The copy's own list: the files it holds, with the digests committed with the run (a
        # file that is not listed there stays unlisted, and loading the entry refuses it).
        digests = store.get_json(f"{ckpt.prefix}/{CHECKPOINT_DIGESTS}")
        digests["files"] = {rel: digests["files"][rel] for rel in copied if rel in digests["files"]}
        _create(store, f"{prefix}/{ENTRY_CHECKPOINT}/{CHECKPOINT_DIGESTS}", _json(digests))
    decision = None
    if gate_alias:  # the holder now, not the one find_gate_holder saw before the evaluation
        holder = read_alias(store, name, gate_alias)[0]
        evaluation = (config or {}).get("evaluation")
        decision = gate_for_holder(store, name, report, gate_alias, gate_tolerance, holder, evaluation, gate_metric)
    card = _entry_card(store, name, version, report, manifest, config, execution_id, decision, hf_export, run_name)
    if not _create(store, card_key(prefix), _json(card.to_dict())):
        card = read_card(store, prefix)  # the identical registration's: its time and gate decision
    _create(store, f"{prefix}/{CARD_MARKDOWN}", card_markdown(card).encode())
    return card


def _copy_entry_files(store: Store, prefix: str, report: EvalReport, manifest: dict) -> tuple[list[str], str]:
    """Copy the checkpoint's model files and meta, the dataset's tokenizer (as its ``manifest`` records it) and
    the evaluation's results and Hugging Face export (digest-checked) under ``prefix``, through a local staging
    folder; returns the checkpoint files copied (relative to the checkpoint) and the export's folder name ('' without
    one)."""
    ckpt = report.checkpoint
    hf_export = ""
    with tempfile.TemporaryDirectory(prefix="pretrain-register-") as tmp, local_space(tmp, "the registry entry's staging"):
        staging = Path(tmp)
        copied = []
        for key in store.list(f"{ckpt.prefix}/"):
            rel = store.relative(ckpt.prefix, key)  # stays inside the staging folder
            if rel.startswith(f"{CHECKPOINT_MODEL}/") or rel == CHECKPOINT_META:
                store.download(key, staging / ENTRY_CHECKPOINT / rel)
                copied.append(rel)
        (staging / TOKENIZER).write_bytes(read_recorded(store, ckpt.dataset, "tokenizer", manifest))
        if report.outputs:
            for key in store.list(f"{report.outputs}/"):
                rel = store.relative(report.outputs, key)
                if rel == EVAL_RESULTS:
                    store.download(key, staging / ENTRY_EVALUATION)
                elif rel.startswith(f"{HF_EXPORT}/"):
                    store.download(key, staging / rel)
                    hf_export = HF_EXPORT
            if hf_export:  # the evaluation's bytes only: the run folder can be written by the train role
                what = f"the Hugging Face export {store.url(f'{report.outputs}/{HF_EXPORT}')}"
                require_digests(staging / HF_EXPORT, report.export_digests, what, "the evaluation report's export_digests")
        # A version's objects are only ever created: one already there is the identical copy.
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            _create(store, f"{prefix}/{path.relative_to(staging).as_posix()}", path=path)
    return copied, hf_export


def _entry_card(
    store: Store,
    name: str,
    version: int,
    report: EvalReport,
    manifest: dict,
    config: dict[str, Any] | None,
    execution_id: str,
    decision: GateDecision | None,
    hf_export: str,
    run_name: str = "",
) -> ModelCard:
    """The card of entry ``version``: the evaluation's and the training's figures, the lineage, the layouts,
    the (redacted) config, the code revision, the gate's decision and the run's name (``common.run_names``);
    ``manifest`` is the dataset's (checked)."""
    ckpt = report.checkpoint
    return ModelCard(
        name=name,
        version=version,
        registered_at=utc_now(),
        metrics={
            "val_loss": report.val_loss,
            "perplexity": report.perplexity,
            "bits_per_byte": report.bits_per_byte,
            "val_tokens": report.tokens_evaluated,
            **ckpt.summary,
            **report.lm_eval,
            # The base's figures on the same rows, beside the candidate's: what continuing it changed.
            **{f"base.{k}": v for k, v in report.base.items()},
            # A mixture's figures per component, each on its own validation rows.
            **{f"{k}.{name}": v for name, figures in report.components.items() for k, v in figures.items()},
        },
        sample=report.sample,
        sampled=report.sampled,
        # Keys, not URLs: a copied or moved store still reads its cards (registry.card.location_url).
        lineage=Lineage(
            dataset_version=ckpt.dataset.version,
            dataset=_dataset_location(store, ckpt.dataset),
            dataset_manifest=f"{ckpt.dataset.prefix}/{MANIFEST}",
            tokenizer_sha256=manifest["tokenizer"]["sha256"],
            training_run=ckpt.run,
            training_steps=ckpt.step,
            checkpoint=ckpt.prefix,
            base_model=ckpt.base_model,
            cooldown_from=ckpt.cooled_from,
            evaluation=report.outputs,
            flyte_execution_id=execution_id,
            eod_token=manifest.get("eod_token", EOD_TOKEN) if manifest.get("eod_token", EOD_TOKEN) != EOD_TOKEN else "",
            mixture=_mixture(manifest, ckpt),
        ),
        layouts=list(ckpt.layouts),
        config=redacted(config or {}),  # a card is read by everyone who can list the registry
        code=code_revision(),
        gate=decision,
        hf_export=hf_export,
        run_name=run_name,
    )


def _mixture(manifest: dict, ckpt: CheckpointRef) -> list[MixtureShare]:
    """Each component's share and what the run took of it (``tokens_trained.<name>`` in the training summary;
    a plain dataset's is the run's ``tokens_trained``)."""
    parts = mixture_of(manifest, ckpt.dataset)
    seq_len = int(manifest.get("seq_len", 0))
    shares = []
    for part in parts:
        key = f"tokens_trained.{part['name']}" if len(parts) > 1 else "tokens_trained"
        tokens = int(ckpt.summary.get(key, 0))
        epochs = tokens / max(1, part["train_sequences"] * seq_len)
        shares.append(MixtureShare(part["name"], part["dataset"], float(part["weight"]), tokens, round(epochs, 4)))
    return shares


def _dataset_location(store: Store, dataset: DatasetRef) -> str:
    """The dataset's key when it is in the registry's store (always, in the pipeline), else its URL."""
    return store_key(store, f"{dataset.store.rstrip('/')}/{dataset.prefix}") if dataset.store else dataset.prefix


def _model_names(store: Store) -> list[str]:
    """The registry's model names: its folders, less any no registration could have made."""
    return [name for name in store.children(MODELS) if not name_problem(name)]


def list_models(store: Store) -> list[dict[str, Any]]:
    """One row per committed version: name, version, aliases, key metrics."""
    rows = []
    for name in _model_names(store):
        aliases = aliases_of(store, name)
        for version in _versions(store, name):
            card = read_card(store, model_prefix(name, version))
            rows.append(
                {
                    "name": name,
                    "version": version,
                    "aliases": sorted(a for a, v in aliases.items() if v == version),
                    "registered_at": card.registered_at,
                    "dataset": card.lineage.dataset_version,
                    "run_name": card.run_name,
                    "metrics": card.metrics,
                    "trained_by": describe_layouts(card.layouts),
                    "uri": store.url(model_prefix(name, version)),
                }
            )
    return rows


def _not_found(store: Store, name: str, version: int | None, alias: str) -> RegistryError:
    """What a spec that names nothing gets: the models there are (or the model's aliases, or versions),
    with the closest one to a typo."""
    models = _model_names(store)
    if name not in models:
        listed = f"; models: {', '.join(sorted(models))}" if models else " (no models registered)"
        return RegistryError(f"no model {name!r} in {store.uri}{did_you_mean(name, models)}{listed}")
    if version is None:
        aliases = aliases_of(store, name)
        known = f"; its aliases: {', '.join(sorted(aliases)) or 'none'}"
        return RegistryError(f"model {name!r} has no alias {alias!r} in {store.uri}{did_you_mean(alias, aliases)}{known}")
    versions = ", ".join(map(str, _versions(store, name))) or "none"
    return RegistryError(f"model {name}:{version} does not exist in {store.uri}; its versions: {versions}")


def resolve(store: Store, spec: str) -> tuple[str, int]:
    """``NAME``, ``NAME:VERSION`` or ``NAME:ALIAS`` → (name, version); NAME alone means latest.
    A name or alias outside ``common.names`` is refused before the store is read."""
    name, version, which = parse_spec(spec)
    if version is None:
        version = read_alias(store, name, which)[0]
    if version is None or not store.is_committed(model_prefix(name, version)):
        raise _not_found(store, name, version, which)
    return name, version


@dataclass
class Entry:
    """A committed version as ``show`` finds it: its card, and what is true of it now."""

    card: ModelCard
    aliases: list[str]
    """The aliases pointing at it now (not at registration)."""
    uri: str
    files: list[str]
    """URIs of every file of the entry (not the registry's markers, ``MARKERS``)."""
    lineage_urls: dict[str, str] = field(default_factory=dict)
    """Where each location of the card's lineage is in this store (its keys resolved here)."""

    def to_dict(self) -> dict[str, Any]:
        out = {**self.card.to_dict(), "aliases": self.aliases, "uri": self.uri, "files": self.files}
        return {**out, "lineage_urls": self.lineage_urls}


def show(store: Store, spec: str) -> Entry:
    name, version = resolve(store, spec)
    prefix = model_prefix(name, version)
    card = read_card(store, prefix)
    return Entry(
        card=card,
        aliases=sorted(a for a, v in aliases_of(store, name).items() if v == version),
        uri=store.url(prefix),
        files=[store.url(k) for k in store.list(f"{prefix}/") if k not in {f"{prefix}/{m}" for m in MARKERS}],
        lineage_urls=lineage_urls(store, card.lineage),
    )


@dataclass(frozen=True)
class Promotion:
    """What ``promote`` did: ``name:alias`` names ``version`` now, and named ``replaced`` before (None: nothing)."""

    name: str
    alias: str
    version: int
    replaced: int | None
    metric: str = ""
    """The figure the two versions' cards were compared on ('' when they were not: one of them lacks it)."""
    figure: float | None = None
    """``version``'s ``metric``."""
    replaced_figure: float | None = None
    """``replaced``'s ``metric``."""
    worse: bool = False
    """``version`` is worse on ``metric`` than ``replaced`` (promoted all the same: not asked to refuse)."""
    note: str = ""
    """Why the figures may not compare (measured on different validation data), '' when nothing says so."""


def promote(store: Store, spec: str, alias: str, *, refuse_worse: bool = False) -> Promotion:
    """Point ``alias`` at the version ``spec`` names, comparing it with the version the alias names now on the
    figure the quality gate compares (``compared_figures``). With ``refuse_worse``, a version worse than that
    holder is refused (a RegistryError giving both figures) and the alias left as it is. The comparison is made
    against the holder the conditional write replaces (``move_alias``): one that moves meanwhile is compared again."""
    check_alias(alias)
    name, version = resolve(store, spec)
    card = read_card(store, model_prefix(name, version))
    done: list[Promotion] = []

    def decide(holder: int | None) -> int:
        done.clear()
        promotion = _compared(store, card, alias, holder)
        if promotion.worse and refuse_worse:
            raise RegistryError(_worse_text(promotion))
        done.append(promotion)
        return version

    move_alias(store, name, alias, decide)
    return done[-1]


def compared_figures(candidate: ModelCard, holder: ModelCard) -> tuple[str, float | None, float | None]:
    """The figure two versions compare on, and each one's: the candidate's gate metric (its config's
    ``registry.gate_metric``) when both cards record it, else bits per byte; ('', None, None) when neither."""
    asked = ((candidate.config.get("registry") or {}).get("gate_metric")) or DEFAULT_GATE_METRIC
    for metric in dict.fromkeys((asked, DEFAULT_GATE_METRIC)):
        ours, theirs = candidate.metrics.get(metric), holder.metrics.get(metric)
        measured = [v for v in (ours, theirs) if isinstance(v, int | float) and not isinstance(v, bool)]
        # A negative bits per byte: not measurable (another tokenizer), as the gate reads it.
        if len(measured) == 2 and not (metric == DEFAULT_GATE_METRIC and min(measured) < 0):
            return metric, float(ours), float(theirs)
    return "", None, None


def _compared(store: Store, card: ModelCard, alias: str, holder: int | None) -> Promotion:
    """The promotion of ``card``'s version to ``alias`` over ``holder``, with the two figures compared."""
    name, version = card.name, card.version
    if holder is None or holder == version:
        return Promotion(name, alias, version, holder)
    try:
        theirs = read_card(store, model_prefix(name, holder))
    except (RegistryError, StoreError, ValueError):  # an alias naming a version gone or unreadable: nothing to compare
        return Promotion(name, alias, version, holder)
    metric, figure, replaced_figure = compared_figures(card, theirs)
    if not metric:
        return Promotion(name, alias, version, holder)
    promoted, _reason = gate_decision(figure, model_prefix(name, holder), replaced_figure, 0.0, metric)
    ours_data, theirs_data = card.lineage.dataset_version, theirs.lineage.dataset_version
    differ = ours_data and theirs_data and ours_data != theirs_data
    note = f"measured on different validation data (datasets {ours_data} and {theirs_data})" if differ else ""
    return Promotion(name, alias, version, holder, metric, figure, replaced_figure, not promoted, note)


def _worse_text(p: Promotion) -> str:
    better = "lower" if gate_direction(p.metric) < 0 else "higher"
    note = f"; {p.note}" if p.note else ""
    ours, theirs = metric_text(p.metric, p.figure), metric_text(p.metric, p.replaced_figure)
    return (
        f"{p.name}:{p.version} ({p.metric} {ours}) is worse than {p.name}:{p.replaced} ({p.metric} {theirs}), which "
        f"{p.alias} names ({better} is better){note}; {p.alias} left on version {p.replaced}: add --force to move it anyway"
    )


def download(store: Store, spec: str, dest: str | Path) -> Path:
    """Copy a committed version's files to ``dest``; returns the folder.

    Every key of the version's folder is checked to stay inside it before anything is written:
    a planted key (``..``, an absolute or empty part) writes nothing anywhere."""
    name, version = resolve(store, spec)
    prefix = model_prefix(name, version)
    target = Path(dest)
    try:
        planned = [(key, store.relative(prefix, key)) for key in store.list(f"{prefix}/")]
    except StoreError as e:
        raise RegistryError(f"{name}:{version} holds a key outside its folder, nothing was downloaded: {e}") from e
    for key, rel in planned:
        if rel not in MARKERS:
            store.download(key, target / rel)
    return target
