import sys

import pytest

from common.hashing import config_hash, source_hash
from training.config import TrainConfig


@pytest.fixture
def package(tmp_path, monkeypatch):
    root = tmp_path / "versioned_pkg"
    (root / "sub").mkdir(parents=True)
    (root / "__init__.py").write_text("")
    (root / "sub" / "mod.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    yield root
    sys.modules.pop("versioned_pkg", None)


def test_source_hash_follows_every_file_of_a_package(package):
    before = source_hash("versioned_pkg")
    assert source_hash("versioned_pkg") == before
    (package / "sub" / "mod.py").write_text("X = 2\n")
    assert source_hash("versioned_pkg") != before


def test_config_hash_follows_values_not_identity():
    assert config_hash(TrainConfig()) == config_hash(TrainConfig())
    assert config_hash(TrainConfig(steps=1)) != config_hash(TrainConfig())
    assert config_hash({"a": 1, "b": 2}) == config_hash({"b": 2, "a": 1})
