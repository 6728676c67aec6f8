"""The fast encoder gives HF ``tokenizers``' ids exactly, or hands over to HF."""

import pytest
from tokenizers import normalizers

from data_prep.config import TokenizerConfig
from data_prep.encoder import FastBPE, HFEncoder, make_encoder
from data_prep.sources import _stdlib_files
from data_prep.tokenizer import encode_parallel, train_tokenizer
from tests.helpers import distinct_docs

EDGE_CASES = [
    "café naïve 一二三 ²³ x² emoji 😀😀 it's we'll I'd 'S 'LL",
    "tabs\t\t\nx\u3000y\u00a0z \u2003 w\n\n\n  \n a",
    "<|endoftext|>hello<|endoftext|> <|pad|>x<|endof",
    "\u0600\u0661\u0662 किताब 한국어 ა \u0301a\u0301 Ⅷ ٣٤",
    "   leading",
    "trailing   ",
    "\n",
    "a\n",
    "\x1c\x1dseparators\x85next line",
    "\U000e0001 tag \U0010ffff private \ue000 unassigned \U0003134b\U000e01f0",
    "12345 3.14 1,000 ...!!! ?? -- __init__ self._x=[1,2]",
    "line\r\nwindows\rmac",
    "",
]


@pytest.fixture(scope="module")
def corpus() -> list[str]:
    texts = []
    for path in _stdlib_files()[:50]:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
    return texts + distinct_docs(20) + EDGE_CASES


@pytest.fixture(scope="module")
def tokenizer(corpus):
    return train_tokenizer(corpus[:40], TokenizerConfig(vocab_size=1024))


def test_fast_encoder_gives_hf_ids(tokenizer, corpus):
    fast = FastBPE(tokenizer)
    for text in corpus:
        assert fast.encode(text).tolist() == tokenizer.encode(text).ids, text[:80]
    # Caches warm: a second pass answers the same.
    assert [a.tolist() for a in fast.encode_batch(EDGE_CASES)] == [e.ids for e in tokenizer.encode_batch(EDGE_CASES)]


def test_parallel_encoding_keeps_order_and_ids(tokenizer, corpus):
    expected = [e.ids for e in tokenizer.encode_batch(corpus)]
    for workers in (1, 2):
        assert [a.tolist() for a in encode_parallel(tokenizer, corpus, workers, batch_bytes=50_000)] == expected


def test_other_tokenizers_fall_back_to_hf(tokenizer):
    assert isinstance(make_encoder(tokenizer), FastBPE)
    lowercasing = train_tokenizer(distinct_docs(10), TokenizerConfig(vocab_size=300))
    lowercasing.normalizer = normalizers.Lowercase()
    encoder = make_encoder(lowercasing)
    assert isinstance(encoder, HFEncoder)
    assert encoder.encode_batch(["ABC"])[0].tolist() == lowercasing.encode("ABC").ids
    with pytest.raises(ValueError, match="normalizer"):
        FastBPE(lowercasing)
