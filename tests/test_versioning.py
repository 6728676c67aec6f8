"""Code versions (``common.codeversion``) on a small synthetic tree, and config hashes."""

import sys
import textwrap

import pytest

from common.codeversion import closure, code_version
from common.hashing import config_hash
from training.config import TrainConfig

# A tree under the project's top-level package names (the walker only follows those), each
# file a different way to import. Module bodies raise: the walk must never execute them.
TREE = {
    "tasks/__init__.py": "",
    "tasks/job.py": """
        import numpy as np
        import storage.store
        from os import path
        from training import model, not_a_module
        from . import helper

        def late():
            from kernels.k import go
            import torch.nn
        raise SystemExit("walked modules must not be imported")
    """,
    "tasks/helper.py": "from .sub import deep\n",
    "tasks/sub/__init__.py": "",
    "tasks/sub/deep.py": "from .. import helper\nfrom ..sub import *\n",
    "tasks/unused.py": "import registry.registry\n",
    "storage/__init__.py": "from storage.store import Store\n",
    "storage/store.py": "class Store: ...\n",
    "training/__init__.py": "import yaml\n",
    "training/model.py": "from training.config import X\n",
    "training/config.py": "X = 1\n",
    "kernels/__init__.py": "",
    "kernels/k.py": "import triton\n",
    "registry/__init__.py": "",
    "registry/registry.py": "",
}


@pytest.fixture
def tree(tmp_path):
    for name, text in TREE.items():
        path = tmp_path / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return tmp_path


def test_closure_follows_every_form_of_import_without_importing(tree):
    before = set(sys.modules)
    found = closure("tasks.job", tree)
    assert list(found.modules) == [
        "kernels",
        "kernels.k",
        "storage",
        "storage.store",
        "tasks",
        "tasks.helper",
        "tasks.job",
        "tasks.sub",
        "tasks.sub.deep",
        "training",
        "training.config",
        "training.model",
    ]
    assert found.modules["tasks.sub"] == tree / "tasks/sub/__init__.py"
    assert found.third_party == {"numpy", "torch", "triton", "yaml"}
    assert not {"tasks", "tasks.job", "storage", "kernels"} & (set(sys.modules) - before)


def test_code_version_follows_the_closure_and_nothing_else(tree):
    before = code_version("tasks.job", tree)
    assert code_version("tasks.job", tree) == before
    (tree / "tasks/unused.py").write_text("import registry.registry  # not imported by tasks.job\n")
    (tree / "registry/registry.py").write_text("Y = 2\n")
    assert code_version("tasks.job", tree) == before
    (tree / "training/__init__.py").write_text("import yaml  # a parent package's __init__\n")
    after = code_version("tasks.job", tree)
    assert after != before
    (tree / "kernels/k.py").write_text("import triton  # imported inside a function\n")
    assert code_version("tasks.job", tree) != after


def test_unknown_module_is_an_error(tree):
    with pytest.raises(ModuleNotFoundError):
        code_version("tasks.missing", tree)


def test_config_hash_follows_values_not_identity():
    assert config_hash(TrainConfig()) == config_hash(TrainConfig())
    assert config_hash(TrainConfig(steps=1)) != config_hash(TrainConfig())
    assert config_hash({"a": 1, "b": 2}) == config_hash({"b": 2, "a": 1})
