"""What the tests share, in one place: paths, tiny settings and corpora, training and pipeline
runs and what they leave in the store, registry entries, the Triton kernel harness and the
infra/ checkers. Fixtures live in conftest.py; test modules import helpers from here only,
never from each other or from conftest.

Heavy libraries (torch, triton, kubernetes, jsonschema) are imported where they are used, so
that a data test does not pay for them.
"""

from __future__ import annotations

import copy
import dataclasses
import gzip
import hashlib
import importlib
import json
import math
import os
import pickle
import random
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any

import pytest
import yaml

from common.contracts import CheckpointRef, DatasetRef, EvalReport, Layout, LayoutSpan, metrics_key
from common.net import free_port
from data_prep.config import DataConfig, TokenizerConfig
from runs.view import RunView, build_view
from storage import Store, open_store

if TYPE_CHECKING:
    import jsonschema
    import torch

    from training.config import ModelConfig

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent  # the venv's console scripts: pyflyte, pretrain


# ----------------------------------------------------------------------------------------------
# Tiny settings: small enough for seconds per stage, real enough to exercise every component

TINY_DATA = dict(max_documents=60, seq_len=32, sequences_per_sample=16, samples_per_shard=16, val_fraction=0.1, workers=2)
TINY_TOKENIZER = dict(vocab_size=384)


def tiny_data(**overrides) -> DataConfig:
    return DataConfig(**{**TINY_DATA, **overrides})


def tiny_tokenizer(**overrides) -> TokenizerConfig:
    return TokenizerConfig(**{**TINY_TOKENIZER, **overrides})


TINY_MODEL = dict(num_layers=2, hidden_size=64, num_attention_heads=4)


def tiny_model(**overrides) -> ModelConfig:
    from training.config import ModelConfig

    return ModelConfig(**{**TINY_MODEL, **overrides})


# ----------------------------------------------------------------------------------------------
# Corpora

_SYLLABLES = ["ka", "lo", "mi", "ren", "tu", "sa", "vo", "ne", "pi", "dor", "ex", "quo", "lin", "ba", "te", "ru"]


def write_corpus(root: Path, documents: dict[str, str | bytes]) -> Path:
    """``root`` holding each ``{relative name: content}``."""
    root.mkdir(parents=True, exist_ok=True)
    for name, content in documents.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return root


def words(rng: random.Random, n: int) -> str:
    return " ".join("".join(rng.choice(_SYLLABLES) for _ in range(rng.randint(1, 3))) for _ in range(n))


def distinct_docs(n: int, seed: int = 0, words_per_doc: int = 60) -> list[str]:
    """Documents that share a vocabulary but no near-duplicate pairs (a fixed seed: always the same)."""
    rng = random.Random(seed)
    return [f"Document {i}. {words(rng, words_per_doc)}." for i in range(n)]


def distinct_corpus(root: Path, n: int = 40, words_per_doc: int = 150) -> Path:
    """A folder of ``n`` distinct documents ``doc<i>.txt``: near-duplicate de-duplication would keep
    only one of a templated set."""
    return write_corpus(root, {f"doc{i}.txt": text for i, text in enumerate(distinct_docs(n, words_per_doc=words_per_doc))})


def mixed_corpus(root: Path) -> tuple[Path, dict[str, int]]:
    """A folder with text, JSONL, gzip and problem files; returns it and the expected skips."""
    import zstandard

    docs = distinct_docs(40)
    files: dict[str, str | bytes] = {f"doc{i}.txt": text for i, text in enumerate(docs[:30])}
    files["dup.txt"] = docs[0]  # exact duplicate
    near = docs[1].split(" ")
    near[5] = "changed"
    files["near.txt"] = " ".join(near)  # one word changed: a near-duplicate
    files["empty.txt"] = "   \n"
    files["short.txt"] = "tiny"
    files["latin1.txt"] = "caf\xe9 ".encode("latin-1") * 40
    files["blob.txt"] = b"\x00\x01binary" * 50
    files["nested/records.jsonl"] = "\n".join(
        [json.dumps({"text": text}) for text in docs[30:35]] + ["{not json", json.dumps({"other": 1})]
    )
    files["packed.txt.gz"] = gzip.compress(docs[35].encode())
    files["packed.jsonl.zst"] = zstandard.ZstdCompressor().compress(json.dumps({"text": docs[36]}).encode())
    files["broken.txt.gz"] = gzip.compress(b"x" * 1000)[:20]
    expected = {
        "duplicate": 1,
        "near_duplicate": 1,
        "empty": 1,
        "too_short": 1,
        "not_utf8": 1,
        "binary": 1,
        "bad_jsonl_record": 1,
        "jsonl_missing_text_field": 1,
        "bad_gzip": 1,
    }
    return write_corpus(root, files), expected


KEPT_IN_MIXED = 30 + 5 + 2  # text files, JSONL records, the gzip and zstd documents


# ----------------------------------------------------------------------------------------------
# Training runs and what they leave in the store


def fresh_copy(dataset, root: Path):
    """The dataset alone in a new local store at ``root``: a run there starts from scratch (the
    run id ignores the layout, so each layout needs its own store)."""
    shutil.copytree(Path(dataset.store) / dataset.prefix, root / dataset.prefix)
    return dataclasses.replace(dataset, store=str(root))


def run_metrics(store: Store, run: str) -> list[dict]:
    """The run's ``metrics.jsonl``: one record per step (loss, grad norm, lr, tokens/s, ...)."""
    return [json.loads(line) for line in store.get_bytes(metrics_key(run)).decode().splitlines()]


def records(ref) -> list[dict]:
    """The metrics of a training result (a ``CheckpointRef``)."""
    return run_metrics(open_store(ref.store), ref.run)


def checkpoint_state(store_root: str, prefix: str, tmp_path: Path) -> dict:
    """Every tensor of a committed checkpoint in a local store (weights and optimizer moments, unsharded) and its
    meta (tests/test_resume.py, tests/test_cooldown.py)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    folder = Path(store_root) / prefix
    out = tmp_path / f"{prefix.replace('/', '_')}.pt"
    dcp_to_torch_save(folder / "model", out)
    state = torch.load(out, weights_only=False)
    state = {k: v for k, v in state.items() if isinstance(v, torch.Tensor)}
    return {"tensors": state, "meta": json.loads((folder / "meta.json").read_text())}


def losses(ref) -> list[float]:
    return [r["loss"] for r in records(ref)]


# Runs launch() in a child process, so that a test can SIGKILL the whole job (agent and ranks).
# A process that launches once gains nothing from a fork server: its ranks are spawned, children of it,
# so that the launcher sees a killed or stuck rank's exit first hand, as these tests check.
_CHILD = (
    "import pickle, sys\nfrom training.launch import launch\n"
    "launch(*pickle.load(open(sys.argv[1], 'rb')), start_method='spawn')\n"
)


def start_training(tmp_path: Path, nproc: int, *args, env: dict | None = None, log_name: str = "train.log") -> subprocess.Popen:
    """``launch(train, nproc, *args)`` in its own process group; stdout and stderr go to ``log_name``."""
    from training.train import train

    return start_launch(tmp_path, train, nproc, *args, env=env, log_name=log_name)


def kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait(timeout=30)


# ----------------------------------------------------------------------------------------------
# The whole workflow under `pyflyte run`, and what it leaves behind

CACHED_TASKS = ["prepare_data", "validate_data", "train_model", "evaluate_model", "register_model"]


def write_config(path: Path, store: str, **overrides) -> Path:
    """A preset for a tiny pipeline run against ``store``; ``overrides`` update its sections."""
    config = {
        "store": store,
        "data": dict(TINY_DATA),
        "tokenizer": dict(TINY_TOKENIZER),
        "model": dict(TINY_MODEL),
        "train": {"steps": 12, "micro_batch_size": 4, "global_batch_size": 8, "warmup_steps": 2, "checkpoint_every": 6},
        # lm-eval costs ~15 s per evaluation: on only where a test asks (evaluation={"lm_eval_tasks": [...]}).
        "evaluation": {"max_batches": 2, "batch_size": 4, "sample_tokens": 8, "lm_eval_tasks": []},
        "registry": {"model_name": "gpt-e2e"},
    }
    for section, values in overrides.items():
        config[section] = {**config.get(section, {}), **values}
    path.write_text(yaml.safe_dump(config))
    return path


def run(args: list[str], env: dict[str, str], timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(args, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def local_cache_entries(home: Path) -> dict[str, set[str]]:
    """flytekit's local task cache (``$HOME/.flyte/local-cache``): {task: its cache keys}. A key is
    ``<module>.<task>-<cache version>-<inputs hash>``, written once the task ran (a miss)."""
    from diskcache import Cache

    folder = home / ".flyte" / "local-cache"
    if not folder.exists():
        return {}
    entries: dict[str, set[str]] = {}
    with Cache(str(folder)) as cache_db:
        for key in cache_db.iterkeys():
            entries.setdefault(key.rsplit("-", 2)[0].rsplit(".", 1)[-1], set()).add(key)
    return entries


def cache_outcomes(before: dict[str, set[str]], after: dict[str, set[str]]) -> dict[str, str]:
    """{task: 'miss' | 'hit'} for a successful run of the workflow, from the local cache before and
    after it: every cached task runs in each execution, and a miss adds the task's new key."""
    return {task: "miss" if after.get(task, set()) - before.get(task, set()) else "hit" for task in CACHED_TASKS}


def training_run_of(store: Store, card: dict) -> str:
    """The run (``runs/<id>``) whose checkpoint a registry entry copied."""
    return card["lineage"]["checkpoint"].removeprefix(store.url("")).split("/checkpoints/")[0]


# ----------------------------------------------------------------------------------------------
# Registry entries made without training

TOKENIZER_JSON = b"{}"
DATASET_MANIFEST = json.dumps(
    {"tokenizer": {"file": "tokenizer.json", "sha256": hashlib.sha256(TOKENIZER_JSON).hexdigest()}, "stats": {}},
    indent=2,
    sort_keys=True,
).encode()
DATASET_VERSION = hashlib.sha256(DATASET_MANIFEST).hexdigest()[:16]  # as data_prep.manifest.version_of
DATASET = f"datasets/{DATASET_VERSION}"
CKPT = "runs/r1/checkpoints/step-0000010"


def registry_inputs(store: Store, weights: bytes = b"weights") -> Store:
    """What registration copies from: a dataset's manifest and tokenizer, and a committed
    checkpoint (weights, optimizer state that stays with the run, meta)."""
    store.put_bytes(f"{DATASET}/manifest.json", DATASET_MANIFEST)
    store.put_bytes(f"{DATASET}/tokenizer.json", TOKENIZER_JSON)
    store.commit(DATASET)
    store.put_bytes(f"{CKPT}/model/.metadata", b"meta")
    store.put_bytes(f"{CKPT}/model/__0_0.distcp", weights)
    store.put_bytes(f"{CKPT}/optim/rank-00000.pt", b"optimizer")
    store.put_json(f"{CKPT}/meta.json", {"step": 10})
    store.commit(CKPT)
    return store


def report(loss: float, outputs: str = "", checkpoint: str = CKPT) -> EvalReport:
    """What evaluation hands registration: a report on ``checkpoint``, trained by TP=2 on dataset abc."""
    dataset = DatasetRef(store="", version=DATASET_VERSION, prefix=DATASET)
    layouts = [LayoutSpan(1, 10, Layout(world_size=2, tensor_parallel=2))]
    ckpt = CheckpointRef(store="", run="runs/r1", prefix=checkpoint, step=10, dataset=dataset, layouts=layouts)
    return EvalReport(ckpt, loss, math.exp(loss), 100, loss / math.log(2), sample="def f():", outputs=outputs)


# ----------------------------------------------------------------------------------------------
# Triton kernels (tests/test_kernels_*.py)
#
# Without a GPU the Triton kernels run on the CPU through Triton's interpreter, which @triton.jit
# chooses when a kernel is defined, i.e. when its module is imported. So the kernel tests load the
# kernel modules with `load_kernels()`, which sets TRITON_INTERPRET=1 only while it (re-)imports
# them: `kernels.*` modules that something else imported earlier without the interpreter are
# reloaded (importlib.reload re-executes a module in its own namespace, so functions already
# imported elsewhere pick up the interpreted kernels too). The variable is restored afterwards, so
# that it does not leak into the rest of the test session: the training tests' ranks would
# otherwise run every kernel interpreted. The kernels do not depend on when `triton` itself was
# imported (see kernels/_tl.py).


@cache
def interpret() -> bool:
    """Whether the kernels run under Triton's interpreter: TRITON_INTERPRET=1, or no CUDA device."""
    import torch

    return os.environ.get("TRITON_INTERPRET", "0") == "1" or not torch.cuda.is_available()


@contextmanager
def _interpreter_mode() -> Iterator[None]:
    saved = os.environ.get("TRITON_INTERPRET")
    if interpret():
        os.environ["TRITON_INTERPRET"] = "1"
    try:
        yield
    finally:
        if saved is None:
            os.environ.pop("TRITON_INTERPRET", None)
        else:
            os.environ["TRITON_INTERPRET"] = saved


def tolerances(dtype: torch.dtype) -> tuple[float, float]:
    """(rtol, atol as a fraction of max|expected|) for ``dtype`` (see `assert_close`).

    float32: both sides compute in float32, only summation order differs.
    bfloat16: both sides compute in float32 and round once; a value that lands near a rounding
      boundary can round the other way: one bf16 step = 2^-8 of the leading binade, so 2^-7
      relative per element plus 2^-8 of the tensor's max absolute value.
    float16: the same, with float16's 10 mantissa bits.
    float64: both sides compute in float64.
    """
    import torch

    return {
        torch.float32: (1e-5, 1e-6),
        torch.bfloat16: (2**-7, 2**-8),
        torch.float16: (2**-10, 2**-11),
        torch.float64: (1e-12, 1e-13),
    }[dtype]


def kernels_of(module: ModuleType) -> dict[str, Any]:
    """The @triton.jit functions defined in `module` (not the helpers it imports)."""
    from triton.runtime.jit import KernelInterface

    return {
        name: value
        for name, value in vars(module).items()
        if isinstance(value, KernelInterface) and getattr(value.fn, "__module__", None) == module.__name__
    }


def _interpreted(module: ModuleType) -> bool:
    from triton.runtime.interpreter import InterpretedFunction

    return all(isinstance(k, InterpretedFunction) for k in kernels_of(module).values())


def load_kernels(name: str) -> ModuleType:
    """`kernels.<name>`, with its @triton.jit functions built for the interpreter if
    TRITON_INTERPRET=1 (re-importing it, and the helpers it uses, if it was imported before
    the variable was set)."""
    # triton itself is imported outside interpreter mode, as a module-level import would: its own
    # @jit helpers (tl.cdiv...) must stay JITFunctions, which triton.experimental.gluon, imported
    # at the first launch, insists on when the interpreter is off.
    import triton.runtime.interpreter  # noqa: F401

    module = None
    with _interpreter_mode():
        for dependency in ("kernels._tl", f"kernels.{name}"):  # helpers first: the kernel module binds them
            module = importlib.import_module(dependency)
            if interpret() and not _interpreted(module):
                module = importlib.reload(module)
    assert module is not None and kernels_of(module), f"kernels.{name} defines no Triton kernel"
    assert _interpreted(module) == interpret(), f"kernels.{name}: interpreter mode does not match TRITON_INTERPRET"
    return module


def device() -> str:
    """Where the tests run the kernels: the CPU under the interpreter, else a GPU."""
    import torch

    if interpret():
        return "cpu"
    if not torch.cuda.is_available():
        pytest.skip("TRITON_INTERPRET=0 and no CUDA device: the Triton kernels cannot run here")
    return "cuda"


@dataclass
class Launches:
    """What `count_launches` saw: kernel name -> number of launches, and each launch's args."""

    counts: dict[str, int] = field(default_factory=dict)
    calls: list[tuple[str, Any, tuple[Any, ...], dict[str, Any]]] = field(default_factory=list)  # name, grid, args, kwargs

    def total(self) -> int:
        return sum(self.counts.values())


class _Spy:
    """Stands in for a Triton kernel: `spy[grid](*args)` records the launch, then runs it."""

    def __init__(self, name: str, kernel: Any, launches: Launches) -> None:
        self.name, self.kernel, self.launches = name, kernel, launches

    def __getitem__(self, grid: Any):
        def launch(*args: Any, **kwargs: Any) -> Any:
            self.launches.counts[self.name] = self.launches.counts.get(self.name, 0) + 1
            self.launches.calls.append((self.name, grid, args, kwargs))
            return self.kernel[grid](*args, **kwargs)

        return launch


@contextmanager
def count_launches(module: ModuleType) -> Iterator[Launches]:
    """Count the Triton launches of `module`'s kernels inside the block: proof that a result
    came from the Triton path and not silently from torch."""
    with _spying(module, kernels_of(module)) as launches:
        yield launches


@contextmanager
def _spying(module: ModuleType, originals: dict) -> Iterator[Launches]:
    """``originals`` (name: kernel) of ``module`` replaced by counting spies inside the block."""
    launches = Launches()
    for name, kernel in originals.items():
        setattr(module, name, _Spy(name, kernel, launches))
    try:
        yield launches
    finally:
        for name, kernel in originals.items():
            setattr(module, name, kernel)


def assert_close(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype | None = None, scale: float = 1.0) -> None:
    """Elementwise |actual - expected| <= rtol * |expected| + atol * max|expected|, with the
    tolerances of `dtype` (default: expected's dtype) multiplied by `scale`."""
    import torch

    assert actual.shape == expected.shape, f"shape {tuple(actual.shape)} != {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"dtype {actual.dtype} != {expected.dtype}"
    rtol, atol_frac = tolerances(dtype or expected.dtype)
    a, e = actual.detach().double().cpu(), expected.detach().double().cpu()
    atol = atol_frac * max(e.abs().max().item() if e.numel() else 0.0, 1e-30)
    torch.testing.assert_close(a, e, rtol=rtol * scale, atol=atol * scale)


def forward_backward(
    fn, inputs: list[torch.Tensor], grad_out: torch.Tensor | None = None, n_grad: int | None = None
) -> tuple[torch.Tensor, list[torch.Tensor]]:
    """fn(*inputs), then backward with grad_out (None: a scalar output). The first `n_grad`
    inputs (default: the floating-point ones) are leaves that require grad; returns the
    output and their gradients."""
    n_grad = sum(x.is_floating_point() for x in inputs) if n_grad is None else n_grad
    leaves = [x.detach().clone().requires_grad_(i < n_grad) for i, x in enumerate(inputs)]
    out = fn(*leaves)
    out.backward(grad_out)
    return out.detach(), [x.grad for x in leaves[:n_grad]]


# ----------------------------------------------------------------------------------------------
# infra/: the checkers of tests/test_infra*.py
#
# - Kubernetes core objects: walked against the models of the installed ``kubernetes`` client
#   (field names from ``attribute_map``, types from ``openapi_types``), then built with
#   ``Model.from_dict`` for required fields and strict types.
# - Kueue objects: JSON Schemas in infra/schemas/ (derived from the Kueue CRDs) with ``jsonschema``,
#   plus their metadata against the ObjectMeta model.
# - IAM: a small evaluator of S3 identity policies against a per-role specification.
# - Flyte: the chart's Helm ``tpl`` escapes and the cluster resource manager's ``{{ var }}``
#   substitution, reimplemented to render what Flyte would apply.


def _k8s() -> ModuleType:
    import kubernetes.client

    return kubernetes.client


def _parse_quantity(value: Any):
    from kubernetes.utils.quantity import parse_quantity

    return parse_quantity(value)


INFRA = ROOT / "infra"
DOMAINS = ("development", "staging", "production")
PROJECT = "pretrain"
PRETRAIN_NAMESPACES = tuple(f"{PROJECT}-{d}" for d in DOMAINS)


# ----------------------------------------------------------------------------------------------
# Loading


def infra_files(*suffixes: str) -> list[Path]:
    return sorted(p for p in INFRA.rglob("*") if p.is_file() and p.suffix in suffixes)


@cache
def load_docs(rel: str) -> tuple[dict, ...]:
    """The YAML documents of infra/<rel> (empty documents dropped)."""
    return tuple(d for d in yaml.safe_load_all((INFRA / rel).read_text()) if d is not None)


@cache
def load_json(rel: str) -> dict:
    return json.loads((INFRA / rel).read_text())


def objects(rel: str, kind: str | None = None) -> list[dict]:
    return [copy.deepcopy(d) for d in load_docs(rel) if kind is None or d.get("kind") == kind]


def by_name(docs: list[dict]) -> dict[str, dict]:
    return {d["metadata"]["name"]: d for d in docs}


# ----------------------------------------------------------------------------------------------
# Kubernetes core objects, validated against the kubernetes client's models

PRIMITIVES = {"str": str, "int": int, "bool": bool, "float": (int, float), "datetime": str, "date": str, "bytes": str}
CORE_KINDS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("v1", "ResourceQuota"): "V1ResourceQuota",
    ("v1", "LimitRange"): "V1LimitRange",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
    ("v1", "Service"): "V1Service",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
}
NAMESPACED = {"ServiceAccount", "ResourceQuota", "LimitRange", "ConfigMap", "Role", "RoleBinding", "LocalQueue"}
NAMESPACED |= {"Service", "NetworkPolicy"}
DNS1123_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
DNS1123_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
QUOTA_RESOURCE = re.compile(
    r"^(pods|services|secrets|configmaps|persistentvolumeclaims|replicationcontrollers|resourcequotas"
    r"|(requests\.|limits\.)?(cpu|memory|ephemeral-storage)|requests\.storage"
    r"|requests\.[a-z0-9.-]+/[a-z0-9.-]+|count/[a-z0-9.-]+)$"
)


def model_errors(obj: Any, type_name: str, path: str = "") -> list[str]:
    """Unknown fields and wrong types of ``obj`` read as the client model ``type_name``."""
    if type_name.startswith("List["):
        if not isinstance(obj, list):
            return [f"{path}: expected a list, got {type(obj).__name__}"]
        return [e for i, item in enumerate(obj) for e in model_errors(item, type_name[5:-1], f"{path}[{i}]")]
    if type_name.startswith("Dict[str, "):
        if not isinstance(obj, dict):
            return [f"{path}: expected a mapping, got {type(obj).__name__}"]
        return [e for k, v in obj.items() for e in model_errors(v, type_name[10:-1], f"{path}.{k}")]
    if type_name == "object":
        return []
    if type_name in PRIMITIVES:
        wanted = PRIMITIVES[type_name]
        if isinstance(obj, bool) and type_name != "bool" or not isinstance(obj, wanted):
            return [f"{path}: expected {type_name}, got {type(obj).__name__} {obj!r}"]
        return []
    model = getattr(_k8s(), type_name)
    if not isinstance(obj, dict):
        return [f"{path}: expected a {type_name} mapping, got {type(obj).__name__}"]
    wire = {json_key: attr for attr, json_key in model.attribute_map.items()}
    errors = []
    for key, value in obj.items():
        if key not in wire:
            errors.append(f"{path}.{key}: unknown field of {type_name}")
        else:
            errors += model_errors(value, model.openapi_types[wire[key]], f"{path}.{key}")
    return errors


def k8s_model_errors(obj: Any, model_name: str, path: str = "") -> list[str]:
    """Field names and types, then required fields and strict types through ``Model.from_dict``."""
    errors = model_errors(obj, model_name, path)
    if not errors:
        try:
            getattr(_k8s(), model_name).from_dict(obj)
        except Exception as e:  # pydantic.ValidationError: required field missing, wrong type
            errors.append(f"{path}: {model_name}: {' '.join(str(e).split())[:300]}")
    return errors


def metadata_errors(obj: dict, where: str) -> list[str]:
    meta = obj.get("metadata")
    if not isinstance(meta, dict):
        return [f"{where}: metadata missing"]
    errors = k8s_model_errors(meta, "V1ObjectMeta", f"{where}.metadata")
    name = meta.get("name")
    kind = obj.get("kind")
    pattern = DNS1123_LABEL if kind == "Namespace" else DNS1123_SUBDOMAIN
    if not isinstance(name, str) or not pattern.match(name) or len(name) > (63 if kind == "Namespace" else 253):
        errors.append(f"{where}: metadata.name {name!r} is not a valid {kind} name")
    if kind in NAMESPACED and not meta.get("namespace"):
        errors.append(f"{where}: {kind} is namespaced but has no metadata.namespace")
    if kind not in NAMESPACED and "namespace" in meta:
        errors.append(f"{where}: {kind} is cluster-scoped but has metadata.namespace")
    return errors


def core_object_errors(obj: Any, where: str = "object") -> list[str]:
    if not isinstance(obj, dict):
        return [f"{where}: not a mapping"]
    model = CORE_KINDS.get((obj.get("apiVersion"), obj.get("kind")))
    if model is None:
        return [f"{where}: unknown apiVersion/kind {obj.get('apiVersion')}/{obj.get('kind')}"]
    if "status" in obj:
        return [f"{where}: status does not belong in a manifest"]
    errors = k8s_model_errors(obj, model, where) + metadata_errors(obj, where)
    if obj["kind"] == "ResourceQuota" and not errors:
        for res, qty in (obj.get("spec") or {}).get("hard", {}).items():
            if not QUOTA_RESOURCE.match(res):
                errors.append(f"{where}: {res!r} is not a resource a ResourceQuota can limit")
            try:
                _parse_quantity(qty)
            except ValueError:
                errors.append(f"{where}: {res}: {qty!r} is not a quantity")
    return errors


# ----------------------------------------------------------------------------------------------
# Kueue objects, validated against infra/schemas/*.json

KUEUE_SCHEMAS = {
    "ResourceFlavor": "resourceflavor.json",
    "ClusterQueue": "clusterqueue.json",
    "LocalQueue": "localqueue.json",
    "WorkloadPriorityClass": "workloadpriorityclass.json",
}


@cache
def validator(schema_file: str) -> jsonschema.protocols.Validator:
    import jsonschema

    schema = load_json(f"schemas/{schema_file}")
    cls = jsonschema.validators.validator_for(schema)
    cls.check_schema(schema)
    return cls(schema)


def schema_errors(obj: Any, schema_file: str, where: str) -> list[str]:
    return [
        f"{where}: {'/'.join(map(str, e.absolute_path)) or '<root>'}: {e.message}"
        for e in sorted(validator(schema_file).iter_errors(obj), key=lambda e: list(map(str, e.absolute_path)))
    ]


def kueue_object_errors(obj: Any, where: str = "object") -> list[str]:
    if not isinstance(obj, dict) or obj.get("kind") not in KUEUE_SCHEMAS:
        return [f"{where}: not a Kueue object this deployment uses"]
    errors = schema_errors(obj, KUEUE_SCHEMAS[obj["kind"]], where)
    if isinstance(obj.get("metadata"), dict):
        errors += metadata_errors(obj, where)
    return errors


def object_errors(obj: Any, where: str = "object") -> list[str]:
    """Any manifest of this deployment: Kueue objects by schema, the rest by the Kubernetes models."""
    if isinstance(obj, dict) and str(obj.get("apiVersion", "")).startswith("kueue.x-k8s.io/"):
        return kueue_object_errors(obj, where)
    return core_object_errors(obj, where)


# ----------------------------------------------------------------------------------------------
# Label selectors and quantities


def selector_matches(selector: dict | None, labels: dict[str, str]) -> bool:
    """metav1.LabelSelector semantics: None selects nothing, {} selects everything."""
    if selector is None:
        return False
    if any(labels.get(k) != v for k, v in (selector.get("matchLabels") or {}).items()):
        return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def qty(value: Any) -> float:
    return float(_parse_quantity(value))


# ----------------------------------------------------------------------------------------------
# IAM policies for S3: a checker of what each role grants, and an evaluator of single requests

OBJECT_READ = {"s3:GetObject"}
OBJECT_WRITE = {"s3:PutObject", "s3:AbortMultipartUpload"}
OBJECT_DELETE = {"s3:DeleteObject"}
BUCKET_LIST = {"s3:ListBucket"}
S3_ARN = "arn:aws:s3:::"


@dataclass
class RoleSpec:
    """What a role may do: S3 locations as ``bucket/prefix/``. ``list``: where it may list, either a
    bucket alone (the whole bucket, no condition needed) or ``bucket/prefix`` (s3:ListBucket limited by
    an ``s3:prefix`` condition to listings under that prefix)."""

    read: set[str] = field(default_factory=set)
    write: set[str] = field(default_factory=set)
    delete: set[str] = field(default_factory=set)
    list: set[str] = field(default_factory=set)


def _as_list(value: Any) -> list:
    return value if isinstance(value, list) else [value]


def policy_errors(doc: Any, spec: RoleSpec) -> list[str]:
    """Everything the policy grants beyond ``spec``, and any construct that hides what it grants."""
    if not isinstance(doc, dict) or doc.get("Version") != "2012-10-17":
        return ['policy: Version must be "2012-10-17"']
    statements = doc.get("Statement")
    if not isinstance(statements, list) or not statements:
        return ["policy: Statement must be a non-empty list"]
    errors = []
    allowed = {**{a: spec.read for a in OBJECT_READ}, **{a: spec.write for a in OBJECT_WRITE}}
    allowed |= {a: spec.delete for a in OBJECT_DELETE} | {a: spec.list for a in BUCKET_LIST}
    for i, st in enumerate(statements):
        where = f"Statement[{i}] {st.get('Sid', '')}".strip()
        extra = set(st) - {"Sid", "Effect", "Action", "Resource", "Condition"}
        if extra:
            errors.append(f"{where}: unexpected {sorted(extra)} (NotAction/NotResource/Principal hide grants)")
        if st.get("Effect") != "Allow":
            errors.append(f"{where}: only Allow statements are expected")
        actions = _as_list(st.get("Action", []))
        if "Condition" in st and set(actions) - BUCKET_LIST:
            # the only condition these roles need is the listing's s3:prefix; elsewhere it hides what is granted
            errors.append(f"{where}: a Condition may only limit s3:ListBucket, not {sorted(set(actions) - BUCKET_LIST)}")
        for action in actions:
            if action not in allowed:
                errors.append(f"{where}: action {action!r} is not an explicit, known S3 action for this store")
                continue
            for resource in _as_list(st.get("Resource", [])):
                if not isinstance(resource, str) or not resource.startswith(S3_ARN):
                    errors.append(f"{where}: resource {resource!r} is not an S3 ARN")
                    continue
                path = resource[len(S3_ARN) :]
                if any(c in path[:-1] for c in "*?") or path in ("", "*"):
                    errors.append(f"{where}: resource {resource!r} has a wildcard before its end")
                    continue
                if action in BUCKET_LIST:
                    if "/" in path:
                        errors.append(f"{where}: {action} on {resource!r}, not a bucket: role may list only {sorted(spec.list)}")
                    else:
                        errors += _listing_errors(where, path, st.get("Condition"), spec.list)
                    continue
                if "/" not in path:
                    errors.append(f"{where}: {action} needs object ARNs (bucket/key), got bucket {resource!r}")
                    continue
                prefix = path.removesuffix("*")
                if not any(prefix.startswith(p) for p in allowed[action]):
                    errors.append(f"{where}: {action} on {resource!r} is outside {sorted(allowed[action]) or 'nothing'}")
    return errors


def _listing_errors(where: str, bucket: str, condition: Any, may_list: set[str]) -> list[str]:
    """What an s3:ListBucket on ``bucket`` under ``condition`` lists beyond ``may_list``. The one
    condition form accepted: StringLike or StringEquals on ``s3:prefix``, each value a prefix inside
    one of the role's (``p/*``: everything under it; ``p``: the folder's own key, which a HEAD of it
    and a listing of ``p`` without the slash name)."""
    scope = f"role may list only {sorted(may_list)}"
    if condition is None:
        return [] if bucket in may_list else [f"{where}: s3:ListBucket on the whole bucket {bucket!r}: {scope}"]
    form = f"{where}: s3:ListBucket condition {condition!r} is not one StringLike/StringEquals on s3:prefix"
    if not isinstance(condition, dict) or len(condition) != 1 or next(iter(condition)) not in ("StringLike", "StringEquals"):
        return [form]
    ((operator, keys),) = condition.items()
    if not isinstance(keys, dict) or [k.lower() for k in keys] != ["s3:prefix"]:
        return [form]
    if bucket in may_list:
        return []  # the whole bucket may be listed: a condition only narrows it
    prefixes = [p[len(bucket) + 1 :] for p in may_list if p.startswith(f"{bucket}/")]
    errors = []
    for value in _as_list(next(iter(keys.values()))):
        literal = value
        if operator == "StringLike" and isinstance(value, str):
            if "?" in value or "*" in value[:-1] or "${" in value:
                errors.append(f"{where}: s3:prefix {value!r} has a wildcard before its end")
                continue
            literal = value.removesuffix("*")
        inside = isinstance(value, str) and any(
            literal.startswith(p) or (literal == value and p.endswith("/") and value == p[:-1]) for p in prefixes
        )
        if not inside:
            errors.append(f"{where}: s3:ListBucket on {bucket!r} with s3:prefix {value!r}: {scope}")
    return errors


class PolicyEvaluationError(ValueError):
    """A policy holds something the evaluator does not model (an operator, condition key, element or
    value). Raised, never skipped: a skipped Allow could hide a grant, a skipped Deny a refusal."""


# The condition operators decided here, with IAM's semantics. Anything else raises: Numeric*, Date*,
# IpAddress, the negated String forms, ...IfExists, ForAnyValue:/ForAllValues: set operators.
CONDITION_OPERATORS = ("StringEquals", "StringLike", "Bool", "Null")
# The condition keys a request here carries (lowercase: IAM compares key names case-insensitively):
# ListBucket's s3:prefix; PutObject's conditional headers and whether it creates an object.
S3_CONDITION_KEYS = frozenset({"s3:prefix", "s3:if-match", "s3:if-none-match", "s3:objectcreationoperation"})
_STATEMENT_ELEMENTS = {"Sid", "Effect", "Principal", "Action", "NotAction", "Resource", "NotResource", "Condition"}


def iam_match(pattern: str, value: str, *, ignore_case: bool = False) -> bool:
    """IAM wildcard matching: ``*`` any run of characters (``/`` included, or none), ``?`` exactly one,
    anything else literal (unlike fnmatch, ``[...]`` is no character class)."""
    if not isinstance(pattern, str) or "${" in pattern:
        raise PolicyEvaluationError(f"{pattern!r}: not a plain pattern (policy variables are not evaluated here)")
    regex = "".join(".*" if c == "*" else "." if c == "?" else re.escape(c) for c in pattern)
    return re.fullmatch(regex, value, re.DOTALL | (re.IGNORECASE if ignore_case else 0)) is not None


def _condition_values(operator: str, key: str, values: Any, where: str) -> list[str]:
    """The values of one key, as strings (Bool and Null: lowercase ``true``/``false``); raises on others."""
    listed = _as_list(values)
    if operator in ("Bool", "Null"):
        out = [str(v).lower() for v in listed if isinstance(v, (str, bool))]
        if len(out) != len(listed) or not out or set(out) - {"true", "false"}:
            raise PolicyEvaluationError(f"{where}: {operator} {key!r} takes true or false, got {values!r}")
        return out
    if not listed or not all(isinstance(v, str) and "${" not in v for v in listed):
        raise PolicyEvaluationError(f"{where}: {operator} {key!r} takes plain strings (no policy variables), got {values!r}")
    return listed


def check_condition(condition: Any, known_keys: frozenset[str] = S3_CONDITION_KEYS, where: str = "Condition") -> None:
    """Raise PolicyEvaluationError unless ``condition_holds`` decides every operator, key and value of ``condition``."""
    if not isinstance(condition, dict) or not condition:
        raise PolicyEvaluationError(f"{where}: a Condition is a non-empty object of operators, got {condition!r}")
    for operator, keys in condition.items():
        if operator not in CONDITION_OPERATORS:
            raise PolicyEvaluationError(
                f"{where}: condition operator {operator!r} is not one this evaluator decides ({', '.join(CONDITION_OPERATORS)})"
            )
        if not isinstance(keys, dict) or not keys:
            raise PolicyEvaluationError(f"{where}: {operator} must map condition keys to values, got {keys!r}")
        for key, values in keys.items():
            if not isinstance(key, str) or key.lower() not in known_keys:
                carried = ", ".join(sorted(known_keys))
                raise PolicyEvaluationError(
                    f"{where}: condition key {key!r} ({operator}) is not one a request here carries: {carried}"
                )
            _condition_values(operator, key, values, where)


def condition_holds(condition: Any, context: Mapping[str, str], known_keys: frozenset[str] = S3_CONDITION_KEYS) -> bool:
    """Whether ``condition`` holds for a request whose condition keys are ``context``: every operator,
    and every key under it, must hold (AND); a key given several values holds if one does (OR). A key
    missing from ``context`` is one the request does not carry: StringEquals, StringLike and Bool fail
    on it, Null ``true`` holds. Raises PolicyEvaluationError on anything ``check_condition`` rejects."""
    check_condition(condition, known_keys)
    request = {}
    for key, value in context.items():
        if not isinstance(value, str):  # a multi-valued key would need ForAnyValue/ForAllValues
            raise PolicyEvaluationError(f"request context {key!r}: {value!r} is not one string")
        request[key.lower()] = value
    for operator, keys in condition.items():
        for key, values in keys.items():
            actual = request.get(key.lower())
            expected = _condition_values(operator, key, values, "Condition")
            if operator == "Null":
                holds = any((actual is None) == (v == "true") for v in expected)
            elif actual is None:
                holds = False
            elif operator == "StringEquals":
                holds = actual in expected
            elif operator == "StringLike":
                holds = any(iam_match(v, actual) for v in expected)
            else:  # Bool
                holds = actual.lower() in expected
            if not holds:
                return False
    return True


def check_policy(doc: Any, known_keys: frozenset[str] = S3_CONDITION_KEYS) -> list[dict]:
    """The statements of ``doc``, once each was checked to hold only what the evaluator decides (else
    PolicyEvaluationError): Effect Allow or Deny, Action or NotAction, Resource or NotResource, a
    Principal of everyone (a bucket policy's ``*``), conditions ``check_condition`` accepts. The whole
    document is checked on every evaluation, so that a statement no request reached cannot hide anything."""
    statements = doc.get("Statement") if isinstance(doc, dict) else None
    if not isinstance(statements, (list, dict)) or not statements:
        raise PolicyEvaluationError(f"policy: Statement must be a statement or a non-empty list, got {statements!r}")
    statements = _as_list(statements)
    for i, st in enumerate(statements):
        if not isinstance(st, dict):
            raise PolicyEvaluationError(f"Statement[{i}]: not an object: {st!r}")
        where = f"Statement[{i}] {st.get('Sid', '')}".strip()
        unknown = set(st) - _STATEMENT_ELEMENTS
        if unknown:
            raise PolicyEvaluationError(f"{where}: elements {sorted(unknown)} are not evaluated here")
        if st.get("Effect") not in ("Allow", "Deny"):
            raise PolicyEvaluationError(f"{where}: Effect must be Allow or Deny, got {st.get('Effect')!r}")
        for positive, negative in (("Action", "NotAction"), ("Resource", "NotResource")):
            if (positive in st) == (negative in st):
                raise PolicyEvaluationError(f"{where}: exactly one of {positive} and {negative}")
            for pattern in _as_list(st.get(positive, st.get(negative))):
                iam_match(pattern, "")  # raises on a non-string or a policy variable
        if "Principal" in st and st["Principal"] not in ("*", {"AWS": "*"}):
            raise PolicyEvaluationError(f"{where}: Principal {st['Principal']!r}: only everyone ('*') is evaluated here")
        if "Condition" in st:
            check_condition(st["Condition"], known_keys, where)
    return statements


def matching_statements(doc: dict, action: str, arn: str, context: Mapping[str, str] | None = None) -> list[dict]:
    """The statements of ``doc`` that apply to ``action`` on ``arn`` for a request carrying the condition
    keys ``context``: action (case-insensitive) and resource (case-sensitive) match with IAM wildcards,
    NotAction/NotResource match what they do not name, and the Condition, if any, holds."""
    out = []
    for st in check_policy(doc):
        if "Action" in st:
            acts = any(iam_match(a, action, ignore_case=True) for a in _as_list(st["Action"]))
        else:
            acts = not any(iam_match(a, action, ignore_case=True) for a in _as_list(st["NotAction"]))
        if "Resource" in st:
            on = any(iam_match(r, arn) for r in _as_list(st["Resource"]))
        else:
            on = not any(iam_match(r, arn) for r in _as_list(st["NotResource"]))
        if acts and on and ("Condition" not in st or condition_holds(st["Condition"], context or {})):
            out.append(st)
    return out


def policy_allows(doc: dict, action: str, arn: str, context: Mapping[str, str] | None = None) -> bool:
    """IAM's decision for one request under one policy: an explicit Deny that applies wins, else an
    Allow that applies grants, else it is denied. ``context``: the request's condition keys, e.g.
    ``{"s3:prefix": "store/production/runs/"}`` for a ListObjectsV2 with that Prefix (none: a listing
    without one). Raises PolicyEvaluationError on a policy it cannot fully evaluate (``check_policy``)."""
    applying = matching_statements(doc, action, arn, context)
    return not any(st["Effect"] == "Deny" for st in applying) and any(st["Effect"] == "Allow" for st in applying)


# ----------------------------------------------------------------------------------------------
# Flyte: Helm tpl escapes and cluster resource templates

HELM_RAW = re.compile(r"\{\{`(.*?)`\}\}", re.S)
FLYTE_VAR = re.compile(r"\{\{ ?([A-Za-z0-9_]+) ?\}\}")


def helm_tpl(value: Any, path: str = "") -> tuple[Any, list[str]]:
    """``value`` as Helm's ``tpl`` renders it, for values that use only raw-string escapes ``{{`...`}}``.

    Any other ``{{`` would be evaluated by Helm (``{{ project }}`` fails: function "project" not defined).
    """
    if isinstance(value, dict):
        out, errors = {}, []
        for k, v in value.items():
            out[k], e = helm_tpl(v, f"{path}.{k}")
            errors += e
        return out, errors
    if isinstance(value, list):
        rendered = [helm_tpl(v, f"{path}[{i}]") for i, v in enumerate(value)]
        return [r for r, _ in rendered], [e for _, es in rendered for e in es]
    if isinstance(value, str):
        if "{{" in HELM_RAW.sub("", value) or "}}" in HELM_RAW.sub("", value):
            return value, [f"{path}: {value!r} would be evaluated by Helm's tpl: escape it as {{{{`...`}}}}"]
        return HELM_RAW.sub(lambda m: m.group(1), value), []
    return value, []


def custom_data(values: dict) -> dict[str, dict[str, str]]:
    """cluster_resources.customData as {domain: {variable: value}}."""
    out: dict[str, dict[str, str]] = {}
    for entry in values["configuration"]["inline"]["cluster_resources"]["customData"]:
        for domain, variables in entry.items():
            for var in variables:
                for name, source in var.items():
                    assert set(source) == {"value"}, f"customData {domain}.{name}: expected {{value: ...}}, got {source}"
                    out.setdefault(domain, {})[name] = str(source["value"])
    return out


def render_flyte_template(text: str, project: str, domain: str, namespace: str, data: dict[str, str]) -> tuple[str, list]:
    """What flyteadmin's cluster resource controller applies: literal ``{{ var }}`` substitution."""
    variables = {"namespace": namespace, "project": project, "domain": domain, **data}
    for name, value in variables.items():
        text = text.replace(f"{{{{ {name} }}}}", value)
    return text, sorted(set(FLYTE_VAR.findall(text)))


def namespace_for(values: dict, project: str, domain: str) -> str:
    template, errors = helm_tpl(values["configuration"]["inline"]["namespace_mapping"]["template"])
    assert not errors, errors
    return template.replace("{{ project }}", project).replace("{{ domain }}", domain)


@cache
def flyte_values() -> dict:
    (values,) = load_docs("flyte/values.yaml")
    return values


def rendered_cluster_resources(project: str = PROJECT) -> dict[str, list[tuple[str, dict]]]:
    """{namespace: [(template file, object)]} as Flyte's cluster resource manager renders them."""
    values = flyte_values()
    data = custom_data(values)
    out: dict[str, list[tuple[str, dict]]] = {}
    for domain in DOMAINS:
        namespace = namespace_for(values, project, domain)
        for name, text in sorted(values["clusterResourceTemplates"]["inline"].items()):
            rendered, unresolved = render_flyte_template(text, project, domain, namespace, data.get(domain, {}))
            assert not unresolved, f"{name} in {domain}: no value for {unresolved} in customData"
            out.setdefault(namespace, []).append((name, yaml.safe_load(rendered)))
    return out


# ----------------------------------------------------------------------------------------------
# The MLflow tracking servers (infra/mlflow): one Helm release of the community-charts chart per domain

MLFLOW_NAMESPACE = "mlflow"
MLFLOW_CHART_VERSION = re.compile(r"community-charts/mlflow --version (\d+\.\d+\.\d+)\b")


def mlflow_release(domain: str) -> str:
    """The Helm release of a domain's server (infra/README.md, "Install")."""
    return f"mlflow-{domain}"


def helm_merge(base: Any, override: Any) -> Any:
    """``helm -f base -f override``: mappings merge key by key, anything else (lists too) is replaced;
    a null deletes the key."""
    if not isinstance(base, dict) or not isinstance(override, dict):
        return copy.deepcopy(override)
    merged = copy.deepcopy(base)
    for key, value in override.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = helm_merge(merged.get(key), value)
    return merged


def mlflow_values(domain: str) -> dict:
    """What release mlflow-<domain> is installed with: infra/mlflow/values.yaml, then infra/mlflow/<domain>.yaml."""
    ((shared,), (own,)) = load_docs("mlflow/values.yaml"), load_docs(f"mlflow/{domain}.yaml")
    return helm_merge(shared, own)


def chart_fullname(release: str, values: dict, chart: str = "mlflow") -> str:
    """The chart's ``mlflow.fullname`` (the standard Helm helper): the name of its Service and Deployment."""
    if values.get("fullnameOverride"):
        return str(values["fullnameOverride"])[:63].rstrip("-")
    name = values.get("nameOverride") or chart
    return (release if name in release else f"{release}-{name}")[:63].rstrip("-")


# ----------------------------------------------------------------------------------------------
# What registration produces: cluster profiles, labels, images

CLUSTER_PROFILES = sorted((ROOT / "configs" / "cluster").glob("*.yaml"))
REGISTERED_PROFILE = ROOT / "configs" / "cluster" / "gpu-2x8.yaml"  # the profile infra/README.md registers with
FACTS_SCRIPT = """
import dataclasses, json, sys
from pipeline.cluster import load_cluster
from tasks import placement
from workflows.pretrain import pretrain_default, pretrain_nightly

def image(spec):
    fields = [f.name for f in dataclasses.fields(spec)]
    return {name: getattr(spec, name) for name in fields if isinstance(getattr(spec, name), (str, list, type(None)))}

profiles = {}
for path in sys.argv[1:]:
    cluster = load_cluster(path)
    image_spec = placement.training_image(cluster)
    kinds = {"data": placement.data_task, "train": placement.train_task,
             "evaluate": placement.evaluate_task, "registry": placement.registry_task}
    profiles[path] = {
        "pod_labels": placement.train_task(cluster)["pod_template"].labels,
        "service_accounts": {k: f(cluster)["pod_template"].pod_spec.service_account_name for k, f in kinds.items()},
        "training_image": image(image_spec),
    }
plans = {"pretrain_default": pretrain_default, "pretrain_nightly": pretrain_nightly}
print(json.dumps({
    "launch_plan_labels": {name: plan.labels.values for name, plan in plans.items()},
    "module_pod_labels": placement.train_task()["pod_template"].labels,
    "profiles": profiles,
    "cuda_base": placement.CUDA_BASE,
    "train_packages": placement.TRAIN_PACKAGES,
    "python": "%d.%d" % sys.version_info[:2],
}))
"""


@cache
def cluster_profiles() -> dict[str, Any]:
    """Each configs/cluster/*.yaml as pipeline.cluster.load_cluster reads it."""
    from pipeline.cluster import load_cluster

    return {p.stem: load_cluster(str(p)) for p in CLUSTER_PROFILES}


@cache
def registration_facts() -> dict[str, Any]:
    """What `PRETRAIN_CLUSTER=configs/cluster/gpu-2x8.yaml pyflyte register` sees, from a fresh interpreter
    (the launch plans' labels are fixed at import): the launch plans' labels, and for every profile the
    labels of tasks.placement.pod_template() and the training ImageSpec."""
    command = [sys.executable, "-c", FACTS_SCRIPT, *map(str, CLUSTER_PROFILES)]
    env = {**os.environ, "PRETRAIN_CLUSTER": str(REGISTERED_PROFILE)}
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=180)
    assert result.returncode == 0, result.stderr[-3000:]
    facts = json.loads(result.stdout.strip().splitlines()[-1])
    facts["profiles"] = {Path(path).stem: f for path, f in facts["profiles"].items()}
    return facts


def train_with_slow_rank(slow_rank: int, delay_s: float, *args):
    """``training.train.train(*args)`` with rank ``slow_rank``'s every batch read ``delay_s`` slower (a
    slow disk on one node): the straggler the exchange must name. The other ranks are untouched."""
    import time

    import training.data
    from training.train import train

    if int(os.environ.get("RANK", "0")) == slow_rank:
        original = training.data.StreamingLoader.batch

        def slow_batch(self, *batch_args, **batch_kwargs):
            time.sleep(delay_s)
            return original(self, *batch_args, **batch_kwargs)

        training.data.StreamingLoader.batch = slow_batch
    return train(*args)


# ----------------------------------------------------------------------------------------------
# Faults injected into training ranks (run by ``training.launch.launch`` in each spawned rank)


def copy_run(source: Store, run: str, dest: Store, new_run: str = "") -> str:
    """Copy every object of the run ``run`` (``runs/<id>``) to ``dest`` through the store API, as
    ``new_run`` (default: the same prefix); returns the new prefix."""
    new_run = new_run or run
    for key in source.list(f"{run}/"):
        dest.put_bytes(f"{new_run}{key[len(run) :]}", source.get_bytes(key))
    return new_run


def train_with_bad_loss(bad_step: int, bad_ranks: tuple[int, ...] | None, *args):
    """``training.train.train(*args)`` with step ``bad_step``'s loss (1-based) made NaN on the ranks
    ``bad_ranks`` (None: all of them).

    The loss function both step implementations call (``training.model.layers.mean_token_loss``: LocalStep
    through ``training.model.gpt.mean_loss``, MegatronStep in its forward step) returns NaN, so its
    gradients are NaN too and the step's data-parallel mean reaches ``TrainStep.step``'s accept hook
    as a bad batch's would. The step is the one whose batch the loader last handed out.
    """
    import training.model.layers
    from training.data import StreamingLoader
    from training.train import train

    rank = int(os.environ.get("RANK", "0"))
    batch, loss = StreamingLoader.batch, training.model.layers.mean_token_loss
    current = {"step": 0}

    def batch_of_step(self, step: int, *a, **kw):
        current["step"] = step + 1
        return batch(self, step, *a, **kw)

    def bad_loss(*a, **kw):
        value = loss(*a, **kw)
        bad = current["step"] == bad_step and (bad_ranks is None or rank in bad_ranks)
        return value * float("nan") if bad else value

    StreamingLoader.batch = batch_of_step
    training.model.layers.mean_token_loss = bad_loss
    return train(*args)


# ----------------------------------------------------------------------------------------------
# Hang diagnostics: a rank that stops or hangs in a chosen phase of a chosen step


def call_by_name(target: str, *args: Any) -> Any:
    """``module:function`` (``target``) called with ``args``, imported where it runs. ``start_launch``'s launcher
    only starts spawned ranks: given the function itself, unpickling it loaded what the ranks run
    (``training.train``: megatron-core, about 3 CPU-s per launch) in a process that never calls it."""
    module, name = target.split(":")
    return getattr(importlib.import_module(module), name)(*args)


def start_launch(tmp_path: Path, fn, nproc: int, *args, env: dict | None = None, log_name: str = "train.log") -> subprocess.Popen:
    """``launch(fn, nproc, *args)`` in its own process group, for any importable ``fn`` (``train``, a
    ``train_with_*`` fault injector); stdout and stderr go to ``log_name``."""
    spec = tmp_path / f"{log_name}.pickle"
    spec.write_bytes(pickle.dumps((call_by_name, nproc, f"{fn.__module__}:{fn.__qualname__}", *args)))
    log = open(tmp_path / log_name, "wb")
    return subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(spec)],
        cwd=ROOT,
        stdout=log,
        stderr=subprocess.STDOUT,
        env={**os.environ, **(env or {})},
        start_new_session=True,
    )


@dataclass(frozen=True)
class Stall:
    """Rank ``rank`` stalls on entering ``phase`` (a ``training.observe.timing.PHASES`` name) of step ``step``
    (1-based): ``"stop"`` SIGSTOPs it (a hung node: it cannot run anything, its watchdog included),
    ``"hang"`` sleeps in the phase for an hour (a read that never returns: its watchdog still runs)."""

    how: str
    rank: int
    step: int
    phase: str


# Started by a rank before it stops itself: it SIGKILLs that rank once its peers have exited, as the
# launcher's SIGTERM cannot end a stopped process (the launcher would wait 30 s more, then SIGKILL it).
_RELEASE = (
    "import signal, sys, psutil\n"
    "me = psutil.Process(int(sys.argv[1]))\n"
    "peers = [p for p in me.parent().children() if p.pid != me.pid and 'spawn_main' in ' '.join(p.cmdline())]\n"
    "psutil.wait_procs(peers, timeout=float(sys.argv[2]))\n"
    "me.send_signal(signal.SIGKILL)\n"
)


def train_with_stall(stall: Stall, *args):
    """``training.train.train(*args)`` with ``stall`` injected: run in the spawned ranks."""
    from training.observe.timing import StepTimer
    from training.train import train

    if int(os.environ.get("RANK", "0")) == stall.rank:
        original = StepTimer.phase

        @contextmanager
        def phase(timer, name: str):
            with original(timer, name):  # the rank's progress says it is in this phase
                if name == stall.phase and timer.step == stall.step:
                    _stall(stall.how)
                yield

        StepTimer.phase = phase
    return train(*args)


def _stall(how: str) -> None:
    import time

    if how == "hang":
        time.sleep(3600)
    elif how == "stop":
        time.sleep(2.5)  # the watchdog thread publishes the phase's heartbeat (it polls every second)
        subprocess.Popen([sys.executable, "-c", _RELEASE, str(os.getpid()), "300"], cwd=ROOT)
        os.kill(os.getpid(), signal.SIGSTOP)
    else:
        raise ValueError(f"unknown stall {how!r}: use 'stop' or 'hang'")


# ----------------------------------------------------------------------------------------------
# Which rank failed first: one rank raises at a chosen step, through training.launch and through
# Flyte's Elastic task plugin


def train_with_error(fail_step: int, fail_rank: int, *args):
    """``training.train.train(*args)`` where rank ``fail_rank`` raises ``ValueError("boom at step N")``
    as it fetches step ``fail_step``'s batch (1-based): run in the spawned ranks. Its peers go on into
    the step's collectives and fail there when the failing rank's connections close."""
    from training.data import StreamingLoader
    from training.train import train

    if int(os.environ.get("RANK", "0")) == fail_rank:
        batch = StreamingLoader.batch

        def batch_or_boom(self, step: int, *a, **kw):
            if step + 1 == fail_step:
                raise ValueError(f"boom at step {fail_step}")
            return batch(self, step, *a, **kw)

        StreamingLoader.batch = batch_or_boom
    return train(*args)


def train_with_fault(kind: str, fail_step: int, fail_rank: int, attempts: set[int], *args):
    """``training.train.train(*args)`` where rank ``fail_rank``, in the attempts numbered ``attempts`` (0: the
    first; torch elastic's restart count), meets a fault as it fetches step ``fail_step``'s batch: ``kill``
    (SIGKILL of its own process: a rank lost, recorded nowhere) or ``raise`` (``ValueError("boom at step N")``)."""
    from training.data import StreamingLoader
    from training.train import train

    attempt = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    if int(os.environ.get("RANK", "0")) == fail_rank and attempt in attempts:
        batch = StreamingLoader.batch

        def batch_or_fault(self, step: int, *a, **kw):
            if step + 1 == fail_step:
                if kind == "kill":
                    os.kill(os.getpid(), signal.SIGKILL)
                raise ValueError(f"boom at step {fail_step}")
            return batch(self, step, *a, **kw)

        StreamingLoader.batch = batch_or_fault
    return train(*args)


def elastic_train_with_error(dataset: DatasetRef, fail_step: int, fail_rank: int, steps: int) -> CheckpointRef:
    """A Flyte task function (see ``elastic_task``): ``train_with_error`` on the tiny model, data-parallel."""
    from training.config import ParallelConfig, TrainConfig

    parallel = ParallelConfig(tensor_parallel=1, collective_timeout_s=300)  # a loaded machine: not a test of timeouts
    cfg = TrainConfig(steps=steps, micro_batch_size=4, global_batch_size=8, warmup_steps=1, checkpoint_every=steps, seed=18)
    return train_with_error(fail_step, fail_rank, dataset, tiny_model(), parallel, cfg)


def elastic_task(fn, task_config):
    """``fn`` (a module-level function of this module) as a Flyte task with ``task_config`` (an
    ``Elastic``): calling it runs Flyte's local execution of the plugin, which launches the ranks."""
    from flytekit import task

    return task(task_config=task_config)(fn)


# ----------------------------------------------------------------------------------------------
# Retention (pretrain gc) while a run trains: checkpoints that stay uncommitted for a while


def train_with_slow_uploads(delay_s: float, *args):
    """``training.train.train(*args)`` where every checkpoint file uploaded to a local store is followed
    by ``delay_s`` of sleep (run in the spawned ranks): each checkpoint stays uncommitted in the store,
    half uploaded, long enough for whoever looks at the store meanwhile (``pretrain gc``) to see it."""
    import time

    from storage.local import LocalStore
    from training.train import train

    put_file = LocalStore.put_file

    def slow_put_file(self, key: str, path, *, if_absent: bool = False) -> None:
        put_file(self, key, path, if_absent=if_absent)
        if "/checkpoints/" in key:
            time.sleep(delay_s)

    LocalStore.put_file = slow_put_file
    return train(*args)


# ----------------------------------------------------------------------------------------------
# Identical executions (tests/test_identical_runs.py): a registration killed before its commit


def register_killed_before_commit(store_uri: str, loss: float, config: dict) -> None:
    """Run in a subprocess: ``register`` of ``report(loss)`` that SIGKILLs its own process when it
    commits the registry entry, i.e. after every file of the version was copied and its card written."""
    from registry import registry

    store = open_store(store_uri)
    commit = type(store).commit

    def die_at_entry_commit(self, prefix: str, info: dict | None = None) -> None:
        if prefix.startswith("models/"):
            os.kill(os.getpid(), signal.SIGKILL)
        commit(self, prefix, info)

    type(store).commit = die_at_entry_commit
    registry.register(store, "gpt", report(loss), config=config)


# ----------------------------------------------------------------------------------------------
# A full store (tests/test_store_full.py): a tmpfs of a chosen size


@contextmanager
def tmpfs(folder: Path, size: str) -> Iterator[Path]:
    """``folder`` as a tmpfs of ``size`` (``mount -o size=``: "3m") for the block, always unmounted.

    Skips the test where this process may not mount (root or CAP_SYS_ADMIN is needed; CI runs as root)."""
    folder.mkdir(parents=True, exist_ok=True)
    try:
        command = ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)]
        mounted = subprocess.run(command, capture_output=True, text=True)
    except FileNotFoundError:
        pytest.skip("no 'mount' command: a tmpfs store needs it (and root or CAP_SYS_ADMIN)")
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs at {folder}: needs root or CAP_SYS_ADMIN ({mounted.stderr.strip()})")
    try:
        yield folder
    finally:
        if subprocess.run(["umount", str(folder)], capture_output=True).returncode != 0:
            subprocess.run(["umount", "--lazy", str(folder)], check=True)  # a file still open: detach now, free later


def resize_tmpfs(folder: Path, size: str) -> None:
    """Grow or shrink the tmpfs at ``folder``, keeping its files (space freed as an operator would)."""
    subprocess.run(["mount", "-o", f"remount,size={size}", str(folder)], check=True, capture_output=True)


def fill_up(folder: Path, chunk: int = 64 * 1024) -> Path:
    """Write ``folder/filler`` until its filesystem is full (ENOSPC); the file, to delete for space."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as f:
        try:
            while True:
                f.write(b"\0" * chunk)
        except OSError as e:
            if e.errno != 28:  # ENOSPC
                raise
    with open(filler, "ab", buffering=0) as f:  # the last pages a smaller write still fits in
        try:
            while True:
                f.write(b"\0" * 512)
        except OSError as e:
            if e.errno != 28:
                raise
    return filler


def temp_leftovers(root: Path) -> list[str]:
    """Temporary files a write left under ``root`` (the store's ``.tmp-*``, downloads' ``*.part``;
    not the compare-and-swap lock files, which stay by design)."""
    from storage.store import LOCK_NAME

    left = (p for p in root.rglob("*") if (p.name.startswith(".tmp-") and p.name != LOCK_NAME) or p.name.endswith(".part"))
    return sorted(p.relative_to(root).as_posix() for p in left)


# ----------------------------------------------------------------------------------------------
# A rank's user error reaches the caller as one line (tests/test_rank_user_errors.py)

RANK_DATA_PROBLEM = "shard train-000000.tar: a sample of step {step} holds token ids beyond the vocabulary; prepare it again"


def train_with_data_problem(fail_step: int, fail_rank: int, *args):
    """``training.train.train(*args)`` where rank ``fail_rank`` raises ``data_prep.sources.DataError`` (a
    UserError: a problem the user can fix, found on one rank) as it fetches step ``fail_step``'s batch."""
    from data_prep.errors import DataError
    from training.data import StreamingLoader
    from training.train import train

    if int(os.environ.get("RANK", "0")) == fail_rank:
        batch = StreamingLoader.batch

        def batch_or_problem(self, step: int, *a, **kw):
            if step + 1 == fail_step:
                raise DataError(RANK_DATA_PROBLEM.format(step=fail_step))
            return batch(self, step, *a, **kw)

        StreamingLoader.batch = batch_or_problem
    return train(*args)


def elastic_train_with_data_problem(dataset: DatasetRef, fail_step: int, fail_rank: int, steps: int) -> CheckpointRef:
    """A Flyte task function (see ``elastic_task``): ``train_with_data_problem`` on the tiny model, data-parallel."""
    from training.config import ParallelConfig, TrainConfig

    parallel = ParallelConfig(tensor_parallel=1, collective_timeout_s=300)  # a loaded machine: not a test of timeouts
    cfg = TrainConfig(steps=steps, micro_batch_size=4, global_batch_size=8, warmup_steps=1, checkpoint_every=steps, seed=18)
    return train_with_data_problem(fail_step, fail_rank, dataset, tiny_model(), parallel, cfg)


def fill_once_present(
    proc: subprocess.Popen, marker: str, root: Path, disk: Path, leave: int, timeout: float = 600, gone: str = ""
) -> Path:
    """Wait (while ``proc`` runs) until a file matching the glob ``marker`` is under ``root`` (and, with ``gone``,
    nothing matching that glob is left: files the stage removes after its marker, which would free space), then
    fill the filesystem of ``disk`` with ``disk/filler`` so that only ``leave`` bytes stay free: whatever the
    stages before it wrote, the space runs out in what comes after. Returns the filler; fails if ``proc`` ends
    first."""
    import time

    deadline = time.monotonic() + timeout
    while not list(root.glob(marker)) or (gone and list(root.glob(gone))):
        assert proc.poll() is None, f"the command ended (status {proc.returncode}) before {marker} appeared under {root}"
        assert time.monotonic() < deadline, f"{marker} did not appear under {root} within {timeout:g} s"
        time.sleep(0.05)
    filler = disk / "filler"
    with open(filler, "wb") as f:  # emptied before measuring: an earlier step's filler is space to fill again
        stat = os.statvfs(disk)
        remaining = stat.f_bavail * stat.f_frsize - leave
        while remaining > 0:
            remaining -= f.write(b"\0" * min(remaining, 1 << 20))
    return filler


# ----------------------------------------------------------------------------------------------
# Charts (reports.charts): reading matplotlib's SVG back. Each drawn series is a group <g id="...">
# (the artist's gid); a line is a <path d="M x y L x y ...">, markers are <use x= y=> of a marker
# path in <defs>, a filled area a <use> of its outline in <defs> moved by the use's x and y.

SVG = "{http://www.w3.org/2000/svg}"
XLINK_HREF = "{http://www.w3.org/1999/xlink}href"
_POINT = re.compile(r"[ML]\s+(-?[\d.]+(?:e[-+]?\d+)?)\s+(-?[\d.]+(?:e[-+]?\d+)?)")


def svg_root(svg: str):
    """The parsed ``<svg>`` element (fails on text that is not well-formed XML)."""
    import xml.etree.ElementTree as ET

    root = ET.fromstring(svg)
    assert root.tag == f"{SVG}svg", root.tag
    return root


def svg_group(root, gid: str):
    """The group matplotlib wrote for the artist whose gid is ``gid``, or None."""
    return next((g for g in root.iter(f"{SVG}g") if g.get("id") == gid), None)


def svg_ids(root, prefix: str) -> list[str]:
    """The ids of the groups whose id starts with ``prefix``, in drawing order."""
    return [g.get("id") for g in root.iter(f"{SVG}g") if (g.get("id") or "").startswith(prefix)]


def svg_texts(root) -> list[str]:
    """Every <text> of the figure (titles, axis labels, tick labels, legend entries), in order."""
    return ["".join(t.itertext()) for t in root.iter(f"{SVG}text")]


def svg_points(d: str, dx: float = 0.0, dy: float = 0.0) -> list[tuple[float, float]]:
    """The vertices (M and L commands) of a path's ``d``, moved by (dx, dy)."""
    return [(float(x) + dx, float(y) + dy) for x, y in _POINT.findall(d)]


def svg_lines(group) -> list[list[tuple[float, float]]]:
    """The vertices of every path drawn in ``group``: its own paths, and each <use> of a <defs> path moved by
    the use's offset (markers: the offsets are the markers' centres, see ``svg_marks``)."""
    defs = {p.get("id"): p.get("d") for d in group.iter(f"{SVG}defs") for p in d.iter(f"{SVG}path")}
    out = [svg_points(p.get("d")) for p in group.iter(f"{SVG}path") if p.get("id") not in defs]
    for use in group.iter(f"{SVG}use"):
        ref = (use.get(XLINK_HREF) or "").lstrip("#")
        if ref in defs:
            out.append(svg_points(defs[ref], float(use.get("x", 0)), float(use.get("y", 0))))
    return out


def svg_marks(group) -> list[tuple[float, float]]:
    """Where the markers of ``group`` are drawn: the (x, y) of each <use>."""
    return [(float(u.get("x", 0)), float(u.get("y", 0))) for u in group.iter(f"{SVG}use")]


def html_charts(html: str) -> list:
    """Every chart inlined in a Deck or report page, parsed (each must be well-formed SVG)."""
    return [svg_root(svg) for svg in re.findall(r"<svg.*?</svg>", html, re.DOTALL)]


def html_table(html: str, css_class: str) -> list[list[str]]:
    """The cells of each row (the header's <th> included) of the page's table of that class, as HTML text."""
    body = re.search(rf"<table class='{css_class}'>(.*?)</table>", html, re.DOTALL).group(1)
    return [re.findall(r"<t[dh][^>]*>(.*?)</t[dh]>", row) for row in body.split("</tr>")[:-1]]


# ----------------------------------------------------------------------------------------------
# MLflow: tracking databases and a real tracking server on 127.0.0.1


def init_tracking_db(path: Path) -> str:
    """A migrated SQLite MLflow database at ``path`` (its schema created once); returns its URI."""
    from mlflow import MlflowClient

    uri = f"sqlite:///{path}"
    MlflowClient(tracking_uri=uri).search_experiments(max_results=1)
    return uri


class MlflowServer:
    """``mlflow server`` on 127.0.0.1 over a SQLite database and an artifacts folder (a real server:
    gunicorn/uvicorn workers in its own process group, stopped as a whole)."""

    def __init__(self, root: Path, port: int = 0) -> None:
        self.root, self.port = root, port or free_port()
        self.db = root / "mlflow.db"
        self.process: subprocess.Popen | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self, timeout: float = 180.0) -> MlflowServer:
        import time
        import urllib.request

        command = [str(BIN / "mlflow"), "server", "--backend-store-uri", f"sqlite:///{self.db}", "--host", "127.0.0.1"]
        command += ["--port", str(self.port), "--workers", "1", "--artifacts-destination", str(self.root / "artifacts")]
        log = open(self.root / f"server-{self.port}.log", "ab")  # noqa: SIM115 - the server's for its lifetime
        # Without MLflow's GenAI job runner (a huey consumer per server, ~2 CPU-s each), as `pretrain ui` serves:
        # nothing of ours submits jobs, and the tracking API under test is the same.
        env = {**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"}
        self.process = subprocess.Popen(command, cwd=self.root, env=env, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                log_text = (self.root / f"server-{self.port}.log").read_text()[-3000:]
                raise RuntimeError(f"mlflow server exited {self.process.returncode}: {log_text}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=2) as answer:
                    if answer.status == 200:
                        return self
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise TimeoutError(f"mlflow server on {self.url} did not answer /health within {timeout:g} s")

    def stop(self) -> None:
        """Kill the server's whole process group (its workers too) and wait for the leader."""
        if self.process is not None and self.process.poll() is None:
            kill_group(self.process)
        self.process = None

    def get(self, path: str, **params: Any) -> dict:
        """A GET of MLflow's REST API (``/api/2.0/mlflow/<path>``), as JSON."""
        import urllib.parse
        import urllib.request

        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/2.0/mlflow/{path}?{query}", timeout=30) as answer:
            return json.loads(answer.read())

    def post(self, path: str, body: dict) -> dict:
        import urllib.request

        request = urllib.request.Request(
            f"{self.url}/api/2.0/mlflow/{path}", data=json.dumps(body).encode(), headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as answer:
            return json.loads(answer.read())

    def run_of(self, experiment: str, tag: str, value: str) -> dict:
        """The one run of ``experiment`` tagged ``tag = value`` (REST: experiments/get-by-name, runs/search)."""
        exp = self.get("experiments/get-by-name", experiment_name=experiment)["experiment"]["experiment_id"]
        found = self.post("runs/search", {"experiment_ids": [exp], "filter": f"tags.`{tag}` = '{value}'"}).get("runs", [])
        assert len(found) == 1, found
        return found[0]

    def metric_history(self, run_id: str, key: str) -> list[dict]:
        """Every point of a metric (REST: metrics/get-history, every page)."""
        points, token = [], ""
        while True:
            params = {"run_id": run_id, "metric_key": key, "max_results": 25000, **({"page_token": token} if token else {})}
            page = self.get("metrics/get-history", **params)
            points += page.get("metrics", [])
            token = page.get("next_page_token", "")
            if not token:
                return points


_ENGLISH = (
    "the of and to with that have be river garden morning teacher village window question answer market people "
    "history library evening family kitchen journey mountain letter winter summer friend student doctor picture music "
    "quietly carefully walked opened found wrote carried remembered explained noticed bright small old green careful "
    "warm early long story table bread water city school road"
).split()


def english_docs(n: int, seed: int = 0, sentences: int = 8, words_per_sentence: int = 12) -> list[str]:
    """``n`` distinct English-like documents (common words, stop words included; one sentence a
    line, each ending in a period): prose that the Gopher, C4 and FineWeb rules keep and that
    language identification calls English."""
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        lines = [" ".join(rng.choice(_ENGLISH) for _ in range(words_per_sentence)).capitalize() + "." for _ in range(sentences)]
        docs.append("\n".join(lines))
    return docs


# ----------------------------------------------------------------------------------------------
# Liger-Kernel, the peer of our Triton kernels (tests/test_kernels_liger.py)

# Liger modules that bind another module's kernels at import come after that module: a reload
# under the interpreter must see the reloaded (interpreted) kernels.
_LIGER_ORDER = ("utils", "cross_entropy", "rms_norm", "swiglu", "rope", "fused_linear_cross_entropy")


def load_liger(name: str) -> ModuleType:
    """``liger_kernel.ops.<name>``, with its @triton.jit kernels (and those it imports from other
    Liger modules) built for the interpreter if TRITON_INTERPRET=1, as `load_kernels` does ours."""
    # Imported outside interpreter mode, as in load_kernels: triton's own @jit helpers stay compiled.
    from triton.runtime.interpreter import InterpretedFunction

    def interpreted(module: ModuleType) -> set[bool]:  # of every kernel it launches, its own or imported
        return {isinstance(value, InterpretedFunction) for value in _all_kernels(module).values()}

    module = None
    with _interpreter_mode():
        for dependency in _LIGER_ORDER[: _LIGER_ORDER.index(name) + 1]:
            module = importlib.import_module(f"liger_kernel.ops.{dependency}")
            if interpret() and interpreted(module) != {True}:
                module = importlib.reload(module)
    assert module is not None and _all_kernels(module), f"liger_kernel.ops.{name} launches no Triton kernel"
    assert interpreted(module) == {interpret()}, f"liger_kernel.ops.{name}: interpreter mode does not match TRITON_INTERPRET"
    return module


def _all_kernels(module: ModuleType) -> dict[str, Any]:
    """The @triton.jit functions among ``module``'s globals, defined there or imported."""
    from triton.runtime.jit import KernelInterface

    return {name: value for name, value in vars(module).items() if isinstance(value, KernelInterface)}


@contextmanager
def count_all_launches(module: ModuleType, names: tuple[str, ...]) -> Iterator[Launches]:
    """`count_launches` over the kernels ``names`` that ``module`` launches by a global name, also
    those it imported (Liger's fused linear cross-entropy launches cross_entropy's kernel). Named,
    because a module's globals also hold @triton.jit device functions (Liger's ``silu``), which
    kernels call, not launch, and which must stay what they are."""
    with _spying(module, {name: _all_kernels(module)[name] for name in names}) as launches:
        yield launches


# ----------------------------------------------------------------------------------------------
# Parallel layouts: what each rank really built, and a run's final weights in one piece


def train_recording_layout(facts_dir: str, *args):
    """``training.train.train(*args)`` that also writes what this rank built to
    ``facts_dir/rank-<RANK>.json`` (see ``_layout_facts``), so that a test can tell the layout asked
    for from the one used: the run's recorded layout is made from the settings, not from the model."""
    import training.train

    build = training.train.build_step

    def recording_build_step(*build_args, **build_kwargs):
        trainer = build(*build_args, **build_kwargs)
        facts = _layout_facts(trainer)
        seen = _record_sequence_length(trainer.model, facts)
        step = trainer.step

        def recording_step(*step_args, **step_kwargs):
            result = step(*step_args, **step_kwargs)
            if "optimizer_state_elements" not in facts:  # optimizer state exists once a step has run
                seen.remove()
                facts["optimizer_state_elements"] = _optimizer_state_elements(trainer.optimizer)
                Path(facts_dir, f"rank-{os.environ.get('RANK', '0')}.json").write_text(json.dumps(facts))
            return result

        trainer.step = recording_step
        return trainer

    training.train.build_step = recording_build_step
    return training.train.train(*args)


def _layout_facts(trainer) -> dict:
    """Facts of the built model and optimizer, not of the settings: megatron's process groups, the
    sequence-parallel flag of every tensor-parallel linear layer, the transformer layers this rank
    holds (megatron's global 1-based numbers), its embedding and output layer, its parameters (whole,
    and the elements this rank holds: a DTensor's local shard under FSDP), and the overlap switches
    megatron's DDP was built with (None without it)."""
    import torch.distributed as dist
    from megatron.core import parallel_state as ps
    from megatron.core.tensor_parallel import ColumnParallelLinear, RowParallelLinear
    from torch.distributed.tensor import DTensor

    model = trainer.model
    linears = [m for m in model.modules() if isinstance(m, (ColumnParallelLinear, RowParallelLinear))]
    ddp = getattr(trainer, "ddp", None)
    return {
        "rank": dist.get_rank(),
        "step": type(trainer).__name__,
        # megatron chains one optimizer per parameter group kind: the classes of the chain's parts
        "optimizer": [type(part).__name__ for part in getattr(trainer.optimizer, "chained_optimizers", [trainer.optimizer])],
        "tensor_parallel": ps.get_tensor_model_parallel_world_size(),
        "pipeline_parallel": ps.get_pipeline_model_parallel_world_size(),
        "pipeline_rank": ps.get_pipeline_model_parallel_rank(),
        "data_parallel": ps.get_data_parallel_world_size(),
        "linears_sequence_parallel": sorted({bool(m.sequence_parallel) for m in linears}),
        "layers": [layer.layer_number for layer in model.decoder.layers],
        "embedding": hasattr(model, "embedding"),
        "output_layer": hasattr(model, "output_layer"),
        "parameters": sum(p.numel() for p in model.parameters()),  # a DTensor's numel is the whole parameter's
        "local_parameter_elements": sum(_local(p).numel() for p in model.parameters()),
        "dtensor_parameters": sorted({isinstance(p, DTensor) for p in model.parameters()}),
        # megatron's DDP: overlap switches, and whether the schedules defer the reduction to the last micro-batch
        "ddp_overlap": None
        if ddp is None
        else {
            "grad_reduce": ddp.ddp_config.overlap_grad_reduce,
            "param_gather": ddp.ddp_config.overlap_param_gather,
            "no_sync_func": model.config.no_sync_func is not None,
        },
        "recompute": model.config.recompute_granularity,  # None, "selective" or "full"
        # Module.compile() wraps each layer's call in torch.compile (training/model/compiling.py)
        "compiled_layers": [getattr(layer, "_compiled_call_impl", None) is not None for layer in model.decoder.layers],
    }


def _record_sequence_length(model, facts: dict):
    """Record the sequence length the transformer layers receive (split across the
    tensor-parallel ranks under sequence parallelism): a hook to remove once it has run."""

    def hook(module, args, kwargs):
        hidden = kwargs.get("hidden_states", args[0] if args else None)
        if hasattr(hidden, "_wrapper"):  # megatron's WrappedTensor: look inside without unwrapping it
            hidden = hidden._wrapper[0]
        if hidden is None:  # a later pipeline stage: its input came from the previous stage (set_input_tensor)
            hidden = module.input_tensor
        facts["layer_input_sequence"] = int(hidden.shape[0])  # megatron's [sequence, batch, hidden]

    # On the block, not its first layer: a hook on a compiled layer would be traced into its graph,
    # and removing it would recompile the layer.
    return model.decoder.register_forward_pre_hook(hook, with_kwargs=True)


def _optimizer_state_elements(optimizer) -> int:
    """Elements of this rank's Adam first moments: every parameter's, or one data-parallel shard's
    under megatron's distributed optimizer (its inner torch optimizer steps the shard only) and under
    FSDP (the moments are DTensors like their parameters: their local shards)."""
    total = 0
    for part in getattr(optimizer, "chained_optimizers", [optimizer]):
        inner = getattr(part, "optimizer", part)
        total += sum(_local(state["exp_avg"]).numel() for state in inner.state.values() if "exp_avg" in state)
    return total


def _local(tensor):
    """What this rank holds of ``tensor``: a DTensor's local shard, any other tensor whole."""
    from torch.distributed.tensor import DTensor

    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def layout_facts(facts_dir: Path) -> list[dict]:
    """Every rank's facts written by ``train_recording_layout``, in rank order."""
    files = sorted(facts_dir.glob("rank-*.json"), key=lambda p: int(p.stem.split("-")[1]))
    return [json.loads(p.read_text()) for p in files]


def final_weights(ref, model_cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """The run's final checkpoint loaded whole at TP=1, PP=1 in this process (evaluation's path:
    megatron reshards any saved layout), as ``{parameter name: tensor}``."""
    import tempfile

    from training.checkpointing import checkpoint
    from training.config import ParallelConfig
    from training.distributed import init_distributed, shutdown_distributed
    from training.model.gpt import build_gpt

    store = open_store(ref.store)
    manifest = store.get_json(f"{ref.dataset.prefix}/manifest.json")
    init_distributed(ParallelConfig(tensor_parallel=1), seed=0, standalone=True)
    try:
        model = build_gpt(model_cfg, manifest["vocab_size"], manifest["seq_len"], tensor_parallel=1)
        with tempfile.TemporaryDirectory(prefix="layout-weights-") as tmp:
            checkpoint.load_model(model, checkpoint.fetch(store, ref.prefix, Path(tmp)))
        return {name: p.detach().clone() for name, p in model.named_parameters()}
    finally:
        shutdown_distributed()


# ----------------------------------------------------------------------------------------------
# Which cached tasks an edit reruns: derived by tests/test_cache_keys.py from the cache keys, observed
# from real executions by tests/test_workflow_e2e.py.

CACHED_STEPS = ("prepare", "validate", "train", "evaluate", "register")
"""CACHED_TASKS as the table names them, in the workflow's order."""
ALL_TASKS = set(CACHED_STEPS)
LM_EVAL_HELDOUT = {"lm_eval_tasks": ["heldout_cloze", "heldout_continuation"], "lm_eval_examples": 16}
"""lm-eval on 16 examples of each held-out task: the end-to-end cold run's evaluation, as the presets run it."""

# file edited -> (keys that change, tasks that rerun). The wide rows: storage and common.contracts
# are imported by every stage. The data stages' own code (filters, dedup, the encoder, validation)
# reaches prepare and validate only: training reads a dataset through data_prep.manifest and
# data_prep.shards, and pipeline.config takes ValidationConfig from data_prep.config. The run's
# charts and comparisons (reports.run_html) reach the train task only; runs.catalog reaches
# train and evaluate (the evaluation's TensorBoard hparams: evaluation.tensorboard_log).
CACHE_KEY_TABLE = {
    "kernels/rmsnorm.py": ({"train", "evaluate", "run id"}, {"train", "evaluate", "register"}),
    "data_prep/clean.py": ({"prepare", "validate"}, {"prepare", "validate"}),
    "data_prep/pii.py": ({"prepare", "validate"}, {"prepare", "validate"}),
    "data_prep/quality.py": ({"prepare", "validate"}, {"prepare", "validate"}),
    "training/model/step.py": ({"train", "run id"}, {"train", "evaluate", "register"}),
    "storage/store.py": (ALL_TASKS | {"run id"}, ALL_TASKS),
    "registry/registry.py": ({"register"}, {"register"}),
    "common/contracts.py": (ALL_TASKS | {"run id"}, ALL_TASKS),
    "cli/main.py": (set(), set()),
    "tasks/decks.py": ({"prepare", "validate", "train", "evaluate"}, {"prepare", "validate", "train", "evaluate"}),
    "reports/run_html.py": ({"train"}, {"train"}),  # the run's Decks: the data tasks never draw a run
    # The Dataset Deck is drawn by prepare's commit task (tasks.data, prepare's and validate's module).
    "reports/dataset_html.py": ({"prepare", "validate"}, {"prepare", "validate"}),
    "runs/catalog.py": ({"train", "evaluate"}, {"train", "evaluate"}),
    # A data file of evaluation.lm_eval_suite (its __data__): the evaluation only, not every task that checks settings.
    "evaluation/lm_eval_tasks/heldout_cloze.yaml": ({"evaluate"}, {"evaluate"}),
}


def long_fixture(reason: str):
    """Marks a shared fixture allowed to build for longer than tests/conftest.py's LONG_S, saying why."""

    def mark(fn):
        fn.long_reason = reason
        return fn

    return mark


def rank_processes(launcher_pid: int) -> list:
    """The ranks of a job that ``start_launch`` started (``launch(..., start_method="spawn")``): the
    launcher's spawned children (not its resource tracker, nor a rank's own children)."""
    import psutil

    return [c for c in psutil.Process(launcher_pid).children() if "spawn_main" in " ".join(c.cmdline())]


# ----------------------------------------------------------------------------------------------
# Text for the tokenizer's trainer and encoder (tests/test_encoder.py, tests/test_tokenizer.py)

EDGE_CASES = [
    "café naïve 一二三 ²³ x² emoji 😀😀 it's we'll I'd 'S 'LL",
    "tabs\t\t\nx\u3000y\u00a0z \u2003 w\n\n\n  \n a",
    "<|endoftext|>hello<|endoftext|> <|pad|>x<|endof",
    "\u0600\u0661\u0662 किताब 한국어 ა \u0301a\u0301 Ⅷ ٣٤",
    "   leading",
    "trailing   ",
    "\n",
    "a\n",
    "\x1c\x1dseparators\x85next line",
    "\U000e0001 tag \U0010ffff private \ue000 unassigned \U0003134b\U000e01f0",
    "12345 3.14 1,000 ...!!! ?? -- __init__ self._x=[1,2]",
    "line\r\nwindows\rmac",
    "",
]


def stdlib_texts(files: int) -> list[str]:
    """The first ``files`` standard-library Python files that are UTF-8, whole: code to train and encode."""
    from data_prep.sources import _stdlib_files as stdlib_files

    texts = []
    for path in stdlib_files()[:files]:
        try:
            texts.append(path.read_text(encoding="utf-8"))
        except UnicodeDecodeError:
            continue
    return texts


# Real sentences per script; the seeded mix below repeats them in new orders, as a corpus would.
SCRIPTS = {
    "cjk": ["无法打开文件，请检查权限。", "鉴定令牌过期处理已禁用", "日本語の文章には空白がありません。", "東京都の天気"],
    "hangul": ["마지막 로그인 후 로그인 시도가 실패하였습니다.", "암호 기한이 곧 끝납니다"],
    "kana": ["ひらがなとカタカナ", "ファイルを開けませんでした。もう一度お試しください"],
    "arabic": ["لا يمكن فتح الملف، يرجى التحقق من الأذونات.", "مرحبا بالعالم"],
    "cyrillic": ["Не удалось открыть файл: доступ запрещён.", "Привет, мир! Съешь же ещё этих мягких булок."],
    "devanagari": ["फ़ाइल खोली नहीं जा सकी, अनुमति जाँचें।", "नमस्ते दुनिया"],
    "emoji": ["👍🏽 done ✅", "👨‍👩‍👧‍👦 family", "🇯🇵🇰🇷 flags 😀😀😀", "🏳️‍🌈"],
    # Letters and numbers beyond U+FFFF (CJK extension B, mathematical letters and digits) next to others.
    "astral": ["𠀀𠀁漢字𠀂", "abc𝐀𝐁𝐂def", "x𝟙𝟚3"],
}


def multilingual_docs(n: int, seed: int = 0) -> list[str]:
    """Documents mixing the scripts' sentences, emoji between them (a fixed seed: always the same)."""
    rng = random.Random(seed)
    sentences = [s for group in SCRIPTS.values() for s in group]
    return ["\n".join(rng.choice(sentences) + rng.choice(["", " ", "😀", "。"]) for _ in range(30)) for _ in range(n)]


LONG_RUNS = [
    "".join(SCRIPTS["cjk"]) * 40,  # no spaces for ~2,000 characters
    "".join(SCRIPTS["kana"] + SCRIPTS["hangul"]).replace(" ", "") * 30,
    "あ" * 3000,
    "a" * 5000,
    " " * 3000 + "x",
    "!" * 2000,
    "😀" * 1000,
    "ـ" * 2000,  # Arabic tatweel
]


def view_of(metrics: list[dict], step_times: list[dict] | None = None, **records) -> RunView:
    """A run's view built from records alone (``runs.view.build_view``), for rendering tests without a store."""
    return build_view("run", "file:///run", metrics, step_times=step_times, **records)


def run_decks(view: RunView) -> dict[str, str]:
    """A run's Decks as the train task draws them (``reports.run_html.run_sections`` with its charts)."""
    from reports import charts, run_html

    return run_html.run_sections(view, charts.run_charts(view))


# ----------------------------------------------------------------------------------------------
# Document masking (tests/test_document_masking.py): a layout's logits of packed rows


def document_logits(model_cfg: ModelConfig, tp: int, pp: int, rows: list[list[int]], vocab: int, eod: int | None) -> list:
    """On each rank of a ``tp`` × ``pp`` launch: a freshly initialised GPT's logits ``[rows, seq, vocab]`` of
    ``rows`` (input ids), whole (gathered over TP, from the last pipeline stage), with document masking at
    ``eod`` (None: off). Rank 0's result is the launch's."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from training.config import ParallelConfig
    from training.distributed import init_distributed, shutdown_distributed
    from training.model.gpt import build_gpt, model_inputs

    parallel = ParallelConfig(tensor_parallel=tp, pipeline_parallel=pp)
    init_distributed(parallel, seed=7)
    try:
        tokens = torch.tensor([row + [eod or 0] for row in rows])  # a label column, unused
        model = build_gpt(model_cfg, vocab, tokens.shape[1] - 1, tp, pipeline_parallel=pp, init_seed=7, document_eod=eod)
        model.eval()
        inputs, positions, _, mask, _ = model_inputs(model, tokens)
        with torch.no_grad():
            if pp > 1 and not ps.is_pipeline_first_stage():
                hidden = torch.empty(inputs.shape[1], inputs.shape[0], model_cfg.hidden_size)
                dist.recv(hidden, src=ps.get_pipeline_model_parallel_prev_rank())
                model.set_input_tensor(hidden)
            out = model(inputs, positions, mask)
            if not ps.is_pipeline_last_stage():
                dist.send(out.contiguous(), dst=ps.get_pipeline_model_parallel_next_rank())
                out = torch.empty(inputs.shape[0], inputs.shape[1], 0)
            elif tp > 1:  # vocab-parallel logits: each TP rank holds its slice of the vocabulary
                parts = [torch.empty_like(out) for _ in range(tp)]
                dist.all_gather(parts, out.contiguous(), group=ps.get_tensor_model_parallel_group())
                out = torch.cat(parts, dim=-1)
        # Rank 0 answers: the last stage's logits travel to it (the first stage's rank, under PP).
        result = [out[..., :vocab].tolist() if ps.is_pipeline_last_stage() else None]
        if pp > 1:
            last = ps.get_pipeline_model_parallel_last_rank()
            dist.broadcast_object_list(result, src=last, group=ps.get_pipeline_model_parallel_group())
        return result[0]
    finally:
        shutdown_distributed()


def torchao_float8_linear(weight, recipe: str):
    """torchao's ``Float8Linear`` (``convert_to_float8_training`` under ``recipe``) holding a copy of ``weight``: the
    peer an FP8 linear of ours must equal bit for bit."""
    import torch
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    linear = torch.nn.Sequential(torch.nn.Linear(weight.shape[1], weight.shape[0], bias=False))
    linear[0].weight.data.copy_(weight.data)
    return convert_to_float8_training(linear, config=Float8LinearConfig.from_recipe_name(recipe))[0]


def fp8_linears_against_torchao(model_cfg: ModelConfig, recipe: str, vocab: int, seq: int, batch: int) -> dict:
    """On each rank of a TP=2 launch with sequence parallelism: the first layer's MLP linears in FP8 (column-parallel
    fc1, row-parallel fc2) against torchao's ``Float8Linear`` holding the same weight shard, on the whole sequence
    (what megatron's regions gather) with megatron's reductions applied by hand: output, input gradient and weight
    gradient, each ``torch.equal``. Raises on the first difference; rank 0's counts are the launch's result."""
    import torch
    import torch.distributed as dist
    from megatron.core import parallel_state as ps

    from training.config import ParallelConfig
    from training.distributed import init_distributed, shutdown_distributed
    from training.model.gpt import build_gpt

    init_distributed(ParallelConfig(tensor_parallel=2, sequence_parallel=True), seed=7)
    try:
        group, rank = ps.get_tensor_model_parallel_group(), ps.get_tensor_model_parallel_rank()
        model = build_gpt(model_cfg, vocab, seq, 2, sequence_parallel=True, init_seed=7, fp8_recipe=recipe)
        mlp = model.decoder.layers[0].mlp

        def check(name: str, got: torch.Tensor, expected: torch.Tensor) -> None:
            if not torch.equal(got, expected):
                raise AssertionError(f"rank {rank}: {name} differs by {(got - expected).abs().max().item():.3g}")

        generator = torch.Generator().manual_seed(11)  # the same whole tensors on both ranks
        x = torch.randn(seq, batch, model_cfg.hidden_size, generator=generator)
        # fc1 (column-parallel): this rank's sequence slice in, the whole sequence through its weight shard out.
        x_ours = x.chunk(2)[rank].clone().requires_grad_()
        x_peer = x.clone().requires_grad_()
        fc1_peer = torchao_float8_linear(mlp.linear_fc1.weight, recipe)
        out, _ = mlp.linear_fc1(x_ours)
        expected = fc1_peer(x_peer)
        check("fc1 output", out, expected)
        grad = torch.randn(2, *out.shape, generator=generator)[rank]  # each rank's own output gradient
        out.backward(grad)
        expected.backward(grad)
        check("fc1 weight gradient", mlp.linear_fc1.weight.grad, fc1_peer.weight.grad)
        summed = x_peer.grad.clone()
        dist.all_reduce(summed, group=group)  # what the sequence-parallel backward reduce-scatters
        check("fc1 input gradient", x_ours.grad, summed.chunk(2)[rank])
        # fc2 (row-parallel): this rank's share of the hidden features in, reduce-scattered over the sequence out.
        h = torch.randn(2, seq, batch, mlp.linear_fc2.weight.shape[1], generator=generator)[rank]
        h_ours, h_peer = h.clone().requires_grad_(), h.clone().requires_grad_()
        fc2_peer = torchao_float8_linear(mlp.linear_fc2.weight, recipe)
        out, _ = mlp.linear_fc2(h_ours)
        partial = fc2_peer(h_peer)
        reduced = torch.empty_like(out)
        dist.reduce_scatter_tensor(reduced, partial.detach().contiguous(), group=group)
        check("fc2 output", out, reduced)
        grad = torch.randn(seq, batch, out.shape[-1], generator=generator)  # the whole sequence's gradient
        out.backward(grad.chunk(2)[rank])
        partial.backward(grad)  # a reduce-scatter's backward gathers the gradient
        check("fc2 weight gradient", mlp.linear_fc2.weight.grad, fc2_peer.weight.grad)
        check("fc2 input gradient", h_ours.grad, h_peer.grad)
        return {"rank": rank, "checked": 6}
    finally:
        shutdown_distributed()
