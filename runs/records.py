"""The JSONL files a run leaves in the store (``metrics.jsonl``, ``step_times.jsonl``, ``health.jsonl``): how
they are written and read. Torch-free: the training loop writes them (``training.runlog``), ``pretrain runs``,
the reports and the tracking mirror read them (``runs.view``)."""

from __future__ import annotations

import json

from storage import Store


def jsonl(records: list[dict]) -> bytes:
    return "".join(json.dumps(r) + "\n" for r in records).encode()


def read_jsonl(store: Store, key: str) -> list[dict]:
    """The records of a JSONL file, [] if it does not exist (a run that never saved)."""
    if not store.exists(key):
        return []
    return [json.loads(line) for line in store.get_bytes(key, "log").decode().splitlines() if line.strip()]


def row_ranges(rows: list[int], shown: int) -> str:
    """A health event's batch rows (sorted row indices) as '3, 7-9, 12' (the rows are shuffled, so rarely
    consecutive); after ``shown`` runs, '… (N rows)'."""
    runs: list[list[int]] = []
    for row in rows:
        if runs and row <= runs[-1][1] + 1:  # a repeat (an epoch boundary inside the batch) or the next row
            runs[-1][1] = max(runs[-1][1], row)
        else:
            runs.append([row, row])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in runs[:shown])
    return text + (f", … ({len(rows)} rows)" if len(runs) > shown else "")
