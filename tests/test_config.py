"""Settings are checked before anything runs: every section lists its own problems, PipelineConfig
adds the rules that span sections, and a preset (``load_config``: ``pretrain run``, ``pretrain
check``) or ``pyflyte run … --config`` fails with all of them, one line each, before a task starts."""

import dataclasses
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from common.errors import ConfigError
from common.hashing import config_hash
from data_prep.config import DataConfig, Normalization, TokenizerConfig, ValidationConfig
from evaluation.config import EvalConfig
from pipeline.config import PipelineConfig, RegistryConfig, load_config, parse_config
from training.config import Kernels, ModelConfig, ParallelConfig, Recompute, TrainConfig

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
PRESETS = sorted(p.name for p in (ROOT / "configs").glob("*.yaml"))
GPU_2X8 = ROOT / "configs" / "cluster" / "gpu-2x8.yaml"


@pytest.fixture(autouse=True)
def local_cluster(monkeypatch):
    """The local cluster profile (one node, two ranks) unless a test sets another."""
    monkeypatch.delenv("PRETRAIN_CLUSTER", raising=False)


def problems_of(values: dict) -> list[str]:
    """The problem lines a config built from ``values`` is refused with (launch rules included)."""
    with pytest.raises(ConfigError) as caught:
        parse_config(values)
    head, *lines = str(caught.value).splitlines()
    assert head.startswith("the settings have ") and head.endswith(":"), head
    assert lines and all(line.startswith("  - ") for line in lines), lines
    return [line.removeprefix("  - ") for line in lines]


def write(tmp_path: Path, values: dict, name: str = "c.yaml") -> Path:
    path = tmp_path / name
    path.write_text(yaml.safe_dump(values))
    return path


# -- presets and defaults --------------------------------------------------------------------


def test_tiny_cpu_preset_spells_out_the_defaults():
    assert load_config(ROOT / "configs" / "tiny-cpu.yaml") == PipelineConfig()


@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_and_section_default_has_no_problems(preset):
    config = load_config(ROOT / "configs" / preset)
    assert config.problems(world_size=2) == []
    for section in (DataConfig(), TokenizerConfig(), ValidationConfig(), ModelConfig(), ParallelConfig()):
        assert section.problems() == []
    assert TrainConfig().problems() == EvalConfig().problems() == RegistryConfig().problems() == []


def test_partial_preset_keeps_defaults(tmp_path):
    (tmp_path / "corpus").mkdir()
    path = tmp_path / "c.yaml"
    path.write_text(f"data:\n  sources: [{tmp_path / 'corpus'}, 's3://b/raw']\ntrain:\n  lr: 1\n")
    config = load_config(path)
    assert config.data.sources == [str(tmp_path / "corpus"), "s3://b/raw"]
    assert config.train.lr == 1.0 and config.train.steps == PipelineConfig().train.steps


@pytest.mark.parametrize(
    "text,message",
    [
        ("train:\n  stepz: 3\n", r"unknown setting train.stepz \(did you mean train.steps\?\); known: "),
        ("model:\n  num_layers: four\n", "model.num_layers must be int, got 'four'"),
        ("data:\n  sources: /one/path\n", "data.sources must be a list"),
        ("data: [1, 2]\n", "data must be a mapping"),
        ("train:\n  recompute: everything\n", "train.recompute is 'everything': use one of none, selective, full"),
    ],
)
def test_bad_preset_names_the_setting(tmp_path, text, message):
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_every_unknown_key_and_bad_type_is_reported_at_once(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  stepz: 3\n  lr: fast\nmodel:\n  kernels: cuda\nregistri: {}\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value).splitlines() == [
        f"the settings in {path} have 4 problems:",
        "  - unknown setting registri (did you mean registry?); known: cluster_profile, data, evaluation, model, parallel, "
        "registry, store, tokenizer, tracking, train, validation",
        "  - unknown setting train.stepz (did you mean train.steps?); known: "
        + ", ".join(sorted(f.name for f in dataclasses.fields(TrainConfig))),
        "  - train.lr must be float, got 'fast'",
        "  - model.kernels is 'cuda': use one of triton, torch",
    ]


def test_unreadable_settings_and_broken_rules_are_reported_together(tmp_path):
    # A typo'd key beside values that read but break a rule: one error lists both kinds, so a user fixes
    # everything in one go (the rules run on what was read, with defaults standing in for the rest).
    path = tmp_path / "c.yaml"
    path.write_text("train:\n  stpes: 3\n  lr: -1\nmodel:\n  hidden_size: 0\n  kernels: cuda\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path, overrides=["evaluation.batch_size=x"])
    lines = str(caught.value).splitlines()
    assert lines[0] == f"the settings in {path} with --set evaluation.batch_size=x have 5 problems:"
    assert [re.search(r"\w+\.\w+", line).group() for line in lines[1:]] == [
        "train.stpes",
        "model.kernels",
        "evaluation.batch_size",
        "model.hidden_size",
        "train.lr",
    ]


def test_a_preset_for_another_cluster_profile_warns(monkeypatch, capsys):
    # The GPU presets say which profile they are tuned for; launched under another one they warn (and still load).
    monkeypatch.delenv("PRETRAIN_CLUSTER", raising=False)
    config = load_config(ROOT / "configs" / "gpt-350m.yaml")
    assert config.cluster_profile == "gpu-2x8"
    err = capsys.readouterr().err
    assert "WARNING: " in err and "is written for cluster profile 'gpu-2x8' but this launch uses 'local'" in err
    assert "PRETRAIN_CLUSTER=configs/cluster/gpu-2x8.yaml" in err
    monkeypatch.setenv("PRETRAIN_CLUSTER", str(GPU_2X8))
    load_config(ROOT / "configs" / "gpt-350m.yaml")
    load_config(ROOT / "configs" / "nightly.yaml")  # written for any profile
    assert capsys.readouterr().err == ""


def test_missing_or_broken_file_is_named(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    (tmp_path / "bad.yaml").write_text("train: [\n")
    with pytest.raises(ConfigError, match="is not valid YAML"):
        load_config(tmp_path / "bad.yaml")


# -- every rule gives its line ---------------------------------------------------------------

RULES = [
    # (settings, the line's start) — one case per rule.
    ({"store": "gs://bucket/x"}, "store is 'gs://bucket/x': use a local path or s3://bucket/prefix"),
    ({"store": "s3://"}, "store is 's3://': name a bucket"),
    ({"data": {"normalization": "NFX"}}, "data.normalization is 'NFX': use one of NFC, NFKC, NFD, NFKD, none"),
    ({"data": {"sources": []}}, "data.sources is []: name at least one"),
    ({"data": {"sources": [""]}}, "data.sources[0] is '': give a path"),
    ({"data": {"text_field": ""}}, "data.text_field is '': name the JSONL field"),
    ({"data": {"seq_len": -5}}, "data.seq_len is -5: must be ≥ 1"),
    ({"data": {"sequences_per_sample": 0}}, "data.sequences_per_sample is 0: must be ≥ 1"),
    ({"data": {"samples_per_shard": 0}}, "data.samples_per_shard is 0: must be ≥ 1"),
    ({"data": {"shingle_words": 0}}, "data.shingle_words is 0: must be ≥ 1"),
    ({"data": {"minhash_bands": 0}}, "data.minhash_bands is 0: must be ≥ 1"),
    ({"data": {"minhash_rows": 0}}, "data.minhash_rows is 0: must be ≥ 1"),
    ({"data": {"max_chars": 0, "min_chars": 0}}, "data.max_chars is 0: must be ≥ 1"),
    ({"data": {"min_chars": 10, "max_chars": 5}}, "data.min_chars is 10: must be ≤ data.max_chars (5)"),
    ({"data": {"val_fraction": 1.0}}, "data.val_fraction is 1.0: must be in [0, 1)"),
    ({"data": {"workers": -1}}, "data.workers is -1: must be ≥ 0"),
    ({"data": {"max_documents": -1}}, "data.max_documents is -1: must be ≥ 0"),
    ({"tokenizer": {"vocab_size": 10}}, "tokenizer.vocab_size is 10: must be ≥ 258 (256 bytes + 2 special tokens"),
    ({"tokenizer": {"min_frequency": -1}}, "tokenizer.min_frequency is -1: must be ≥ 0"),
    ({"tokenizer": {"train_bytes": 0}}, "tokenizer.train_bytes is 0: must be ≥ 1"),
    ({"validation": {"min_documents": -1}}, "validation.min_documents is -1: must be ≥ 0"),
    (
        {"validation": {"min_doc_tokens": 9, "max_doc_tokens": 8}},
        "validation.min_doc_tokens is 9: must be ≤ validation.max_doc_tokens",
    ),
    (
        {"validation": {"min_shard_bytes": 9, "max_shard_bytes": 8}},
        "validation.min_shard_bytes is 9: must be ≤ validation.max_shard_bytes",
    ),
    ({"validation": {"max_duplicate_fraction": 1.5}}, "validation.max_duplicate_fraction is 1.5: must be a fraction in [0, 1]"),
    ({"validation": {"max_skipped_fraction": -0.1}}, "validation.max_skipped_fraction is -0.1: must be a fraction"),
    ({"validation": {"max_byte_fallback_ratio": 2.0}}, "validation.max_byte_fallback_ratio is 2.0: must be a fraction"),
    ({"model": {"kernels": "cuda"}}, "model.kernels is 'cuda': use one of triton, torch"),
    ({"model": {"num_layers": 0}}, "model.num_layers is 0: must be ≥ 1"),
    ({"model": {"hidden_size": 0}}, "model.hidden_size is 0: must be ≥ 1"),
    ({"model": {"num_attention_heads": 0}}, "model.num_attention_heads is 0: must be ≥ 1"),
    ({"model": {"num_query_groups": -1}}, "model.num_query_groups is -1: must be ≥ 0"),
    ({"model": {"ffn_hidden_size": -1}}, "model.ffn_hidden_size is -1: must be ≥ 0"),
    ({"model": {"rotary_base": 1}}, "model.rotary_base is 1: must be ≥ 2"),
    ({"model": {"hidden_size": 130}}, "model.hidden_size=130 is not divisible by model.num_attention_heads=4"),
    ({"model": {"hidden_size": 132, "num_attention_heads": 4}}, "model.hidden_size=132 / model.num_attention_heads=4 = 33"),
    ({"model": {"num_query_groups": 3}}, "model.num_query_groups=3 does not divide model.num_attention_heads=4"),
    ({"model": {"hidden_size": 66048, "num_attention_heads": 4}}, "model.hidden_size is 66048: the Triton RMSNorm handles"),
    (
        {"model": {"num_attention_heads": 2, "hidden_size": 128}, "parallel": {"tensor_parallel": 4}},
        "model.num_attention_heads=2 is not divisible by parallel.tensor_parallel=4",
    ),
    ({"model": {"num_query_groups": 1}}, "model.num_query_groups=1 is not divisible by parallel.tensor_parallel=2"),
    (
        {"model": {"num_layers": 3}, "parallel": {"pipeline_parallel": 2, "tensor_parallel": 1}},
        "model.num_layers=3 is not divisible by parallel.pipeline_parallel=2",
    ),
    ({"parallel": {"tensor_parallel": 0}}, "parallel.tensor_parallel is 0: must be ≥ 1"),
    ({"parallel": {"pipeline_parallel": 0}}, "parallel.pipeline_parallel is 0: must be ≥ 1"),
    (
        {"parallel": {"tensor_parallel": 1, "sequence_parallel": True}},
        "parallel.sequence_parallel needs parallel.tensor_parallel ≥ 2 (it is 1)",
    ),
    (
        {"parallel": {"sequence_parallel": True}, "data": {"seq_len": 127}},
        "data.seq_len=127 is not divisible by parallel.tensor_parallel=2",
    ),
    ({"parallel": {"collective_timeout_s": 0}}, "parallel.collective_timeout_s is 0: must be ≥ 1"),
    ({"parallel": {"checkpoint_timeout_s": 0}}, "parallel.checkpoint_timeout_s is 0: must be ≥ 1"),
    ({"parallel": {"stall_timeout_s": -1}}, "parallel.stall_timeout_s is -1: must be ≥ 0"),
    (
        {"parallel": {"tensor_parallel": 4}, "model": {"num_attention_heads": 4}},
        "parallel.tensor_parallel=4 × parallel.pipeline_parallel=1 = 4 does not divide the 2 ranks",
    ),
    (
        {"train": {"global_batch_size": 16, "micro_batch_size": 16}, "parallel": {"tensor_parallel": 1}},
        "train.global_batch_size=16 is not a multiple of train.micro_batch_size × data-parallel size = 16 × 2 = 32",
    ),
    (
        {"train": {"global_batch_size": 12, "micro_batch_size": 8}},
        "train.global_batch_size=12 is not a multiple of train.micro_batch_size=8",
    ),
    ({"train": {"steps": 0}}, "train.steps and train.tokens are both 0: give the run's budget in steps or in tokens"),
    ({"train": {"steps": -1}}, "train.steps is -1: must be ≥ 0 (0 = from train.tokens)"),
    ({"train": {"micro_batch_size": 0}}, "train.micro_batch_size is 0: must be ≥ 1"),
    ({"train": {"global_batch_size": 0}}, "train.global_batch_size is 0: must be ≥ 1"),
    ({"train": {"lr": -1}}, "train.lr is -1.0: must be > 0 (typical 1e-4 … 3e-3)"),
    ({"train": {"lr": 1e-3, "min_lr": 1e-2}}, "train.min_lr is 0.01: must be in [0, train.lr = 0.001]"),
    ({"train": {"warmup_steps": -1}}, "train.warmup_steps is -1: must be ≥ 0"),
    ({"train": {"weight_decay": -0.1}}, "train.weight_decay is -0.1: must be ≥ 0"),
    ({"train": {"grad_clip": -1.0}}, "train.grad_clip is -1.0: must be ≥ 0"),
    ({"train": {"recompute": "some"}}, "train.recompute is 'some': use one of none, selective, full"),
    ({"train": {"seed": -1}}, "train.seed is -1: must be ≥ 0"),
    ({"train": {"checkpoint_every": 0}}, "train.checkpoint_every is 0: must be ≥ 1"),
    ({"train": {"local_checkpoint_every": -1}}, "train.local_checkpoint_every is -1: must be ≥ 0 (0 = off)"),
    (
        {"train": {"local_checkpoint_every": 25, "keep_local_checkpoints": 0}},
        "train.local_checkpoint_every=25 saves checkpoints that only this node keeps, but train.keep_local_checkpoints=0",
    ),
    ({"train": {"shuffle_window_shards": 0}}, "train.shuffle_window_shards is 0: must be ≥ 1"),
    ({"train": {"peak_flops": -1.0}}, "train.peak_flops is -1.0: must be ≥ 0"),
    ({"train": {"init_from": "gpt tiny:latest"}}, "train.init_from is 'gpt tiny:latest': use NAME, NAME:VERSION or NAME:ALIAS"),
    ({"evaluation": {"batch_size": 0}}, "evaluation.batch_size is 0: must be ≥ 1"),
    ({"evaluation": {"max_batches": -1}}, "evaluation.max_batches is -1: must be ≥ 0"),
    ({"evaluation": {"sample_tokens": -1}}, "evaluation.sample_tokens is -1: must be ≥ 0"),
    ({"evaluation": {"temperature": -0.5}}, "evaluation.temperature is -0.5: must be ≥ 0"),
    ({"evaluation": {"prompt": ""}}, "evaluation.prompt is '': the samples continue it"),
    ({"registry": {"model_name": "my model"}}, "registry.model_name is 'my model': use a name of 1-64 letters"),
    ({"registry": {"model_name": "x" * 65}}, f"registry.model_name is '{'x' * 65}': use a name"),
    ({"registry": {"gate_alias": "-prod"}}, "registry.gate_alias is '-prod': use an alias of 1-64 letters"),
    ({"registry": {"gate_alias": "42"}}, "registry.gate_alias is '42': an alias cannot be all digits"),
    ({"registry": {"gate_alias": "latest"}}, "registry.gate_alias is 'latest': the registry moves it to each new version"),
    ({"data": {"sources": ["/no/such/corpus"]}}, "data.sources[0] is '/no/such/corpus': does not exist; give an existing file"),
    ({"data": {"sources": ["/no/such/*.jsonl"]}}, "data.sources[0] is '/no/such/*.jsonl': matches no files; check the pattern"),
    ({"tokenizer": {"file": "/no/such/tokenizer.json"}}, "tokenizer.file is '/no/such/tokenizer.json': no such file"),
]


@pytest.mark.parametrize("values,line", RULES, ids=[line.split(" ")[0] for _, line in RULES])
def test_each_rule_gives_one_line_naming_key_value_and_remedy(values, line):
    problems = problems_of(values)
    assert [p for p in problems if p.startswith(line)], f"{line!r} not in {problems}"


def test_world_size_rules_follow_the_cluster_profile(monkeypatch):
    # The tiny preset fits the local profile (2 ranks, DP 1) but not 2 nodes × 8 (DP 8: 16 < 8 × 8).
    assert parse_config({}) == PipelineConfig()
    monkeypatch.setenv("PRETRAIN_CLUSTER", str(GPU_2X8))
    (line,) = problems_of({})
    assert line == (
        "train.global_batch_size=16 is not a multiple of train.micro_batch_size × data-parallel size = 8 × 8 = 64: "
        "use e.g. 64 or 128, or a smaller micro_batch_size (data-parallel size = 16 ranks ÷ (TP 2 × PP 1); "
        f"16 = 2 node(s) × 8 ranks of cluster profile {GPU_2X8})"
    )
    assert parse_config({}, launch=False) == PipelineConfig()  # what registration-time defaults use
    # The GPU presets fit it, and so does the nightly launch plan's input, which runs on the cluster.
    for preset in ("gpt-125m.yaml", "gpt-350m.yaml", "gpt-1b.yaml", "nightly.yaml"):
        load_config(ROOT / "configs" / preset)


def test_sources_that_exist_or_are_not_local_pass(tmp_path):
    (tmp_path / "a.jsonl").write_text("{}\n")
    sources = [str(tmp_path), str(tmp_path / "*.jsonl"), str(tmp_path / "a.jsonl"), "s3://bucket/corpus/", "python-stdlib"]
    assert parse_config({"data": {"sources": sources}}).data.sources == sources


def test_all_problems_are_reported_together():
    problems = problems_of(
        {
            "model": {"num_attention_heads": 3},
            "parallel": {"tensor_parallel": 2},
            "train": {"lr": -1},
            "tokenizer": {"vocab_size": 10},
            "data": {"seq_len": -5, "sources": ["/no/such/corpus"]},
            "registry": {"model_name": "bad name"},
        }
    )
    assert [p.split(" ")[0].split("=")[0] for p in problems] == [
        "data.seq_len",
        "tokenizer.vocab_size",
        "model.hidden_size",
        "train.lr",
        "registry.model_name",
        "model.num_attention_heads",
        "data.sources[0]",
    ]


def test_building_a_config_that_cannot_work_fails_at_construction():
    # What flytekit does when it builds the input from the launch form or a task's input.
    with pytest.raises(ConfigError, match="train.lr is -1.0: must be > 0"):
        PipelineConfig(train=TrainConfig(lr=-1.0))
    with pytest.raises(ConfigError, match="model.num_attention_heads=3 is not divisible by parallel.tensor_parallel=2"):
        PipelineConfig(model=ModelConfig(num_attention_heads=3, hidden_size=192))


def test_pyflyte_builds_the_input_strictly():
    # flytekit's `--config FILE` calls PipelineConfig.from_json: unknown keys are errors there too.
    import click

    assert PipelineConfig.from_json(json.dumps({"train": {"recompute": "full"}})).train.recompute is Recompute.FULL
    with pytest.raises(click.BadParameter, match="unknown setting train.stepz"):
        PipelineConfig.from_json(json.dumps({"train": {"stepz": 3}}))


# -- library entry points apply the same rules -------------------------------------------------


def test_prepare_checks_with_the_sections_rules():
    from data_prep.errors import DataError
    from data_prep.prepare import check_settings

    with pytest.raises(DataError) as caught:
        check_settings(DataConfig(seq_len=-5), TokenizerConfig(vocab_size=10))
    assert "  - data.seq_len is -5: must be ≥ 1" in str(caught.value)
    assert "  - tokenizer.vocab_size is 10: must be ≥ 258" in str(caught.value)


def test_training_checks_with_the_sections_rules():
    from training.distributed import check_parallel
    from training.model.step import micro_batches

    with pytest.raises(ConfigError, match="model.num_attention_heads=3 is not divisible by parallel.tensor_parallel=2"):
        check_parallel(ParallelConfig(tensor_parallel=2), ModelConfig(num_attention_heads=3, hidden_size=192))
    with pytest.raises(ConfigError, match="train.global_batch_size=16 is not a multiple of .* = 8 × 4 = 32"):
        micro_batches(TrainConfig(), 4)
    assert micro_batches(TrainConfig(), 1) == 2


# -- choices are enums -----------------------------------------------------------------------


def test_choices_load_from_strings_and_compare_as_strings(tmp_path):
    from data_prep.clean import clean_text

    path = write(
        tmp_path, {"data": {"normalization": "NFKC"}, "model": {"kernels": "torch"}, "train": {"recompute": "selective"}}
    )
    config = load_config(path)
    assert config.data.normalization is Normalization.NFKC and config.model.kernels is Kernels.TORCH
    assert config.train.recompute is Recompute.SELECTIVE
    assert config.train.recompute == "selective" and f"{config.model.kernels}" == "torch"
    assert {"selective": 1}[config.train.recompute] == 1
    assert clean_text("ﬁ e\u0301", config.data.normalization) == "fi é"
    # A plain string given in Python becomes the member too (flytekit serializes members only).
    assert TrainConfig(recompute="full").recompute is Recompute.FULL
    assert DataConfig(normalization="none").normalization is Normalization.NONE


def test_json_and_hashes_of_enum_fields_are_the_plain_strings():
    config = PipelineConfig(train=TrainConfig(recompute=Recompute.FULL))
    as_json = json.dumps(dataclasses.asdict(config), sort_keys=True)
    assert '"recompute": "full"' in as_json and '"normalization": "NFC"' in as_json and '"kernels": "triton"' in as_json
    plain = json.loads(as_json)  # what a stored card or manifest holds: strings
    assert config_hash(config) == config_hash(plain)
    assert config_hash(config.model) == config_hash(json.loads(json.dumps(dataclasses.asdict(config.model))))
    assert plain["model"] == dataclasses.asdict(config.model)  # a card's model section compares equal


@pytest.mark.slow
@pytest.mark.parametrize("preset", PRESETS)
def test_every_preset_travels_through_flyte(preset):
    from flytekit import FlyteContextManager
    from flytekit.core.type_engine import TypeEngine

    config = load_config(ROOT / "configs" / preset)
    ctx = FlyteContextManager.current_context()
    literal_type = TypeEngine.to_literal_type(PipelineConfig)
    literal = TypeEngine.to_literal(ctx, config, PipelineConfig, literal_type)
    back = TypeEngine.to_python_value(ctx, literal, PipelineConfig)
    assert back == config and back.train.recompute is config.train.recompute
    schema = json.dumps(literal_type.metadata)
    assert '"enum": ["none", "selective", "full"]' in schema  # the launch form offers the choices


# -- the commands ------------------------------------------------------------------------------

BAD = {"model": {"num_attention_heads": 3}, "parallel": {"tensor_parallel": 2}, "train": {"lr": -1}}
BAD_LINES = [
    "  - model.hidden_size=128 is not divisible by model.num_attention_heads=3: every head gets hidden_size / heads channels",
    "  - train.lr is -1.0: must be > 0 (typical 1e-4 … 3e-3)",
    "  - model.num_attention_heads=3 is not divisible by parallel.tensor_parallel=2: each tensor-parallel rank holds "
    "the same number of heads",
]


@pytest.fixture
def isolated(tmp_path, monkeypatch) -> dict[str, str]:
    """An empty store and a private HOME (flytekit's cache, pretrain's logs)."""
    env = {"HOME": str(tmp_path / "home"), "PRETRAIN_STORE": str(tmp_path / "store")}
    for key, value in env.items():
        Path(value).mkdir()
        monkeypatch.setenv(key, value)
    return env


def test_pretrain_check_exit_codes(tmp_path, isolated, capsys):
    from cli.main import main

    assert main(["check", "--config", str(ROOT / "configs" / "tiny-cpu.yaml")]) == 0
    out = capsys.readouterr().out.strip()
    assert len(out.splitlines()) == 1 and out.startswith("ok: ") and "world 2 ranks" in out and "TP 2 × PP 1 × DP 1" in out
    bad = write(tmp_path, BAD)
    assert main(["check", "--config", str(bad)]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: the settings in {bad} have 3 problems:", *BAD_LINES]
    assert list(Path(isolated["PRETRAIN_STORE"]).iterdir()) == []


def test_pretrain_run_fails_before_anything_and_writes_nothing(tmp_path, isolated, capsys):
    from cli.main import main

    bad = write(tmp_path, BAD)
    assert main(["run", "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: the settings in {bad} have 3 problems:\n{BAD_LINES[0]}\n")
    assert list(Path(isolated["PRETRAIN_STORE"]).iterdir()) == []


# -- tracking under a cluster profile (issue 30, item 4) -----------------------------------------

GPT_125M = ROOT / "configs" / "gpt-125m.yaml"  # written for gpu-2x8: fits its 16 ranks


def pretrain_check(capsys, *sets: str) -> tuple[int, list[str]]:
    from cli.main import main

    status = main(["check", "--config", str(GPT_125M), *(a for item in sets for a in ("--set", item))])
    captured = capsys.readouterr()
    return status, captured.err.splitlines() if status else captured.out.splitlines()


@pytest.mark.parametrize("uri", ["sqlite:///x.db", "/data/mlruns", "mlruns", "file:///data/mlruns"])
def test_pretrain_check_under_a_cluster_profile_refuses_a_tracking_uri_in_the_pod(uri, isolated, capsys, monkeypatch):
    monkeypatch.setenv("PRETRAIN_CLUSTER", str(GPU_2X8))
    status, err = pretrain_check(capsys, f"tracking.uri={uri}")
    assert status == 2
    assert err == [
        f"error: the settings in {GPT_125M} with --set tracking.uri={uri} have 1 problem:",
        f"  - tracking.uri is {uri!r}: the pods of cluster profile gpu-2x8 would record into the pod, lost with it; "
        "set it to the MLflow server's http(s):// URL (infra/mlflow), or '' for the profile's (http://mlflow:5000)",
    ]


@pytest.mark.parametrize("uri", ["", "http://mlflow:5000", "https://mlflow.example.org"])
def test_pretrain_check_under_a_cluster_profile_passes_an_mlflow_server(uri, isolated, capsys, monkeypatch):
    monkeypatch.setenv("PRETRAIN_CLUSTER", str(GPU_2X8))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///on-this-machine.db")  # never reaches the pods: not checked
    status, out = pretrain_check(capsys, f"tracking.uri='{uri}'")
    assert status == 0 and len(out) == 1 and out[0].startswith("ok: "), out


def test_the_local_profile_keeps_its_sqlite_or_file_tracking(isolated, capsys, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///x.db")
    from cli.main import main

    for uri in ("", "sqlite:///x.db", "mlruns"):
        assert main(["check", "--set", f"tracking.uri='{uri}'"]) == 0, capsys.readouterr().err
    assert parse_config({"tracking": {"uri": "sqlite:///x.db"}}).tracking.uri == "sqlite:///x.db"


def test_a_cluster_profile_without_a_server_is_refused_and_tracking_off_passes(tmp_path, monkeypatch):
    """A profile whose pods run on the cluster but names no MLflow server: its pods would fall back to SQLite."""
    profile = tmp_path / "gpu-nomlflow.yaml"
    values = {k: v for k, v in yaml.safe_load(GPU_2X8.read_text()).items() if k != "tracking_uri"}
    profile.write_text(yaml.safe_dump(values))
    monkeypatch.setenv("PRETRAIN_CLUSTER", str(profile))
    preset = yaml.safe_load(GPT_125M.read_text()) | {"cluster_profile": ""}
    (line,) = problems_of(preset)
    assert line == (
        "tracking_uri of cluster profile gpu-nomlflow (the pods' $MLFLOW_TRACKING_URI) is '': its pods would record "
        f"into a SQLite file in the pod, lost with it; set tracking_uri in {profile} (or tracking.uri) to the MLflow "
        "server's http(s):// URL, e.g. http://mlflow:5000 (infra/mlflow)"
    )
    assert parse_config(preset | {"tracking": {"uri": "http://mlflow.example.org:5000"}})
    assert parse_config(preset | {"tracking": {"enabled": False}})  # nothing is tracked: nothing to lose


def test_the_workflows_first_node_applies_the_same_rule_in_the_pod(tmp_path, monkeypatch):
    """A launch from the console or a launch plan, which no command line checked, stops at check_settings."""
    monkeypatch.setenv("PRETRAIN_LOG_DIR", str(tmp_path))  # the failed task's traceback
    from pipeline.cluster import load_cluster
    from tasks.settings import check_settings
    from tracking.config import TrackingConfig

    cluster = load_cluster(str(GPU_2X8))
    check_settings(config=PipelineConfig(), world_size=2, cluster=cluster)  # the profile's server
    bad = PipelineConfig(tracking=TrackingConfig(uri="sqlite:///x.db"))
    check_settings(config=bad, world_size=2)  # registered under the local profile: SQLite is fine
    with pytest.raises(Exception) as raised:
        check_settings(config=bad, world_size=2, cluster=cluster)
    assert "tracking.uri is 'sqlite:///x.db': the pods of the cluster profile would record into the pod" in str(raised.value)


@pytest.mark.slow
def test_pyflyte_run_with_a_bad_config_fails_before_the_first_task(tmp_path, isolated):
    bad = write(tmp_path, BAD)
    command = [str(BIN / "pyflyte"), "run", "workflows/pretrain.py", "pretrain", "--config", str(bad)]
    env = {**os.environ, **isolated, "COLUMNS": "200"}
    started = time.monotonic()
    result = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    seconds = time.monotonic() - started
    output = result.stdout + result.stderr
    assert result.returncode == 2, output[-3000:]
    assert "Invalid value for '--config': the settings have 3 problems:" in output
    for line in BAD_LINES:
        assert line.strip() in output, output
    assert "Traceback" not in output
    assert list(Path(isolated["PRETRAIN_STORE"]).iterdir()) == []
    print(f"pyflyte run with a bad config failed after {seconds:.1f} s")
