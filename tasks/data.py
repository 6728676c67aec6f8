"""Fingerprint, prepare and validate the dataset."""

from __future__ import annotations

import dataclasses
import functools
import logging
from typing import Annotated, Any

from flytekit import Cache, Deck, HashMethod, dynamic, map_task, task

from common.contracts import TOKENIZER, DatasetRef
from common.hashing import config_hash
from common.stages import mark_stage
from data_prep import manifest as manifest_keys
from data_prep import mixture_tokenizer
from data_prep import prepare as stages
from data_prep.blend_dataset import Part, commit_blend
from data_prep.config import DataConfig, TokenizerConfig, ValidationConfig
from data_prep.dedup_across import NearSettings, commit_exclusions, cross_component_duplicates, load_exclusions
from data_prep.mixture import components
from data_prep.shards import ShardInfo
from data_prep.sources import content_fingerprint, list_corpus
from data_prep.validation import Validation, ValidationFailed, check_dataset, report_html
from registry.card import base_eod_token
from reports.dataset_html import dataset_html
from storage import Store, open_store
from tasks import decks
from tasks.caching import cache_version
from tasks.placement import data_task
from tasks.user_errors import as_messages

VERSION = cache_version(__name__)


def corpus_hash(data: DataConfig) -> str:
    """The data section with its sources replaced by the content of what they name, so that
    identical data hits prepare's cache from any path, and changed data misses it. Files are
    streamed: a corpus bigger than memory is fine."""
    if data.mixture:  # every component's content and settings, not the weights (nor the names)
        return config_hash([corpus_hash(part.data) for part in components(data)])
    # The section without its sources and mixture: the bytes this hash had before mixtures existed.
    section = {
        k: v for k, v in dataclasses.asdict(dataclasses.replace(data, sources=[])).items() if k not in manifest_keys.MIXTURE
    }
    return config_hash(section, content_fingerprint(data.sources, data.sniff_unlisted, data.follow_symlinks))


@task(**data_task())
@as_messages
def fingerprint_corpus(data: DataConfig) -> Annotated[DataConfig, HashMethod(corpus_hash)]:
    """Pass the data section on, keyed for caching by the corpus content rather than its paths. A corpus
    with no file to read stops here, at listing, before anything is written (the hash would say it too,
    wrapped in Flyte's output conversion)."""
    list_corpus(data)
    return data


@dynamic(**data_task())
@as_messages
def prepare_mixture(
    store: str, data: DataConfig, tokenizer: TokenizerConfig, validation: ValidationConfig, base_model: str
) -> DatasetRef:
    """Prepare and validate each component of the mixture on its own, then blend them (a plain ``data.sources``
    is one component, and its dataset is the blend).

    Each component is keyed by its own files and settings, never by the weights: editing one component
    prepares that one again, changing only the weights prepares nothing. A mixture of several trains one
    tokenizer for all of them first, on an equal share of each (unless ``tokenizer.file`` or a base model
    gives it), and, with ``data.dedup_across``, finds each later component's duplicates of an earlier one's
    documents after the prepares: the blend leaves their rows out.
    """
    parts = components(data)
    corpora = [fingerprint_corpus(data=part.data) for part in parts]
    key: Any = ""
    if len(parts) > 1 and not base_model and not tokenizer.file:
        key = train_mixture_tokenizer(store=store, components=corpora, tokenizer=tokenizer)
    prepared = [
        prepare_data(store=store, data=corpus, tokenizer=tokenizer, base_model=base_model, tokenizer_key=key)
        for corpus in corpora
    ]
    checked = [validate_data(dataset=dataset, validation=validation) for dataset in prepared]
    if len(parts) == 1:
        return checked[0]  # one component is its own dataset: no blend, no task more than before mixtures
    exclusions: Any = ""
    if data.dedup_across:
        near = [data.shingle_words, data.minhash_bands, data.minhash_rows] if data.near_dedup else []
        exclusions = dedup_across_components(store=store, datasets=checked, near=near, threshold=data.near_dup_threshold)
    names, weights, max_epochs = [p.name for p in parts], [p.weight for p in parts], [p.max_epochs for p in parts]
    return blend_datasets(
        store=store, datasets=checked, names=names, weights=weights, max_epochs=max_epochs, exclusions=exclusions
    )


@task(cache=Cache(version=VERSION, serialize=True), **data_task())
@as_messages
def train_mixture_tokenizer(store: str, components: list[DataConfig], tokenizer: TokenizerConfig) -> str:
    """The mixture's one tokenizer, trained on an equal share of each component: its store key."""
    _log_progress()
    return mixture_tokenizer.train_mixture_tokenizer(open_store(store), components, tokenizer)


@task(cache=Cache(version=VERSION, serialize=True), **data_task())
@as_messages
def dedup_across_components(store: str, datasets: list[DatasetRef], near: list[int], threshold: float) -> str:
    """Each later component's exact and near duplicates of an earlier component's documents (``near``: shingle
    words, bands and rows; [] for exact ones only): the exclusion list's store key. Keyed by the components'
    datasets: editing one component reruns its prepare and this stage, and nothing else."""
    _log_progress()
    opened, settings = open_store(store), NearSettings(*near, threshold) if near else None
    return commit_exclusions(opened, cross_component_duplicates(opened, datasets, settings))


@task(**data_task())
@as_messages
def blend_datasets(
    store: str, datasets: list[DatasetRef], names: list[str], weights: list[float], max_epochs: list[float], exclusions: str
) -> DatasetRef:
    """The components' datasets as one, each with its weight, without the rows ``exclusions`` names (a plain
    dataset stays as it is).

    Not cached: it writes one manifest (the same inputs, the same version), and the weights, which no
    component's cache key holds, are read here."""
    opened = open_store(store)
    parts = [Part(*part) for part in zip(names, datasets, weights, max_epochs, strict=True)]
    return commit_blend(opened, parts, load_exclusions(opened, exclusions) if exclusions else None)


@dynamic(cache=Cache(version=VERSION, serialize=True), **data_task())
@as_messages
def prepare_data(store: str, data: DataConfig, tokenizer: TokenizerConfig, base_model: str, tokenizer_key: str) -> DatasetRef:
    """Read, clean, de-duplicate, tokenize and shard the corpus into the store.

    Lists the corpus and cuts it into ``data.partitions``, then fans out: a scan task per
    partition, exact and near de-duplication per key shard, one resolve and one tokenizer task,
    an encode task per partition, a pack task per range of shards, and the commit. A task that
    fails is retried alone (``retries``); the others keep their results.

    A ``base_model`` (registry entry) lends its tokenizer and the token ending its documents: continued
    pretraining keeps the vocabulary (an imported model's tokenizer encodes the corpus). Else
    ``tokenizer_key``, a tokenizer.json in the store (a mixture's), or ``""``: one is trained here.
    """
    mark_stage("prepare")
    _log_progress()
    if base_model:
        tokenizer_key = f"{base_model}/{TOKENIZER}"
    if base_model:  # its tokenizer's own end-of-text token ends the documents
        tokenizer = dataclasses.replace(tokenizer, eod_token=base_eod_token(open_store(store), base_model))
    prep = stages.plan(open_store(store), data, tokenizer, tokenizer_key)
    partitions = list(range(prep.partitions))
    scanned = map_task(functools.partial(scan_partition, prep=prep))(index=partitions)
    exact = map_task(functools.partial(dedup_exact, prep=prep))(shard=partitions)
    near = map_task(functools.partial(dedup_near, prep=prep))(shard=partitions)
    resolved = resolve_documents(prep=prep)
    trained = train_tokenizer(prep=prep)
    encoded = map_task(functools.partial(encode_partition, prep=prep))(index=partitions)
    jobs = plan_packing(prep=prep)
    packed = map_task(functools.partial(pack_shards, prep=prep))(job=jobs)
    scanned >> exact >> near >> resolved >> trained >> encoded >> jobs
    return commit_dataset(prep=prep, packed=packed)


def _log_progress() -> None:
    progress = logging.getLogger("data_prep")
    if not progress.handlers:
        progress.addHandler(logging.StreamHandler())
        progress.setLevel(logging.INFO)


def _store(prep: stages.Preparation) -> Store:
    _log_progress()
    return open_store(prep.store)


@task(**data_task())
@as_messages
def scan_partition(prep: stages.Preparation, index: int) -> None:
    """Read, clean and filter one partition's files; its keys and signatures to the work prefix."""
    stages.scan_stage(prep, _store(prep), index)


@task(**data_task())
@as_messages
def dedup_exact(prep: stages.Preparation, shard: int) -> None:
    """Exact duplicates among the content keys of one key shard."""
    stages.exact_stage(prep, _store(prep), shard)


@task(**data_task())
@as_messages
def dedup_near(prep: stages.Preparation, shard: int) -> None:
    """Verified near-duplicate pairs among the LSH buckets of one key shard."""
    stages.near_stage(prep, _store(prep), shard)


@task(**data_task())
@as_messages
def resolve_documents(prep: stages.Preparation) -> None:
    """Which documents are kept, in which split, and the tokenizer's sample."""
    stages.resolve_stage(prep, _store(prep))


@task(**data_task())
@as_messages
def train_tokenizer(prep: stages.Preparation) -> None:
    """Train the BPE tokenizer on the sample (or take the given one)."""
    stages.tokenizer_stage(prep, _store(prep))


@task(**data_task())
@as_messages
def encode_partition(prep: stages.Preparation, index: int) -> None:
    """Encode one partition's kept documents into token streams."""
    stages.encode_stage(prep, _store(prep), index)


@task(**data_task())
@as_messages
def plan_packing(prep: stages.Preparation) -> list[stages.PackJob]:
    """The pack tasks' shares of the shards."""
    return stages.pack_jobs(prep, _store(prep))


@task(**data_task())
@as_messages
def pack_shards(prep: stages.Preparation, job: stages.PackJob) -> list[ShardInfo]:
    """Write one range of shards, each uploaded as it is written."""
    return stages.pack_stage(prep, _store(prep), job)


@task(enable_deck=True, deck_fields=decks.FIELDS, **data_task())
@as_messages
def commit_dataset(prep: stages.Preparation, packed: list[list[ShardInfo]]) -> DatasetRef:
    """The manifest and the commit marker: the dataset, whole, under its version."""
    store = _store(prep)
    ref = stages.commit_stage(prep, store, packed)
    # Its figures, documents skipped by reason and document lengths (doc_stats.csv, from the store).
    Deck("Dataset", dataset_html(store, ref.version))
    return ref


@task(cache=Cache(version=VERSION, serialize=True), enable_deck=True, deck_fields=decks.FIELDS, **data_task())
@as_messages
def validate_data(dataset: DatasetRef, validation: ValidationConfig) -> DatasetRef:
    """Great Expectations gate: raises, listing every failed expectation, before training starts."""
    mark_stage("validate")
    store = open_store(dataset.store)
    try:
        result = check_dataset(store, dataset, validation)
    except ValidationFailed as failed:
        if failed.validation is not None:
            _validation_decks(dataset, failed.validation)
        raise
    _validation_decks(dataset, result)
    return dataset


def _validation_decks(dataset: DatasetRef, result: Validation) -> None:
    """The gate's report as a Deck (pass or fail), rendered here from the outcomes this task
    computed, every value escaped: never HTML read back from the bucket, which anyone who can
    write there could have replaced."""
    Deck("Data validation", report_html(dataset, result.outcomes, result.modified))
