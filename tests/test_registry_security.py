"""Issue 19, items 2 and 4 for the registry: names and aliases follow one strict rule, checked
before the store is touched; keys stay inside their folders; committed objects are only created.

Runs on the local store and on the real SeaweedFS server (the ``store`` fixture)."""

from __future__ import annotations

import os

import pytest

from cli.main import main as cli
from registry import aliases as registry_aliases
from registry import names as registry_names
from registry import registry as registry_registry
from registry.aliases import set_alias
from registry.names import RegistryError
from registry.registry import download, list_models, promote, register, resolve, show
from storage import AlreadyCommitted, StoreError
from tests.helpers import CKPT, registry_inputs, report

HOSTILE_NAMES = ["gpt/1", "..", ".", "_COMMITTED", "_CLAIMED", "../models/gpt", "a b", "x" * 65, "", "-gpt", "gpt\n", "gpt\\1"]
HOSTILE_ALIASES = [*HOSTILE_NAMES, "42", ".tmp-lock"]


class Untouchable:
    """A store that fails the test as soon as anything of it is used."""

    def __getattr__(self, attr):
        raise AssertionError(f"the store was touched (store.{attr}) before the name was checked")


def refused(call, bad: str) -> str:
    with pytest.raises(RegistryError) as info:
        call()
    message = str(info.value)
    assert repr(bad) in message and ("1-64 letters" in message or "all digits" in message or "version" in message), message
    return message


@pytest.mark.parametrize("bad", HOSTILE_NAMES)
def test_hostile_model_names_are_refused_before_any_store_access(bad):
    store = Untouchable()
    refused(lambda: register(store, bad, report(1.0)), bad)
    for spec in (bad, f"{bad}:1", f"{bad}:latest"):
        refused(lambda spec=spec: resolve(store, spec), bad)
        refused(lambda spec=spec: show(store, spec), bad)
        refused(lambda spec=spec: download(store, spec, "/nonexistent/dest"), bad)
        refused(lambda spec=spec: promote(store, spec, "production"), bad)
    refused(lambda: set_alias(store, bad, "production", 1), bad)


@pytest.mark.parametrize("bad", HOSTILE_ALIASES)
def test_hostile_aliases_are_refused_before_any_store_access(bad):
    store = Untouchable()
    refused(lambda: register(store, "gpt", report(1.0), aliases=(bad,)), bad)
    if bad:  # gate_alias='' means no gate
        refused(lambda: register(store, "gpt", report(1.0), gate_alias=bad), bad)
    for call in (resolve, show, lambda s, spec: download(s, spec, "/nonexistent/dest")):
        if bad != "42":  # gpt:42 is version 42
            refused(lambda call=call: call(store, f"gpt:{bad}"), bad)
    refused(lambda: promote(store, "gpt:1", bad), bad)
    refused(lambda: set_alias(store, "gpt", bad, 1), bad)


def test_the_issue_examples_are_refused_with_the_rule(store):
    """``gpt/1`` would claim models/gpt/1/1/ inside the committed entry gpt:1; the aliases
    ``..``, ``_COMMITTED`` and ``../models/gpt:1`` named files outside the aliases folder."""
    registry_inputs(store)
    register(store, "gpt", report(2.0))
    before = store.list("models/")
    with pytest.raises(RegistryError, match=r"invalid model name 'gpt/1': use a name of 1-64 letters"):
        register(store, "gpt/1", report(1.0))
    for alias in ("..", "_COMMITTED", "../models/gpt:1"):
        with pytest.raises(RegistryError, match="invalid alias"):
            promote(store, "gpt:1", alias)
    with pytest.raises(RegistryError, match="an alias cannot be all digits"):
        promote(store, "gpt:1", "7")
    for spec in ("gpt:0", "gpt:01"):
        with pytest.raises(RegistryError, match="versions are 1, 2, 3"):
            resolve(store, spec)
    assert store.list("models/") == before


def test_the_command_line_refuses_hostile_names(store, tmp_path, capsys):
    dest = tmp_path / "dest"
    assert cli(["registry", "download", "../models/gpt:1", str(dest), "--store", store.uri]) == 2
    assert capsys.readouterr().err.startswith("error: invalid model name '../models/gpt': use a name of 1-64 letters")
    assert cli(["registry", "promote", "gpt:1", "--alias", "_COMMITTED", "--store", store.uri]) == 2
    assert capsys.readouterr().err.startswith("error: invalid alias '_COMMITTED'")
    assert not dest.exists()


def test_the_config_and_the_registry_share_one_rule():
    from registry.config import setting_name_problem as config_problem

    for value in [*HOSTILE_ALIASES, "gpt", "gpt-tiny", "GPT.2_b", "a" * 64, "1e3"]:
        for alias in (False, True):
            check = registry_names.check_alias if alias else registry_names.check_name
            try:
                check(value)
                registry_refuses = False
            except RegistryError:
                registry_refuses = True
            assert bool(config_problem("registry.x", value, alias=alias)) == registry_refuses, (value, alias)
    assert registry_names.check_name("42") == "42"  # a model may be called 42; an alias may not


# ----------------------------------------------------------------------------------------------
# Keys stay inside their folders


def test_download_of_version_1_copies_only_version_1(store, tmp_path):
    """The issue's reproduction: with versions 1 and 10 committed and a key models/gpt/10/tmp/x,
    ``download gpt:1`` wrote /tmp/x (version 10's files, joined with a leading '/')."""
    registry_inputs(store)
    register(store, "gpt", report(2.0))
    store.put_bytes("models/gpt/10/tmp/x", b"version 10")
    store.put_bytes("models/gpt/10/card.json", b"{}")
    store.commit("models/gpt/10")
    folder = download(store, "gpt:1", tmp_path / "dest")
    files = sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file())
    entry = sorted(u.rsplit("models/gpt/1/", 1)[1] for u in show(store, "gpt:1").files)
    assert files == [f for f in entry if f not in ("_COMMITTED", "_CLAIMED")]
    assert "tmp/x" not in files and not any("version 10" in (folder / f).read_text(errors="ignore") for f in files)
    assert all("/models/gpt/1/" in u for u in show(store, "gpt:1").files)


def _plant(store, monkeypatch, keys: list[str]) -> None:
    """Make the store's listings hold ``keys`` too, as a shared bucket can (AWS S3 keeps keys
    with ``..`` or ``//`` as they are; SeaweedFS refuses or folds them, a local folder cannot
    hold them), with content for any that is downloaded."""
    real_list, real_download = store.list, store.download

    def listing(prefix: str) -> list[str]:
        folder = prefix.rstrip("/") + "/"
        return sorted(real_list(prefix) + [k for k in keys if k.startswith(folder)])

    def fetch(key, path):
        if key in keys:
            os.makedirs(os.path.dirname(path), exist_ok=True)
            with open(path, "wb") as f:
                f.write(b"planted")
            return
        real_download(key, path)

    monkeypatch.setattr(store, "list", listing)
    monkeypatch.setattr(store, "download", fetch)


@pytest.mark.parametrize(
    "planted",
    [
        "models/gpt/1/../../../../escaped.txt",
        "models/gpt/1//tmp/escaped.txt",
        "models/gpt/1/checkpoint/../../../escaped.txt",
        "models/gpt/1/./escaped.txt",
        "models/gpt/1/hf\\..\\..\\escaped.txt",
    ],
    ids=["dotdot", "absolute", "dotdot-inside", "dot", "backslash"],
)
def test_download_refuses_planted_keys_and_writes_nothing(store, tmp_path, monkeypatch, planted):
    registry_inputs(store)
    register(store, "gpt", report(2.0))
    _plant(store, monkeypatch, [planted])
    dest = tmp_path / "deep" / "er" / "dest"
    with pytest.raises(RegistryError, match=r"gpt:1 holds a key outside its folder, nothing was downloaded"):
        download(store, "gpt:1", dest)
    assert not dest.exists()  # checked before anything was written
    assert not list(tmp_path.rglob("escaped.txt")) and not os.path.exists("/tmp/escaped.txt")


def test_registration_refuses_planted_keys_in_the_checkpoint(store, monkeypatch):
    registry_inputs(store)
    _plant(store, monkeypatch, [f"{CKPT}/model/../../../../../escaped.txt"])
    with pytest.raises(StoreError, match=r"has a '\.' or '\.\.' part"):
        register(store, "gpt", report(2.0))
    assert list_models(store) == []


def test_a_planted_alias_cannot_point_outside(store):
    registry_inputs(store)
    register(store, "gpt", report(2.0))
    store.put_json("models/gpt/aliases/production.json", {"version": "../../datasets/abc"})
    with pytest.raises(RegistryError, match="does not name a version"):
        resolve(store, "gpt:production")
    assert list_models(store)[0]["aliases"] == ["latest"]  # listed without the broken one


# ----------------------------------------------------------------------------------------------
# Committed objects are only ever created


def test_every_registry_write_into_models_is_conditional(store, monkeypatch):
    """Each object written under models/<name>/<version>/ is created only if absent; alias
    writes are created only if absent or replaced only if unchanged (ETag)."""
    registry_inputs(store)
    writes: list[tuple[str, bool, bool]] = []
    for method in ("put_bytes", "put_file"):
        real = getattr(store, method)

        def spy(key, data, *, real=real, if_absent=False, if_match=None):
            writes.append((key, if_absent, if_match is not None))
            return real(key, data, if_absent=if_absent, **({"if_match": if_match} if if_match else {}))

        monkeypatch.setattr(store, method, spy)
    register(store, "gpt", report(2.0), config={"evaluation": {"batch_size": 16, "max_batches": 16}}, gate_alias="production")
    register(store, "gpt", report(1.0), config={"evaluation": {"batch_size": 16, "max_batches": 16}}, gate_alias="production")
    promote(store, "gpt:1", "staging")
    promote(store, "gpt:2", "staging")
    models = [w for w in writes if w[0].startswith("models/")]
    assert {k for k, _, _ in models} >= {"models/gpt/1/card.json", "models/gpt/2/card.md", "models/gpt/aliases/production.json"}
    for key, if_absent, if_match in models:
        if "/aliases/" in key:
            assert if_absent or if_match, key
        else:
            assert if_absent and not if_match, key
    assert ("models/gpt/aliases/production.json", False, True) in models  # moved from 1 to 2 by CAS
    assert resolve(store, "gpt:production") == ("gpt", 2) and resolve(store, "gpt:staging") == ("gpt", 2)


def test_a_replayed_registration_cannot_overwrite_a_version(store, monkeypatch):
    """Were the claim bypassed (a replayed or buggy writer aiming at version 1), its first write
    fails loudly and version 1 stays as it was."""
    registry_inputs(store)
    register(store, "gpt", report(2.0))
    card = store.get_bytes("models/gpt/1/card.json")
    monkeypatch.setattr(registry_registry, "_claim_version", lambda store, name, identity: 1)
    with pytest.raises(AlreadyCommitted, match="already exists"):
        register(store, "gpt", report(9.0))
    assert store.get_bytes("models/gpt/1/card.json") == card
    assert show(store, "gpt:1").card.metrics["val_loss"] == 2.0


def test_latest_never_moves_back(store):
    """Two registrations finishing out of order: latest stays on the newer version."""
    registry_inputs(store)
    register(store, "gpt", report(2.0))
    register(store, "gpt", report(1.0))
    registry_aliases.move_alias(store, "gpt", "latest", lambda holder: 1 if holder is None or holder < 1 else None)
    assert resolve(store, "gpt") == ("gpt", 2)
    set_alias(store, "gpt", "latest", 1)  # a person may still point it anywhere
    assert resolve(store, "gpt:latest") == ("gpt", 1)
