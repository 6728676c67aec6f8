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
uses the winner's version. Then a committed version only has its aliases moved again; an
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
import datetime as dt
import json
import logging
import random
import subprocess
import tempfile
import time
from collections.abc import Callable
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
    registration_key,
)
from common.errors import ConfigError, UserError, local_space
from common.hashing import config_hash
from common.names import VERSION, name_problem
from storage import COMMIT_MARKER, AlreadyCommitted, PreconditionFailed, Store, StoreError

CLAIM = "_CLAIMED"
LATEST = "latest"
"""The alias every registration moves to its version (forward only)."""
ALIAS_ATTEMPTS = 50
"""Conditional alias writes tried before giving up when other writers keep winning."""
ROW_SETTINGS = ("batch_size", "max_batches")
"""The evaluation settings that, with the dataset version, fix which validation rows are scored."""
DEFAULT_GATE_METRIC = "bits_per_byte"
LOWER_IS_BETTER = ("bits_per_byte", "val_loss", "perplexity")
"""Figures (the last part of a metric's name) for which less is better; any other (acc, acc_norm) more."""

log = logging.getLogger(__name__)


class RegistryError(UserError, LookupError):
    """A model or version that does not exist, or a registration that cannot proceed."""


def check_name(name: object) -> str:
    """``name`` if it is a valid model name (``common.names``), else a RegistryError naming it."""
    problem = name_problem(name)
    if problem:
        raise RegistryError(f"invalid model name {name!r}: {problem}")
    return name  # type: ignore[return-value]


def check_alias(alias: object) -> str:
    """``alias`` if it is a valid alias (``common.names``), else a RegistryError naming it."""
    problem = name_problem(alias, alias=True)
    if problem:
        raise RegistryError(f"invalid alias {alias!r}: {problem}")
    return alias  # type: ignore[return-value]


def parse_spec(spec: object) -> tuple[str, int | None, str]:
    """``NAME``, ``NAME:VERSION`` or ``NAME:ALIAS`` → (name, version or None, alias or ''),
    checked against the naming rule without touching the store; NAME alone means ``latest``."""
    if not isinstance(spec, str):
        raise RegistryError(f"invalid model spec {spec!r}: use NAME, NAME:VERSION or NAME:ALIAS")
    name, colon, which = spec.partition(":")
    check_name(name)
    if not colon:
        return name, None, LATEST
    if VERSION.fullmatch(which):
        return name, int(which), ""
    if which.isascii() and which.isdigit():
        raise RegistryError(f"invalid version {which!r} in {spec!r}: versions are 1, 2, 3, ... (no leading zeros)")
    return name, None, check_alias(which)


def _versions(store: Store, name: str, committed_only: bool = True) -> list[int]:
    found = []
    for child in store.children(model_root(name)):
        if VERSION.fullmatch(child) and (not committed_only or store.is_committed(model_prefix(name, int(child)))):
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
    version = _claim_version(store, name)
    try:
        store.put_json(key, {"version": version, "claimed": _now()}, if_absent=True)
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
    gate_alias: str = "",
    gate_tolerance: float = 0.0,
    execution_id: str = "",
    aliases: tuple[str, ...] = (LATEST,),
    gate_metric: str | None = None,
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
        card = _write_entry(store, name, version, report, config, gate_alias, gate_tolerance, execution_id, gate_metric)
        try:
            store.commit(prefix, {"version": version, "registration": identity})
        except AlreadyCommitted:
            _check_same_registration(store, prefix, identity)  # the identical registration committed first
    for alias in aliases:
        if alias == LATEST or replay:
            # Never back to an older version: a slower registration's, or a replay's long after a
            # later registration took the alias.
            _move_alias(store, name, alias, lambda holder: version if holder is None or holder < version else None)
        else:
            _move_alias(store, name, alias, lambda holder: version)
    decision = card.gate
    if gate_alias and decision is not None and decision.promoted:
        compared_with = decision.baseline

        def still_passes(holder: int | None) -> int | None:
            entry = model_prefix(name, holder) if holder is not None else ""
            if entry == compared_with or holder == version:
                return version
            again = gate_for_holder(
                store, name, report, gate_alias, gate_tolerance, holder, (config or {}).get("evaluation"), gate_metric
            )
            if again.promoted:
                return version
            log.warning(
                "%s:%s moved to %s while %s:%s was registered (the card records the decision against %s): %s",
                name, gate_alias, entry, name, version, compared_with or "no holder", again.reason,
            )  # fmt: skip
            return None

        _move_alias(store, name, gate_alias, still_passes)
    return ModelRef(store=store.uri, name=name, version=version, prefix=prefix)


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
) -> ModelCard:
    """Every object of the uncommitted entry ``version`` that is not there yet; returns its card
    (the one already there, if an identical registration wrote it first)."""
    ckpt = report.checkpoint
    prefix = model_prefix(name, version)
    manifest = store.get_json(f"{ckpt.dataset.prefix}/{MANIFEST}")
    hf_export = ""
    with tempfile.TemporaryDirectory(prefix="pretrain-register-") as tmp, local_space(tmp, "the registry entry's staging"):
        staging = Path(tmp)
        copied = []
        for key in store.list(f"{ckpt.prefix}/"):
            rel = store.relative(ckpt.prefix, key)  # stays inside the staging folder
            if rel.startswith(f"{CHECKPOINT_MODEL}/") or rel == CHECKPOINT_META:
                store.download(key, staging / ENTRY_CHECKPOINT / rel)
                copied.append(rel)
        store.download(f"{ckpt.dataset.prefix}/{TOKENIZER}", staging / TOKENIZER)
        if report.outputs:
            for key in store.list(f"{report.outputs}/"):
                rel = store.relative(report.outputs, key)
                if rel == EVAL_RESULTS:
                    store.download(key, staging / ENTRY_EVALUATION)
                elif rel.startswith(f"{HF_EXPORT}/"):
                    store.download(key, staging / rel)
                    hf_export = HF_EXPORT
        # A version's objects are only ever created: one already there is the identical copy.
        for path in sorted(p for p in staging.rglob("*") if p.is_file()):
            _create(store, f"{prefix}/{path.relative_to(staging).as_posix()}", path=path)
    if store.exists(f"{ckpt.prefix}/{CHECKPOINT_DIGESTS}"):
        # The copy's own list: the files it holds, with the digests committed with the run (a
        # file that is not listed there stays unlisted, and loading the entry refuses it).
        digests = store.get_json(f"{ckpt.prefix}/{CHECKPOINT_DIGESTS}")
        digests["files"] = {rel: digests["files"][rel] for rel in copied if rel in digests["files"]}
        _create(store, f"{prefix}/{ENTRY_CHECKPOINT}/{CHECKPOINT_DIGESTS}", _json(digests))
    decision = None
    if gate_alias:  # the holder now, not the one find_gate_holder saw before the evaluation
        holder = _read_alias(store, name, gate_alias)[0]
        evaluation = (config or {}).get("evaluation")
        decision = gate_for_holder(store, name, report, gate_alias, gate_tolerance, holder, evaluation, gate_metric)
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
            **report.lm_eval,
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
        gate=decision,
        hf_export=hf_export,
    )
    if not _create(store, card_key(prefix), _json(card.to_dict())):
        card = read_card(store, prefix)  # the identical registration's: its time and gate decision
    _create(store, f"{prefix}/{CARD_MARKDOWN}", card_markdown(card).encode())
    return card


def _read_alias(store: Store, name: str, alias: str) -> tuple[int | None, str | None]:
    """The version ``name:alias`` points at and the alias object's ETag; (None, None) if there is none."""
    key = alias_key(name, alias)
    for attempt in range(3):
        try:
            record, etag = store.get_json_with_etag(key)
            break
        except StoreError:
            if not store.exists(key):
                return None, None
            if attempt == 2:
                raise  # it exists and cannot be read
            # created between the read and the check: read it again
        except ValueError as e:
            raise RegistryError(f"{store.url(key)} is not JSON: {e}") from e
    version = record.get("version") if isinstance(record, dict) else None
    if type(version) is not int or version < 1:
        raise RegistryError(f"{store.url(key)} does not name a version ({record!r}): promote a version to {name}:{alias} again")
    return version, etag


def _move_alias(store: Store, name: str, alias: str, decide: Callable[[int | None], int | None]) -> int | None:
    """Point ``name:alias`` at ``decide(holder)`` (None: leave it), ``holder`` being the version
    it points at now; the write is conditional on the alias being what ``decide`` saw (created
    only if absent, replaced only if its ETag is unchanged). A lost race reads the alias again
    and decides again. Returns the version the alias holds afterwards."""
    key = alias_key(name, alias)
    for attempt in range(ALIAS_ATTEMPTS):
        holder, etag = _read_alias(store, name, alias)
        target = decide(holder)
        if target is None or target == holder:
            return holder
        if not store.is_committed(model_prefix(name, target)):
            raise RegistryError(f"{name}:{target} is not a committed version")
        record = {"version": target, "updated_at": _now()}
        try:
            if etag is None:
                store.put_json(key, record, if_absent=True)
            else:
                store.put_json(key, record, if_match=etag)
            return target
        except (AlreadyCommitted, PreconditionFailed):
            time.sleep(random.uniform(0, min(0.5, 0.005 * 2**attempt)))  # someone else moved it: again
    raise RegistryError(f"{name}:{alias} kept changing under {ALIAS_ATTEMPTS} attempts to move it; try again")


def set_alias(store: Store, name: str, alias: str, version: int) -> None:
    """Point ``name:alias`` at ``version`` (a committed one), whoever moved it last."""
    check_name(name)
    check_alias(alias)
    if type(version) is not int or version < 1:
        raise RegistryError(f"invalid version {version!r}: versions are 1, 2, 3, ...")
    if not store.is_committed(model_prefix(name, version)):
        raise RegistryError(f"{name}:{version} is not a committed version")
    _move_alias(store, name, alias, lambda holder: version)


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
        if name_problem(name):  # a folder no registration could have made
            continue
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
    """Every alias of ``name`` and its version (files that are not an alias's are left out)."""
    out = {}
    folder = aliases_prefix(name)
    for key in store.list(folder):
        alias = key[len(folder) :].removesuffix(".json")
        if key.endswith(".json") and not name_problem(alias, alias=True):
            try:
                version = _read_alias(store, name, alias)[0]
            except RegistryError:
                continue
            if version is not None:
                out[alias] = version
    return out


def resolve(store: Store, spec: str) -> tuple[str, int]:
    """``NAME``, ``NAME:VERSION`` or ``NAME:ALIAS`` → (name, version); NAME alone means latest.
    A name or alias outside ``common.names`` is refused before the store is read."""
    name, version, which = parse_spec(spec)
    if version is None:
        version = _read_alias(store, name, which)[0]
        if version is None:
            raise RegistryError(f"model {name!r} has no alias {which!r} in {store.uri}")
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
        files=[store.url(k) for k in store.list(f"{prefix}/")],
    )


def gate_direction(metric: str) -> int:
    """+1 when more of ``metric`` is better (acc, acc_norm), -1 when less is (``LOWER_IS_BETTER``)."""
    return -1 if metric.rpartition(".")[2] in LOWER_IS_BETTER else 1


def gate_decision(
    candidate: float | None, baseline: str, baseline_value: float | None, tolerance: float, metric: str = DEFAULT_GATE_METRIC
) -> tuple[bool, str]:
    """Whether the candidate takes the gate alias, and why (recorded on its card): its ``metric``
    against the holder's on the same rows or examples, ``tolerance`` in the metric's units."""
    if not baseline:
        return True, "no model holds the alias yet: the candidate takes it"
    if metric == DEFAULT_GATE_METRIC:
        if baseline_value is None or baseline_value < 0:
            return False, f"{baseline} uses another tokenizer or model shape: not comparable, alias kept"
        if candidate <= baseline_value + tolerance:
            return True, f"{candidate:.4f} bits/byte ≤ {baseline_value:.4f} + tolerance {tolerance}: promoted"
        return False, f"{candidate:.4f} bits/byte > {baseline_value:.4f} + tolerance {tolerance}: alias kept"
    if candidate is None:
        return False, f"the candidate has no {metric} (is its task in evaluation.lm_eval_tasks?): alias kept"
    if baseline_value is None:
        return False, f"{baseline} has no {metric} on the same examples (no Hugging Face export?): not comparable, alias kept"
    if gate_direction(metric) < 0:
        if candidate <= baseline_value + tolerance:
            return True, f"{metric} {candidate:.4f} ≤ {baseline_value:.4f} + tolerance {tolerance}: promoted"
        return False, f"{metric} {candidate:.4f} > {baseline_value:.4f} + tolerance {tolerance}: alias kept"
    if candidate >= baseline_value - tolerance:
        return True, f"{metric} {candidate:.4f} ≥ {baseline_value:.4f} − tolerance {tolerance}: promoted"
    return False, f"{metric} {candidate:.4f} < {baseline_value:.4f} − tolerance {tolerance}: alias kept"


def _figures(report: EvalReport, metric: str) -> tuple[float | None, float | None]:
    """The candidate's ``metric`` and the baseline's, as the evaluation measured them (None: not measured)."""
    if metric == DEFAULT_GATE_METRIC:
        return report.bits_per_byte, report.baseline_bits_per_byte if report.baseline_bits_per_byte >= 0 else None
    return report.lm_eval.get(metric), report.baseline_lm_eval.get(metric)


def gate(report: EvalReport, alias: str, tolerance: float, metric: str = DEFAULT_GATE_METRIC) -> GateDecision:
    """The quality gate's decision on ``report`` for ``alias`` against the holder the evaluation
    compared it with (``report.baseline``), as its card records it."""
    candidate, baseline = _figures(report, metric)
    promoted, reason = gate_decision(candidate, report.baseline, baseline, tolerance, metric)
    return GateDecision(
        alias=alias,
        baseline=report.baseline,
        baseline_bits_per_byte=report.baseline_bits_per_byte if report.baseline_bits_per_byte >= 0 else None,
        candidate_bits_per_byte=report.bits_per_byte,
        tolerance=tolerance,
        promoted=promoted,
        reason=reason,
        metric=metric,
        candidate_value=candidate,
        baseline_value=baseline,
    )


def _recorded_figure(
    store: Store, entry: str, report: EvalReport, evaluation: dict[str, Any] | None, metric: str = DEFAULT_GATE_METRIC
) -> float | None:
    """The ``metric`` that ``entry``'s card records, if it was measured on what ``report`` was, else None.

    Bits per byte: the same dataset version, the same row settings (``ROW_SETTINGS`` of the
    evaluation section) and as many tokens. An lm-eval figure: the same examples, i.e. the digest
    of the task's JSONL in the entry's evaluation.json equals the report's."""
    card = read_card(store, entry)
    figure = card.metrics.get(metric)
    if not isinstance(figure, int | float):
        return None
    if metric != DEFAULT_GATE_METRIC:
        task = metric.split(".")[1]
        try:
            recorded = store.get_json(f"{entry}/{ENTRY_EVALUATION}").get("lm_eval_examples", {})
        except (StoreError, ValueError):
            return None
        same = bool(report.lm_eval_examples.get(task)) and recorded.get(task) == report.lm_eval_examples.get(task)
        return float(figure) if same else None
    if not isinstance(evaluation, dict) or any(evaluation.get(k) is None for k in ROW_SETTINGS):
        return None
    theirs = card.config.get("evaluation") or {}
    same_rows = (
        card.lineage.dataset_version == report.checkpoint.dataset.version
        and all(theirs.get(k) == evaluation[k] for k in ROW_SETTINGS)
        and card.metrics.get("val_tokens") == report.tokens_evaluated
    )
    return float(figure) if same_rows and figure >= 0 else None


def gate_for_holder(
    store: Store,
    name: str,
    report: EvalReport,
    alias: str,
    tolerance: float,
    holder: int | None,
    evaluation: dict[str, Any] | None,
    metric: str = DEFAULT_GATE_METRIC,
) -> GateDecision:
    """The gate's decision for ``report`` against ``holder`` (the version holding ``alias`` now).

    The holder the evaluation compared with: its figures (``gate``). Another one (the alias
    moved during the evaluation): its recorded ``metric`` if it was measured on the same validation
    rows or lm-eval examples (``evaluation``: the candidate's evaluation section), else the alias is kept."""
    entry = model_prefix(name, holder) if holder is not None else ""
    if entry == report.baseline:
        return gate(report, alias, tolerance, metric)
    then = report.baseline or "no model"
    candidate = _figures(report, metric)[0]
    if not entry:
        promoted, reason = True, f"holder changed during evaluation ({then} then, none now): the candidate takes it"
        figure = None
    else:
        figure = _recorded_figure(store, entry, report, evaluation, metric)
        if figure is None:
            promoted = False
            reason = (
                f"holder changed during evaluation: alias kept, re-run to compare ({entry} holds {alias} now, "
                f"the evaluation compared with {then}; {entry}'s recorded figures are not on the same validation rows)"
            )
        else:
            promoted, decided = gate_decision(candidate, entry, figure, tolerance, metric)
            reason = f"holder changed during evaluation ({then} then, {entry} now; its recorded figures, same rows): {decided}"
    return GateDecision(
        alias=alias,
        baseline=entry,
        baseline_bits_per_byte=figure if metric == DEFAULT_GATE_METRIC else None,
        candidate_bits_per_byte=report.bits_per_byte,
        tolerance=tolerance,
        promoted=promoted,
        reason=reason,
        metric=metric,
        candidate_value=candidate,
        baseline_value=figure,
    )


def promote(store: Store, spec: str, alias: str) -> int:
    """Point ``alias`` at the version ``spec`` names; returns that version."""
    check_alias(alias)
    name, version = resolve(store, spec)
    set_alias(store, name, alias, version)
    return version


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
        if rel not in (COMMIT_MARKER, CLAIM):
            store.download(key, target / rel)
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
