"""Fingerprint, prepare and validate the dataset."""

from __future__ import annotations

import dataclasses
import logging
from typing import Annotated

from flytekit import Cache, Deck, HashMethod, task

from common.contracts import TOKENIZER, DatasetRef
from common.hashing import config_hash
from data_prep.config import DataConfig, TokenizerConfig
from data_prep.prepare import prepare_dataset
from data_prep.sources import content_fingerprint
from data_prep.validation import Validation, ValidationConfig, ValidationFailed, check_dataset, report_html
from storage import open_store
from tasks import decks
from tasks.caching import cache_version
from tasks.placement import data_task
from tasks.user_errors import as_messages

VERSION = cache_version(__name__)


def corpus_hash(data: DataConfig) -> str:
    """The data section with its sources replaced by the content of what they name, so that
    identical data hits prepare's cache from any path, and changed data misses it. Files are
    streamed: a corpus bigger than memory is fine."""
    return config_hash(dataclasses.replace(data, sources=[]), content_fingerprint(data.sources, data.sniff_unlisted))


@task(**data_task())
@as_messages
def fingerprint_corpus(data: DataConfig) -> Annotated[DataConfig, HashMethod(corpus_hash)]:
    """Pass the data section on, keyed for caching by the corpus content rather than its paths."""
    return data


@task(cache=Cache(version=VERSION, serialize=True), **data_task())
@as_messages
def prepare_data(store: str, data: DataConfig, tokenizer: TokenizerConfig, base_model: str) -> DatasetRef:
    """Read, clean, de-duplicate, tokenize and shard the corpus into the store.

    A ``base_model`` (registry entry) lends its tokenizer: continued pretraining keeps the vocabulary.
    """
    progress = logging.getLogger("data_prep")
    if not progress.handlers:
        progress.addHandler(logging.StreamHandler())
        progress.setLevel(logging.INFO)
    tokenizer_key = f"{base_model}/{TOKENIZER}" if base_model else ""
    ref = prepare_dataset(data, tokenizer, open_store(store), tokenizer_key=tokenizer_key)
    Deck("Dataset", decks.table({"version": ref.version, "uri": f"{ref.store}/{ref.prefix}", **ref.stats}, "Dataset"))
    return ref


@task(cache=Cache(version=VERSION, serialize=True), enable_deck=True, **data_task())
@as_messages
def validate_data(dataset: DatasetRef, validation: ValidationConfig) -> DatasetRef:
    """Great Expectations gate: raises, listing every failed expectation, before training starts."""
    store = open_store(dataset.store)
    try:
        result = check_dataset(store, dataset, validation)
    except ValidationFailed as failed:
        if failed.validation is not None:
            _validation_decks(dataset, failed.validation)
        raise
    _validation_decks(dataset, result)
    return dataset


def _validation_decks(dataset: DatasetRef, result: Validation) -> None:
    """The gate's report as a Deck (pass or fail), rendered here from the outcomes this task
    computed, every value escaped: never HTML read back from the bucket, which anyone who can
    write there could have replaced. GE's Data Docs pages are not shown: they are stored beside
    the report, and GE's templates do not escape the data values they show."""
    Deck("Data validation", report_html(dataset, result.outcomes, result.modified))
