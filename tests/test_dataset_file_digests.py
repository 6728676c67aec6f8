"""Every file of a dataset is checked against the sha256 its manifest records before it is used (issue 50
finding 3): a writer to ``datasets/`` who overwrites ``tokenizer.json`` or ``doc_stats.csv`` after the commit is
refused by name. Evaluation and registration are shown in ``test_checkpoint_safety.py`` (they need a checkpoint)."""

from __future__ import annotations

import pytest

from common.contracts import DOC_STATS, TOKENIZER
from data_prep.config import ValidationConfig
from data_prep.errors import DataError
from data_prep.mixture_tokenizer import TOKENIZERS, mixture_tokenizer_digest
from data_prep.prepare import plan
from data_prep.validation import ValidationFailed, check_dataset
from reports.dataset_html import dataset_html
from storage import open_store
from tests.helpers import fresh_copy, tiny_data, tiny_tokenizer

CHANGED = r"has sha256 \w+…, not the \w+… its manifest records: it was changed after dataset \w+ was committed"


@pytest.fixture
def dataset(tiny_dataset, tmp_path):
    return fresh_copy(tiny_dataset, tmp_path / "store")


def test_a_doc_stats_file_changed_after_the_commit_is_refused_by_the_gate_and_the_report(dataset):
    store = open_store(dataset.store)
    assert "length of the kept documents" in dataset_html(store, dataset.version)  # control: as committed
    key = f"{dataset.prefix}/{DOC_STATS}"
    store.put_bytes(key, store.get_bytes(key).replace(b",train,", b",val,", 1))  # one document moved to val
    with pytest.raises(DataError, match=rf"{DOC_STATS} {CHANGED}; prepare the dataset again"):
        dataset_html(store, dataset.version)
    # The gate reports it with the modified shards (its suites still check what is there) and fails on it alone.
    reported = rf"and has 1 file\(s\) changed since its commit(.|\n)*{DOC_STATS} {CHANGED}"
    with pytest.raises(ValidationFailed, match=reported) as failed:
        check_dataset(store, dataset, ValidationConfig())
    assert len(failed.value.validation.modified) == 1


def test_a_mixture_tokenizer_is_used_only_as_its_key_names_it(dataset, tmp_path):
    store = open_store(dataset.store)
    data = store.get_bytes(f"{dataset.prefix}/{TOKENIZER}")
    key = f"{TOKENIZERS}/0123456789abcdef/{TOKENIZER}"
    assert mixture_tokenizer_digest(key) == "0123456789abcdef" and mixture_tokenizer_digest(f"models/m/1/{TOKENIZER}") == ""
    store.put_bytes(key, data)  # the bytes do not hash to the name: as if swapped after the mixture trained them
    config = tiny_data(sources=[str(tmp_path)])
    (tmp_path / "a.txt").write_text("some text\n" * 50)
    with pytest.raises(DataError, match=r"does not hash to the 0123456789abcdef its key names"):
        plan(store, config, tiny_tokenizer(), key)
