"""Tokenization per core on five text classes: ours against HF ``encode_batch_fast``, tiktoken and
the byte-level BPE libraries that load our tokenizer.json; and the whole prepare step with 1 and 2
processes, every ratio taken inside one run.

    python benchmarks/bench_tokenize.py [--mb 3] [--prepare-mb 56] [--prepare-prose-share 0.5]
                                        [--prepare-rules gopher|default] [--repeats 3] [--quick]
                                        [--no-prepare | --prepare-only] [--unique-words-mb 0] [--profile]
                                        [--big-gb 0]

Text classes, each about ``--mb`` MB, built from text on this machine (nothing generated but the
emoji placement):

* ``code``: Python standard library files, whole, each once;
* ``prose``: English documentation: ``*.md`` / ``*.rst`` / ``METADATA`` of the installed Python
  packages and READMEs / ``*.txt`` / ``*.md`` under ``/usr/share/doc``, each file once;
* ``multilingual``: the translated messages of the gettext catalogs (``/usr/share/locale/<lang>/
  LC_MESSAGES/*.mo``) in Simplified and Traditional Chinese, Japanese, Korean, Arabic, Persian,
  Russian, Ukrainian and Hindi (Devanagari), 40 messages a document, a language per document in
  turn; a seeded generator appends 1-3 emoji to 15% of the messages (no such text is on the machine);
* ``mixed``: the three, a document of each in turn;
* ``cjk``: the Chinese (zh_CN, zh_TW), Japanese and Korean catalogs' messages alone, 40 a document,
  a language per document in turn, no emoji (the messages keep their ASCII: format strings, names).

A byte-level BPE of 8,192 tokens is trained by our pipeline (``data_prep.tokenizer.train_tokenizer``)
on ``mixed``. Per class, each repeat runs every peer, in an order that rotates every repeat, in a
fresh process of its own (``--child encode``: no cache or lazy table survives from an earlier run),
on one core (``RAYON_NUM_THREADS=1``, ``FASTOKENS_BPE_THREADS=1``; CPU over wall seconds reported).
The encoder is built from the tokenizer.json string, and called once on ``["a"]`` (gigatoken sets up
~0.2 s of tables on its first call in a process), outside the timed part (``<peer>_build_s``); the
timed call returns each library's own output, cut into documents after the clock stops:

* ours: ``data_prep.encoder.make_encoder(tokenizer).encode_batch`` (it must be ``FastokensEncoder``:
  fastokens' ``encode_batch_flat(texts, add_special_tokens=True)``, the flat ids cut into one array a
  document inside the timed call, as the pipeline uses it);
* ``hf_fast``: ``Tokenizer.encode_batch_fast`` (no offsets: HF's fastest call), ``.ids``;
* tiktoken: an ``Encoding`` built from the same vocabulary and merges (``mergeable_ranks``: each
  token's bytes → its id, merges in id order) and the same GPT-2 pre-tokenizer regex,
  ``encode(text, allowed_special="all")`` per document;
* gigatoken: ``gigatoken.Tokenizer.from_json(spec)``, ``encode(text)`` per document (numpy; faster
  here than its ``encode_batch(parallel=False)``);
* kitoken: ``kitoken.Kitoken.from_tokenizers(spec.encode())``, ``encode_all(texts, True)``;
* bpe_openai: cannot load a vocabulary of ours (only its compiled-in encodings): ``bpe_openai_error``.

A peer not installed, or failing on our tokenizer, is reported as ``<peer>_error`` and skipped.
Special tokens in the text read as special everywhere, as HF's ``encode_batch`` reads them.

Ids are compared on every document of every class and repeat with HF ``Tokenizer.encode_batch`` (the
pipeline's reference, run once in this process): ours must be identical (``BenchmarkCheckError``
otherwise, with the first difference); a peer's count is ``identical_<peer>_<class>`` (documents
identical / documents, the least over the repeats), with ``<peer>_first_difference_<class>``. A peer
identical on every document of every class is exact (``exact_peers``); per class the fastest of them
(median MB/s) is ``fastest_exact_peer_<class>``, among those that kept one core busy: CPU seconds of
all threads over wall seconds of the timed calls, all runs together, at most 1.1
(``<peer>_cpu_per_wall``, ``_max`` of one run; any other is listed in ``multi_threaded_peers``;
``<peer>_threads_max``: threads of the process).
Memory: the child's VmHWM (``/proc/self/status``), ``<peer>_process_peak_mib_<class>``, and what
build and encode (output included) added to it over the resident set before the build,
``<peer>_peak_mib_<class>`` (the most over the repeats);
``<peer>_build_mib`` is the build's share. ``--unique-words-mb N`` also runs each peer, in a fresh
process, over N MB of seeded random lowercase words in batches of 100 documents, ids dropped: nearly
every word is new, so ``<peer>_unique_words_peak_mib`` shows whether its caches stay bounded (our
text classes are too small to show it); ``<peer>_unique_words_mb_s`` is its speed there.

Prepare (``prepare_dataset`` end to end: read, clean, filter, exact + near dedup, BPE training,
encode, pack, shard, commit to a local store) runs on a corpus of ``--prepare-mb`` MB
(``prepare_texts``) in ``.jsonl.zst`` files, in a fresh process per run, 1 and 2 worker processes
alternating (skipped with ``--no-prepare``; ``--prepare-only`` skips the encoder runs instead):

* the corpus: ``prose`` documents (the ``prose`` class' sources, each file once) until they make
  ``--prepare-prose-share`` (0.5) of the bytes, the rest code (the standard library, then the
  installed packages) and every locale's catalog messages, a document of each in turn, the two
  parts blended through the corpus. Its prose share is a claim: measured on the documents written
  (``prepare_corpus_share_<class>``, ``_mb_``, ``_documents_``), and a corpus below it is refused
  (``BenchmarkCheckError``: no prepare run, no figure). The 2-core VM holds about 28 MB of distinct
  prose, hence the default of 56 MB (256 MB before 2026-12-06, then 11% prose and 79% code);
* the rules (``--prepare-rules``, ``prepare_quality``, both in the result): ``gopher`` (the
  default), Gopher's document rules (``quality.gopher`` at its defaults, datatrove's) and all 13
  repetition rules at Gopher's thresholds, the rules bench_dataprep runs ours with against
  datatrove; ``default``, the pipeline's defaults (Gopher off, two looser repetition rules), as
  the figures before 2026-12-06 ran. Per class, the documents and the share of its bytes that pass
  the filters before de-duplication (``filtered_text`` in this process, untimed) are
  ``prepare_filters_pass_<documents|share>_<class>``, checked against the runs' own counts (kept =
  passed - duplicates); ``prepare_skipped``: the runs' drops by rule.

``prepare_mb_s_per_core`` is the 1-process run's MB/s (corpus bytes over the run's wall seconds,
imports excluded). Peak RSS is sampled every 0.2 s over the process tree. ``--profile`` also runs
prepare once (1 process) under cProfile and prints the time by stage; in that run the trainer gets
its sample as a list, so the scan pass that produces it is profiled apart from BPE training.
``load_average_start``/``_end``: the machine's 1-minute load around the whole benchmark.

The table (class, peer, MB/s, identical, peak MiB, build s) is printed, then the result; the last
line is one JSON object. Per class and peer: ``<peer>_mb_s_<class>`` (median) and ``_spread``
([min, max]). ``ratios`` / ``spread`` (ratio > 1: ours faster): ``<class>_vs_hf_fast``,
``ours_vs_fastest_exact_peer_<class>`` (also top-level, with ``_spread``), ``mixed_vs_tiktoken``,
``prepare_scaling_2_processes`` (2-process MB/s over twice the 1-process MB/s) and
``prepare_mb_s_per_core`` (a figure in MB/s, not a ratio: the 1-process run). Kept keys:
``corpus_mb``, ``prepare_*``, ``documents_kept``, ``duplicates``, ``tokens``,
``ratio_prepare_scaling`` (= ``prepare_scaling_2_processes``), ``ratio_prepare_scaling_cpu_bound``,
``identical_ids``, ``ours_encode_mb_s_1`` (ours on ``mixed``), ``tokens_<class>``, ``big_*``:
medians over the repeats. Renamed: ``tiktoken_identical_docs_<class>`` (now
``identical_tiktoken_<class>``; ``tiktoken_first_difference_<class>`` only where ids differ). Retired,
as they measured the issue-14 faults: ``raw_*`` and
``ratio_raw_scaling`` (HF ``encode_batch``, not ``encode_batch_fast``, on random standard-library
lines), ``ratio_ours_encode_vs_raw_1`` and ``ratio_prepare_per_core_vs_raw_1`` (ratios of runs made
minutes apart), ``ours_encode_mb_s_2`` / ``ratio_ours_encode_scaling``.
"""

from __future__ import annotations

import os
import sys

if "--child" not in sys.argv or sys.argv[sys.argv.index("--child") + 1 :][:1] == ["encode"]:
    # One thread per encoder, before any library starts a thread pool: per-core figures compare
    # (THREAD_ENV below). Not in a prepare child, which sets its own threads.
    os.environ.update(RAYON_NUM_THREADS="1", FASTOKENS_BPE_THREADS="1")

import argparse
import cProfile
import gettext
import gzip
import hashlib
import io
import json
import math
import pstats
import random
import statistics
import subprocess
import tempfile
import threading
import time
import unicodedata
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
import psutil
from machine_info import machine, ratio_keys, require, spread  # benchmarks/ (the script's folder)

try:
    import zstandard
except ImportError:  # an image without it: gzip instead
    zstandard = None

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
FILE_BYTES = 4 << 20
# Rayon (tokenizers, gigatoken, fastokens) reads RAYON_NUM_THREADS; fastokens also starts a BPE
# worker thread of its own unless FASTOKENS_BPE_THREADS=1. tiktoken and kitoken: the calling thread.
THREAD_ENV = {"RAYON_NUM_THREADS": "1", "FASTOKENS_BPE_THREADS": "1"}
# CPU seconds over wall seconds of a timed encode above which it used more than one core.
MAX_CPU_PER_WALL = 1.1
LANGUAGES = ["zh_CN", "zh_TW", "ja", "ko", "ar", "fa", "ru", "uk", "hi"]
CJK_LANGUAGES = ["zh_CN", "zh_TW", "ja", "ko"]
CLASSES = ["code", "prose", "multilingual", "mixed", "cjk"]
# ours (fastokens, through data_prep.encoder) and HF's encode_batch_fast, tiktoken, then the peers that
# load an HF tokenizer.json (bpe_openai cannot: reported as such); a peer not installed is reported and skipped.
PEERS = ["ours", "hf_fast", "tiktoken", "gigatoken", "kitoken", "bpe_openai"]
# GPT-2's pre-tokenizer regex, as HF's ByteLevel pre-tokenizer and tiktoken's r50k_base write it.
GPT2_PATTERN = r"""'(?:[sdmt]|ll|ve|re)| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"""
# The prepare corpus' classes, and the share of its bytes that is prose unless --prepare-prose-share says otherwise:
# the least the benchmark claims, measured on the corpus it builds and refused below (BenchmarkCheckError).
PREPARE_CLASSES = ("prose", "code", "multilingual")
PROSE_SHARE = 0.5
# About 28 MB of distinct prose is on the 2-core VM (prose_texts): at half prose, a corpus of at most 56 MB.
PREPARE_MB = 56.0
# The prepare runs' quality rules (--prepare-rules; prepare_quality): gopher first, the default.
RULES = ("gopher", "default")


# --- text classes -----------------------------------------------------------------------
def _distinct(texts: Iterator[str], limit: int) -> list[str]:
    """Texts in order, each content once, until ``limit`` UTF-8 bytes."""
    out, seen, size = [], set(), 0
    for text in texts:
        digest = hashlib.sha1(text.encode("utf-8", "replace")).digest()
        if not text.strip() or digest in seen:
            continue
        seen.add(digest)
        out.append(text)
        size += len(text.encode("utf-8", "replace"))
        if size >= limit:
            break
    return out


def _read(path: Path) -> str | None:
    try:
        raw = gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes()
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


def code_texts(limit: int, packages: bool = False) -> list[str]:
    """The standard library's Python files; with ``packages``, then the installed packages' (for
    the prepare corpus, larger than the standard library)."""
    from data_prep.sources import _stdlib_files

    paths = _stdlib_files()
    if packages:
        paths += sorted(Path(psutil.__file__).resolve().parents[1].rglob("*.py"))
    return _distinct((t for t in map(_read, paths) if t), limit)


def prose_texts(limit: int) -> list[str]:
    site = Path(psutil.__file__).resolve().parents[1]
    paths = sorted(p for pattern in ("*.md", "*.rst", "METADATA") for p in site.rglob(pattern))
    doc = Path("/usr/share/doc")
    if doc.is_dir():
        names = ("README*", "*.md", "*.txt", "*.md.gz", "*.txt.gz")
        paths += sorted(p for pattern in names for p in doc.rglob(pattern) if p.is_file())
    return _distinct((t for t in map(_read, paths) if t), limit)


def _emoji() -> list[str]:
    blocks = ((0x1F300, 0x1F5FF), (0x1F600, 0x1F64F), (0x1F680, 0x1F6FF), (0x1F90C, 0x1F9FF))
    # Only code points Python's Unicode database knows: an unknown one sends the whole text to HF.
    return [chr(c) for lo, hi in blocks for c in range(lo, hi + 1) if unicodedata.category(chr(c)) != "Cn"]


def _catalog_documents(language: str) -> list[list[str]]:
    """The translated messages of one language's gettext catalogs, 40 a document, each message once."""
    docs, seen = [], set()
    for path in sorted(Path("/usr/share/locale", language, "LC_MESSAGES").glob("*.mo")):
        try:
            with open(path, "rb") as f:
                catalog = gettext.GNUTranslations(f)._catalog
        except (OSError, UnicodeDecodeError, ValueError, IndexError):  # IndexError: a malformed Plural-Forms header
            continue
        messages = [v for k, v in sorted(catalog.items(), key=lambda kv: str(kv[0])) if k and v and v not in seen]
        seen.update(messages)
        docs += [messages[i : i + 40] for i in range(0, len(messages), 40)]
    return docs


def multilingual_texts(limit: int, seed: int = 0, languages: list[str] = LANGUAGES) -> list[str]:
    rng, emoji = random.Random(seed), _emoji()
    per_language = [d for d in map(_catalog_documents, languages) if d]
    out, size = [], 0
    while size < limit and any(per_language):
        for docs in filter(None, per_language):
            messages = [
                m + rng.choice(["", " "]) + "".join(rng.choices(emoji, k=rng.randint(1, 3))) if rng.random() < 0.15 else m
                for m in docs.pop(0)
            ]
            out.append("\n".join(messages))
            size += len(out[-1].encode())
            if size >= limit:
                break
    return out


def cjk_texts(limit: int) -> list[str]:
    """The Chinese (Simplified, Traditional), Japanese and Korean catalogs' messages, 40 a
    document, a language per document in turn, without emoji."""
    per_language = [d for d in map(_catalog_documents, CJK_LANGUAGES) if d]
    return interleave([["\n".join(messages) for messages in docs] for docs in per_language], limit)


def text_classes(mb: float) -> dict[str, list[str]]:
    limit = int(mb * 1e6)
    classes = {"code": code_texts(limit), "prose": prose_texts(limit), "multilingual": multilingual_texts(limit)}
    classes["mixed"] = interleave(list(classes.values()), limit)
    classes["cjk"] = cjk_texts(limit)
    return classes


def prepare_texts(limit: int, prose_share: float) -> tuple[list[str], list[str]]:
    """The prepare runs' corpus and each document's class: ``prose`` documents until they make
    ``prose_share`` of ``limit`` bytes, the rest code (the standard library, then the installed
    packages) and the messages of every locale's catalogs on this machine, a document of each in
    turn, up to ``limit`` bytes in all; the prose and the rest blended so that every stretch of the
    corpus holds about the same share of each. A class that runs out is short: ``corpus_shares``
    measures what was built, and the caller refuses a prose share below the claim."""
    locales = sorted(p.name for p in Path("/usr/share/locale").iterdir() if (p / "LC_MESSAGES").is_dir())
    prose = prose_texts(math.ceil(prose_share * limit)) if prose_share > 0 else []
    room = limit - mb_of(prose) * 1e6
    code = code_texts(limit, packages=True)
    rest = interleave([code, multilingual_texts(limit, languages=locales)], room)
    while rest and mb_of(rest) * 1e6 > room:  # interleave passes its limit by up to a round: taken off again
        rest.pop()
    code_ids = {id(t) for t in code}
    classes = {id(t): "prose" for t in prose} | {id(t): "code" if id(t) in code_ids else "multilingual" for t in rest}
    texts = blend(prose, rest)
    return texts, [classes[id(t)] for t in texts]


def blend(first: list[str], second: list[str]) -> list[str]:
    """The two lists' documents in their own order, each next from the list that is behind its
    share of the bytes taken so far."""
    totals = [max(mb_of(first), 1e-9), max(mb_of(second), 1e-9)]
    lists, taken, at, out = (first, second), [0.0, 0.0], [0, 0], []
    while at[0] < len(first) or at[1] < len(second):
        pick = 0 if at[1] == len(second) or (at[0] < len(first) and taken[0] / totals[0] <= taken[1] / totals[1]) else 1
        text = lists[pick][at[pick]]
        out.append(text)
        taken[pick] += mb_of([text])
        at[pick] += 1
    return out


def corpus_shares(texts: list[str], classes: list[str]) -> dict[str, dict[str, float]]:
    """Per class of the prepare corpus: its MB, its share of the corpus' bytes and its documents."""
    sizes: dict[str, int] = dict.fromkeys(PREPARE_CLASSES, 0)
    documents: dict[str, int] = dict.fromkeys(PREPARE_CLASSES, 0)
    for text, name in zip(texts, classes, strict=True):
        sizes[name] += len(text.encode("utf-8", "replace"))
        documents[name] += 1
    total = max(sum(sizes.values()), 1)
    return {name: {"mb": sizes[name] / 1e6, "share": sizes[name] / total, "documents": documents[name]} for name in sizes}


def interleave(groups: list[list[str]], limit: int) -> list[str]:
    """A document of each group in turn (groups that run out drop out) until ``limit`` bytes."""
    out, size = [], 0
    for i in range(max(map(len, groups))):
        for group in groups:
            if i < len(group):
                out.append(group[i])
                size += len(group[i].encode("utf-8", "replace"))
        if size >= limit:
            break
    return out


def mb_of(texts: list[str]) -> float:
    return sum(len(t.encode("utf-8", "replace")) for t in texts) / 1e6


# --- encoders ---------------------------------------------------------------------------
def tiktoken_encoding(tokenizer):
    """tiktoken with our vocabulary: each token's bytes ranked by its id (HF numbers merged tokens
    in merge order, so rank order is merge order), GPT-2's regex, our special tokens."""
    import tiktoken

    from data_prep.encoder import bytes_to_unicode

    spec = json.loads(tokenizer.to_str())
    to_byte = {c: b for b, c in bytes_to_unicode().items()}
    specials = {t["content"]: t["id"] for t in spec["added_tokens"]}
    ranks = {bytes(to_byte[c] for c in token): i for token, i in spec["model"]["vocab"].items() if token not in specials}
    return tiktoken.Encoding("ours", pat_str=GPT2_PATTERN, mergeable_ranks=ranks, special_tokens=specials)


Encode = Callable[[list[str]], object]
Split = Callable[[object], list[np.ndarray]]


def _per_document(out) -> list[np.ndarray]:
    return [np.asarray(ids, dtype=np.int64) for ids in out]


def build_encoder(peer: str, spec: str) -> tuple[Encode, Split]:
    """Peer ``peer``'s encoder for the tokenizer.json ``spec``, one thread, special tokens in the
    text read as special (as HF's ``encode_batch`` does): the timed call, and how to cut its
    output (taken as it comes, each library's fastest single-thread output) into one id array
    per document, outside the timed part. Raises ``Unsupported`` when the peer cannot load it."""
    from tokenizers import Tokenizer

    if peer == "ours":
        from data_prep.encoder import make_encoder

        encoder = make_encoder(Tokenizer.from_str(spec))
        require(
            type(encoder).__name__ == "FastokensEncoder", f"make_encoder fell back to {type(encoder).__name__} on our tokenizer"
        )
        return encoder.encode_batch, _per_document
    if peer == "hf_fast":
        hf = Tokenizer.from_str(spec)
        return (lambda texts: [e.ids for e in hf.encode_batch_fast(texts)]), _per_document
    if peer == "tiktoken":
        encoding = tiktoken_encoding(Tokenizer.from_str(spec))
        # Special tokens in the text count as such, as in HF and ours (a package's docs hold "<|endoftext|>").
        return (lambda texts: [encoding.encode(t, allowed_special="all") for t in texts]), _per_document
    if peer == "gigatoken":
        import gigatoken

        giga = gigatoken.Tokenizer.from_json(spec)
        # One numpy array per document, on the calling thread: faster here than encode_batch(parallel=False)
        # (an awkward Array) and than encode_batch_list; added tokens from tokenizer.json are matched.
        return (lambda texts: [giga.encode(t) for t in texts]), _per_document
    if peer == "kitoken":
        import kitoken

        kit = kitoken.Kitoken.from_tokenizers(spec.encode())
        # encode_specials=True: our special tokens in the text become their ids (False spells them out).
        return (lambda texts: kit.encode_all(texts, True)), _per_document
    if peer == "bpe_openai":
        import bpe_openai._bindings as bindings

        raise Unsupported(
            "bpe-openai builds only the encodings compiled into it "
            f"({', '.join(bindings.supported_encodings())}): no constructor from a vocabulary and merges"
        )
    raise ValueError(f"unknown peer {peer!r}")


class Unsupported(Exception):
    """The peer cannot load our tokenizer (or is not installed)."""


def _status_mib(*fields: str) -> list[float]:
    """Fields of ``/proc/self/status`` in MiB (VmHWM: this process' peak resident set)."""
    values = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines() if ":" in line)
    return [int(values[f].split()[0]) / 1024 for f in fields]


def child_encode(peer: str, spec_path: str, texts_path: str, out_path: str) -> dict:
    """One timed encode in this fresh process: build (outside the timed part), encode, peak memory."""
    spec = Path(spec_path).read_text()
    texts = json.loads(Path(texts_path).read_text())
    module = {"ours": "data_prep.encoder", "hf_fast": "tokenizers", "tiktoken": "tiktoken", "bpe_openai": "bpe_openai"}
    try:
        __import__(module.get(peer, peer))
    except ImportError as error:
        return {"error": f"not installed: {error}"}
    (rss_before,) = _status_mib("VmRSS")
    start = time.perf_counter()
    try:
        encode, split = build_encoder(peer, spec)
    except Unsupported as error:
        return {"error": str(error)}
    except Exception as error:  # a peer that fails on our tokenizer.json: reported, not fatal
        if peer in ("ours", "hf_fast"):
            raise
        return {"error": f"{type(error).__name__}: {error}"}
    encode(["a"])  # one-off lazy set-up (gigatoken: ~0.2 s on its first call in a process) counts as build
    build_s = time.perf_counter() - start
    (hwm_built,) = _status_mib("VmHWM")
    cpu = time.process_time()  # CPU time of all threads, exact (getrusage counts in clock ticks)
    # out_path "-": the unique-words run, batches of 100 documents whose ids are dropped (memory
    # then is the encoder's own, not a growing output).
    batches = [texts] if out_path != "-" else [texts[i : i + 100] for i in range(0, len(texts), 100)]
    start = time.perf_counter()
    for batch in batches:
        out = encode(batch)
    seconds = time.perf_counter() - start
    cpu = time.process_time() - cpu
    (hwm,) = _status_mib("VmHWM")
    result = {
        "seconds": seconds,
        "build_s": build_s,
        "cpu_per_wall": cpu / seconds,
        "threads": len(os.listdir("/proc/self/task")),
        "build_mib": hwm_built - rss_before,
        "peak_mib": hwm - rss_before,
        "process_peak_mib": hwm,
    }
    if out_path == "-":
        return result
    docs = split(out)
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    np.savez(out_path, ids=np.concatenate(docs).astype(np.int64) if docs else np.zeros(0, np.int64), lengths=lengths)
    return result


def run_encode_child(peer: str, spec_path: Path, texts_path: Path, out_path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env |= THREAD_ENV
    args = [sys.executable, __file__, "--child", "encode", peer, str(spec_path), str(texts_path), str(out_path)]
    proc = subprocess.run(args, capture_output=True, env=env, text=True)
    if proc.returncode:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        require(peer not in ("ours", "hf_fast"), f"{peer} failed (exit code {proc.returncode}): {tail}")
        return {"error": f"exit code {proc.returncode}: {tail}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def first_difference(got: list[np.ndarray], want: list[np.ndarray], decode) -> str:
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if not np.array_equal(a, b):
            a, b = a.tolist(), b.tolist()
            at = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            return f"document {i}, token {at}: {decode(a[at : at + 4])} vs HF {decode(b[at : at + 4])}"
    return ""


def _documents(path: Path) -> list[np.ndarray]:
    with np.load(path) as saved:
        ids, lengths = saved["ids"], saved["lengths"]
    return np.split(ids, np.cumsum(lengths)[:-1]) if len(lengths) else []


def encode_runs(classes: dict[str, list[str]], tokenizer, repeats: int, tmp: str) -> tuple[dict, dict]:
    """Per class and repeat, each peer in a fresh process, in an order that rotates every repeat:
    MB/s, build seconds, peak memory; ids checked against HF ``Tokenizer.encode_batch`` (the
    pipeline's reference, computed here once) on every document of every repeat."""
    from tokenizers import Tokenizer

    def decode(ids: list[int]) -> list[str]:
        # Token by token: a difference is often the same text cut differently.
        return [tokenizer.decode([i], skip_special_tokens=False) for i in ids]

    spec_path = Path(tmp) / "tokenizer.json"
    spec_path.write_text(tokenizer.to_str())
    reference_tokenizer = Tokenizer.from_str(tokenizer.to_str())
    runs: dict = {name: {p: [] for p in PEERS} for name in classes}
    errors: dict[str, str] = {}
    checks: dict = {}
    for name, texts in classes.items():
        texts_path = Path(tmp) / f"{name}.json"
        texts_path.write_text(json.dumps(texts))
        want = [np.asarray(e.ids, dtype=np.int64) for e in reference_tokenizer.encode_batch(texts)]
        checks[f"tokens_{name}"] = int(sum(map(len, want)))
        mb = mb_of(texts)
        for r in range(repeats):
            for peer in PEERS[r % len(PEERS) :] + PEERS[: r % len(PEERS)]:
                if peer in errors:
                    continue
                out_path = Path(tmp) / f"ids-{peer}.npz"
                out = run_encode_child(peer, spec_path, texts_path, out_path)
                if "error" in out:
                    errors[peer] = out["error"]
                    continue
                got = _documents(out_path)
                out_path.unlink()
                require(len(got) == len(texts), f"{peer} returned {len(got)} documents for {len(texts)} on {name}")
                out["identical"] = sum(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
                if out["identical"] < len(texts):
                    out["first_difference"] = first_difference(got, want, decode)
                    # Not an assert: python -O must not hide a wrong encoder.
                    require(peer != "ours", f"our ids differ from HF's on {name}: {out['first_difference']}")
                out["mb_s"] = mb / out["seconds"]
                runs[name][peer].append(out)
    for peer, error in errors.items():
        require(peer not in ("ours", "hf_fast"), f"{peer} could not run: {error}")
        checks[f"{peer}_error"] = error
        for name in classes:
            runs[name].pop(peer)
    return runs, checks


def unique_words(total_bytes: int, seed: int = 2) -> list[str]:
    """Documents of 600 seeded random lowercase words of 4-12 letters: nearly every word is new,
    the worst case for a word cache (the unique-words memory run only)."""
    rng, letters, texts, size = random.Random(seed), "abcdefghijklmnopqrstuvwxyz", [], 0
    while size < total_bytes:
        texts.append(" ".join("".join(rng.choices(letters, k=rng.randint(4, 12))) for _ in range(600)))
        size += len(texts[-1])
    return texts


def unique_words_runs(tokenizer, peers: list[str], mb: float, tmp: str) -> dict:
    """Each peer, in a fresh process, over ``mb`` MB of unique words in batches of 100 documents
    (ids dropped): whether its caches stay bounded (``<peer>_unique_words_peak_mib``)."""
    spec_path, texts_path = Path(tmp) / "tokenizer.json", Path(tmp) / "unique_words.json"
    spec_path.write_text(tokenizer.to_str())
    texts = unique_words(int(mb * 1e6))
    texts_path.write_text(json.dumps(texts))
    result: dict = {"unique_words_mb": round(mb_of(texts), 1)}
    for peer in peers:
        out = run_encode_child(peer, spec_path, texts_path, Path("-"))
        if "error" in out:
            result[f"{peer}_unique_words_error"] = out["error"]
            continue
        result[f"{peer}_unique_words_peak_mib"] = round(out["peak_mib"], 1)
        result[f"{peer}_unique_words_mb_s"] = round(mb_of(texts) / out["seconds"], 2)
    return result


# --- prepare, in a fresh process --------------------------------------------------------
def write_corpus(root: Path, texts: list[str]) -> float:
    """``texts`` as ``.jsonl.zst`` files of about 4 MB; returns the MB of text."""
    root.mkdir(parents=True, exist_ok=True)
    compress, suffix = (zstandard.ZstdCompressor(level=3).compress, "zst") if zstandard else (lambda b: gzip.compress(b, 6), "gz")
    records, size, index = [], 0, 0
    for text in [*texts, None]:
        if text is not None:
            records.append(json.dumps({"text": text}))
            size += len(text.encode("utf-8", "replace"))
        if records and (text is None or size >= FILE_BYTES * (index + 1)):
            (root / f"part-{index:05d}.jsonl.{suffix}").write_bytes(compress(("\n".join(records) + "\n").encode()))
            records, index = [], index + 1
    return size / 1e6


def run_child(args: list[str]) -> tuple[dict, float, float]:
    """This script in ``--child`` mode; its JSON, peak RSS sum over the tree and of its largest process (MiB)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])))
    env.pop("RAYON_NUM_THREADS", None)  # prepare gives the BPE trainer as many threads as workers
    proc = subprocess.Popen([sys.executable, __file__, "--child", *args], stdout=subprocess.PIPE, env=env, text=True)
    peak_sum = peak_max = 0.0
    stop = threading.Event()

    def sample() -> None:
        nonlocal peak_sum, peak_max
        parent = psutil.Process(proc.pid)
        while not stop.is_set():
            try:
                rss = [p.memory_info().rss for p in [parent, *parent.children(recursive=True)]]
            except psutil.Error:
                rss = []
            if rss:
                peak_sum, peak_max = max(peak_sum, sum(rss)), max(peak_max, max(rss))
            stop.wait(0.2)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    out, _ = proc.communicate()
    stop.set()
    sampler.join()
    if proc.returncode:
        raise SystemExit(f"child {args} failed with exit code {proc.returncode}")
    return json.loads(out.strip().splitlines()[-1]), peak_sum / 2**20, peak_max / 2**20


# Where prepare's time goes: cumulative cProfile seconds of the function that does each stage
# (reading and filters run in the scan, the tokenizer sample and the encode stages alike).
STAGES = {
    "scan_pass": ("scan.py", "scan_partition"),
    "encode_pass": ("encode.py", "encode_partition"),
    "reading": ("readers.py", "read_file"),
    "filters": ("filters.py", "filtered_text"),
    "dedup_near_rows": ("dedup.py", "near_row"),
    "dedup_exact": ("dedup_stages.py", "exact_shard"),
    "dedup_near": ("dedup_stages.py", "near_shard"),
    "resolve": ("dedup_stages.py", "resolve"),
    "bpe_training": ("tokenizer.py", "train_tokenizer"),
    "encoding": ("encoder.py", "encode_batch"),
    "shards": ("encode.py", "pack_shards"),
}


def _sample_first(train: Callable) -> Callable:
    """The trainer, fed the whole sample as a list: HF pulls a streamed sample from a thread of
    its own, where cProfile would not see the scan pass that produces it (profile run only)."""

    def train_on_list(texts, config):
        return train(list(texts), config)

    return train_on_list


def prepare_quality(rules: str) -> dict:
    """The prepare runs' ``data.quality`` settings, as they differ from the pipeline's defaults:
    ``gopher``, Gopher's document rules (``quality.gopher`` on, its defaults = datatrove's) and all
    13 repetition rules at Gopher's thresholds, the rules bench_dataprep runs ours with against
    datatrove; ``default``, none (Gopher off, two repetition rules looser than Gopher's: docs/data.md)."""
    require(rules in RULES, f"unknown rules {rules!r}: one of {', '.join(RULES)}")
    if rules == "default":
        return {}
    from bench_dataprep import QUALITY  # the parent only: a child's memory stays its own

    return json.loads(json.dumps(QUALITY))  # a copy


def data_config(corpus: str, workers: int, quality: dict):
    """The prepare step's data settings: the defaults, but the corpus, the workers and ``quality``."""
    from common.settings import from_dict
    from data_prep.config import DataConfig, QualityConfig

    return DataConfig(sources=[corpus], workers=workers, quality=from_dict(QualityConfig, quality, "data.quality"))


def filter_keep(texts: list[str], classes: list[str], quality: dict) -> dict[str, dict[str, float]]:
    """Per class, the documents and the share of the class' bytes that pass the filters
    (``filtered_text`` with the prepare runs' settings, before de-duplication): what the rules
    leave of each class to train the tokenizer on and encode."""
    from data_prep.filters import filtered_text

    config = data_config("-", 0, quality)
    passed: dict[str, list[int]] = {name: [0, 0, 0] for name in PREPARE_CLASSES}  # documents passing, bytes passing, bytes
    for text, name in zip(texts, classes, strict=True):
        size = len(text.encode("utf-8", "replace"))
        _, reason, _ = filtered_text(text, config)
        passed[name][0] += not reason
        passed[name][1] += 0 if reason else size
        passed[name][2] += size
    return {name: {"documents": n, "share": kept / size if size else 0.0} for name, (n, kept, size) in passed.items()}


def child_prepare(corpus: str, store: str, workers: int, profile: bool, quality: dict) -> dict:
    import resource

    from data_prep.config import TokenizerConfig
    from data_prep.prepare import prepare_dataset
    from storage import open_store

    profiler = cProfile.Profile() if profile else None
    if profile:
        import data_prep.prepare

        data_prep.prepare.train_tokenizer = _sample_first(data_prep.prepare.train_tokenizer)
    config = data_config(corpus, workers, quality)
    start = time.perf_counter()
    if profiler:
        profiler.enable()
    ref = prepare_dataset(config, TokenizerConfig(), open_store(store))
    if profiler:
        profiler.disable()
    seconds = time.perf_counter() - start
    own, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    result = {
        "seconds": seconds,
        "version": ref.version,
        "stats": ref.stats,
        # CPU seconds: on a machine shared with other jobs, wall time understates scaling.
        "parent_cpu": own.ru_utime + own.ru_stime,
        "workers_cpu": children.ru_utime + children.ru_stime,
    }
    if profiler:
        result["stages"] = stage_seconds(profiler)
    return result


def stage_seconds(profiler: cProfile.Profile) -> dict[str, float]:
    stats = pstats.Stats(profiler, stream=io.StringIO()).stats  # {(file, line, name): (cc, nc, tt, ct, callers)}
    out = {}
    for stage, (file, name) in STAGES.items():
        out[stage] = round(sum(v[3] for k, v in stats.items() if k[0].endswith(file) and k[2] == name), 2)
    top = sorted(stats.items(), key=lambda kv: -kv[1][2])[:12]
    out["top_self_seconds"] = {f"{Path(k[0]).name}:{k[2]}": round(v[2], 2) for k, v in top}
    return out


def prepare_runs(texts: list[str], repeats: int, workers: int, tmp: str, profile: bool, quality: dict) -> dict:
    corpus = Path(tmp) / "corpus"
    mb = write_corpus(corpus, texts)
    require(abs(mb - mb_of(texts)) < 1e-6, f"the corpus files hold {mb} MB, its documents {mb_of(texts)}")
    runs: dict[int, list[dict]] = {1: [], workers: []}
    rules = json.dumps(quality)
    for r in range(repeats):
        for w in (1, workers) if r % 2 == 0 else (workers, 1):
            out, rss_sum, rss_max = run_child(["prepare", str(corpus), f"{tmp}/store-{r}-{w}", str(w), "0", rules])
            runs[w].append(out | {"rss_sum": rss_sum, "rss_max": rss_max, "mb_s": mb / out["seconds"]})
    versions = {out["version"] for w in runs for out in runs[w]}
    require(len(versions) == 1, f"the worker count or the repeat changed the dataset: versions {sorted(versions)}")
    result: dict = {"corpus_mb": round(mb, 1)}
    for w, outs in runs.items():
        result[f"prepare_mb_s_{w}"] = round(statistics.median(o["mb_s"] for o in outs), 2)
        result[f"prepare_mb_s_{w}_spread"] = [round(min(o["mb_s"] for o in outs), 2), round(max(o["mb_s"] for o in outs), 2)]
        result[f"prepare_mb_s_per_core_{w}"] = round(result[f"prepare_mb_s_{w}"] / w, 2)
        result[f"prepare_peak_rss_mib_{w}"] = round(max(o["rss_sum"] for o in outs))
        result[f"prepare_peak_rss_max_process_mib_{w}"] = round(max(o["rss_max"] for o in outs))
        result[f"prepare_cpu_s_parent_{w}"] = round(statistics.median(o["parent_cpu"] for o in outs), 1)
        result[f"prepare_cpu_s_workers_{w}"] = round(statistics.median(o["workers_cpu"] for o in outs), 1)
    stats = runs[1][0]["stats"]
    result["documents_read"] = stats["documents_read"]
    result["documents_kept"] = stats["documents_kept"]
    result["duplicates"] = stats["duplicates_total"]
    result["tokens"] = stats["train_tokens"] + stats["val_tokens"]
    result["tokenizer_sample_mb"] = round(stats["tokenizer_sample_bytes"] / 1e6, 1)
    # What each rule dropped (its first hit per document), as the prepare step counted it.
    result["prepare_skipped"] = {k.removeprefix("skipped_"): v for k, v in stats.items() if k.startswith("skipped_") and v}
    # The ratio idle cores would give, from CPU seconds: on N cores the parallel run takes at
    # least its parent's time, each worker's share, and all its CPU time over N.
    cpu_bound = []
    for one, par in zip(runs[1], runs[workers], strict=True):
        serial = one["parent_cpu"] + one["workers_cpu"]
        critical = max(par["parent_cpu"], par["workers_cpu"] / workers, (par["parent_cpu"] + par["workers_cpu"]) / workers)
        cpu_bound.append(serial / (workers * critical))
    result["ratio_prepare_scaling_cpu_bound"] = round(statistics.median(cpu_bound), 3)
    result["_scaling"] = [par["mb_s"] / (workers * one["mb_s"]) for one, par in zip(runs[1], runs[workers], strict=True)]
    result["_per_core"] = [o["mb_s"] for o in runs[1]]
    if profile:
        out, *_ = run_child(["prepare", str(corpus), f"{tmp}/store-profile", "1", "1", rules])
        result["prepare_profile_1_process_s"] = {"total": round(out["seconds"], 2)} | out["stages"]
    return result


def child(argv: list[str]) -> None:
    mode, *rest = argv
    if mode == "encode":
        peer, spec_path, texts_path, out_path = rest
        print(json.dumps(child_encode(peer, spec_path, texts_path, out_path)))
        return
    require(mode == "prepare", f"unknown child mode {mode!r}: 'prepare' or 'encode'")
    corpus, store, workers, profile, quality = rest
    print(json.dumps(child_prepare(corpus, store, int(workers), profile == "1", json.loads(quality))))


# --- the benchmark ----------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=float, default=3.0, help="MB of text per class for the encoder runs")
    parser.add_argument("--prepare-mb", type=float, default=PREPARE_MB, help="MB of text through prepare (prose, code, catalogs)")
    parser.add_argument(
        "--prepare-prose-share", type=float, default=PROSE_SHARE, help="least share of the prepare corpus' bytes that is prose"
    )
    parser.add_argument("--prepare-rules", choices=RULES, default=RULES[0], help="the prepare runs' quality rules")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2, help="processes of the parallel prepare run")
    parser.add_argument("--quick", action="store_true", help="smoke run: 0.4 MB per class, 2 MB through prepare")
    parser.add_argument("--no-prepare", action="store_true", help="the encoder runs only (no prepare runs)")
    parser.add_argument("--prepare-only", action="store_true", help="the prepare runs only (no encoder runs)")
    parser.add_argument(
        "--unique-words-mb", type=float, default=0.0, help="also encode this many MB of random words (cache memory)"
    )
    parser.add_argument("--profile", action="store_true", help="also profile one 1-process prepare run, by stage")
    parser.add_argument("--big-gb", type=float, default=0.0, help="also run a corpus this big through prepare (memory)")
    parser.add_argument("--tmp", default=None, help="where to write corpora (default: system temp)")
    args = parser.parse_args()
    if args.quick:
        args.mb, args.prepare_mb = 0.4, 2.0
    require(args.repeats >= 1, "--repeats must be at least 1")
    require(not (args.no_prepare and args.prepare_only), "--no-prepare and --prepare-only leave nothing to run")
    require(0 <= args.prepare_prose_share <= 1, f"--prepare-prose-share is {args.prepare_prose_share}: a fraction in [0, 1]")
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    result, ratios = run(args)
    if args.big_gb:
        result |= big(args)
    result |= {
        "cpu_count": os.cpu_count(),
        "workers": args.workers,
        "repeats": args.repeats,
        "seconds": round(time.perf_counter() - started),
        # How busy the machine was (1-minute load average; 2 cores here): other jobs slow every run.
        "load_average_start": round(load_start, 2),
        "load_average_end": round(os.getloadavg()[0], 2),
    }
    summary = ratio_keys(ratios)
    if "prepare_mb_s_per_core" in result:
        summary["ratios"]["prepare_mb_s_per_core"] = result["prepare_mb_s_per_core"]
        summary["spread"]["prepare_mb_s_per_core"] = result["prepare_mb_s_per_core_spread"]
    result |= summary
    packages = ["tokenizers", "tiktoken", "gigatoken", "fastokens", "kitoken", "bpe-openai", "numpy", "zstandard"]
    result["machine"] = machine(packages, **{k.lower(): v for k, v in THREAD_ENV.items()})
    for key, value in result.items():
        print(f"  {key:<40} {value}")
    print(json.dumps(result))


def _cpu_per_wall(outs: list[dict]) -> float:
    """CPU seconds over wall seconds of all these timed encodes together (one run of ~10 ms can read
    1.4 from a moment of an allocator's background thread)."""
    return sum(o["cpu_per_wall"] * o["seconds"] for o in outs) / sum(o["seconds"] for o in outs)


def encode_summary(runs: dict, classes: dict[str, list[str]]) -> tuple[dict, dict[str, list[float]], list[str]]:
    """Result keys per class and peer, per-repeat ratios, and the table's lines."""
    result: dict = {}
    ratios: dict[str, list[float]] = {}
    peers = [p for p in PEERS if p in runs[next(iter(classes))]]
    exact = [p for p in peers if all(o["identical"] == len(classes[n]) for n in classes for o in runs[n][p])]
    result["exact_peers"] = [p for p in exact if p != "ours"]
    # A peer that kept more than one core busy has no per-core figure: not a fastest exact peer. (Threads
    # that take turns, as HF's caller and its one Rayon worker do, still make one core.)
    many = [p for p in peers if _cpu_per_wall([o for n in classes for o in runs[n][p]]) > MAX_CPU_PER_WALL]
    result["multi_threaded_peers"] = many
    require("ours" not in many, "our encoder kept more than one core busy")
    single = [p for p in result["exact_peers"] if p not in many]
    lines = [f"{'class':<13} {'peer':<10} {'MB/s':>8} {'[min, max]':>17} {'identical':>11} {'peak MiB':>9} {'build s':>8}"]
    for name, texts in classes.items():
        for peer in peers:
            outs = runs[name][peer]
            s = spread([o["mb_s"] for o in outs])
            identical = min(o["identical"] for o in outs)
            result[f"{peer}_mb_s_{name}"] = round(s["median"], 2)
            result[f"{peer}_mb_s_{name}_spread"] = [round(s["min"], 2), round(s["max"], 2)]
            result[f"identical_{peer}_{name}"] = f"{identical}/{len(texts)}"
            # Peak resident set the build and the encode (output included) added to the process.
            result[f"{peer}_peak_mib_{name}"] = round(max(o["peak_mib"] for o in outs), 1)
            result[f"{peer}_process_peak_mib_{name}"] = round(max(o["process_peak_mib"] for o in outs), 1)
            differences = [o["first_difference"] for o in outs if "first_difference" in o]
            if differences:
                result[f"{peer}_first_difference_{name}"] = differences[0]
            span = f"[{s['min']:.1f}, {s['max']:.1f}]"
            lines.append(
                f"{name:<13} {peer:<10} {s['median']:>8.2f} {span:>17} {result[f'identical_{peer}_{name}']:>11} "
                f"{result[f'{peer}_peak_mib_{name}']:>9} {statistics.median(o['build_s'] for o in outs):>8.3f}"
            )
        ours = [o["mb_s"] for o in runs[name]["ours"]]
        ratios[f"{name}_vs_hf_fast"] = [o / h["mb_s"] for o, h in zip(ours, runs[name]["hf_fast"], strict=True)]
        if single:
            fastest = max(single, key=lambda p: result[f"{p}_mb_s_{name}"])
            result[f"fastest_exact_peer_{name}"] = fastest
            per_repeat = [o / p["mb_s"] for o, p in zip(ours, runs[name][fastest], strict=True)]
            ratios[f"ours_vs_fastest_exact_peer_{name}"] = per_repeat
            result[f"ours_vs_fastest_exact_peer_{name}"] = round(statistics.median(per_repeat), 3)
            result[f"ours_vs_fastest_exact_peer_{name}_spread"] = [round(min(per_repeat), 3), round(max(per_repeat), 3)]
    if "mixed" in classes and "tiktoken" in peers:
        ours = [o["mb_s"] for o in runs["mixed"]["ours"]]
        ratios["mixed_vs_tiktoken"] = [o / t["mb_s"] for o, t in zip(ours, runs["mixed"]["tiktoken"], strict=True)]
    for peer in peers:
        outs = [o for name in classes for o in runs[name][peer]]
        result[f"{peer}_build_s"] = round(statistics.median(o["build_s"] for o in outs), 3)
        result[f"{peer}_build_mib"] = round(max(o["build_mib"] for o in outs), 1)
        # One core each: CPU seconds over wall seconds of the timed encodes (1.0 for one busy core), over
        # all of them and at most in one, and the process' threads after them, at most.
        result[f"{peer}_cpu_per_wall"] = round(_cpu_per_wall(outs), 2)
        result[f"{peer}_cpu_per_wall_max"] = round(max(o["cpu_per_wall"] for o in outs), 2)
        result[f"{peer}_threads_max"] = max(o["threads"] for o in outs)
    return result, ratios, lines


def run(args: argparse.Namespace) -> tuple[dict, dict[str, list[float]]]:
    result, ratios = ({}, {}) if args.prepare_only else encode(args)
    if not args.no_prepare:
        prepared, prepare_ratios = prepare(args)
        result |= prepared
        ratios |= prepare_ratios
    return result, ratios


def encode(args: argparse.Namespace) -> tuple[dict, dict[str, list[float]]]:
    """The encoder runs: every peer on every text class."""
    from data_prep.config import TokenizerConfig
    from data_prep.tokenizer import train_tokenizer

    classes = text_classes(args.mb)
    result: dict = {f"text_mb_{name}": round(mb_of(texts), 2) for name, texts in classes.items()}
    start = time.perf_counter()
    tokenizer = train_tokenizer(classes["mixed"], TokenizerConfig())
    result["tokenizer_training_s_1_thread"] = round(time.perf_counter() - start, 1)
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-encode-", dir=args.tmp) as tmp:
        runs, checks = encode_runs(classes, tokenizer, args.repeats, tmp)
        if args.unique_words_mb:
            peers = [p for p in PEERS if p in runs["mixed"]]
            result |= unique_words_runs(tokenizer, peers, args.unique_words_mb, tmp)
    encoded, ratios, table = encode_summary(runs, classes)
    print("\n".join(table))
    result |= encoded
    result["ours_encode_mb_s_1"] = result["ours_mb_s_mixed"]
    result["identical_ids"] = True  # ours == HF on every document of every class: checked in encode_runs (raises otherwise)
    result |= checks
    return result, ratios


def prepare(args: argparse.Namespace) -> tuple[dict, dict[str, list[float]]]:
    """The prepare runs, on a corpus whose prose share is measured and checked first, with the
    rules ``--prepare-rules`` names."""
    claim = args.prepare_prose_share
    texts, classes = prepare_texts(int(args.prepare_mb * 1e6), claim)
    shares = corpus_shares(texts, classes)
    prose, mb = shares["prose"], mb_of(texts)
    # Not an assert (python -O): a corpus that is not the prose share it claims gets no figure.
    require(
        prose["share"] >= claim,
        f"the prepare corpus is {prose['share']:.3f} prose ({prose['mb']:.1f} of {mb:.1f} MB), not the {claim} it claims: "
        f"this machine's distinct prose (prose_texts) ran out; give --prepare-mb {math.floor(prose['mb'] / claim)} or less",
    )
    result: dict = {"prepare_corpus_prose_share_claimed": claim}
    for name, row in shares.items():
        result[f"prepare_corpus_mb_{name}"] = round(row["mb"], 1)
        result[f"prepare_corpus_share_{name}"] = round(row["share"], 3)
        result[f"prepare_corpus_documents_{name}"] = row["documents"]
    quality = prepare_quality(args.prepare_rules)
    result |= {"prepare_rules": args.prepare_rules, "prepare_quality": quality}
    start = time.perf_counter()
    for name, row in filter_keep(texts, classes, quality).items():
        result[f"prepare_filters_pass_documents_{name}"] = row["documents"]
        result[f"prepare_filters_pass_share_{name}"] = round(row["share"], 3)
    result["prepare_filters_pass_seconds"] = round(time.perf_counter() - start, 1)
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-", dir=args.tmp) as tmp:
        prepared = prepare_runs(texts, args.repeats, args.workers, tmp, args.profile, quality)
    passed = sum(result[f"prepare_filters_pass_documents_{name}"] for name in PREPARE_CLASSES)
    require(
        passed - prepared["duplicates"] == prepared["documents_kept"],
        f"the filters pass {passed} documents and prepare dropped {prepared['duplicates']} duplicates, "
        f"but it kept {prepared['documents_kept']}: the per-class figures are not the runs'",
    )
    ratios = {"prepare_scaling_2_processes": prepared.pop("_scaling")}
    per_core = prepared.pop("_per_core")
    result |= prepared
    result["ratio_prepare_scaling"] = round(statistics.median(ratios["prepare_scaling_2_processes"]), 3)
    result["prepare_mb_s_per_core"] = round(statistics.median(per_core), 2)
    result["prepare_mb_s_per_core_spread"] = [round(min(per_core), 2), round(max(per_core), 2)]
    return result, ratios


def generate(root: Path, total_bytes: int, seed: int = 1) -> float:
    """Documents of 20-200 random standard-library lines (the memory run only: the text classes
    above are the realistic ones); returns the MB of text written."""
    lines = [line for text in code_texts(10**10) for line in text.splitlines()]
    rng, texts, size = random.Random(seed), [], 0
    while size < total_bytes:
        texts.append("\n".join(rng.choices(lines, k=rng.randint(20, 200))))
        size += len(texts[-1].encode("utf-8", "replace"))
    return write_corpus(root, texts)


def big(args: argparse.Namespace) -> dict:
    """A corpus of several GB through prepare: the memory figure."""
    result: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-tokenize-big-", dir=args.tmp) as tmp:
        big_mb = generate(Path(tmp) / "corpus", int(args.big_gb * 1e9))
        # The pipeline's default rules: Gopher's would drop most of these random code lines.
        out, rss_sum, rss_max = run_child(["prepare", f"{tmp}/corpus", f"{tmp}/store", str(args.workers), "0", "{}"])
        result["big_corpus_mb"] = round(big_mb)
        result["big_rules"] = "default"
        result["big_prepare_seconds"] = round(out["seconds"])
        result["big_prepare_mb_s"] = round(big_mb / out["seconds"], 2)
        result["big_peak_rss_mib"] = round(rss_sum)
        result["big_peak_rss_max_process_mib"] = round(rss_max)
        result["big_documents_kept"] = out["stats"]["documents_kept"]
        result["big_tokens"] = out["stats"]["train_tokens"] + out["stats"]["val_tokens"]
    return result


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        child(sys.argv[2:])
    else:
        main()
