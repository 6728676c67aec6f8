"""What the prepare step tells a person on the console: a pass's progress and what it skipped.

Everything goes through ``logging`` at INFO (a problem input's reason at WARNING), so that a
Flyte task, the CLI and a test see the same lines. Progress is time-based, at most one line
every ``PROGRESS_INTERVAL_S`` seconds and a last one when the pass ends, so a pass over a big
corpus prints tens of lines, not thousands. Skipped inputs are summarised once, one line per
reason with a few example names, never one line per file.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import replace
from typing import BinaryIO

from data_prep.formats import COMPRESSIONS, JSONL_SUFFIXES, PARQUET_SUFFIXES, TEXT_SUFFIXES
from data_prep.readers import Skips
from data_prep.sources import HIDDEN, RawFile

log = logging.getLogger(__name__)

PROGRESS_INTERVAL_S = 5.0
"""Seconds between two progress lines of a pass (read when a pass starts: a test may lower it)."""
MB = 1e6
EXAMPLES_SHOWN = 3
SUFFIXES_SHOWN = 5
_HIDDEN = "hidden files or folders"

# What each skip reason means, and where it is the user's to change, the setting to change.
REASONS = {
    "empty": "empty after cleaning",
    "too_short": "shorter than data.min_chars after cleaning",
    "too_long": "longer than data.max_chars",
    "duplicate": "exact duplicates of an earlier document",
    "near_duplicate": "near-duplicates of an earlier document, data.near_dedup",
    "not_utf8": "not UTF-8 text",
    "binary": "NUL bytes near the start: not text",
    "bad_gzip": "truncated or corrupt gzip",
    "bad_zstd": "truncated or corrupt zstd",
    "bad_jsonl_record": "JSONL lines that are not JSON",
    "jsonl_missing_text_field": "JSONL records without a string data.text_field",
    "parquet_missing_text_field": "Parquet files without the data.text_field column",
    "parquet_text_not_string": "Parquet files whose data.text_field column is not a string",
    "parquet_null_text": "Parquet rows with a null text",
    "bad_parquet": "unreadable or corrupt Parquet",
    "symlink_loop": "symlinks that lead back to a folder above them",
    "symlink_outside": "symlinks that lead out of their source (data.follow_symlinks: true follows them)",
    "broken_link": "symlinks to nothing",
    "not_a_regular_file": "not regular files (FIFOs, sockets, devices)",
    "unreadable": "unreadable (permissions, or gone since the listing)",
    "changed_since_listing": "replaced since the listing, by a link or another file (not read)",
    "unsupported_format": "formats that cannot be read",
}


# --- progress ---------------------------------------------------------------------------------
def _duration(seconds: float) -> str:
    """'45s', '3m20s', '1h05m': short enough for a progress line."""
    seconds = max(0, round(seconds))
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m{seconds % 60:02d}s"
    return f"{seconds // 3600}h{seconds % 3600 // 60:02d}m"


class PassProgress:
    """One pass over the listed files: documents done, bytes read of the listing's total, the rate
    and the time left. Bytes are counted as the readers pull them (a 10 GB JSONL file moves the
    line while it is read), compressed bytes for a compressed file, as the listing's sizes are."""

    def __init__(self, name: str, total_bytes: int, interval_s: float | None = None, clock: Callable[[], float] = time.monotonic):
        self.name = name
        self.total_bytes = total_bytes
        self.interval_s = PROGRESS_INTERVAL_S if interval_s is None else interval_s
        self.clock = clock
        self.documents = 0
        self._files_bytes = 0  # sizes of the files read to the end
        self._current = 0  # bytes read of the file being read
        self._current_size: int | None = None  # None: bytes read outside ``files`` (no listed size to cap them)
        self._started = clock()
        self._last_line = self._started

    @property
    def bytes_done(self) -> int:
        # A file can grow between the listing and the read: never count past its listed size.
        if self._current_size is None:
            return self._files_bytes + self._current
        return self._files_bytes + min(self._current, self._current_size)

    def files(self, files: Iterable[RawFile]) -> Iterator[RawFile]:
        """The files, each opened through a byte counter; a file counts in full once the next is asked for."""
        for f in files:
            self._current, self._current_size = 0, f.size
            yield replace(f, open=lambda f=f: _Counted(f.open(), self))
            self._files_bytes += f.size
            self._current, self._current_size = 0, None
            self.tick()

    def read(self, n: int) -> None:
        self._current += n
        self.tick()

    def add_documents(self, n: int) -> None:
        self.documents += n
        self.tick()

    def tick(self) -> None:
        """Log a progress line if the interval has passed since the last one."""
        now = self.clock()
        if now - self._last_line >= self.interval_s:
            self._last_line = now
            log.info("%s", self.line(now))

    def line(self, now: float) -> str:
        elapsed = max(now - self._started, 1e-9)
        done = self.bytes_done
        rate = done / elapsed
        share = f" ({done / self.total_bytes:.0%})" if self.total_bytes else ""
        eta = _duration((self.total_bytes - done) / rate) if rate > 0 and self.total_bytes >= done else "unknown"
        return (
            f"{self.name}: {self.documents:,} documents, {done / MB:,.1f} of {self.total_bytes / MB:,.1f} MB{share}, "
            f"{rate / MB:,.1f} MB/s, ETA {eta}"
        )

    def finish(self) -> None:
        """The pass's last line, whatever the interval."""
        elapsed = max(self.clock() - self._started, 1e-9)
        done = self.bytes_done
        log.info(
            "%s: done in %s, %s documents, %s MB read (%s MB/s)",
            self.name,
            _duration(elapsed),
            f"{self.documents:,}",
            f"{done / MB:,.1f}",
            f"{done / MB / elapsed:,.1f}",
        )


class _Counted:
    """A binary stream that tells a ``PassProgress`` how many bytes were read from it."""

    def __init__(self, stream: BinaryIO, progress: PassProgress) -> None:
        self._stream = stream
        self._progress = progress

    def read(self, size: int = -1) -> bytes:
        data = self._stream.read(size)
        self._progress.read(len(data))
        return data

    def close(self) -> None:
        self._stream.close()

    def __getattr__(self, name: str):
        # Everything else (name, mode, closed, readable...) is the stream's: gzip and zstd ask for some.
        return getattr(self._stream, name)

    def __enter__(self) -> _Counted:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# --- skipped inputs ---------------------------------------------------------------------------
def _examples(names: list[str], total: int) -> str:
    shown = names[:EXAMPLES_SHOWN]
    return ", ".join(shown) + (", …" if total > len(shown) else "")


def readable_suffixes() -> str:
    """The suffixes a folder's files are read for, as a person would write them."""
    compressed = "/".join(sorted(COMPRESSIONS))
    return f"{', '.join((*TEXT_SUFFIXES, *JSONL_SUFFIXES, *PARQUET_SUFFIXES))} (text and JSONL also {compressed}-compressed)"


def skip_summary(skips: Skips, ignored: Counter, name: Callable[[str], str] = str) -> list[tuple[int, str]]:
    """The summary's lines with their logging level: a header, then one line per reason (problems
    first, then filtering, then files ignored by suffix, then hidden ones), each with up to three
    example names (``name`` shortens them: the names inside the sources). ``ignored`` counts files
    by suffix and hidden ones under ``HIDDEN`` (an ``Ignored`` also keeps example names)."""
    counts, problems = skips.counts, skips.problems
    ignored_examples = getattr(ignored, "examples", {})
    hidden = ignored.get(HIDDEN, 0)
    by_suffix_counts = Counter({s: n for s, n in ignored.items() if s != HIDDEN})
    skipped, files_ignored = sum(counts.values()), sum(ignored.values())
    if not skipped and not files_ignored:
        return []
    lines: list[tuple[int, str]] = []
    parts = [f"skipped {skipped:,} inputs (files, records or documents)"] if skipped else []
    ignored_parts = [f"{n:,} {what}" for n, what in ((sum(by_suffix_counts.values()), "files by suffix"), (hidden, _HIDDEN)) if n]
    if ignored_parts:
        parts.append(f"ignored {' and '.join(ignored_parts)}")
    stats = ", ".join(name for name, n in (("skipped_<reason>", skipped), ("files_ignored", files_ignored)) if n)
    level = logging.WARNING if problems & set(counts) else logging.INFO
    lines.append((level, f"{' and '.join(parts)}, by reason (in the dataset's stats: {stats}):"))
    order = sorted(counts, key=lambda r: (r not in problems, -counts[r], r))
    for reason in order:
        what = REASONS.get(reason, reason.replace("_", " "))
        names = [name(n) for n in skips.examples.get(reason, [])]
        detail = f"; {skips.details[reason]}" if reason in skips.details else ""
        lines.append(
            (
                logging.WARNING if reason in problems else logging.INFO,
                f"  skipped {counts[reason]:,} × {reason} ({what}), e.g. {_examples(names, counts[reason])}{detail}",
            )
        )
    if by_suffix_counts:
        by_suffix, names = _by_suffix(by_suffix_counts, ignored_examples, name)
        if getattr(ignored, "sniffed_unlisted", False):
            why = (
                f"a folder's files are read for {readable_suffixes()}, and for other suffixes when they hold UTF-8 "
                "text (data.sniff_unlisted); these did not (binary, or another encoding: convert text to UTF-8)"
            )
        else:
            why = (
                f"a folder's files are read for {readable_suffixes()} only; set data.sniff_unlisted: true to read the "
                "ones holding UTF-8 text whatever their suffix, rename them, or name a file in data.sources"
            )
        n = sum(by_suffix_counts.values())
        lines.append((logging.INFO, f"  ignored {n:,} files by suffix ({by_suffix}), e.g. {names}: {why}"))
    if hidden:
        lines.append((logging.INFO, _hidden_line(hidden, [name(n) for n in ignored_examples.get(HIDDEN, [])])))
    return lines


def _hidden_line(hidden: int, names: list[str]) -> str:
    # Not the suffix advice: renaming or sniffing would not read these; only naming them does.
    return (
        f"  ignored {hidden:,} {_HIDDEN} (names starting with '.'), e.g. {_examples(names, hidden)}: "
        "name them in data.sources to read them"
    )


def _by_suffix(counts: Counter, examples: dict[str, list[str]], name: Callable[[str], str]) -> tuple[str, str]:
    """``.png ×3, .bin ×1`` (the most frequent suffixes) and example names, one per suffix first."""
    suffixes = sorted(counts, key=lambda s: (-counts[s], s))
    by_suffix = ", ".join(f"{s} ×{counts[s]:,}" for s in suffixes[:SUFFIXES_SHOWN])
    if len(suffixes) > SUFFIXES_SHOWN:
        by_suffix += f" and {len(suffixes) - SUFFIXES_SHOWN} more suffixes"
    names = [name(n) for s in suffixes for n in examples.get(s, [])[:1]]
    names += [name(n) for s in suffixes for n in examples.get(s, [])[1:]]
    return by_suffix, _examples(names, sum(counts.values()))


def sniffed_summary(ignored: Counter, name: Callable[[str], str] = str) -> str:
    """One line on the files with unlisted suffixes that sniffing read as text ('' for none)."""
    sniffed: Counter = getattr(ignored, "sniffed", Counter())
    if not sniffed:
        return ""
    by_suffix, names = _by_suffix(sniffed, getattr(ignored, "sniffed_examples", {}), name)
    return (
        f"read {sum(sniffed.values()):,} files with unlisted suffixes as text ({by_suffix}), e.g. {names}: "
        "their first 8 KB are UTF-8 text (data.sniff_unlisted: false leaves them out)"
    )


def log_skip_summary(lines: list[tuple[int, str]]) -> None:
    for level, line in lines:
        log.log(level, "%s", line)
