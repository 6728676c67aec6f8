"""The pretraining pipeline: prepare → validate → train → evaluate → register.

pyflyte run workflows/pretrain.py pretrain                                # embedded defaults
pyflyte run workflows/pretrain.py pretrain --config configs/tiny-cpu.yaml
"""

from __future__ import annotations

from flytekit import workflow

from pipeline.config import PipelineConfig
from registry.registry import ModelRef
from tasks.data import prepare_data, validate_data
from tasks.evaluate import evaluate_model
from tasks.register import register_model
from tasks.train import train_model


@workflow
def pretrain(config: PipelineConfig = PipelineConfig()) -> ModelRef:
    """Pretrain a GPT from raw text and register it, every step cached and versioned."""
    dataset = prepare_data(store=config.store, data=config.data, tokenizer=config.tokenizer)
    checked = validate_data(dataset=dataset, validation=config.validation)
    checkpoint = train_model(dataset=checked, model=config.model, parallel=config.parallel, train_cfg=config.train)
    report = evaluate_model(checkpoint=checkpoint, model=config.model, eval_cfg=config.evaluation)
    return register_model(report=report, config=config)
