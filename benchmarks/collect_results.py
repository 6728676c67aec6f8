"""Gather the last JSON line of each step of ``gpu_checks.sh`` into one results file.

    python benchmarks/collect_results.py OUT_DIR [--results benchmarks/results] [--dry-run]

Reads ``OUT_DIR/steps.tsv`` (name, exit status, seconds per step), each ``OUT_DIR/<name>.log``
and ``OUT_DIR/device.txt`` (nvidia-smi's line), and writes ``<results>/<device>-<date>.json``
and a copy in OUT_DIR. A step whose log ends without a JSON object is recorded with its exit
status and last lines: a failed check is a result too. ``headline`` gathers the figures issue 52 asks
for, per training shape: ``ours_vs_plain_compiled`` and ``fp8_vs_bf16`` (medians, with their
[min, max] over the repeats), tokens/s of ours, ours in FP8 and the plain compiled model, and each
one's step peak memory (GiB), so that a closing note quotes one place.

``--dry-run`` (``gpu_checks.sh --dry-run``): the record says so (``dry_run``), it is named
``cpu-dry-run-<date>.json`` and written to OUT_DIR only: ``--results`` defaults to OUT_DIR and may
not be benchmarks/results, since a CPU dry run's figures mean nothing and must never be quoted.
"""

from __future__ import annotations

import argparse
import datetime
import json
import re
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def last_json(log: str) -> dict | None:
    """The last line of ``log`` that parses as a JSON object."""
    for line in reversed(log.splitlines()):
        line = line.strip()
        if line.startswith("{"):
            try:
                value = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(value, dict):
                return value
    return None


def device_slug(nvidia_smi_line: str) -> str:
    """``"NVIDIA H200, 143771 MiB, …"`` → ``"nvidia-h200"``; no line → ``"no-gpu"``."""
    name = nvidia_smi_line.split(",")[0].strip().lower()
    return re.sub(r"[^a-z0-9]+", "-", name).strip("-") or "no-gpu"


DRY_RUN = "gpu_checks.sh --dry-run: every step on CPU at tiny shapes; its figures mean nothing"


HEADLINE_RATIOS = ("ours_vs_plain_compiled", "fp8_vs_bf16")
HEADLINE_VARIANTS = ("ours", "ours_fp8", "plain_compiled")


def headline(steps: dict) -> dict:
    """Per bench_train step: the goal's ratios with their spread, and tokens/s and step peak memory per variant."""
    out = {}
    for name, entry in steps.items():
        result = entry.get("result") or {}
        if not name.startswith("bench_train") or "ratios" not in result:
            continue
        spread = result.get("spread", {})
        ratios = {k: {"median": result["ratios"][k], "spread": spread[k]} for k in HEADLINE_RATIOS if k in spread}
        variants = {
            v: {k: result[v][k] for k in ("tokens_per_s", "mfu", "step_peak_gib") if k in result[v]}
            for v in HEADLINE_VARIANTS
            if v in result
        }
        out[name] = {"size": result.get("size"), "ratios": ratios, "variants": variants, "memory": result.get("memory")}
    return out


def collect(out: Path) -> dict:
    device_file = out / "device.txt"
    device = device_file.read_text().strip().splitlines()[0] if device_file.exists() and device_file.read_text().strip() else ""
    steps = {}
    for row in (out / "steps.tsv").read_text().splitlines():
        name, status, seconds = row.split("\t")
        log_file = out / f"{name}.log"
        log = log_file.read_text(errors="replace") if log_file.exists() else ""
        result = last_json(log)
        steps[name] = {"exit": int(status), "seconds": int(seconds), "result": result}
        if result is None:
            steps[name]["log_tail"] = log.splitlines()[-10:]
    return {"device": device, "date": datetime.date.today().isoformat(), "headline": headline(steps), "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--results", type=Path, help="folder of the results file (default: benchmarks/results; dry run: OUT)")
    parser.add_argument("--dry-run", action="store_true", help="a CPU dry run's logs: marked as such, written to OUT only")
    args = parser.parse_args()
    results: Path = args.results or (args.out if args.dry_run else RESULTS)
    if args.dry_run and results.resolve() == RESULTS.resolve():
        parser.error(f"--dry-run writes to OUT only, not {RESULTS}: its figures must never be quoted")
    record = collect(args.out)
    name = f"{device_slug(record['device'])}-{record['date']}.json"
    if args.dry_run:
        record = {"dry_run": DRY_RUN, **record}
        name = f"cpu-dry-run-{record['date']}.json"  # whatever device.txt says: never a device's name
    text = json.dumps(record, indent=1) + "\n"
    results.mkdir(parents=True, exist_ok=True)
    for folder in {results.resolve(), args.out.resolve()}:  # once where the two are the same folder
        (folder / name).write_text(text)
    failed = [step for step, entry in record["steps"].items() if entry["exit"] != 0]
    print(f"results: {results / name}" + (f" (failed: {', '.join(failed)})" if failed else ""))
    print(json.dumps({"results": str(results / name), "dry_run": args.dry_run, "failed": failed}))


if __name__ == "__main__":
    main()
