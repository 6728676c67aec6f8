"""The stage contracts: store keys, the layout history, the typed model card, and the issue's
scenario of a run resumed by another layout (two gloo ranks, four steps)."""

import dataclasses
import json
import math
import shutil
import sys
from pathlib import Path

import pytest

from cli.main import main as cli
from common import contracts
from common.contracts import (
    CardFormatError,
    CheckpointRef,
    CodeRevision,
    DatasetRef,
    EvalReport,
    GateDecision,
    Layout,
    LayoutSpan,
    Lineage,
    ModelCard,
    extend_layouts,
)
from common.errors import ConfigError, user_error_in
from registry.names import RegistryError
from registry.registry import register, show
from storage import open_store
from tests.helpers import DATASET, DATASET_MANIFEST, DATASET_VERSION, TOKENIZER_JSON

PP2 = Layout(world_size=2, tensor_parallel=1, pipeline_parallel=2)
DP2_DISTOPT = Layout(world_size=2, tensor_parallel=1, distributed_optimizer=True)
DP2_FSDP = Layout(world_size=2, tensor_parallel=1, fsdp=True)


def test_contracts_import_neither_torch_nor_flyte():
    import subprocess

    code = "import sys, common.contracts; print(sorted(m for m in ('torch', 'flytekit') if m in sys.modules))"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip() == "[]"


def test_store_keys_spell_the_layout_once():
    run = contracts.run_prefix("ab12")
    assert contracts.checkpoint_prefix(run, 30) == "runs/ab12/checkpoints/step-0000030"
    assert contracts.step_of_checkpoint("step-0000030") == 30 and contracts.step_of_checkpoint("tmp") is None
    assert contracts.metrics_key(run) == "runs/ab12/metrics.jsonl"
    assert contracts.tensorboard_prefix(run) == "runs/ab12/tensorboard"
    assert contracts.eval_prefix(run, "k") == "runs/ab12/eval/k"
    assert contracts.validation_prefix(contracts.dataset_prefix("v1")) == "datasets/v1/validation"
    entry = contracts.model_prefix("gpt", 3)
    assert (entry, contracts.card_key(entry)) == ("models/gpt/3", "models/gpt/3/card.json")
    assert contracts.alias_key("gpt", "production") == "models/gpt/aliases/production.json"


def test_layout_history_grows_on_the_same_layout_and_appends_another():
    history = extend_layouts([], 1, 5, PP2)
    assert extend_layouts(history, 6, 10, PP2) == [LayoutSpan(1, 10, PP2)]  # a plain resume
    assert extend_layouts(history, 6, 10, DP2_DISTOPT) == [LayoutSpan(1, 5, PP2), LayoutSpan(6, 10, DP2_DISTOPT)]
    assert extend_layouts(history, 6, 5, DP2_DISTOPT) == history  # nothing trained: nothing added
    assert PP2.data_parallel == 1 and DP2_DISTOPT.data_parallel == 2


def make_card(**overrides) -> ModelCard:
    lineage = Lineage("v1", "s3://b/datasets/v1", "s3://b/datasets/v1/manifest.json", "t" * 64, "runs/ab12", 10, "s3://b/c")
    card = ModelCard(
        name="gpt",
        version=1,
        registered_at="2025-01-01T00:00:00+00:00",
        metrics={"val_loss": 3.0, "val_tokens": 100},
        sample="def f():",
        sampled="def g():",
        lineage=lineage,
        layouts=[LayoutSpan(1, 10, PP2)],
        config={"model": {"num_layers": 2}, "parallel": {"pipeline_parallel": 2}},
        code=CodeRevision("abc", False),
        gate=GateDecision("production", "", None, 2.0, 0.0, True, "no model holds the alias yet: the candidate takes it"),
    )
    return dataclasses.replace(card, **overrides)


def test_card_round_trips_through_json():
    card = make_card()
    assert ModelCard.from_dict(json.loads(json.dumps(card.to_dict()))) == card
    assert make_card(gate=None, hf_export="hf").to_dict()["gate"] is None
    assert card.model_config() == {"num_layers": 2}


def test_card_format_1_loads_without_a_layout_history_and_anything_else_is_named():
    old = make_card().to_dict()
    del old["format"], old["layouts"]
    assert ModelCard.from_dict(old).layouts == [] and ModelCard.from_dict(old).format == 1
    with pytest.raises(CardFormatError, match="card has no 'lineage'"):
        ModelCard.from_dict({k: v for k, v in old.items() if k != "lineage"})
    with pytest.raises(CardFormatError, match=r"unknown ModelCard keys \['half'\]"):
        ModelCard.from_dict({**old, "half": "written"})
    with pytest.raises(CardFormatError, match="card format 3"):
        ModelCard.from_dict({**old, "format": 3})


def populated_store(root: Path):
    """A store with a dataset's manifest and tokenizer and one committed checkpoint."""
    store = open_store(str(root))
    store.put_bytes(f"{DATASET}/manifest.json", DATASET_MANIFEST)
    store.put_bytes(f"{DATASET}/tokenizer.json", TOKENIZER_JSON)
    store.commit(DATASET)
    store.put_bytes("runs/ab12/checkpoints/step-0000010/model/__0_0.distcp", b"weights")
    store.put_json("runs/ab12/checkpoints/step-0000010/meta.json", {"step": 10})
    store.commit("runs/ab12/checkpoints/step-0000010")
    return store


def evaluated(ckpt: CheckpointRef, loss: float = 3.0) -> EvalReport:
    return EvalReport(ckpt, loss, math.exp(loss), 100, loss / math.log(2), sample="def f():")


def test_registry_show_says_which_layout_trained_which_steps(tmp_path, capsys):
    store = populated_store(tmp_path / "store")
    layouts = [LayoutSpan(1, 5, PP2), LayoutSpan(6, 8, DP2_DISTOPT), LayoutSpan(9, 10, DP2_FSDP)]
    dataset = DatasetRef(store.uri, DATASET_VERSION, DATASET)
    ckpt = CheckpointRef(store.uri, "runs/ab12", "runs/ab12/checkpoints/step-0000010", 10, dataset, layouts=layouts)
    register(store, "gpt", evaluated(ckpt), config={"parallel": {"tensor_parallel": 2}})
    assert show(store, "gpt:1").card.layouts == layouts
    assert cli(["registry", "show", "gpt:1", "--store", store.uri]) == 0
    out = capsys.readouterr().out
    assert "trained by:\n  steps 1-5: tensor_parallel=1, pipeline_parallel=2, data_parallel=1, distributed_optimizer=false" in out
    assert "  steps 6-8: tensor_parallel=1, pipeline_parallel=1, data_parallel=2, distributed_optimizer=true, fsdp=false\n" in out
    fsdp_line = "  steps 9-10: tensor_parallel=1, pipeline_parallel=1, data_parallel=2, distributed_optimizer=false, fsdp=true"
    assert f"{fsdp_line}\n" in out
    card_md = store.get_bytes("models/gpt/1/card.md").decode()
    assert "## Trained by\n- steps 1-5: tensor_parallel=1" in card_md and "- steps 9-10: " in card_md and "fsdp=true" in card_md
    assert cli(["registry", "list", "--json", "--store", store.uri]) == 0
    trained_by = json.loads(capsys.readouterr().out)[0]["trained_by"]
    assert trained_by.startswith("steps 1-5: ") and trained_by.endswith("steps 9-10: " + DP2_FSDP.describe()), trained_by


def test_a_layout_recorded_before_fsdp_existed_reads_as_not_fsdp():
    old = {"first_step": 1, "last_step": 4, "layout": {"world_size": 2, "tensor_parallel": 1, "pipeline_parallel": 1}}
    assert LayoutSpan.from_dict(old).layout == Layout(world_size=2, tensor_parallel=1, fsdp=False)
    assert LayoutSpan.from_dict(old).describe().endswith("distributed_optimizer=false, fsdp=false")


def test_a_card_this_release_cannot_read_is_one_registry_error(tmp_path):
    store = populated_store(tmp_path / "store")
    store.put_json("models/gpt/1/card.json", {"metrics": {"val_loss": 3.0}})
    store.commit("models/gpt/1")
    store.put_json("models/gpt/aliases/latest.json", {"version": 1})
    with pytest.raises(RegistryError, match="card.json: card has no 'lineage'; register the model again"):
        show(store, "gpt")


def test_continuing_a_model_of_another_shape_stops_before_the_data_stage(tmp_path):
    from tasks.register import find_base_model
    from training.config import ModelConfig, ParallelConfig

    store = populated_store(tmp_path / "store")
    ckpt = CheckpointRef(
        store.uri, "runs/ab12", "runs/ab12/checkpoints/step-0000010", 10, DatasetRef(store.uri, DATASET_VERSION, DATASET)
    )
    register(store, "gpt", evaluated(ckpt), config={"model": dataclasses.asdict(ModelConfig(num_layers=2, hidden_size=64))})
    same = find_base_model(store=store.uri, init_from="gpt:latest", parallel=ParallelConfig(), model=ModelConfig(num_layers=2))
    assert same == ("models/gpt/1", ModelConfig(num_layers=2, hidden_size=64))  # settings left at defaults: the base's
    # The run's kernels stand (how it computes, not what it is).
    torch_kernels = find_base_model(
        store=store.uri, init_from="gpt:latest", parallel=ParallelConfig(), model=ModelConfig(kernels="torch")
    )
    assert torch_kernels.model == ModelConfig(num_layers=2, hidden_size=64, kernels="torch")
    with pytest.raises(Exception) as raised:
        find_base_model(
            store=store.uri, init_from="gpt:latest", parallel=ParallelConfig(), model=ModelConfig(num_layers=3, hidden_size=64)
        )
    error = user_error_in(raised.value)
    assert isinstance(error, ConfigError)
    assert "train.init_from names gpt:1, whose model section differs (model.num_layers: 3 here, 2 there)" in str(error)
    # The base's heads over this run's tensor-parallel ranks: before the data stage too.
    with pytest.raises(Exception) as raised:
        find_base_model(store=store.uri, init_from="gpt:latest", parallel=ParallelConfig(tensor_parallel=8), model=ModelConfig())
    said = "gpt:latest is models/gpt/1: model.num_attention_heads=4 is not divisible by parallel.tensor_parallel=8"
    assert said in str(user_error_in(raised.value))


# -- the scenario: a pipeline_parallel=2 run, then the same settings at DP=2 ------
@pytest.mark.slow
def test_resuming_another_layouts_run_says_so_and_the_card_names_the_layouts_that_trained(tiny_dataset, tmp_path, capfd):
    from training.checkpointing import checkpoint
    from training.config import ModelConfig, ParallelConfig, TrainConfig
    from training.launch import launch
    from training.train import train

    model = ModelConfig(num_layers=2, hidden_size=64, num_attention_heads=4)
    steps = TrainConfig(steps=4, micro_batch_size=4, global_batch_size=8, warmup_steps=1, checkpoint_every=2, seed=77)
    shutil.copytree(Path(tiny_dataset.store) / tiny_dataset.prefix, tmp_path / "store" / tiny_dataset.prefix)
    dataset = dataclasses.replace(tiny_dataset, store=str(tmp_path / "store"))
    store = open_store(dataset.store)

    pp2 = launch(train, 2, dataset, model, ParallelConfig(tensor_parallel=1, pipeline_parallel=2), steps)
    assert pp2.layouts == [LayoutSpan(1, 4, PP2)]
    capfd.readouterr()

    # The run id leaves the layout out: the same settings at DP=2 find the PP=2 run finished.
    distopt = ParallelConfig(tensor_parallel=1, distributed_optimizer=True)
    again = launch(train, 2, dataset, model, distopt, steps)
    log = capfd.readouterr().out
    assert (again.run, again.prefix) == (pp2.run, pp2.prefix)
    assert again.layouts == [LayoutSpan(1, 4, PP2)]  # not DP=2: that call trained nothing
    assert again.summary["tokens_per_second"] == pp2.summary["tokens_per_second"]
    assert (
        f"run {pp2.run} already finished 4 steps (tensor_parallel=1, pipeline_parallel=2, data_parallel=1, "
        "distributed_optimizer=false, fsdp=false): nothing to train; reusing its checkpoint. Its weights, tokens/s and "
        "layout are that run's, not this call's (tensor_parallel=1, pipeline_parallel=1, data_parallel=2, "
        "distributed_optimizer=true, fsdp=false)." in log
    ), log
    assert "step     1/4" not in log

    # Its card, registered from that checkpoint, names PP=2 though the config asked for DP=2.
    register(store, "gpt", evaluated(again), config={"parallel": dataclasses.asdict(distopt)})
    card = show(store, "gpt").card
    assert card.layouts == [LayoutSpan(1, 4, PP2)] and card.config["parallel"]["distributed_optimizer"] is True

    # Halfway: steps 3-4 train at DP=2, and every later checkpoint carries both spans.
    store.delete_prefix(checkpoint.checkpoint_prefix(pp2.run, 4))
    resumed = launch(train, 2, dataset, model, distopt, steps)
    log = capfd.readouterr().out
    assert resumed.layouts == [LayoutSpan(1, 2, PP2), LayoutSpan(3, 4, DP2_DISTOPT)]
    meta = store.get_json(f"{resumed.prefix}/meta.json")
    assert [LayoutSpan.from_dict(span) for span in meta["layouts"]] == resumed.layouts
    assert f"run {pp2.run} has steps 1-2 trained by another layout (tensor_parallel=1, pipeline_parallel=2" in log, log
    assert "training steps 3-4 with tensor_parallel=1, pipeline_parallel=1, data_parallel=2, distributed_optimizer=true" in log
    assert "the weights carry over, the optimizer starts afresh." in log
