"""The encoder gives HF ``tokenizers``' ids exactly, or hands over to HF."""

import os
import random
import subprocess
import sys

import pytest
from tokenizers import Tokenizer, normalizers

from data_prep.config import TokenizerConfig
from data_prep.encoder import THREADS_VARIABLE, FastokensEncoder, HFEncoder, make_encoder
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


def stdlib_texts(files: int) -> list[str]:
    """The first ``files`` standard-library Python files that are UTF-8, whole: code to train and encode."""
    texts = []
    for path in _stdlib_files()[:files]:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
    return texts


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


# Real sentences per script; the seeded mix below repeats them in new orders, as a corpus would.
SCRIPTS = {
    "cjk": ["无法打开文件，请检查权限。", "鉴定令牌过期处理已禁用", "日本語の文章には空白がありません。", "東京都の天気"],
    "hangul": ["마지막 로그인 후 로그인 시도가 실패하였습니다.", "암호 기한이 곧 끝납니다"],
    "kana": ["ひらがなとカタカナ", "ファイルを開けませんでした。もう一度お試しください"],
    "arabic": ["لا يمكن فتح الملف، يرجى التحقق من الأذونات.", "مرحبا بالعالم"],
    "cyrillic": ["Не удалось открыть файл: доступ запрещён.", "Привет, мир! Съешь же ещё этих мягких булок."],
    "devanagari": ["फ़ाइल खोली नहीं जा सकी, अनुमति जाँचें।", "नमस्ते दुनिया"],
    "emoji": ["👍🏽 done ✅", "👨‍👩‍👧‍👦 family", "🇯🇵🇰🇷 flags 😀😀😀", "🏳️‍🌈"],
    # Letters and numbers beyond U+FFFF (CJK extension B, mathematical letters and digits) next to others.
    "astral": ["𠀀𠀁漢字𠀂", "abc𝐀𝐁𝐂def", "x𝟙𝟚3"],
}


def multilingual_docs(n: int, seed: int = 0) -> list[str]:
    """Documents mixing the scripts' sentences, emoji between them (a fixed seed: always the same)."""
    rng = random.Random(seed)
    sentences = [s for group in SCRIPTS.values() for s in group]
    return ["\n".join(rng.choice(sentences) + rng.choice(["", " ", "😀", "。"]) for _ in range(30)) for _ in range(n)]


LONG_RUNS = [
    "".join(SCRIPTS["cjk"]) * 40,  # no spaces for ~2,000 characters
    "".join(SCRIPTS["kana"] + SCRIPTS["hangul"]).replace(" ", "") * 30,
    "あ" * 3000,
    "a" * 5000,
    " " * 3000 + "x",
    "!" * 2000,
    "😀" * 1000,
    "ـ" * 2000,  # Arabic tatweel
]


@pytest.fixture(scope="module")
def multilingual_tokenizer() -> Tokenizer:
    # Trained on these scripts, the vocabulary holds merges across UTF-8 character boundaries.
    return train_tokenizer(multilingual_docs(40), TokenizerConfig(vocab_size=1500))


def test_multilingual_long_runs_and_astral_letters_give_hf_ids(multilingual_tokenizer):
    encoder = make_encoder(multilingual_tokenizer)
    texts = multilingual_docs(20, seed=1) + LONG_RUNS + [" ".join(LONG_RUNS)] + SCRIPTS["astral"]
    assert [a.tolist() for a in encoder.encode_batch(texts)] == [e.ids for e in multilingual_tokenizer.encode_batch(texts)]
