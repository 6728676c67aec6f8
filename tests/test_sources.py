"""Sources and readers: every format, local and S3, and a folder of hostile files."""

from __future__ import annotations

import bz2
import gzip
import json
import logging
import os
import tracemalloc
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from data_prep.errors import DataError
from data_prep.manifest import load_manifest
from data_prep.prepare import prepare_dataset
from data_prep.readers import Skips, iter_documents, read_file
from data_prep.sources import Ignored, content_fingerprint, list_files, listing_hash
from storage import open_store
from tests.helpers import distinct_docs, tiny_data, tiny_tokenizer, write_corpus

CAP = 4 * 2_000_000 + 4  # max_doc_bytes of the default max_chars


def read_all(sources: list[str], text_field: str = "text", cap: int = CAP) -> tuple[list, Skips, Counter]:
    ignored: Counter = Counter()
    skips = Skips()
    docs = list(iter_documents(list_files(sources, ignored), text_field, cap, skips))
    return docs, skips, ignored


def parquet_bytes(table: pa.Table, tmp_path: Path) -> bytes:
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=2)
    return path.read_bytes()


def format_corpus(tmp_path: Path) -> tuple[Path, list[str]]:
    texts = distinct_docs(9)
    jsonl = "\n".join(json.dumps({"body": t, "id": i}) for i, t in enumerate(texts[2:5]))
    files = {
        "a.txt": texts[0],
        "b.md.zst": zstandard.ZstdCompressor().compress(texts[1].encode()),
        "c.jsonl": jsonl,
        "d.jsonl.gz": gzip.compress(json.dumps({"body": texts[5]}).encode()),
        "e.parquet": parquet_bytes(pa.table({"body": texts[6:9], "n": [1, 2, 3]}), tmp_path),
        "notes.bin": b"not a supported format",
    }
    return write_corpus(tmp_path / "corpus", files), texts


def test_every_format_local_with_configured_text_field(tmp_path):
    root, texts = format_corpus(tmp_path)
    docs, skips, ignored = read_all([str(root)], text_field="body")
    assert sorted(d.text for d in docs) == sorted(texts)
    assert not skips.counts and ignored == {".bin": 1}  # counted, not read
    assert {d.source.rsplit("/", 1)[1] for d in docs} >= {"c.jsonl:1", "e.parquet:3", "b.md.zst"}


def test_every_format_from_an_s3_prefix(s3_store, tmp_path):
    root, texts = format_corpus(tmp_path)
    s3_store.upload_dir(root, "raw")
    docs, skips, ignored = read_all([s3_store.url("raw")], text_field="body")
    assert sorted(d.text for d in docs) == sorted(texts) and all(d.source.startswith("s3://") for d in docs)
    assert not skips.counts and ignored == {".bin": 1}
    # The content fingerprint does not depend on where the corpus lives.
    for sniff in (False, True):
        assert content_fingerprint([s3_store.url("raw")], sniff) == content_fingerprint([str(root)], sniff)
    # Sniffing lets notes.bin (text) in: the fingerprint covers what the listing reads.
    assert content_fingerprint([str(root)], True) != content_fingerprint([str(root)], False)


def test_globs_and_explicit_files(tmp_path):
    root, texts = format_corpus(tmp_path)
    docs, _, _ = read_all([str(root / "*.jsonl*"), str(root / "a.txt")], text_field="body")
    assert [d.text for d in docs] == [*texts[2:6], texts[0]]
    with pytest.raises(DataError, match="matches no files"):
        read_all([str(root / "*.nothing")])


def test_s3_prefix_without_objects_is_a_clear_error(s3_store):
    with pytest.raises(DataError, match="holds no objects"):
        list_files([s3_store.url("empty")])


def hostile_folder(root: Path) -> Path:
    good = distinct_docs(3)
    root.mkdir(parents=True)
    write_corpus(
        root,
        {
            "good.txt": good[0],
            "empty.txt": b"",
            "latin1.txt": "caf\xe9 ".encode("latin-1") * 40,
            "nul.txt": b"text\x00with\x00nul\x00bytes" * 100,
            "truncated.txt.gz": gzip.compress(good[1].encode() * 50)[:200],
            "truncated.jsonl.zst": zstandard.ZstdCompressor().compress(json.dumps({"text": good[1]}).encode() * 50)[:100],
            "records.jsonl": "\n".join(
                [
                    "{not json",
                    json.dumps([1, 2]),
                    json.dumps({"text": 5}),
                    "[" * 100_000 + "]" * 100_000,  # deep enough to blow a recursive parser
                    json.dumps({"text": "\ud800 lone surrogate kept apart"}),
                ]
            ).encode()
            + b"\n\xff\xfe bad utf-8 line\n",
            "no_text_column.parquet": _parquet_without_text(root.parent / "p.parquet"),
            "corrupt.parquet": b"PAR1 not really parquet PAR1",
            "dir.jsonl/inner.txt": good[2],  # a folder named like a file is walked
        },
    )
    # One 200 MB line, followed by a good record: streamed past, never held.
    with open(root / "huge.jsonl", "wb") as f:
        f.write(b'{"text": "')
        block = b"x" * (1 << 20)
        for _ in range(200):
            f.write(block)
        f.write(b'"}\n' + json.dumps({"text": "after the huge line " * 5}).encode() + b"\n")
    os.symlink("loop", root / "loop")  # a symlink to itself
    os.symlink("..", root / "dir.jsonl" / "up")  # leads back to an ancestor
    os.symlink("missing-target", root / "dangling.txt")
    os.mkfifo(root / "pipe.txt")
    write_corpus(root.parent, {"outside/secret.txt": "SECRET " * 20})
    os.symlink(root.parent / "outside", root / "home")  # out of the source: refused, not read
    return root


def _parquet_without_text(path: Path) -> bytes:
    pq.write_table(pa.table({"body": ["a document in the wrong column"]}), path)
    return path.read_bytes()


HOSTILE_SKIPS = {
    "empty": 1,  # at filtering, not reading: an empty file is read as an empty document
    "not_utf8": 1,
    "binary": 1,
    "bad_gzip": 1,
    "bad_zstd": 1,
    "bad_jsonl_record": 3,  # not JSON, nested too deep, invalid UTF-8
    "jsonl_missing_text_field": 2,  # a list, a number as text
    "parquet_missing_text_field": 1,
    "bad_parquet": 1,
    "too_long": 1,
    "symlink_loop": 2,
    "symlink_outside": 1,
    "broken_link": 1,
    "not_a_regular_file": 1,
}


def test_hostile_folder_every_file_skipped_by_reason_in_bounded_memory(tmp_path):
    root = hostile_folder(tmp_path / "hostile")
    tracemalloc.start()
    try:
        docs, skips, _ = read_all([str(root)])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 2**20, f"reading held {peak / 2**20:.0f} MiB"
    texts = {d.source.rsplit("/", 1)[1]: d.text for d in docs}
    assert set(texts) == {"good.txt", "inner.txt", "records.jsonl:5", "huge.jsonl:2", "empty.txt"}
    assert dict(skips.counts) == {k: v for k, v in HOSTILE_SKIPS.items() if k != "empty"}
    assert any(name.endswith("no_text_column.parquet") for name in skips.examples["parquet_missing_text_field"])


def test_hostile_folder_through_prepare_fails_nothing_and_counts_everything(tmp_path):
    root = hostile_folder(tmp_path / "hostile")
    store = open_store(str(tmp_path / "store"))
    ref = prepare_dataset(tiny_data(sources=[str(root)], max_documents=0, min_chars=20, seq_len=8), tiny_tokenizer(), store)
    manifest = load_manifest(store, ref)
    assert ref.stats["documents_kept"] == 4  # good, inner, the lone-surrogate record (cleaned), after-huge
    skipped = {k.removeprefix("skipped_"): v for k, v in ref.stats.items() if k.startswith("skipped_") and k != "skipped_total"}
    assert sum(skipped.values()) == ref.stats["skipped_total"] == sum(HOSTILE_SKIPS.values())
    assert {k for k in skipped} == set(HOSTILE_SKIPS)
    assert manifest["sources"]["skipped_examples"]["symlink_loop"]
    assert manifest["sources"]["skipped_examples"]["symlink_outside"] == ["home"]


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads mode-000 files, so a permission failure cannot be staged as root")
def test_unreadable_file_is_skipped(tmp_path):
    root = write_corpus(tmp_path / "c", {"ok.txt": distinct_docs(1)[0], "secret.txt": "hidden"})
    (root / "secret.txt").chmod(0)
    docs, skips, _ = read_all([str(root)])
    assert len(docs) == 1 and skips.counts == {"unreadable": 1}


def test_file_gone_between_listing_and_reading_is_skipped(tmp_path):
    # The same path as an unreadable file (open raises OSError), reachable as root too.
    root = write_corpus(tmp_path / "c", {"ok.txt": distinct_docs(1)[0], "gone.txt": "soon deleted"})
    files = list_files([str(root)])
    (root / "gone.txt").unlink()
    skips = Skips()
    docs = [d for f in files for d in read_file(f, "text", CAP, skips)]
    assert len(docs) == 1 and skips.counts == {"unreadable": 1} and skips.examples["unreadable"][0].endswith("gone.txt")


def unlisted_corpus(root: Path) -> tuple[Path, dict[str, str]]:
    """A folder of files whose suffixes say no format: text ones (what a person would call text)
    and binary ones; returns it and the text each text file holds."""
    texts = distinct_docs(5)
    # Past the sniffed 8 KB, and with a 2-byte character cut by the 8 KB mark.
    long = "a" * 8191 + "é" + texts[3]
    text_files = {"notes.1.gz": texts[0], "LICENSE": texts[1], "sub/data.zst": texts[2], "run.log": long}
    files: dict[str, str | bytes] = {
        "notes.1.gz": gzip.compress(texts[0].encode()),
        "LICENSE": texts[1],
        "sub/data.zst": zstandard.ZstdCompressor().compress(texts[2].encode()),
        "run.log": long,
        "foo.md.bz2": bz2.compress(texts[0].encode()),  # a compression we do not read: binary
        "image.png": b"\x89PNG\r\n\x1a\n" + bytes(range(256)),
        "legacy.dat": "caf\xe9 ".encode("latin-1") * 40,  # text, but not UTF-8
        "table.parquet.gz": gzip.compress(b"PAR1"),  # compressed Parquet: no reader, not sniffed
        ".keep": b"",  # empty: nothing to read
        "a.txt": texts[4],
    }
    return write_corpus(root, files), text_files


def source_of(folder: Path, where: str, request) -> str:
    """The corpus ``folder`` as a source: the folder itself, or a copy under a prefix of the test S3 store."""
    if where == "local":
        return str(folder)
    s3_store = request.getfixturevalue("s3_store")
    s3_store.upload_dir(folder, "raw")
    return s3_store.url("raw")


@pytest.mark.parametrize("where", ["local", "s3"])
def test_unlisted_text_files_are_sniffed_and_read(tmp_path, request, where):
    root, text_files = unlisted_corpus(tmp_path / "corpus")
    source = source_of(root, where, request)
    ignored = Ignored(sniff=True)
    files = list_files([source], ignored, sniff=True)
    docs = {d.source.rsplit("/", 1)[1]: d.text for d in iter_documents(files, "text", CAP, Skips())}
    assert docs == {name.rsplit("/", 1)[-1]: text for name, text in text_files.items()} | {"a.txt": distinct_docs(5)[4]}
    assert dict(ignored) == {".bz2": 1, ".png": 1, ".dat": 1, ".gz": 1, "(hidden)": 1}  # .keep is hidden
    assert dict(ignored.sniffed) == {".gz": 1, "(no suffix)": 1, ".zst": 1, ".log": 1}
    assert ignored.sniffed_examples[".zst"] == ["sub/data.zst"] and ignored.examples[".gz"] == ["table.parquet.gz"]
    # The listing is the same every time, and the same wherever the corpus lives.
    assert [f.relative for f in files] == ["LICENSE", "a.txt", "notes.1.gz", "run.log", "sub/data.zst"]
    again = list_files([source], sniff=True)
    assert listing_hash(again) == listing_hash(files) == listing_hash(list_files([str(root)], sniff=True))
    # Off: every unlisted file is ignored, counted by suffix.
    off = Ignored()
    assert [f.relative for f in list_files([source], off)] == ["a.txt"]
    assert sum(off.values()) == 9 and not off.sniffed


def test_prepare_says_what_it_sniffed_and_what_it_ignored(tmp_path, caplog):
    root, _ = unlisted_corpus(tmp_path / "corpus")
    store = open_store(str(tmp_path / "store"))
    with caplog.at_level(logging.INFO, logger="data_prep"):
        ref = prepare_dataset(tiny_data(sources=[str(root)], max_documents=0, min_chars=20), tiny_tokenizer(), store)
    assert ref.stats["files_sniffed"] == 4 and ref.stats["files_ignored"] == 5 and ref.stats["files_listed"] == 5
    by_suffix = load_manifest(store, ref)["sources"]["ignored_by_suffix"]
    assert by_suffix == {"(hidden)": 1, ".bz2": 1, ".dat": 1, ".gz": 1, ".png": 1}
    assert ref.stats["documents_kept"] == 5  # the four sniffed files and a.txt
    messages = [r.getMessage() for r in caplog.records]
    sniffed = [m for m in messages if m.startswith("read 4 files with unlisted suffixes as text")]
    assert len(sniffed) == 1 and "e.g. LICENSE, notes.1.gz, run.log, …" in sniffed[0], sniffed
    assert "data.sniff_unlisted: false" in sniffed[0]
    ignored = [m for m in messages if m.startswith("  ignored 4 files by suffix")]
    assert (
        len(ignored) == 1
        and "e.g. foo.md.bz2, legacy.dat, table.parquet.gz, …" in ignored[0]
        and "data.sniff_unlisted" in ignored[0]
    )
    hidden = [m for m in messages if m.startswith("  ignored 1 hidden files or folders")]
    assert len(hidden) == 1 and "e.g. .keep:" in hidden[0] and "name them in data.sources" in hidden[0], hidden
    assert "data.sniff_unlisted" not in hidden[0]  # no suffix advice: sniffing would not read it
    caplog.clear()
    data = tiny_data(sources=[str(root)], max_documents=0, min_chars=20, sniff_unlisted=False)
    # Off, one document is left: too few to split, and the summary says which setting reads the rest.
    with caplog.at_level(logging.INFO, logger="data_prep"), pytest.raises(DataError, match="validation"):
        prepare_dataset(data, tiny_tokenizer(), store)
    ignored = [r.getMessage() for r in caplog.records if r.getMessage().startswith("  ignored 8 files by suffix")]
    assert len(ignored) == 1 and "set data.sniff_unlisted: true" in ignored[0]


# The peak is this process's VmHWM: ru_maxrss would be inherited from the test process through fork and exec.
PARQUET_BOMB = """
import re, sys
from data_prep.readers import Skips, read_file
from data_prep.sources import RawFile
def peak_kib():
    return int(re.search(r"VmHWM:\\s+(\\d+) kB", open("/proc/self/status").read()).group(1))
path = sys.argv[1]
before = peak_kib()
skips = Skips()
docs = chars = 0
for doc in read_file(RawFile(path, 0, lambda: open(path, "rb"), local_path=path), "text", 1_000_000, skips):
    docs, chars = docs + 1, chars + len(doc.text)  # as the pipeline reads: one document at a time
print(docs, skips.counts["too_long"], chars, (peak_kib() - before) // 1024)
"""


def read_bomb(path: Path) -> tuple[int, int, int, int]:
    """(documents, too long, characters, MiB the peak memory grew) of reading ``path`` in a fresh process."""
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", PARQUET_BOMB, str(path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    docs, too_long, chars, grown_mib = map(int, out.stdout.split())
    return docs, too_long, chars, grown_mib


def test_a_parquet_bomb_is_read_in_bounded_memory(tmp_path):
    """8 rows of 64 MiB in a 2.5 KB zstd file: decoded 1,024 rows at a time and made Python strings before
    the length check, they raised the peak by 1,729 MiB (issue 32, item 5). Now one value is decoded at a
    time and never made a string: 547 MiB, some eight times one value (decompressed, then decoded)."""
    path = tmp_path / "bomb.parquet"
    pq.write_table(pa.table({"text": ["a" * (64 * 2**20)] * 8 + ["a fine document"]}), path, compression="zstd")
    assert path.stat().st_size < 16_384
    docs, too_long, chars, grown_mib = read_bomb(path)
    assert (docs, too_long, chars) == (1, 8, len("a fine document"))
    assert grown_mib < 1024, f"reading the bomb raised the peak by {grown_mib} MiB"


def test_a_dictionary_encoded_parquet_file_is_decoded_within_the_bound(tmp_path):
    """Issue 50 finding 2: batches were sized from the stored size, which counts a dictionary value once: a 504-byte
    file, 4,096 rows pointing at one 512 KiB value, decoded 1,024 rows at a time (512 MiB per batch, 2 GiB of text
    in all) raised the peak by 2,240 MiB. Now each row counts at its dictionary page's size (read from the page
    header): at most 64 MiB of text per batch, whatever the encoding."""
    path = tmp_path / "dictionary.parquet"
    value = "b" * (512 * 2**10)
    rows = pa.DictionaryArray.from_arrays(pa.array([0] * 4096, pa.int32()), pa.array([value]))
    pq.write_table(pa.table({"text": rows}), path, compression="zstd", store_schema=False)  # read as strings
    assert path.stat().st_size < 4096 and pq.ParquetFile(path).metadata.row_group(0).column(0).total_uncompressed_size < 2**20
    docs, too_long, chars, grown_mib = read_bomb(path)
    assert (docs, too_long, chars) == (4096, 0, 4096 * len(value))  # every row read, as it is written
    assert grown_mib < 1024, f"reading the dictionary-encoded file raised the peak by {grown_mib} MiB"


def test_a_dictionary_page_header_is_read_or_refused():
    from data_prep.readers import _dictionary_page_size

    def i32(field_delta: int, value: int) -> bytes:  # a compact-protocol i32 field: header byte, zigzag varint
        zigzag, out = (value << 1) ^ (value >> 31), b""
        while True:
            out += bytes([zigzag & 0x7F | (0x80 if zigzag > 0x7F else 0)])
            zigzag >>= 7
            if not zigzag:
                return bytes([field_delta << 4 | 5]) + out

    assert _dictionary_page_size(i32(1, 2) + i32(1, 524_300) + i32(1, 40)) == 524_300
    assert _dictionary_page_size(i32(1, 0) + i32(1, 524_300)) is None  # a data page's header, not a dictionary's
    assert _dictionary_page_size(i32(1, 2) + i32(1, -5)) is None
    assert _dictionary_page_size(b"\x15\x04\x15\xff\xff") is None  # cut short
    assert _dictionary_page_size(b"") is None


# --- a source's listing stays inside it (the security finding: a symlink to a home folder) ------
def victim_home(tmp_path: Path) -> Path:
    """A folder like a home directory: credentials in dotfiles, and a token in a plain text file."""
    return write_corpus(
        tmp_path / "victim",
        {
            ".aws/credentials": "[default]\naws_secret_access_key = SECRET",
            ".netrc": "machine x password SECRET",
            "token.txt": "SECRET",
        },
    )


def test_a_symlink_out_of_the_source_is_refused_not_read(tmp_path):
    victim = victim_home(tmp_path)
    corpus = write_corpus(tmp_path / "corpus", {"a.txt": distinct_docs(1)[0]})
    os.symlink(victim, corpus / "home")
    files = list_files([str(corpus)])
    assert [f.relative for f in files if not f.problem] == ["a.txt"], [f.name for f in files]
    assert not [f for f in files if not f.problem and str(victim) in os.path.realpath(f.name)]
    assert [(f.relative, f.problem) for f in files if f.problem] == [("home", "symlink_outside")]
    # Followed on request, the token is read; the victim's dotfiles are still hidden.
    ignored = Ignored()
    followed = list_files([str(corpus)], ignored, follow_symlinks=True)
    assert [f.relative for f in followed] == ["a.txt", "home/token.txt"] and not [f for f in followed if f.problem]
    assert ignored == {"(hidden)": 2}


def test_a_file_replaced_by_a_link_after_the_listing_is_not_read(tmp_path):
    """Issue 50 finding 6: files were opened by path after the listing's link check, so replacing a listed file
    with a link to ``~/.aws/credentials`` between the listing and the read put the credentials into the corpus.
    Each file is now read through one descriptor checked to be the file the listing saw (device, inode)."""
    victim = victim_home(tmp_path)
    docs = distinct_docs(2)
    corpus = write_corpus(tmp_path / "corpus", {"a.txt": docs[0], "b.txt": docs[1]})
    pq.write_table(pa.table({"text": [docs[0]]}), corpus / "c.parquet")
    files = list_files([str(corpus)])
    assert [f.relative for f in files if not f.problem] == ["a.txt", "b.txt", "c.parquet"]
    for name, target in (("a.txt", victim / ".aws" / "credentials"), ("c.parquet", victim / "token.txt")):
        (corpus / name).unlink()
        (corpus / name).symlink_to(target)  # the swap, after the listing
    skips = Skips()
    texts = [d.text for d in iter_documents(files, "text", 1_000_000, skips)]
    assert texts == [docs[1]] and not [t for t in texts if "SECRET" in t]
    assert skips.counts["changed_since_listing"] == 2 and skips.examples["changed_since_listing"] == [
        str(corpus / "a.txt"),
        str(corpus / "c.parquet"),
    ]


def test_a_file_symlink_out_of_the_source_is_refused(tmp_path):
    secret = write_corpus(tmp_path / "elsewhere", {"secret.txt": "SECRET"}) / "secret.txt"
    corpus = write_corpus(tmp_path / "corpus", {"a.txt": distinct_docs(1)[0]})
    os.symlink(secret, corpus / "leak.txt")
    files = list_files([str(corpus)])
    assert [(f.relative, f.problem) for f in files] == [("a.txt", ""), ("leak.txt", "symlink_outside")]
    with pytest.raises(OSError, match="symlink_outside"):
        files[1].open()


def test_a_symlink_to_a_place_inside_the_source_is_followed(tmp_path):
    corpus = write_corpus(tmp_path / "corpus", {"sub/b.txt": distinct_docs(1)[0]})
    os.symlink("sub", corpus / "alias")
    os.symlink("sub/b.txt", corpus / "c.txt")
    files = list_files([str(corpus)])
    assert [(f.relative, f.problem) for f in files] == [("alias/b.txt", ""), ("c.txt", ""), ("sub/b.txt", "")]


def test_a_sibling_folder_with_a_shared_prefix_is_outside(tmp_path):
    write_corpus(tmp_path / "corpus2", {"b.txt": "SECRET"})
    corpus = write_corpus(tmp_path / "corpus", {"a.txt": distinct_docs(1)[0]})
    os.symlink("../corpus2", corpus / "next")  # /…/corpus2 starts with /…/corpus, yet is not inside it
    files = list_files([str(corpus)])
    assert [(f.relative, f.problem) for f in files] == [("a.txt", ""), ("next", "symlink_outside")]


def test_a_source_that_is_itself_a_symlink_is_read(tmp_path):
    real = write_corpus(tmp_path / "disks" / "big" / "corpus", {"a.txt": distinct_docs(1)[0], "sub/b.txt": "text"})
    named = tmp_path / "corpus"
    os.symlink(real, named)  # named in data.sources: where it leads is where the source lives
    files = list_files([str(named)])
    assert [(f.relative, f.problem) for f in files] == [("a.txt", ""), ("sub/b.txt", "")]


@pytest.mark.parametrize("where", ["local", "s3"])
def test_hidden_files_and_folders_are_counted_not_read(tmp_path, request, where):
    corpus = write_corpus(
        tmp_path / "corpus",
        {
            "a.txt": distinct_docs(1)[0],
            ".env": "TOKEN=SECRET",
            ".git/HEAD": "ref: refs/heads/main",
            ".git/objects/ab/cdef.txt": "SECRET",
            "sub/.netrc": "machine x password SECRET",
        },
    )
    source = source_of(corpus, where, request)
    ignored = Ignored(sniff=True)
    files = list_files([source], ignored, sniff=True)
    assert [f.relative for f in files] == ["a.txt"]
    assert dict(ignored) == {"(hidden)": 3}  # .git counted once, as one entry
    assert ignored.examples["(hidden)"] == [".env", ".git", "sub/.netrc"]
    # Named explicitly, a dotfile is read.
    assert [f.relative for f in list_files([str(corpus / ".env")])] == [".env"]


def test_a_glob_match_through_a_symlink_out_of_its_folder_is_refused(tmp_path):
    secret = write_corpus(tmp_path / "elsewhere", {"secret.txt": "SECRET"}) / "secret.txt"
    corpus = write_corpus(tmp_path / "corpus", {"a.txt": distinct_docs(1)[0]})
    os.symlink(secret, corpus / "leak.txt")
    files = list_files([str(corpus / "*.txt")])
    assert [(f.relative, f.problem) for f in files] == [("a.txt", ""), ("leak.txt", "symlink_outside")]
    assert [f.problem for f in list_files([str(corpus / "*.txt")], follow_symlinks=True)] == ["", ""]


def test_the_fingerprint_covers_what_the_listing_reads_not_what_a_link_leads_to(tmp_path):
    victim = victim_home(tmp_path)
    corpus = write_corpus(tmp_path / "corpus", {"a.txt": distinct_docs(1)[0]})
    os.symlink(victim, corpus / "home")
    before = content_fingerprint([str(corpus)], True), content_fingerprint([str(corpus)], True, follow_symlinks=True)
    (victim / "token.txt").write_text("ANOTHER SECRET")
    after = content_fingerprint([str(corpus)], True), content_fingerprint([str(corpus)], True, follow_symlinks=True)
    assert after[0] == before[0]  # the token is not read, so it is not fingerprinted
    assert after[1] != before[1]  # followed, it is read: a change must miss the cache


def test_a_corpus_with_nothing_to_read_stops_at_listing(tmp_path):
    """Issue 33: an empty corpus folder failed after 45.7 s, at resolve_documents, advising to lower
    data.min_chars; now the listing says it, with what it found."""
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(DataError, match=r"hold no file to read \(no files at all\): put text"):
        list_files([str(empty)])
    other = write_corpus(tmp_path / "other", {"logo.png": b"\x89PNG", ".env": "TOKEN=x"})
    with pytest.raises(DataError, match=r"hold no file to read \(1 ignored as \(hidden\), 1 ignored as \.png\)"):
        list_files([str(other)])
    assert [f.relative for f in list_files([str(other / "logo.png")])] == ["logo.png"]  # named: read as named


def test_a_column_whose_dictionary_page_header_does_not_read_is_read_as_a_dictionary(tmp_path, monkeypatch):
    """The fallback: the text stays a dictionary and is decoded a bounded slice at a time; the documents are the
    same, a value over the cap is still skipped unmade."""
    from data_prep import readers
    from data_prep.sources import RawFile

    path = tmp_path / "d.parquet"
    texts = ["short one", "x" * 5000, "short one", None, "another"]
    pq.write_table(pa.table({"text": pa.array(texts).dictionary_encode()}), path, store_schema=False)
    raw = RawFile(str(path), 0, lambda: open(path, "rb"), local_path=str(path))
    plain_skips, skips = Skips(), Skips()
    read = [d.text for d in read_file(raw, "text", 1000, plain_skips)]
    monkeypatch.setattr(readers, "_largest_dictionary_page", lambda *a: None)
    monkeypatch.setattr(readers, "PARQUET_BATCH_BYTES", 12)  # a slice per one or two values
    assert [d.text for d in read_file(raw, "text", 1000, skips)] == read == ["short one", "short one", "another"]
    assert skips.counts == plain_skips.counts == {"too_long": 1, "parquet_null_text": 1}
