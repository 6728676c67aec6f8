"""Encoding an imported model's tokenizer per core: the encoder data prep chooses for it
(``data_prep.encoder.make_encoder``) against HF ``encode_batch_fast`` (its fastest call: no offsets), for every
family ``hf_interop.tiny`` builds.

    python benchmarks/bench_imported_tokenizers.py [--files 157] [--vocab 640] [--repeats 3]

The tokenizers are the tiny checkpoints' own (``hf_interop.tiny.tokenizer_for(family, sample_texts())``: each
family's real configuration, trained on the demo corpus' 60 files at ``--vocab`` tokens, as ``build_tiny``
makes them): Llama 3 (Split on its pattern + ByteLevel, ``<|begin_of_text|>`` prepended), Mistral
(Metaspace, byte fallback, ``<s>`` prepended), Qwen2 and Qwen3 (NFC, Split on Qwen's pattern + ByteLevel)
and SmolLM (GPT-2's ByteLevel).

The text is the demo corpus, extended: ``hf_interop.tiny.sample_texts(--files)``, the standard library's
top-level ``*.py`` files over 2,000 bytes in name order (157 files, all of them, by default; the demo takes
the first 60), whole, one document each; its folder, files and bytes are in the result (``corpus_*``).

Before anything is timed, the chosen encoder's ids are checked in this process against HF
``Tokenizer.encode_batch`` (the pipeline's reference, ``add_special_tokens=True``: the post-processor's BOS
included) on every document; a difference raises ``BenchmarkCheckError`` with the first one, and nothing is
timed. Per family, each repeat runs both candidates, in an order that rotates every repeat, each in a fresh
process of its own (``--child``: no cache survives from an earlier run), on one core: ``RAYON_NUM_THREADS=1``,
``FASTOKENS_BPE_THREADS=1`` (data_prep.encoder's ``THREADS_VARIABLE``), and the process pinned to one CPU
before its first import (``sched_setaffinity``; ``core`` in each run). The pinning is needed: fastokens
0.3.5, with those two variables set, still keeps a second thread busy whenever the process may use two
cores (CPU over wall seconds 1.0-2.0 on this 2-core VM; one thread and 1.0 pinned) for the same wall time
pinned or not (33-39 ms on this corpus, 2026-12-06): the figure is a per-core one either way, and pinned
it also reads as one. The encoder is built
from the tokenizer.json string and called once on ``["a"]`` outside the timed part:

* ``ours``: ``make_encoder(tokenizer).encode_batch(texts)`` (``encoder_<family>`` names the class it chose:
  ``FastokensEncoder`` where the rule admits the configuration, ``HFEncoder`` otherwise, whose ratio is then
  HF against itself, about 1);
* ``hf``: ``Tokenizer.encode_batch_fast(texts)``, ``.ids`` (the same ids as ``encode_batch``, without offsets).

The ids of every timed run are checked again (``BenchmarkCheckError`` on a difference). A candidate that kept
more than one core busy (CPU over wall seconds of its timed calls, all families and repeats together, above 1.1:
``<candidate>_cpu_per_wall``; per family, ``_<family>`` and the most in one run, ``_max_<family>``) is refused.

The last line is one JSON object. Per family: ``<candidate>_mb_s_<family>`` (median MB/s) and ``_spread``
([min, max]), ``tokens_<family>``, ``<candidate>_cpu_per_wall_<family>``; ``ratios`` / ``spread``:
``<family>_vs_hf`` (ours' MB/s over HF's in the same repeat; > 1: ours faster), median and [min, max].
"""

from __future__ import annotations

import os
import sys

if sys.argv[1:2] == ["--child"]:
    # One CPU for the whole child, before any import starts a thread (numpy's BLAS, Rayon, fastokens): every
    # thread inherits it.
    os.sched_setaffinity(0, {max(os.sched_getaffinity(0))})

import argparse
import json
import statistics
import subprocess
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
from machine_info import machine, ratio_keys, require, spread  # benchmarks/ (the script's folder)

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def thread_env() -> dict[str, str]:
    """One core per candidate, in each child's environment (this process, computing the reference ids, uses all):
    Rayon (HF, fastokens) reads RAYON_NUM_THREADS; fastokens also starts a BPE thread of its own unless
    ``data_prep.encoder.THREADS_VARIABLE`` is 1."""
    from data_prep.encoder import THREADS_VARIABLE

    return {"RAYON_NUM_THREADS": "1", THREADS_VARIABLE: "1"}


# CPU seconds over wall seconds of a candidate's timed calls above which it used more than one core.
MAX_CPU_PER_WALL = 1.1
CANDIDATES = ["ours", "hf"]
# Every top-level standard-library file over 2,000 bytes on Python 3.11 (sample_texts takes what there is).
FILES = 157


# --- in a fresh process -----------------------------------------------------------------
def child(candidate: str, spec_path: str, texts_path: str, out_path: str) -> dict:
    """One timed encode, pinned to one core: build outside the timed part, encode, the ids saved for the parent
    to check."""
    (cpu_id,) = os.sched_getaffinity(0)  # pinned at the top of the script
    from tokenizers import Tokenizer

    spec, texts = Path(spec_path).read_text(), json.loads(Path(texts_path).read_text())
    start = time.perf_counter()
    if candidate == "ours":
        from data_prep.encoder import make_encoder

        encoder = make_encoder(Tokenizer.from_str(spec))
        encoder_name = type(encoder).__name__

        def encode(batch: list[str]) -> list[np.ndarray]:
            return encoder.encode_batch(batch)
    else:
        require(candidate == "hf", f"unknown candidate {candidate!r}")
        hf, encoder_name = Tokenizer.from_str(spec), "Tokenizer.encode_batch_fast"

        def encode(batch: list[str]) -> list[list[int]]:
            return [e.ids for e in hf.encode_batch_fast(batch)]

    encode(["a"])
    build_s = time.perf_counter() - start
    cpu, start = time.process_time(), time.perf_counter()
    out = encode(texts)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    docs = [np.asarray(ids, dtype=np.int64) for ids in out]
    lengths = np.array([len(d) for d in docs], dtype=np.int64)
    np.savez(out_path, ids=np.concatenate(docs) if docs else np.zeros(0, np.int64), lengths=lengths)
    threads = len(os.listdir("/proc/self/task"))
    return {"seconds": seconds, "cpu": cpu, "build_s": build_s, "encoder": encoder_name, "threads": threads, "core": cpu_id}


def run_child(candidate: str, spec_path: Path, texts_path: Path, out_path: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))) | thread_env()
    args = [sys.executable, __file__, "--child", candidate, str(spec_path), str(texts_path), str(out_path)]
    proc = subprocess.run(args, capture_output=True, env=env, text=True)
    tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
    require(proc.returncode == 0, f"{candidate} failed (exit code {proc.returncode}): {tail}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


# --- the benchmark ----------------------------------------------------------------------
def first_difference(got: list[np.ndarray], want: list[np.ndarray], tokenizer) -> str:
    for i, (a, b) in enumerate(zip(got, want, strict=True)):
        if not np.array_equal(a, b):
            a, b = a.tolist(), b.tolist()
            at = next((j for j, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
            pieces = [[tokenizer.id_to_token(t) for t in ids[at : at + 4]] for ids in (a, b)]
            return f"document {i}, token {at}: {pieces[0]} vs HF {pieces[1]}"
    return ""


def check(got: list[np.ndarray], want: list[np.ndarray], tokenizer, what: str) -> None:
    """Not an assert (python -O): a wrong encoder gets no figure."""
    require(len(got) == len(want), f"{what} returned {len(got)} documents for {len(want)}")
    same = sum(np.array_equal(a, b) for a, b in zip(got, want, strict=True))
    require(
        same == len(want),
        f"{what}: ids differ from HF encode_batch on {len(want) - same} of {len(want)} documents, "
        f"first at {first_difference(got, want, tokenizer)}",
    )


def _documents(path: Path) -> list[np.ndarray]:
    with np.load(path) as saved:
        ids, lengths = saved["ids"], saved["lengths"]
    return np.split(ids, np.cumsum(lengths)[:-1]) if len(lengths) else []


def family_runs(family: str, tokenizer, texts: list[str], repeats: int, tmp: Path) -> tuple[dict[str, list[dict]], int]:
    """The untimed check of the chosen encoder, then ``repeats`` rounds of both candidates, each in a fresh
    process, in an order that rotates every round; every run's ids checked."""
    from data_prep.encoder import make_encoder

    want = [np.asarray(e.ids, dtype=np.int64) for e in tokenizer.encode_batch(texts)]
    check([np.asarray(a, np.int64) for a in make_encoder(tokenizer).encode_batch(texts)], want, tokenizer, f"ours on {family}")
    spec_path, texts_path = tmp / f"{family}.json", tmp / "texts.json"
    spec_path.write_text(tokenizer.to_str())
    runs: dict[str, list[dict]] = {c: [] for c in CANDIDATES}
    for r in range(repeats):
        for candidate in CANDIDATES[r % len(CANDIDATES) :] + CANDIDATES[: r % len(CANDIDATES)]:
            out_path = tmp / f"ids-{candidate}.npz"
            out = run_child(candidate, spec_path, texts_path, out_path)
            check(_documents(out_path), want, tokenizer, f"{candidate} on {family}, repeat {r}")
            out_path.unlink()
            runs[candidate].append(out)
    return runs, int(sum(map(len, want)))


def summary(all_runs: dict[str, dict], mb: float) -> tuple[dict, dict[str, list[float]]]:
    """Per family and candidate: MB/s (median, [min, max]), build seconds, cores busy; per-repeat ratios."""
    result: dict = {}
    ratios: dict[str, list[float]] = {}
    for family, runs in all_runs.items():
        result[f"encoder_{family}"] = runs["ours"][0]["encoder"]
        require(len({o["encoder"] for o in runs["ours"]}) == 1, f"make_encoder chose differently across runs on {family}")
        for candidate in CANDIDATES:
            outs = runs[candidate]
            s = spread([mb / o["seconds"] for o in outs])
            result[f"{candidate}_mb_s_{family}"] = round(s["median"], 2)
            result[f"{candidate}_mb_s_{family}_spread"] = [round(s["min"], 2), round(s["max"], 2)]
            result[f"{candidate}_build_s_{family}"] = round(statistics.median(o["build_s"] for o in outs), 3)
            result[f"{candidate}_cpu_per_wall_{family}"] = round(_cpu_per_wall(outs), 2)
            result[f"{candidate}_cpu_per_wall_max_{family}"] = round(max(o["cpu"] / o["seconds"] for o in outs), 2)
            result[f"{candidate}_threads_max_{family}"] = max(o["threads"] for o in outs)
        ratios[f"{family}_vs_hf"] = [h["seconds"] / o["seconds"] for o, h in zip(runs["ours"], runs["hf"], strict=True)]
    for candidate in CANDIDATES:
        cpu_per_wall = _cpu_per_wall([o for runs in all_runs.values() for o in runs[candidate]])
        result[f"{candidate}_cpu_per_wall"] = round(cpu_per_wall, 2)
        require(cpu_per_wall <= MAX_CPU_PER_WALL, f"{candidate} kept {cpu_per_wall:.2f} cores busy: not a per-core figure")
    return result, ratios


def _cpu_per_wall(outs: list[dict]) -> float:
    """CPU seconds of all threads over wall seconds of these timed calls together (1.0: one busy core)."""
    return sum(o["cpu"] for o in outs) / sum(o["seconds"] for o in outs)


def main() -> None:
    from hf_interop.tiny import FAMILIES, sample_texts, tokenizer_for

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=FILES, help="standard-library files to encode (sample_texts)")
    parser.add_argument("--vocab", type=int, default=640, help="tokens of each family's tokenizer (tiny's: 640)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--families", nargs="+", choices=FAMILIES, default=list(FAMILIES))
    args = parser.parse_args()
    require(args.repeats >= 3, "--repeats must be at least 3: a spread needs repeats")
    started, load_start = time.perf_counter(), os.getloadavg()[0]
    texts, demo = sample_texts(args.files), sample_texts()
    mb = sum(len(t.encode("utf-8")) for t in texts) / 1e6
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in stdlib.glob("*.py") if p.stat().st_size > 2000)[: args.files]
    require(len(files) == len(texts), f"sample_texts gave {len(texts)} files, the listing here {len(files)}: say which")
    result: dict = {
        "corpus": f"hf_interop.tiny.sample_texts({args.files}): top-level *.py files over 2000 bytes of {stdlib}, "
        "in name order, whole, one document each",
        "corpus_files": len(texts),
        "corpus_first_file": files[0].name,
        "corpus_last_file": files[-1].name,
        "corpus_bytes": sum(len(t.encode("utf-8")) for t in texts),
        "corpus_mb": round(mb, 3),
        "tokenizer_training": f"hf_interop.tiny.tokenizer_for(family, sample_texts()): {len(demo)} files, vocab {args.vocab}",
    }
    all_runs: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="bench-imported-tokenizers-") as tmp:
        (Path(tmp) / "texts.json").write_text(json.dumps(texts))
        for family in args.families:
            tokenizer, _ = tokenizer_for(family, demo, vocab=args.vocab)
            all_runs[family], result[f"tokens_{family}"] = family_runs(family, tokenizer, texts, args.repeats, Path(tmp))
    encoded, ratios = summary(all_runs, mb)
    result |= encoded
    result["identical_ids"] = True  # every run of every family: checked in family_runs (raises otherwise)
    result |= {
        "repeats": args.repeats,
        "cpu_count": os.cpu_count(),
        "seconds": round(time.perf_counter() - started),
        # How busy the machine was (1-minute load average): other jobs slow every run.
        "load_average_start": round(load_start, 2),
        "load_average_end": round(os.getloadavg()[0], 2),
    }
    result |= ratio_keys(ratios)
    result["machine"] = machine(["tokenizers", "fastokens", "numpy"], **{k.lower(): v for k, v in thread_env().items()})
    print(f"{'family':<8} {'encoder':<17} {'ours MB/s':>10} {'HF MB/s':>9} {'ratio [min, max]':>22}")
    for family in all_runs:
        lo, hi = result["spread"][f"{family}_vs_hf"]
        print(
            f"{family:<8} {result[f'encoder_{family}']:<17} {result[f'ours_mb_s_{family}']:>10.2f} "
            f"{result[f'hf_mb_s_{family}']:>9.2f} {result['ratios'][f'{family}_vs_hf']:>7.2f} [{lo:.2f}, {hi:.2f}]"
        )
    print(json.dumps(result))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(*sys.argv[2:6])))
    else:
        main()
