"""What a person reads on the console: prepare's progress lines and its one summary of skipped
inputs, and training's step lines every train.log_every steps."""

from __future__ import annotations

import logging
import re

import pytest

from data_prep import console
from data_prep.console import PassProgress
from data_prep.prepare import prepare_dataset
from data_prep.readers import Skips, iter_documents
from data_prep.sources import list_files
from storage import open_store
from tests.helpers import fresh_copy, mixed_corpus, tiny_data, tiny_model, tiny_tokenizer, write_corpus
from training.config import ParallelConfig, TrainConfig
from training.launch import launch
from training.observe.metrics import flops_per_token, non_embedding_params
from training.observe.step_lines import _si
from training.train import train

PROGRESS = re.compile(
    r"^(scan|encode): (\d[\d,]*) documents, ([\d.,]+) of ([\d.,]+) MB \((\d+)%\), ([\d.,]+) MB/s, "
    r"ETA (\d+s|\d+m\d\ds|\d+h\d\dm|unknown)$"
)
FINAL = re.compile(r"^(scan|encode): done in \S+, (\d[\d,]*) documents, ([\d.,]+) MB read \(([\d.,]+) MB/s\)$")
IGNORED = {"a.png": b"\x89PNG", "b.png": b"\x89PNG", "sub/c.png": b"\x89PNG", "d.bin": b"\x00", "Makefile": b"all:"}
BINARY = ["blob.txt", "blob2.txt", "blob3.txt", "blob4.txt"]  # mixed_corpus's blob.txt and three more


@pytest.fixture(scope="module")
def prepared(tmp_path_factory) -> tuple[object, dict[str, int], list[logging.LogRecord]]:
    """One prepare over a corpus with skips of several reasons and ignored files, every log record
    kept, with progress lines as often as they can come."""
    root, expected = mixed_corpus(tmp_path_factory.mktemp("corpus"))
    write_corpus(root, IGNORED | {name: b"\x00\x01binary" * 50 for name in BINARY[1:]})
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger, handler = logging.getLogger("data_prep"), Keep(logging.DEBUG)
    saved = logger.level, console.PROGRESS_INTERVAL_S
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    console.PROGRESS_INTERVAL_S = 0.0  # a line at every chance: the corpus is read in a blink
    try:
        store = open_store(str(tmp_path_factory.mktemp("store")))
        # Unlisted suffixes ignored, not sniffed (Makefile holds text): the summary of ignored files.
        ref = prepare_dataset(tiny_data(sources=[str(root)], max_documents=0, sniff_unlisted=False), tiny_tokenizer(), store)
    finally:
        logger.removeHandler(handler)
        logger.setLevel(saved[0])
        console.PROGRESS_INTERVAL_S = saved[1]
    return ref, expected | {"binary": len(BINARY)}, records


def test_skips_are_summarised_once_per_reason_with_examples(prepared):
    ref, expected, records = prepared
    messages = [r.getMessage() for r in records]
    # The stats keep their per-reason counts.
    assert {
        k.removeprefix("skipped_"): v for k, v in ref.stats.items() if k.startswith("skipped_") and k != "skipped_total"
    } == expected
    assert ref.stats["files_ignored"] == len(IGNORED)
    headers = [m for m in messages if m.startswith("skipped ") and "by reason" in m]
    header = f"skipped {sum(expected.values())} inputs (files, records or documents) and ignored 5 files by suffix, by reason"
    assert len(headers) == 1 and headers[0].startswith(header), headers
    for reason, n in expected.items():
        lines = [r for r in records if f" × {reason} (" in r.getMessage()]
        assert len(lines) == 1, (reason, lines)
        assert lines[0].getMessage().startswith(f"  skipped {n} × {reason} ("), lines[0].getMessage()
        problem = reason not in ("duplicate", "near_duplicate", "empty", "too_short")
        assert lines[0].levelno == (logging.WARNING if problem else logging.INFO), reason
    binary = next(m for m in messages if " × binary (" in m)
    # Three examples, names inside the source, and a mark that there are more.
    assert binary.endswith("e.g. blob.txt, blob2.txt, blob3.txt, …"), binary
    assert next(m for m in messages if " × bad_jsonl_record (" in m).endswith("e.g. nested/records.jsonl:6")
    ignored = [m for m in messages if m.startswith("  ignored ")]
    assert len(ignored) == 1
    assert "ignored 5 files by suffix (.png ×3, (no suffix) ×1, .bin ×1), e.g. a.png, Makefile, d.bin, …" in ignored[0]
    assert "name a file in data.sources" in ignored[0] and ".jsonl" in ignored[0]
    # No line per file: each skipped or ignored name is in the summary line of its reason only.
    for name in ["blob4.txt", "latin1.txt", "dup.txt", "short.txt", "broken.txt.gz", "a.png", "Makefile"]:
        assert sum(name in m for m in messages) <= 1, (name, [m for m in messages if name in m])
    assert not any(re.match(r"skipped \S+: \w+$", m) for m in messages)  # the old per-file form


def test_prepare_logs_progress_with_documents_megabytes_rate_and_eta(prepared):
    ref, _, records = prepared
    messages = [r.getMessage() for r in records if r.name == "data_prep.console"]
    progress = [PROGRESS.match(m) for m in messages if m.startswith(("scan: ", "encode: ")) and " done in " not in m]
    assert progress and all(progress), [m for m in messages if not PROGRESS.match(m)][:5]
    assert {m.group(1) for m in progress} == {"scan", "encode"}
    totals = {m.group(4) for m in progress}
    assert len(totals) == 1  # the listing's bytes, known before the pass
    # The bytes and the documents only grow within a pass.
    for name in ("scan", "encode"):
        done = [(float(m.group(3)), int(m.group(2).replace(",", ""))) for m in progress if m.group(1) == name]
        assert done == sorted(done)
    finals = {m.group(1): m for m in map(FINAL.match, messages) if m}
    assert set(finals) == {"scan", "encode"}
    # Each pass read the whole listing; the scan judged every document, the encode pass encoded the kept ones.
    assert finals["scan"].group(3) == finals["encode"].group(3) == totals.pop()
    assert int(finals["encode"].group(2)) == ref.stats["documents_kept"]


def test_progress_is_time_based_with_an_eta_from_the_listing(tmp_path, caplog):
    now = [0.0]
    progress = PassProgress("scan", total_bytes=100_000_000, interval_s=5, clock=lambda: now[0])
    with caplog.at_level(logging.INFO, logger="data_prep.console"):
        for second in range(1, 13):  # 12 s at 2.5 MB/s and 10 documents a second
            now[0] = float(second)
            progress.read(2_500_000)
            progress.add_documents(10)
        progress.finish()
    lines = [r.getMessage() for r in caplog.records]
    assert lines == [
        # Logged as the bytes of second 5 and 10 came in, before that second's documents.
        "scan: 40 documents, 12.5 of 100.0 MB (12%), 2.5 MB/s, ETA 35s",
        "scan: 90 documents, 25.0 of 100.0 MB (25%), 2.5 MB/s, ETA 30s",
        "scan: done in 12s, 120 documents, 30.0 MB read (2.5 MB/s)",
    ]


def test_progress_moves_while_one_big_file_is_read(tmp_path, caplog):
    # 3.5 MB in one JSONL file: the readers pull it a MiB at a time, and each read counts.
    root = write_corpus(tmp_path / "c", {"big.jsonl": "\n".join(['{"text": "' + "x" * 999 + '"}'] * 3500)})
    files = list_files([str(root)])
    now = [0.0]

    def clock() -> float:
        now[0] += 1.0
        return now[0]

    progress = PassProgress("scan", sum(f.size for f in files), interval_s=1, clock=clock)
    with caplog.at_level(logging.INFO, logger="data_prep.console"):
        docs = list(iter_documents(progress.files(files), "text", 10_000, Skips()))
    assert len(docs) == 3500
    read = [float(m.group(3)) for m in map(PROGRESS.match, (r.getMessage() for r in caplog.records)) if m]
    total = files[0].size / 1e6
    assert any(0 < mb < total for mb in read), read  # a line while the file was half read
    assert progress.bytes_done == files[0].size


@pytest.mark.slow
def test_training_prints_what_it_trains_then_a_step_line_every_log_every_steps(tiny_dataset, tmp_path, capfd):
    cfg = TrainConfig(steps=12, log_every=5, micro_batch_size=4, global_batch_size=4, warmup_steps=2, checkpoint_every=12)
    launch(train, 1, fresh_copy(tiny_dataset, tmp_path / "store"), tiny_model(), ParallelConfig(tensor_parallel=1), cfg)
    out = capfd.readouterr().out
    steps = [int(s) for s in re.findall(r"^step\s+(\d+)/12 \| loss \d", out, re.MULTILINE)]
    assert steps == [1, 5, 10, 12], out[-3000:]
    # Issue 51: before step 1, what trains (its size and cost per token); each line, the step's peak memory;
    # the held-out points under a name of their own (not the evaluation's val_loss), with their batches.
    model = tiny_model()
    (started,) = re.findall(r"^model: (.*)$", out, re.MULTILINE)
    n = non_embedding_params(model)
    assert f"({_si(n)} non-embedding)" in started, started
    assert f"{_si(flops_per_token(n, model.num_layers, model.hidden_size, 32))}FLOPs per token" in started, started
    assert started.endswith("128 tokens per step on 1 rank (cpu, float32)"), started
    assert out.index("model: ") < out.index("step     1/12")
    assert all(re.search(r" \| mem [\d,]+ MiB", line) for line in re.findall(r"^step .*$", out, re.MULTILINE)), out
    assert "val_loss" not in out
