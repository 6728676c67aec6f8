"""The ``data.mixture`` section: YAML → components, the single-source identity, one problem line per
mistake, the Flyte round trip, and the epoch warning."""

from __future__ import annotations

import dataclasses

import pytest
import yaml

from common.errors import ConfigError
from common.hashing import config_hash
from data_prep.config import DataConfig, MixtureComponent, Normalization
from data_prep.mixture import components, epoch_warnings
from pipeline.config import PipelineConfig, parse_config

PRESET = """
data:
  seq_len: 64
  min_chars: 32
  mixture:
    - name: code
      sources: [python-stdlib]
      weight: 3
    - name: docs
      sources: ["/usr/share/doc/**/*.txt"]
      weight: 1
      max_epochs: 2
      min_chars: 200
      quality: {gopher: {enabled: true}}
"""


def problems_of(data: dict) -> str:
    with pytest.raises(ConfigError) as info:
        parse_config({"data": data}, launch=False)
    return str(info.value)


def mixture(*comps: dict, **data) -> dict:
    return {**data, "mixture": [{"sources": ["python-stdlib"], **c} for c in comps]}


def test_yaml_to_components():
    data = parse_config(yaml.safe_load(PRESET), launch=False).data
    code, docs = components(data)
    assert (code.name, code.weight, code.max_epochs) == ("code", 0.75, 4.0)
    assert (docs.name, docs.weight, docs.max_epochs) == ("docs", 0.25, 2.0)
    assert docs.data.sources == ["/usr/share/doc/**/*.txt"] and code.data.sources == ["python-stdlib"]
    assert docs.data.min_chars == 200 and docs.data.quality.gopher.enabled
    # unset overrides inherit the section's keys; packing stays global; no component holds the weights
    assert code.data.min_chars == 32 and not code.data.quality.gopher.enabled
    assert code.data.seq_len == docs.data.seq_len == 64
    assert code.data.mixture == docs.data.mixture == []
    assert code.data == dataclasses.replace(data, sources=["python-stdlib"], mixture=[])


def test_weights_are_in_no_component_key():
    data = parse_config(yaml.safe_load(PRESET), launch=False).data
    heavier = dataclasses.replace(data, mixture=[dataclasses.replace(c, weight=c.weight * 7) for c in data.mixture])
    assert [config_hash(c.data) for c in components(data)] == [config_hash(c.data) for c in components(heavier)]


def test_single_source_is_the_section_itself():
    data = DataConfig(sources=["python-stdlib"], min_chars=10)
    before = config_hash(data)
    (only,) = components(data)
    assert only.data is data and (only.name, only.weight) == ("data", 1.0)
    assert config_hash(only.data) == before
    assert data.problems() == []


@pytest.mark.parametrize(
    ("comp", "expected"),
    [
        ({"name": "docs", "weight": -1}, "data.mixture[docs].weight is -1: give a positive number (weights are normalised"),
        ({"name": "docs", "weight": 0}, "data.mixture[docs].weight is 0: give a positive number"),
        ({"name": "docs", "weight": float("nan")}, "data.mixture[docs].weight is nan: give a positive number"),
        ({"name": "docs", "weight": float("inf")}, "data.mixture[docs].weight is inf: give a positive number"),
        ({"name": "docs", "max_epochs": 0}, "data.mixture[docs].max_epochs is 0: give a positive number of passes"),
        ({"name": "docs", "sources": []}, "data.mixture[docs].sources is []: name at least one file"),
        ({"name": ""}, "data.mixture[1].name is '': give each component a name of letters, digits, '_', '.' or '-'"),
        ({"name": "my docs"}, "data.mixture[my docs].name is 'my docs': give each component a name of letters"),
        ({"name": "docs", "min_chars": 5_000_000}, "data.mixture[docs].min_chars is 5000000: must be ≤ data.max_chars"),
        ({"name": "docs", "languages": ["English"]}, "data.mixture[docs].languages[0] is 'English': give an ISO 639-1 code"),
        ({"name": "docs", "near_dup_threshold": 2.0}, "data.mixture[docs].near_dup_threshold is 2.0: must be in [0, 1]"),
        ({"name": "docs", "pii": {"email": "hide"}}, "data.mixture[docs].pii.email is 'hide': use one of redact, drop, off"),
        ({"name": "docs", "colour": 1}, "unknown setting data.mixture[docs].colour (did you mean"),
        ({"name": "docs", "weight": "heavy"}, "data.mixture[docs].weight must be float, got 'heavy'"),
    ],
)
def test_one_problem_line_each(comp, expected):
    message = problems_of(mixture({"name": "code"}, comp))
    assert "have 1 problem:" in message and expected in message


def test_weight_of_another_type_built_in_python():
    data = DataConfig(sources=[], mixture=[MixtureComponent(name="docs", sources=["python-stdlib"], weight="3")])
    assert data.problems() == ["data.mixture[docs].weight is '3': give a positive number (weights are normalised to shares)"]


def test_duplicate_names():
    message = problems_of(mixture({"name": "code"}, {"name": "code", "min_chars": 9_000_000}))
    assert "data.mixture[1].name is 'code', as data.mixture[0]'s: give each component its own name" in message
    assert "data.mixture[1].min_chars is 9000000" in message


def test_sources_and_mixture_both_given():
    message = problems_of(mixture({"name": "code"}, sources=["/data/corpus"]))
    assert "data.sources is ['/data/corpus'] and data.mixture is given: give one of them" in message
    for sources in ([], ["python-stdlib"]):  # left empty or at its default: the mixture replaces it
        assert parse_config({"data": mixture({"name": "code"}, sources=sources)}, launch=False).data.sources == sources


def test_inherited_problems_are_the_sections_own():
    message = problems_of(mixture({"name": "code"}, {"name": "docs"}, seq_len=0))
    assert "have 1 problem:" in message and "data.seq_len is 0" in message


def test_missing_component_paths(tmp_path):
    missing = str(tmp_path / "nothing")
    data = DataConfig(sources=[], mixture=[MixtureComponent(name="docs", sources=[missing])])
    assert data.path_problems() == [
        f"data.mixture[docs].sources[0] is {missing!r}: does not exist; give an existing file, folder, glob or s3:// URI"
    ]


def test_flyte_round_trip():
    from flytekit.core.context_manager import FlyteContextManager
    from flytekit.core.type_engine import TypeEngine

    data = DataConfig(
        sources=[],
        mixture=[
            MixtureComponent(name="code", sources=["python-stdlib"], weight=3.0),
            MixtureComponent(name="docs", sources=["python-stdlib"], min_chars=200, normalization=Normalization.NFKC),
        ],
    )
    config = PipelineConfig(data=data)
    ctx = FlyteContextManager.current_context()
    literal = TypeEngine.to_literal(ctx, config, PipelineConfig, TypeEngine.to_literal_type(PipelineConfig))
    back = TypeEngine.to_python_value(ctx, literal, PipelineConfig)
    assert back == config and isinstance(back.data.mixture[1], MixtureComponent)
    assert back.data.mixture[1].normalization is Normalization.NFKC and back.data.mixture[0].quality is None


def test_epoch_warnings(tmp_path):
    for name, size in (("small", 1_000), ("large", 100_000)):
        (tmp_path / name).mkdir()
        (tmp_path / name / "a.txt").write_text("x" * size)
    data = DataConfig(
        sources=[],
        mixture=[
            MixtureComponent(name="small", sources=[str(tmp_path / "small")], weight=1.0, max_epochs=4.0),
            MixtureComponent(name="large", sources=[str(tmp_path / "large")], weight=1.0),
        ],
    )
    # 4,000 training tokens: 2,000 each; small holds ≈ 250 tokens (8 passes), large ≈ 25,000
    (warning,) = epoch_warnings(data, 4_000, bytes_per_token=4.0)
    assert warning.startswith("data.mixture[small]: the run would read it about 8.0 times (weight 0.5 of 4,000 tokens")
    assert "≈ 2,000 tokens, the component holds ≈ 250 tokens" in warning and "more than its max_epochs 4" in warning
    assert epoch_warnings(data, 800) == []  # 400 tokens of 250: 1.6 passes
    assert epoch_warnings(DataConfig(), 10**12) == []  # no mixture: nothing listed, no warning


def test_runs_compare_lists_a_mixtures_weight_changes_and_training_warns_of_an_over_read_component():
    from data_prep.blend import overread_components
    from runs.catalog import differences, flat_config

    meta = {"dataset": "blend-a", "mixture": {"code": 0.75, "docs": 0.25}}
    other = {"dataset": "blend-b", "mixture": {"code": 0.5, "docs": 0.5}}
    changed = {d["key"]: d["values"] for d in differences([flat_config(meta), flat_config(other)])}
    assert changed == {"dataset": ["blend-a", "blend-b"], "mixture.code.weight": [0.75, 0.5], "mixture.docs.weight": [0.25, 0.5]}
    mixture = [
        {"name": "code", "train_sequences": 100, "max_epochs": 4.0},
        {"name": "docs", "train_sequences": 10, "max_epochs": 4.0},
    ]
    (line,) = overread_components(mixture, {"code": 300, "docs": 50})  # docs: 5 passes of its 10 rows
    assert line.startswith("data.mixture[docs]: the run reads it 5.00 times (50 samples of 10), more than its max_epochs 4")
