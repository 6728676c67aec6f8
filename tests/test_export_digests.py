"""The baseline's Hugging Face export is checked against the digests its evaluation recorded before
lm-eval reads it (issue 32 item 10): lm-eval loads whatever the entry's ``hf/`` holds."""

from __future__ import annotations

import hashlib

import pytest

from common.digests import IntegrityError
from evaluation.evaluate import baseline_export

ENTRY = "models/gpt/1"
FILES = {"config.json": b'{"model_type": "llama"}', "model.safetensors": b"tensors"}


def registered(store, digests: dict[str, str] | None = None) -> None:
    for rel, data in FILES.items():
        store.put_bytes(f"{ENTRY}/hf/{rel}", data)
    recorded = {rel: hashlib.sha256(data).hexdigest() for rel, data in FILES.items()} if digests is None else digests
    store.put_json(f"{ENTRY}/evaluation.json", {"val_loss": 3.0, "export_digests": recorded})


def test_the_baseline_export_is_read_only_as_recorded(store, tmp_path, capsys):
    registered(store)
    folder = baseline_export(store, ENTRY, tmp_path / "ok")
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == FILES  # control: the recorded bytes pass

    store.put_bytes(f"{ENTRY}/hf/model.safetensors", b"swapped")  # what a writer of the bucket could do
    with pytest.raises(IntegrityError, match=r"model\.safetensors has sha256 \w+, export_digests of evaluation\.json records"):
        baseline_export(store, ENTRY, tmp_path / "swapped")
    store.put_bytes(f"{ENTRY}/hf/model.safetensors", FILES["model.safetensors"])
    store.put_bytes(f"{ENTRY}/hf/modeling_gpt.py", b"import os; os.system('id')")  # code lm-eval could be told to run
    with pytest.raises(IntegrityError, match=r"modeling_gpt\.py is not listed"):
        baseline_export(store, ENTRY, tmp_path / "added")


def test_an_entry_without_digests_or_export_is_not_scored(store, tmp_path, capsys):
    registered(store, digests={})
    assert baseline_export(store, ENTRY, tmp_path / "old") is None
    assert "has no recorded digests (registered by an older release): not scored" in capsys.readouterr().out
    assert not (tmp_path / "old").exists()  # not even downloaded
    assert baseline_export(store, "models/gpt/2", tmp_path / "none") is None  # registered before exports
