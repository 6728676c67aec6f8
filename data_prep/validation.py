"""The validation gate: Great Expectations suites over a prepared dataset.

Three tables are checked: per-document statistics (``doc_stats.csv``), per-shard
statistics (the manifest, with every shard's sha256 and size read back from storage), and
one row of dataset-level fractions. The results, and GE's HTML Data Docs, are stored under
``datasets/<version>/validation/`` (pass or fail) before a failure is raised.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

from data_prep.prepare import DOC_STATS, DatasetRef, load_manifest
from storage import Store

os.environ.setdefault("GX_ANALYTICS_ENABLED", "False")


@dataclass
class ValidationConfig:
    """Thresholds of the data validation gate."""

    min_documents: int = 1
    """Fewest documents a dataset may hold."""
    min_doc_tokens: int = 1
    """Fewest tokens a kept document may have."""
    max_doc_tokens: int = 2_000_000
    """Most tokens a kept document may have."""
    max_duplicate_fraction: float = 0.5
    """Largest share of read documents dropped as duplicates."""
    max_skipped_fraction: float = 0.5
    """Largest share of read documents skipped for any reason."""


class ValidationFailed(RuntimeError):
    """The dataset failed its expectations; the message lists each failure."""


@dataclass
class Failure:
    suite: str
    expectation: str
    column: str
    observed: str
    expected: str

    def line(self) -> str:
        where = f"{self.suite}.{self.column}" if self.column else self.suite
        return f"{where}: {self.expectation} failed (observed {self.observed}; expected {self.expected})"


def _tables(store: Store, ref: DatasetRef) -> dict[str, pd.DataFrame]:
    manifest = load_manifest(store, ref)
    docs = pd.read_csv(io.BytesIO(store.get_bytes(f"{ref.prefix}/{DOC_STATS}")))
    rows = []
    for split, info in manifest["splits"].items():
        for shard in info["shards"]:
            key = f"{ref.prefix}/{shard['name']}"
            data = store.get_bytes(key) if store.exists(key) else b""
            rows.append(
                {
                    "shard": shard["name"],
                    "split": split,
                    "sequences": shard["sequences"],
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
                "duplicate_fraction": stats.get("skipped_duplicate", 0) / read,
                "skipped_fraction": stats["skipped_total"] / read,
                "train_val_overlap": len(train & val),
                "val_documents": len(val),
            }
        ]
    )
    return {"documents": docs, "shards": pd.DataFrame(rows), "dataset": summary}


def _suites(config: ValidationConfig) -> dict[str, list]:
    import great_expectations as gx

    E = gx.expectations
    return {
        "documents": [
            E.ExpectTableRowCountToBeBetween(min_value=config.min_documents),
            E.ExpectColumnValuesToBeBetween(column="tokens", min_value=config.min_doc_tokens, max_value=config.max_doc_tokens),
            E.ExpectColumnValuesToBeUnique(column="sha256"),
            E.ExpectColumnValuesToBeInSet(column="split", value_set=["train", "val"]),
        ],
        "shards": [
            E.ExpectTableRowCountToBeBetween(min_value=2),
            E.ExpectColumnValuesToBeInSet(column="sha256_matches", value_set=[True]),
            E.ExpectColumnPairValuesToBeEqual(column_A="stored_bytes", column_B="manifest_bytes"),
            E.ExpectColumnValuesToBeBetween(column="sequences", min_value=1),
        ],
        "dataset": [
            E.ExpectColumnMaxToBeBetween(column="duplicate_fraction", max_value=config.max_duplicate_fraction),
            E.ExpectColumnMaxToBeBetween(column="skipped_fraction", max_value=config.max_skipped_fraction),
            E.ExpectColumnMaxToBeBetween(column="train_val_overlap", max_value=0),
            E.ExpectColumnMinToBeBetween(column="val_documents", min_value=1),
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


def validate_dataset(store: Store, ref: DatasetRef, config: ValidationConfig) -> list[Failure]:
    """Run the suites, store results and the HTML report, return the failures (empty = pass)."""
    import great_expectations as gx

    tables = _tables(store, ref)
    failures: list[Failure] = []
    summary: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="pretrain-gx-") as tmp:
        site = Path(tmp) / "site"
        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = {"globally": False}
        # The ephemeral context makes a default docs site in a fresh temp dir and never
        # removes it: drop it, and keep our own site under our own temp dir.
        for name, site_config in dict(context.variables.data_docs_sites or {}).items():
            shutil.rmtree(site_config["store_backend"]["base_directory"], ignore_errors=True)
            context.delete_data_docs_site(name)
        context.add_data_docs_site(
            site_name="pretrain",
            site_config={
                "class_name": "SiteBuilder",
                "store_backend": {"class_name": "TupleFilesystemStoreBackend", "base_directory": str(site)},
                "site_index_builder": {"class_name": "DefaultSiteIndexBuilder"},
            },
        )
        source = context.data_sources.add_pandas("dataset")
        definitions = []
        for name, expectations in _suites(config).items():
            batch = source.add_dataframe_asset(name).add_batch_definition_whole_dataframe("all")
            suite = context.suites.add(gx.ExpectationSuite(name=name))
            for expectation in expectations:
                suite.add_expectation(expectation)
            definitions.append(context.validation_definitions.add(gx.ValidationDefinition(name=name, data=batch, suite=suite)))
        for definition in definitions:
            name = definition.name
            checkpoint = context.checkpoints.add(
                gx.Checkpoint(
                    name=f"check-{name}",
                    validation_definitions=[definition],
                    actions=[gx.checkpoint.UpdateDataDocsAction(name="docs", site_names=["pretrain"])],
                )
            )
            outcome = checkpoint.run(batch_parameters={"dataframe": tables[name]})
            for run in outcome.run_results.values():
                summary[name] = {"success": run.success, "expectations": len(run.results)}
                for r in run.results:
                    if not r.success:
                        kwargs = dict(r.expectation_config.kwargs)
                        failures.append(
                            Failure(
                                suite=name,
                                expectation=r.expectation_config.type,
                                column=str(kwargs.get("column", kwargs.get("column_A", ""))),
                                observed=_observed(r.result),
                                expected=_expected(kwargs),
                            )
                        )
        prefix = f"{ref.prefix}/validation"
        store.delete_prefix(prefix)  # an earlier attempt's report, never committed
        store.upload_dir(site, f"{prefix}/site")
        store.put_json(
            f"{prefix}/result.json",
            {"success": not failures, "suites": summary, "failures": [f.__dict__ for f in failures], "config": config.__dict__},
        )
        store.put_bytes(f"{prefix}/report.html", _report_html(site))
        store.commit(prefix, {"success": not failures})
    return failures


def _report_html(site: Path) -> bytes:
    """One self-contained page: the validation pages of the Data Docs, inlined one after another."""
    pages = sorted((site / "validations").rglob("*.html"))
    body = "\n<hr/>\n".join(p.read_text() for p in pages)
    return body.encode()


def check_dataset(store: Store, ref: DatasetRef, config: ValidationConfig) -> None:
    """Raise ValidationFailed, listing each failed expectation, unless the dataset passes."""
    failures = validate_dataset(store, ref, config)
    if failures:
        report = store.url(f"{ref.prefix}/validation/report.html")
        lines = "\n".join(f"  - {f.line()}" for f in failures)
        raise ValidationFailed(
            f"dataset {ref.version} failed {len(failures)} expectation(s); training was not started.\n{lines}\nReport: {report}"
        )


__all__ = ["ValidationConfig", "ValidationFailed", "check_dataset", "validate_dataset"]
