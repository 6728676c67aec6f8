"""Prepare and validate the dataset."""

from __future__ import annotations

import logging

from flytekit import Deck, task

from data_prep.config import DataConfig, TokenizerConfig
from data_prep.prepare import DatasetRef, prepare_dataset
from data_prep.validation import ValidationConfig, check_dataset
from storage import open_store
from tasks.caching import cache_version

VERSION = cache_version(__name__, "data_prep", "storage")


@task(cache=True, cache_version=VERSION, retries=1)
def prepare_data(store: str, data: DataConfig, tokenizer: TokenizerConfig) -> DatasetRef:
    """Read, clean, de-duplicate, tokenize and shard the corpus into the store."""
    progress = logging.getLogger("data_prep")
    if not progress.handlers:
        progress.addHandler(logging.StreamHandler())
        progress.setLevel(logging.INFO)
    return prepare_dataset(data, tokenizer, open_store(store))


@task(cache=True, cache_version=VERSION, enable_deck=True)
def validate_data(dataset: DatasetRef, validation: ValidationConfig) -> DatasetRef:
    """Great Expectations gate: raises, listing every failed expectation, before training starts."""
    store = open_store(dataset.store)
    try:
        check_dataset(store, dataset, validation)
    finally:
        _decks(store, f"{dataset.prefix}/validation")
    return dataset


def _decks(store, prefix: str) -> None:
    """Our summary, then GE's Data Docs page of each suite, as Decks (pass or fail)."""
    if store.exists(f"{prefix}/report.html"):
        Deck("Data validation", store.get_bytes(f"{prefix}/report.html").decode())
    for key in store.list(f"{prefix}/site/validations/"):
        if key.endswith(".html"):
            suite = key.split("/site/validations/", 1)[1].split("/", 1)[0]
            Deck(f"Data Docs: {suite}", store.get_bytes(key).decode())
