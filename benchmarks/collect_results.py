"""Gather the last JSON line of each step of ``gpu_checks.sh`` into one results file.

    python benchmarks/collect_results.py OUT_DIR [--results benchmarks/results]

Reads ``OUT_DIR/steps.tsv`` (name, exit status, seconds per step), each ``OUT_DIR/<name>.log``
and ``OUT_DIR/device.txt`` (nvidia-smi's line), and writes ``<results>/<device>-<date>.json``
and a copy in OUT_DIR. A step whose log ends without a JSON object is recorded with its exit
status and last lines: a failed check is a result too.
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
    return {"device": device, "date": datetime.date.today().isoformat(), "steps": steps}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    record = collect(args.out)
    name = f"{device_slug(record['device'])}-{record['date']}.json"
    text = json.dumps(record, indent=1) + "\n"
    args.results.mkdir(parents=True, exist_ok=True)
    for folder in (args.results, args.out):
        (folder / name).write_text(text)
    failed = [step for step, entry in record["steps"].items() if entry["exit"] != 0]
    print(f"results: {args.results / name}" + (f" (failed: {', '.join(failed)})" if failed else ""))
    print(json.dumps({"results": str(args.results / name), "failed": failed}))


if __name__ == "__main__":
    main()
