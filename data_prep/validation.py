"""The validation gate: Great Expectations suites over a prepared dataset.

Three tables are checked: per-document statistics (``doc_stats.csv``), per-shard
statistics (the manifest, with every shard's sha256 and size read back from storage), and
one row of dataset-level fractions. The results, the suite and our own report (``report.html``:
self-contained, every value escaped) are stored under ``datasets/<version>/validation/`` (pass or fail)
before a failure is raised. GE's Data Docs are not built: their pages load bootstrap and jQuery from
CDNs (empty and unstyled offline) and print data values unescaped.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
from dataclasses import asdict, dataclass

import pandas as pd

from common.contracts import (
    DOC_STATS,
    VALIDATION_REPORT,
    VALIDATION_RESULT,
    VALIDATION_SUITES,
    DatasetRef,
    validation_prefix,
)
from common.errors import UserError
from data_prep.config import ValidationConfig
from data_prep.errors import DataError
from data_prep.manifest import load_manifest, read_recorded
from data_prep.shards import check_digest, parse_shard
from data_prep.validation_report import Outcome, report_html, report_section
from storage import AlreadyCommitted, Store, StoreError


class ValidationFailed(UserError, RuntimeError):
    """The dataset failed its expectations; the message lists each failure, ``validation``
    holds what the gate computed (for a report built in the task)."""

    def __init__(self, message: str, validation: Validation | None = None) -> None:
        super().__init__(message)
        self.validation = validation


@dataclass
class Validation:
    """What the gate computed, pass or fail."""

    outcomes: list[Outcome]
    """Every expectation's verdict."""
    modified: list[str]
    """One line per file (a shard, the doc stats) whose bytes are not those its manifest records (expected and
    actual sha256)."""

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if not o.success]


def _read_back(data: bytes, url: str, sha256: str) -> tuple[int, str]:
    """Sequences in a shard's bytes as stored (-1 if they are not the manifest's or do not decode
    as a shard: a modified shard is never parsed), and the digest problem ("" if none)."""
    try:
        check_digest(data, url, sha256)
    except DataError as e:
        return -1, str(e)
    try:
        return len(parse_shard(data, url)), ""
    except Exception:
        return -1, ""


def _tables(store: Store, ref: DatasetRef) -> tuple[dict[str, pd.DataFrame], dict, list[str]]:
    """The three tables the suites check, built from what is in the store now, and the shards
    whose digest differs from the manifest's."""
    manifest = load_manifest(store, ref)
    rows, modified = [], []
    try:
        doc_stats = read_recorded(store, ref, "doc_stats", manifest)
    except DataError as changed:  # reported with the modified shards; the suites still check what is there
        modified.append(str(changed))
        doc_stats = store.get_bytes(f"{ref.prefix}/{DOC_STATS}")
    docs = pd.read_csv(io.BytesIO(doc_stats))
    for split, info in manifest["splits"].items():
        for shard in info["shards"]:
            key = f"{ref.prefix}/{shard['name']}"
            data = store.get_bytes(key) if store.exists(key) else b""
            sequences, problem = _read_back(data, store.url(key), shard["sha256"]) if data else (-1, "")
            if problem:
                modified.append(problem)
            rows.append(
                {
                    "shard": shard["name"],
                    "split": split,
                    "named_for_split": shard["name"].startswith(f"shards/{split}-"),
                    "manifest_sequences": shard["sequences"],
                    "stored_sequences": sequences,
                    "manifest_bytes": shard["bytes"],
                    "stored_bytes": len(data),
                    "sha256_matches": hashlib.sha256(data).hexdigest() == shard["sha256"],
                }
            )
    stats = manifest["stats"]
    read = max(stats["documents_read"], 1)
    train = set(docs.loc[docs.split == "train", "sha256"])
    val = set(docs.loc[docs.split == "val", "sha256"])
    summary = pd.DataFrame(
        [
            {
                "duplicate_fraction": stats.get("duplicates_total", stats.get("skipped_duplicate", 0)) / read,
                "skipped_fraction": stats["skipped_total"] / read,
                "byte_fallback_ratio": docs["byte_fallback"].sum() / max(docs["tokens"].sum(), 1),
                "train_val_overlap": len(train & val),
                "val_documents": len(val),
                "train_documents": len(train),
                **_filter_fractions(stats, read),
            }
        ]
    )
    return {"documents": docs, "shards": pd.DataFrame(rows), "dataset": summary}, manifest, modified


def _filter_fractions(stats: dict, read: int) -> dict[str, float]:
    """Share of read documents each filter dropped: ``language_fraction``, ``pii_fraction`` (all
    kinds) and one ``skipped_quality_<rule>`` column per quality rule that dropped any."""
    out = {
        "language_fraction": stats.get("skipped_language", 0) / read,
        "pii_fraction": sum(n for k, n in stats.items() if k.startswith("skipped_pii_")) / read,
    }
    out |= {k: n / read for k, n in sorted(stats.items()) if k.startswith(QUALITY_PREFIX)}
    return out


QUALITY_PREFIX = "skipped_quality_"
_FAMILIES = {"gopher": "gopher", "rep": "repetition", "c4": "c4", "fineweb": "fineweb"}


def advice(outcome: Outcome) -> str:
    """What to change when a filter's drop-rate expectation fails ('' for other expectations)."""
    column = outcome.column
    if column.startswith(QUALITY_PREFIX):
        rule = column.removeprefix(QUALITY_PREFIX)
        family = _FAMILIES.get(rule.split("_", 1)[0], "")
        return (
            f"the quality rule {rule} dropped {outcome.observed} of the documents read: loosen or switch off "
            f"data.quality.{family} (its rules and defaults: docs/data.md), or raise validation.max_quality_fraction"
        )
    if column == "language_fraction":
        return (
            f"the data.languages allow-list dropped {outcome.observed} of the documents read: add their languages "
            "to data.languages ([] keeps all), or raise validation.max_language_fraction"
        )
    if column == "pii_fraction":
        return (
            f"data.pii dropped {outcome.observed} of the documents read: set the kinds that drop (data.pii.<kind>: drop) "
            "to redact, or raise validation.max_pii_fraction"
        )
    return ""


def great_expectations():
    """The ``great_expectations`` module, imported on first use (4-5 s, 140 MB) with its usage
    analytics off: validation must not phone home from a training cluster."""
    os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")
    import great_expectations as gx

    return gx


def _set_by(*settings: str) -> dict[str, str]:
    """An expectation's meta naming the ``validation.*`` settings its threshold comes from: the report says which to
    change (fixed thresholds, such as the two shards at least, have none)."""
    return {"setting": ", ".join(f"validation.{name}" for name in settings)}


def _suites(config: ValidationConfig, manifest: dict) -> dict[str, list]:
    gx = great_expectations()

    E = gx.expectations
    return {
        "documents": [
            E.ExpectTableRowCountToBeBetween(min_value=config.min_documents, meta=_set_by("min_documents")),
            # Every kept document has a row: a doc_stats file that lost rows cannot vouch for the data.
            E.ExpectTableRowCountToEqual(
                value=manifest["stats"]["documents_kept"], meta={"setting": "the manifest (documents_kept)"}
            ),
            E.ExpectColumnValuesToBeBetween(
                column="tokens",
                min_value=config.min_doc_tokens,
                max_value=config.max_doc_tokens,
                meta=_set_by("min_doc_tokens", "max_doc_tokens"),
            ),
            E.ExpectColumnValuesToBeUnique(column="sha256"),
            E.ExpectColumnValuesToBeInSet(column="split", value_set=["train", "val"]),
        ],
        "shards": [
            E.ExpectTableRowCountToBeBetween(min_value=2),
            E.ExpectColumnValuesToBeInSet(column="sha256_matches", value_set=[True]),
            E.ExpectColumnPairValuesToBeEqual(column_A="stored_bytes", column_B="manifest_bytes"),
            E.ExpectColumnPairValuesToBeEqual(column_A="stored_sequences", column_B="manifest_sequences"),
            E.ExpectColumnValuesToBeBetween(
                column="stored_bytes",
                min_value=config.min_shard_bytes,
                max_value=config.max_shard_bytes,
                meta=_set_by("min_shard_bytes", "max_shard_bytes"),
            ),
            E.ExpectColumnValuesToBeBetween(column="manifest_sequences", min_value=1),
            E.ExpectColumnValuesToBeInSet(column="named_for_split", value_set=[True]),
        ],
        "dataset": [
            E.ExpectColumnMaxToBeBetween(
                column="duplicate_fraction", max_value=config.max_duplicate_fraction, meta=_set_by("max_duplicate_fraction")
            ),
            E.ExpectColumnMaxToBeBetween(
                column="skipped_fraction", max_value=config.max_skipped_fraction, meta=_set_by("max_skipped_fraction")
            ),
            E.ExpectColumnMaxToBeBetween(
                column="byte_fallback_ratio", max_value=config.max_byte_fallback_ratio, meta=_set_by("max_byte_fallback_ratio")
            ),
            E.ExpectColumnMaxToBeBetween(column="train_val_overlap", max_value=0),
            E.ExpectColumnMinToBeBetween(column="val_documents", min_value=1),
            E.ExpectColumnMinToBeBetween(column="train_documents", min_value=1),
            E.ExpectColumnMaxToBeBetween(
                column="language_fraction", max_value=config.max_language_fraction, meta=_set_by("max_language_fraction")
            ),
            E.ExpectColumnMaxToBeBetween(
                column="pii_fraction", max_value=config.max_pii_fraction, meta=_set_by("max_pii_fraction")
            ),
            *(
                E.ExpectColumnMaxToBeBetween(
                    column=key, max_value=config.max_quality_fraction, meta=_set_by("max_quality_fraction")
                )
                for key in sorted(manifest["stats"])
                if key.startswith(QUALITY_PREFIX)
            ),
        ],
    }


def _expected(kwargs: dict) -> str:
    shown = {k: v for k, v in kwargs.items() if k not in {"batch_id", "column", "result_format"} and v is not None}
    return ", ".join(f"{k}={v}" for k, v in shown.items()) or "all rows to pass"


def _plain(value):
    """numpy scalars (and tuples of them) as plain Python values, for readable messages."""
    if isinstance(value, (tuple, list)):
        return type(value)(_plain(v) for v in value)
    return value.item() if hasattr(value, "item") else value


def _observed(result: dict) -> str:
    if "observed_value" in result:
        return str(result["observed_value"])
    if "unexpected_count" in result:
        sample = [_plain(v) for v in result.get("partial_unexpected_list", [])[:3]]
        return f"{result['unexpected_count']} unexpected rows, e.g. {sample}"
    return "n/a"


def _run_suites(tables: dict[str, pd.DataFrame], suites: dict[str, list]) -> list[Outcome]:
    """Validate each table against its suite with GE (an ephemeral context: nothing written to disk; no
    Data Docs, see the module's docstring)."""
    gx = great_expectations()

    context = gx.get_context(mode="ephemeral")
    context.variables.progress_bars = {"globally": False}
    source = context.data_sources.add_pandas("dataset")
    outcomes = []
    for name, expectations in suites.items():
        batch = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe("all")
        suite = context.suites.add(gx.ExpectationSuite(name=name))
        for expectation in expectations:
            suite.add_expectation(expectation)
        definition = context.validation_definitions.add(gx.ValidationDefinition(name=name, data=batch, suite=suite))
        result = definition.run(batch_parameters={"dataframe": tables[name]})
        for r in result.results:
            kwargs = dict(r.expectation_config.kwargs)
            outcomes.append(
                Outcome(
                    suite=name,
                    expectation=r.expectation_config.type,
                    column=str(kwargs.get("column", kwargs.get("column_A", ""))),
                    success=bool(r.success),
                    observed=_observed(r.result),
                    expected=_expected(kwargs),
                    setting=str((r.expectation_config.meta or {}).get("setting", "")),
                )
            )
    return outcomes


def validate_dataset(store: Store, ref: DatasetRef, config: ValidationConfig) -> Validation:
    """Run the suites; store the results, the suite and the report under ``<dataset>/validation/``
    (pass or fail); return what was computed (no failures = pass).

    Re-entrant, and safe at the same moment as an identical twin: the suites always run (a shard
    modified since is always caught), but a committed report that says the same (same outcomes,
    config, suite and modified shards: a rerun, or an identical execution that committed first)
    is kept as it is. Otherwise the report is written and committed. Leftovers of an attempt that
    never committed are overwritten, not deleted: they may be a twin's upload in progress, which
    must stay complete when the twin commits. Only a committed report that says something else (a
    different validation config; the folder does not name the config) is deleted first, its
    marker before anything else, and written again: the last writer's report is the one kept."""
    tables, manifest, modified = _tables(store, ref)
    suites = _suites(config, manifest)
    prefix = validation_prefix(ref.prefix)
    # The suite as run, thresholds included, recorded with the dataset it judged.
    recorded = {name: [e.configuration.to_json_dict() for e in expectations] for name, expectations in suites.items()}
    outcomes = _run_suites(tables, suites)
    result = {
        "success": all(o.success for o in outcomes),
        "outcomes": [asdict(o) for o in outcomes],
        "config": asdict(config),
        "modified": list(modified),
    }
    result, recorded = json.loads(json.dumps(result)), json.loads(json.dumps(recorded))  # as they read back
    for _ in range(3):
        stored = _committed_report(store, prefix)
        if stored == (result, recorded):
            break
        if stored is not None:
            store.delete_prefix(prefix)  # another config's report: the marker goes first
        _write_report(store, prefix, result, recorded, report_html(ref, outcomes, modified))
        try:
            store.commit(prefix, {"success": result["success"]})
            break
        except AlreadyCommitted:
            continue  # a twin committed first: the same report (kept) or another config's (written again)
    else:
        if _committed_report(store, prefix) != (result, recorded):
            raise StoreError(
                f"{store.url(prefix)} kept being rewritten by validations of dataset {ref.version} with other "
                "settings at the same time; run this one again once they are done"
            )
    return Validation([Outcome.from_record(o) for o in result["outcomes"]], result["modified"])


def _committed_report(store: Store, prefix: str) -> tuple[dict, dict] | None:
    """The committed report's result and suite, or None if there is no committed report."""
    if not store.is_committed(prefix):
        return None
    try:
        return store.get_json(f"{prefix}/{VALIDATION_RESULT}"), store.get_json(f"{prefix}/{VALIDATION_SUITES}")
    except (StoreError, ValueError):
        return {}, {}  # committed but unreadable: written again


def _write_report(store: Store, prefix: str, result: dict, recorded: dict, html: str) -> None:
    """Every file of the report (the commit marker follows, in ``validate_dataset``)."""
    store.put_json(f"{prefix}/{VALIDATION_SUITES}", recorded)
    store.put_bytes(f"{prefix}/{VALIDATION_REPORT}", html.encode())
    store.put_json(f"{prefix}/{VALIDATION_RESULT}", result)


def check_dataset(store: Store, ref: DatasetRef, config: ValidationConfig) -> Validation:
    """What the gate computed, if the dataset passes; otherwise raise ValidationFailed, listing
    each failed expectation and each modified file, and carrying the same ``Validation``."""
    validation = validate_dataset(store, ref, config)
    failures = validation.failures
    if failures or validation.modified:  # a file changed since the commit fails the gate on its own
        report = store.url(f"{validation_prefix(ref.prefix)}/{VALIDATION_REPORT}")
        said = [f"  - {f.line()}" + (f": {advice(f)}" if advice(f) else "") for f in failures]
        lines = "\n".join([*said, *(f"  - {m}" for m in validation.modified)])
        changed = f" and has {len(validation.modified)} file(s) changed since its commit" if validation.modified else ""
        raise ValidationFailed(
            f"dataset {ref.version} failed {len(failures)} expectation(s){changed}; training was not started.\n{lines}\n"
            f"Report: {report}",
            validation,
        )
    return validation


__all__ = [
    "Outcome",
    "Validation",
    "ValidationConfig",
    "ValidationFailed",
    "check_dataset",
    "report_html",
    "report_section",
    "validate_dataset",
]
