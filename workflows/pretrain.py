"""The pretraining pipeline: prepare → validate → train → evaluate → register, mirrored in MLflow
(``start_tracking`` first, ``track_run`` last: see docs/tracking.md).

    pyflyte run workflows/pretrain.py pretrain                                # embedded defaults
    pyflyte run workflows/pretrain.py pretrain --config configs/tiny-cpu.yaml

Launch plans: ``pretrain_default`` (the defaults, on demand) and ``pretrain_nightly``
(every night at 02:00 UTC: continue the latest registered model on the data in
``configs/nightly.yaml``'s sources; at most one at a time, a night that would overlap the
previous one is skipped).
"""

from __future__ import annotations

from pathlib import Path

from flytekit import ConcurrencyLimitBehavior, ConcurrencyPolicy, CronSchedule, LaunchPlan, workflow
from flytekit.models.common import Labels

from common.contracts import ModelRef
from pipeline.cluster import kueue_labels
from pipeline.config import PipelineConfig, load_config
from tasks.data import prepare_mixture
from tasks.evaluate import evaluate_model
from tasks.placement import CLUSTER
from tasks.register import find_base_model, find_gate_holder, register_model
from tasks.settings import check_settings
from tasks.track import fail_tracking, start_tracking, track_run
from tasks.train import plan_training, train_model

CONFIGS = Path(__file__).resolve().parent.parent / "configs"


# on_failure: a failed execution ends its MLflow run FAILED, with the task and the error (flytekit's local
# execution calls it too: `pretrain run`, `pyflyte run`).
@workflow(on_failure=fail_tracking)
def pretrain(config: PipelineConfig = PipelineConfig()) -> ModelRef:
    """Pretrain a GPT from raw text and register it, every step cached and versioned.

    Args:
        config: The whole run: corpus, tokenizer, validation thresholds, model, parallelism,
            training, evaluation and registry settings, and the object store.
    """
    settings = check_settings(config=config, world_size=CLUSTER.nnodes * CLUSTER.nproc_per_node, cluster=CLUSTER)
    # The model to continue, if any, and the model section that trains: a continued run's is its base's.
    base = find_base_model(store=config.store, init_from=config.train.init_from, model=config.model, parallel=config.parallel)
    train_cfg = plan_training(store=config.store, train_cfg=config.train, seq_len=config.data.seq_len)
    # The run opens before the corpus is listed: a corpus that stops there ends a FAILED run, not none.
    tracking = start_tracking(config=config)
    # Each component of the mixture prepared and validated on its own (a plain data.sources is one), then blended.
    dataset = prepare_mixture(
        store=config.store, data=config.data, tokenizer=config.tokenizer, validation=config.validation, base_model=base.entry
    )
    settings >> tracking
    settings >> base.entry
    settings >> train_cfg
    train_cfg >> dataset  # a budget or cooldown that cannot run stops the run before the corpus is read
    settings >> dataset
    checkpoint = train_model(
        dataset=dataset,
        model=base.model,
        parallel=config.parallel,
        train_cfg=train_cfg,
        base_model=base.entry,
        tracking=tracking,
        tracking_cfg=config.tracking,
        max_restarts=config.train.max_restarts,
        keep_local_checkpoints=config.train.keep_local_checkpoints,
        local_checkpoint_every=config.train.local_checkpoint_every,
    )
    holder = find_gate_holder(store=config.store, registry=config.registry)
    report = evaluate_model(checkpoint=checkpoint, model=base.model, eval_cfg=config.evaluation, baseline=holder)
    model = register_model(report=report, registry=config.registry, config=config, model=base.model)
    track_run(tracking=tracking, model=model, config=config)
    return model


pretrain_default = LaunchPlan.get_or_create(
    workflow=pretrain,
    name="pretrain_default",
    default_inputs={"config": PipelineConfig()},
    labels=Labels(kueue_labels(CLUSTER)),
)

pretrain_nightly = LaunchPlan.get_or_create(
    workflow=pretrain,
    name="pretrain_nightly",
    # launch=False: the settings' own rules only; `pretrain check` adds those of a cluster profile's world size.
    default_inputs={"config": load_config(CONFIGS / "nightly.yaml", launch=False)},
    schedule=CronSchedule(schedule="0 2 * * *"),
    # A night that runs long must not overlap the next one (two trainings continuing the same
    # model, racing for its aliases): at most one execution, a later one is skipped.
    concurrency=ConcurrencyPolicy(max_concurrency=1, behavior=ConcurrencyLimitBehavior.SKIP),
    labels=Labels(kueue_labels(CLUSTER, priority_class="nightly")),
)
