"""The encoder gives HF ``tokenizers``' ids exactly, or hands over to HF."""

import os
import subprocess
import sys

import pytest
from tokenizers import Tokenizer, normalizers

from data_prep.config import TokenizerConfig
from data_prep.encoder import THREADS_VARIABLE, FastokensEncoder, HFEncoder, make_encoder
from data_prep.tokenizer import encode_parallel, train_tokenizer
from tests.helpers import EDGE_CASES, LONG_RUNS, SCRIPTS, distinct_docs, multilingual_docs, stdlib_texts


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    return stdlib_texts(50) + distinct_docs(20) + EDGE_CASES


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_tokenizer(corpus[:40], TokenizerConfig(vocab_size=1024))


def test_encoder_gives_hf_ids(tokenizer, corpus):
    encoder = make_encoder(tokenizer)
    assert isinstance(encoder, FastokensEncoder)
    assert [a.tolist() for a in encoder.encode_batch(corpus)] == [e.ids for e in tokenizer.encode_batch(corpus)]
    for text in EDGE_CASES:  # one at a time too: a batch of one, an empty text
        assert encoder.encode_batch([text])[0].tolist() == tokenizer.encode(text).ids, text[:80]
    assert encoder.encode_batch([]) == []


@pytest.mark.slow
def test_parallel_encoding_keeps_order_and_ids(tokenizer, corpus):
    expected = [e.ids for e in tokenizer.encode_batch(corpus)]
    for workers in (1, 2):
        assert [a.tolist() for a in encode_parallel(tokenizer, corpus, workers, batch_bytes=50_000)] == expected


def test_other_tokenizers_fall_back_to_hf():
    lowercasing = train_tokenizer(distinct_docs(10), TokenizerConfig(vocab_size=300))
    lowercasing.normalizer = normalizers.Lowercase()
    encoder = make_encoder(lowercasing)
    assert isinstance(encoder, HFEncoder)
    assert encoder.encode_batch(["ABC"])[0].tolist() == lowercasing.encode("ABC").ids
    with pytest.raises(ValueError, match="normalizer"):
        FastokensEncoder(lowercasing)


def test_an_encoder_runs_on_one_thread(tokenizer, tmp_path):
    """Each data-prep worker process encodes on one core: fastokens, left alone, adds a thread of its own."""
    tokenizer.save(str(tmp_path / "tokenizer.json"))
    script = f"""
import os
from tokenizers import Tokenizer
from data_prep.encoder import make_encoder
encoder = make_encoder(Tokenizer.from_file({str(tmp_path / "tokenizer.json")!r}))
encoder.encode_batch(["some text to encode, long enough to be worth a thread " * 2000] * 64)
print(*(open(f"/proc/self/task/{{task}}/comm").read().strip() for task in os.listdir("/proc/self/task")))
"""
    env = {k: v for k, v in os.environ.items() if k != THREADS_VARIABLE}
    threads = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, check=True).stdout
    assert threads.split() and not [name for name in threads.split() if name.startswith("fastokens")], threads


@pytest.fixture(scope="module")
def multilingual_tokenizer() -> Tokenizer:
    # Trained on these scripts, the vocabulary holds merges across UTF-8 character boundaries.
    return train_tokenizer(multilingual_docs(40), TokenizerConfig(vocab_size=1500))


def test_multilingual_long_runs_and_astral_letters_give_hf_ids(multilingual_tokenizer):
    encoder = make_encoder(multilingual_tokenizer)
    texts = multilingual_docs(20, seed=1) + LONG_RUNS + [" ".join(LONG_RUNS)] + SCRIPTS["astral"]
    assert [a.tolist() for a in encoder.encode_batch(texts)] == [e.ids for e in multilingual_tokenizer.encode_batch(texts)]
