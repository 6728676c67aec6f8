import hashlib
import json
import shutil
from dataclasses import replace

import pytest

from cli.main import main as cli
from common.contracts import ModelCard
from common.digests import IntegrityError
from registry.aliases import set_alias
from registry.gate import gate_decision
from registry.names import RegistryError
from registry.registry import list_models, register, resolve, show
from storage import AlreadyCommitted, open_store
from tests.helpers import CKPT, DATASET, DATASET_VERSION, TOKENIZER_JSON, registry_inputs, report


@pytest.fixture
def populated(store):
    return registry_inputs(store)


def test_register_creates_immutable_versions_with_lineage(populated):
    store = populated
    first = register(store, "gpt", report(3.0))
    second = register(store, "gpt", report(2.5))
    assert (first.version, second.version) == (1, 2)
    entry = show(store, "gpt:1")
    card = entry.card
    assert card.metrics["val_loss"] == 3.0 and card.metrics["val_tokens"] == 100
    assert card.lineage.dataset_version == DATASET_VERSION
    assert card.lineage.tokenizer_sha256 == hashlib.sha256(TOKENIZER_JSON).hexdigest()
    assert card.lineage.checkpoint == CKPT and card.lineage.dataset == DATASET  # keys: a copied store still reads
    assert card.code.commit and card.layouts == report(3.0).checkpoint.layouts
    assert ModelCard.from_dict(store.get_json("models/gpt/1/card.json")) == card
    files = {uri.rsplit("models/gpt/1/", 1)[1] for uri in entry.files}
    assert {"card.json", "card.md", "tokenizer.json", "checkpoint/model/__0_0.distcp", "checkpoint/meta.json"} <= files
    assert not any("optim" in f for f in files)  # optimizer state stays with the run
    assert store.get_bytes("models/gpt/1/checkpoint/model/__0_0.distcp") == b"weights"
    with pytest.raises(AlreadyCommitted):
        store.commit("models/gpt/1")
    assert resolve(store, "gpt") == ("gpt", 2)  # latest


def test_uncommitted_version_is_invisible(populated):
    store = populated
    register(store, "gpt", report(3.0))
    store.put_json("models/gpt/2/card.json", {"half": "written"})  # a crashed registration
    assert [row["version"] for row in list_models(store)] == [1]
    with pytest.raises(RegistryError, match="does not exist"):
        show(store, "gpt:2")
    assert register(store, "gpt", report(2.0)).version == 3


def test_aliases(populated):
    store = populated
    register(store, "gpt", report(3.0))
    register(store, "gpt", report(2.0))
    set_alias(store, "gpt", "production", 1)
    assert resolve(store, "gpt:production") == ("gpt", 1)
    assert {r["version"]: r["aliases"] for r in list_models(store)} == {1: ["production"], 2: ["latest"]}
    with pytest.raises(RegistryError, match="no alias 'staging'"):
        resolve(store, "gpt:staging")


def test_uncommitted_checkpoint_is_refused(store):
    with pytest.raises(RegistryError, match="not committed"):
        register(store, "gpt", report(1.0, checkpoint="runs/x/checkpoints/step-0000001"))
    assert store.list("models") == []


def test_evaluation_outputs_join_the_entry(populated):
    store = populated
    evaluation = "runs/r1/eval/e1"
    with pytest.raises(RegistryError, match="not committed"):
        register(store, "gpt", report(3.0, outputs=evaluation))
    store.put_json(f"{evaluation}/results.json", {"val_loss": 3.0})
    store.put_bytes(f"{evaluation}/hf/model.safetensors", b"tensors")
    store.put_json(f"{evaluation}/hf/config.json", {"model_type": "llama"})
    store.commit(evaluation)
    written = {"model.safetensors": sha256(b"tensors"), "config.json": sha256(store.get_bytes(f"{evaluation}/hf/config.json"))}
    entry = register(store, "gpt", replace(report(3.0, outputs=evaluation), export_digests=written))
    assert entry.version == 1  # the refused attempt left no version behind
    assert store.get_json("models/gpt/1/evaluation.json") == {"val_loss": 3.0}
    assert store.get_bytes("models/gpt/1/hf/model.safetensors") == b"tensors"
    shown = show(store, "gpt:1")
    assert shown.card.hf_export == "hf" and shown.card.lineage.evaluation == evaluation
    assert shown.lineage_urls["evaluation"] == store.url(evaluation)
    assert 'from_pretrained("DEST/hf")' in store.get_bytes("models/gpt/1/card.md").decode()


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize("change", ["overwritten", "added", "removed", "no digests"])
def test_an_export_changed_after_its_evaluation_is_not_registered(populated, change):
    """Issue 32 item 10: registration copied ``hf/`` from the run's evaluation folder unchecked, and the
    train role can write there: weights swapped after the evaluation would have been registered (and
    loaded by ``from_pretrained``) under the evaluated figures. It copies only the bytes whose digests the
    evaluation report carries (the report comes from the evaluate task, not from the store)."""
    store = populated
    evaluation = "runs/r1/eval/e1"
    store.put_json(f"{evaluation}/results.json", {"val_loss": 3.0})
    store.put_bytes(f"{evaluation}/hf/model.safetensors", b"tensors")
    store.put_bytes(f"{evaluation}/hf/config.json", b"{}")
    written = {"model.safetensors": sha256(b"tensors"), "config.json": sha256(b"{}")}
    if change == "overwritten":
        store.put_bytes(f"{evaluation}/hf/model.safetensors", b"backdoored tensors")
        expected = r"model\.safetensors has sha256 \w+, the evaluation report's export_digests records \w+"
    elif change == "added":
        store.put_bytes(f"{evaluation}/hf/modeling_evil.py", b"import os")
        expected = r"modeling_evil\.py is not listed in the evaluation report's export_digests"
    elif change == "removed":
        written["tokenizer.json"] = sha256(b"{}")
        expected = r"tokenizer\.json is missing"
    else:
        written = {}
        expected = r"has no recorded digests"
    store.commit(evaluation)
    with pytest.raises(IntegrityError, match=expected) as refused:
        register(store, "gpt", replace(report(3.0, outputs=evaluation), export_digests=written))
    assert store.url(f"{evaluation}/hf") in str(refused.value)
    assert store.list("models/gpt/1/") == ["models/gpt/1/_CLAIMED"], store.list("models/")  # no file copied, nothing committed


def test_a_spec_that_names_nothing_says_what_there_is(populated):
    """Issue 33: ``registry show gpt-tny`` said "model 'gpt-tny' has no alias 'latest'"."""
    store = populated
    register(store, "gpt-tiny", report(3.0), gate_alias="production")
    with pytest.raises(RegistryError, match=r"^no model 'gpt-tny' in .* \(did you mean gpt-tiny\?\); models: gpt-tiny$"):
        resolve(store, "gpt-tny")
    aliases = r"its aliases: latest, production$"
    with pytest.raises(RegistryError, match=r"has no alias 'prod' in .* \(did you mean production\?\); " + aliases):
        resolve(store, "gpt-tiny:prod")
    with pytest.raises(RegistryError, match=r"^model gpt-tiny:7 does not exist in .*; its versions: 1$"):
        resolve(store, "gpt-tiny:7")
    with pytest.raises(RegistryError, match=r"^no model 'other' in .*; models: gpt-tiny$"):  # nothing close: no guess
        resolve(store, "other")


def test_cli_list_is_a_table_and_show_prints_counts_as_integers(populated, capsys):
    store = populated
    counted = report(3.0)  # the training summary's counts are floats, as its Flyte type says
    summary = {"parameters": 1901696.0, "world_size": 2.0, "mfu": 0.25, "steps_trained": 10.0, "tokens_trained": 81920.0}
    cooled = "runs/r0/checkpoints/step-0000008"  # a WSD cooldown's starting checkpoint (docs/recipe.md)
    register(store, "gpt", replace(counted, checkpoint=replace(counted.checkpoint, summary=summary, cooled_from=cooled)))
    register(store, "gpt-longer-name", report(2.5), run_name="gpt-longer-name on corpus lr=0.001")  # issue 51
    assert cli(["registry", "list", "--store", store.uri]) == 0
    header, *lines = capsys.readouterr().out.splitlines()
    assert header.split() == ["MODEL", "ALIASES", "REGISTERED", "VAL_LOSS", "RUN", "NAME", "WHERE"]
    assert len(lines) == 2 and {line.index(store.url("models")) for line in lines} == {header.index("WHERE")}  # aligned
    assert lines[0].split()[:2] == ["gpt:1", "latest"] and lines[0].split()[3] == "3.0000"
    assert lines[0][header.index("RUN NAME") :].startswith("- ")  # a card of before: no name recorded
    assert lines[1][header.index("RUN NAME") :].startswith("gpt-longer-name on corpus lr=0.001 ")
    assert cli(["registry", "show", "gpt-longer-name:1", "--store", store.uri]) == 0
    assert "\nrun name: gpt-longer-name on corpus lr=0.001\n" in capsys.readouterr().out
    assert cli(["registry", "show", "gpt:1", "--store", store.uri]) == 0
    shown = {line.split()[0]: line.split()[1:] for line in capsys.readouterr().out.splitlines() if line.startswith("  ")}
    assert shown["parameters"] == ["1,901,696"] and shown["world_size"] == ["2"] and shown["mfu"] == ["0.2500"]
    assert shown["val_tokens"] == ["100"] and shown["training_steps"] == ["10"] and shown["val_loss"] == ["3.0000"]
    assert shown["base_model"] == ["-"]  # an empty lineage value is a dash, not a blank
    assert shown["steps_trained"] == ["10"] and shown["tokens_trained"] == ["81,920"]  # the budget both ways
    assert shown["cooldown_from"] == [cooled]  # the card names where the cooldown started


def test_cli_download_says_what_it_resolved_and_how_to_use_it(populated, capsys, tmp_path):
    store = populated
    register(store, "gpt", report(3.0))
    assert cli(["registry", "download", "gpt", str(tmp_path / "dest"), "--store", store.uri]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == f"gpt is gpt:1; gpt:1 downloaded to {tmp_path / 'dest'}: card.json, card.md, checkpoint, tokenizer.json"
    assert lines[1:] == ["  continue pretraining from it: pretrain run --set train.init_from=gpt:1"]  # no hf/: no transformers


def test_cli_list_and_show(populated, capsys):
    store = populated
    register(store, "gpt", report(3.0))
    assert cli(["registry", "list", "--json", "--store", store.uri]) == 0
    rows = json.loads(capsys.readouterr().out)
    assert rows[0]["name"] == "gpt" and rows[0]["aliases"] == ["latest"]
    assert cli(["registry", "show", "gpt:1", "--store", store.uri]) == 0
    out = capsys.readouterr().out
    assert "gpt:1" in out and "val_loss" in out and "dataset_version" in out
    assert cli(["registry", "show", "gpt:9", "--store", store.uri]) == 2
    assert capsys.readouterr().err.startswith("error: model gpt:9 does not exist")


def test_a_copied_store_reads_its_lineage_inside_the_copy(tmp_path, capsys):
    """Issue 33 item 4: a card's lineage held absolute URLs (``/old/path/runs/...``), so a copied or moved store
    named the original's files. It holds keys now; a card of before, its URLs of the store it was registered
    in, is read as keys too. Shown in the copy, with the original gone, everything resolves inside the copy."""
    original = registry_inputs(open_store(str(tmp_path / "original")))
    evaluations = {1: "runs/r1/eval/e1", 2: "runs/r1/eval/e2"}
    for version, evaluation in evaluations.items():
        original.put_json(f"{evaluation}/results.json", {"val_loss": 3.0})
        original.commit(evaluation)
        assert register(original, "gpt", report(3.0, outputs=evaluation)).version == version
    before = original.get_json("models/gpt/2/card.json")  # version 2 as an earlier release wrote it: URLs
    for name in ("dataset", "dataset_manifest", "checkpoint", "evaluation"):
        before["lineage"][name] = original.url(before["lineage"][name])
    original.put_json("models/gpt/2/card.json", before)
    shutil.copytree(tmp_path / "original", tmp_path / "copy")
    shutil.rmtree(tmp_path / "original")
    copy = open_store(str(tmp_path / "copy"))

    for version, evaluation in evaluations.items():
        entry = show(copy, f"gpt:{version}")
        lineage = entry.card.lineage
        assert (lineage.checkpoint, lineage.dataset, lineage.evaluation) == (CKPT, DATASET, evaluation), version
        assert lineage.dataset_manifest == f"{DATASET}/manifest.json"
        assert copy.is_committed(lineage.checkpoint) and copy.exists(lineage.dataset_manifest)
        assert entry.uri == copy.url(f"models/gpt/{version}")
        assert entry.lineage_urls["checkpoint"] == copy.url(CKPT) and entry.lineage_urls["evaluation"] == copy.url(evaluation)
        assert all(url.startswith(copy.url("")) for url in entry.lineage_urls.values()), entry.lineage_urls
        assert cli(["registry", "show", f"gpt:{version}", "--json", "--store", copy.uri]) == 0
        printed = capsys.readouterr().out
        assert str(tmp_path / "original") not in printed and json.loads(printed)["lineage"]["checkpoint"] == CKPT


def test_gate_decision():
    assert gate_decision(2.0, "", -1.0, 0.0)[0] is True  # first model takes the alias
    assert gate_decision(2.0, "models/g/1", -1.0, 0.0) == (
        False,
        "models/g/1 uses another tokenizer or model shape: not comparable, alias kept",
    )
    assert gate_decision(2.0, "models/g/1", 2.0, 0.0)[0] is True  # not worse
    assert gate_decision(2.05, "models/g/1", 2.0, 0.1)[0] is True  # worse, within tolerance
    promoted, reason = gate_decision(2.2, "models/g/1", 2.0, 0.1)
    assert not promoted and "2.2000 bits/byte > 2.0000 + tolerance 0.1: alias kept" == reason
