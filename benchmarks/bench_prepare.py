"""Throughput of the prepare step against raw HF `tokenizers` on the same text, same run.

Prints human-readable lines, then one JSON object as the last line:
  raw_encode_mb_s          HF encode_batch, one thread (the baseline)
  ours_encode_mb_s_{1,2}   our process-pool encoder with 1 and 2 processes
  prepare_mb_s             the whole prepare step (read, clean, dedup, BPE training,
                           tokenize, pack, shard, upload to a local store), 2 processes
  ratio_*                  against the baseline / 1-process figure

``benchmarks/bench_tokenize.py`` is the fuller benchmark (generated corpus, fresh
processes, peak RSS, a multi-GB corpus).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from itertools import islice

os.environ["RAYON_NUM_THREADS"] = "1"  # before tokenizers starts its thread pool: a per-core baseline

from data_prep.clean import clean_text  # noqa: E402
from data_prep.config import DataConfig, TokenizerConfig  # noqa: E402
from data_prep.prepare import prepare_dataset  # noqa: E402
from data_prep.readers import Skips, iter_documents  # noqa: E402
from data_prep.sources import list_files  # noqa: E402
from data_prep.tokenizer import encode_parallel, train_tokenizer  # noqa: E402
from storage import open_store  # noqa: E402


def timed(fn):
    start = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - start


def main() -> None:
    max_documents = int(sys.argv[1]) if len(sys.argv) > 1 else 400
    data = DataConfig(max_documents=max_documents)
    docs = iter_documents(list_files(data.sources), data.text_field, 4 * data.max_chars, Skips(quiet=True))
    texts = [t for t in (clean_text(d.text) for d in docs) if len(t) >= data.min_chars]
    texts = list(islice(texts, max_documents))
    mb = sum(len(t.encode()) for t in texts) / 1e6
    tokenizer = train_tokenizer(texts, TokenizerConfig())

    ids, raw_s = timed(lambda: tokenizer.encode_batch(texts))
    ours1, one_s = timed(lambda: encode_parallel(tokenizer, texts, workers=1))
    ours2, two_s = timed(lambda: encode_parallel(tokenizer, texts, workers=2))
    assert [list(a) for a in ours2] == [e.ids for e in ids], "process-pool ids differ from HF encode_batch"
    with tempfile.TemporaryDirectory() as tmp:
        config = DataConfig(max_documents=max_documents, workers=2)
        _, prep_s = timed(lambda: prepare_dataset(config, TokenizerConfig(), open_store(tmp)))

    result = {
        "corpus_mb": round(mb, 2),
        "documents": len(texts),
        "raw_encode_mb_s": round(mb / raw_s, 3),
        "ours_encode_mb_s_1": round(mb / one_s, 3),
        "ours_encode_mb_s_2": round(mb / two_s, 3),
        "prepare_mb_s": round(mb / prep_s, 3),
        "ratio_ours1_vs_raw": round(raw_s / one_s, 3),
        "ratio_scaling_2_vs_1": round(one_s / two_s, 3),
        "ratio_prepare_vs_raw": round(raw_s / prep_s, 3),
    }
    print(f"corpus: {len(texts)} documents, {mb:.1f} MB (Python stdlib)")
    for key, value in result.items():
        print(f"  {key:<24} {value}")
    print(json.dumps(result))


if __name__ == "__main__":
    main()
