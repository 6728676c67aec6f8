"""The ``pretrain`` command: run the pipeline locally, start a local S3 store, browse the registry and the runs.

    pretrain run [--config configs/tiny-cpu.yaml] [--set KEY=VALUE ...] [--store URI]
    pretrain check [--config FILE] [--set KEY=VALUE ...] [--store URI]
    pretrain settings [KEY] [--json]
    pretrain store up [--dir DIR] [--port PORT] [--bucket NAME]
    pretrain registry list [--json] [--store URI]
    pretrain registry show NAME[:VERSION|:ALIAS] [--json] [--store URI]
    pretrain registry promote NAME:VERSION [--alias production] [--force] [--store URI]
    pretrain registry download NAME[:VERSION|:ALIAS] DEST [--store URI]
    pretrain runs list [--json] [--store URI]
    pretrain runs show RUN [--json] [--store URI]
    pretrain runs compare RUN_A RUN_B [...] [--out FILE.png|.svg] [--json] [--store URI]
    pretrain runs report RUN [--out FILE.html] [--store URI]
    pretrain gc [--apply] [--min-age MINUTES] [--json] [--store URI]
    pretrain ui [--port 5000] [--run MLFLOW_RUN_ID]
    pretrain tracking sync NAME[:VERSION|:ALIAS] [--store URI]

``pretrain`` or a command group (``pretrain runs``) without a command prints its help (exit status 2); a
mistyped command is refused with the closest one (``unknown command 'rnus'; did you mean 'runs'?``).
Errors the user can fix are printed as one line (``error: …``) with exit status 2; ``pretrain run`` also
writes the full traceback of any failure to a log file (``common.errors.log_dir()``) and names it. Another
failure of ``pretrain run`` prints its first line only (``headline``) and the log's path, with exit status 1.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import threading
from dataclasses import asdict
from pathlib import Path

from cli.parsing import CommandParser, HelpFormatter, command, command_group, commands_of
from cli.settings import add_settings_command
from common.collector import collect_less_often
from common.contracts import HF_EXPORT
from common.errors import TRACEBACK_LABEL, peel_flyte, traceback_note, user_error_in, write_traceback
from common.terminal import escaped_output
from pipeline.cluster import load_cluster
from pipeline.config import PipelineConfig, launch_profile, launch_world, load_config
from registry.card import metric_text
from registry.registry import Promotion, download, list_models, promote, resolve, show
from reports import run_text
from runs import catalog
from runs.reading import load_run
from storage import default_store_uri, open_store
from training.schedule import budget_text


def _store(args: argparse.Namespace):
    return open_store(args.store or default_store_uri())


def _config(args: argparse.Namespace) -> PipelineConfig:
    """The config ``--config`` names (or the defaults) with every ``--set KEY=VALUE``, and ``--store URI`` as the
    last of them (``store`` is the setting it sets), checked."""
    store = [f"store={json.dumps(args.store)}"] if args.store else []  # JSON: a string YAML reads as it is
    config = load_config(args.config, overrides=[*args.set, *store])
    _refuse_fp8_here(config)
    return config


def _refuse_fp8_here(config: PipelineConfig) -> None:
    """FP8 under a profile whose train task runs on this machine's GPUs: refused now if they cannot run it, not
    once the data is prepared (pipeline.config refuses a profile without GPUs; each rank checks its own)."""
    cluster = load_cluster()
    if config.train.precision == "fp8" and cluster.gpus_per_node > 0 and not cluster.remote:
        from training.model.fp8 import refuse_without_hardware

        refuse_without_hardware(f"this machine (cluster profile {Path(launch_profile()).stem} trains here)")


def cmd_run(args: argparse.Namespace) -> int:
    config = _config(args)
    open_store(config.store).check()  # bad credentials or paths fail before anything is written
    from workflows.pretrain import pretrain

    args.started = True  # from here on, a failure's traceback is worth a log file
    ref = pretrain(config=config)  # its last task prints the summary
    if args.json:
        print(json.dumps({"name": ref.name, "version": ref.version, "uri": f"{ref.store.rstrip('/')}/{ref.prefix}"}))
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    """Every rule ``pretrain run`` and ``pyflyte run`` apply before anything runs; one line if all pass."""
    config = _config(args)
    _check_corpus(config)
    world, where = launch_world()
    tp, pp, train = config.parallel.tensor_parallel, config.parallel.pipeline_parallel, config.train
    dp = world // (tp * pp)
    accumulation = train.global_batch_size // (train.micro_batch_size * dp)
    print(
        f"ok: {args.config or 'the defaults'}: world {world} ranks ({where}) = TP {tp} × PP {pp} × DP {dp}; "
        f"global batch {train.global_batch_size} = micro-batch {train.micro_batch_size} × DP {dp} × {accumulation} "
        f"accumulation; {budget_text(train, config.data.seq_len)}"
    )
    if config.data.mixture:  # lists the components' local files: only for a mixture
        from data_prep.mixture import epoch_warnings

        tokens = train.steps_for(config.data.seq_len) * train.global_batch_size * config.data.seq_len
        for warning in epoch_warnings(config.data, tokens):
            print(f"WARNING: {warning}", file=sys.stderr, flush=True)
    return 0


def _check_corpus(config: PipelineConfig) -> None:
    """Refuse a corpus with no file to read as ``pretrain run`` does, by listing each component's sources as
    the pipeline's first task does (``tasks.data.fingerprint_corpus``: ``list_corpus``). A component with an
    ``s3://`` source is left to the run: a check stays local, and the bucket's files may be all it reads."""
    from data_prep.mixture import components
    from data_prep.sources import list_corpus

    for part in components(config.data):
        if not any(source.startswith("s3://") for source in part.data.sources):
            list_corpus(part.data)


def cmd_store_up(args: argparse.Namespace) -> int:
    from storage.s3server import S3Server

    data_dir = Path(args.dir or tempfile.mkdtemp(prefix="pretrain-s3-"))
    server = S3Server(data_dir=data_dir, bucket=args.bucket, port=args.port)
    server.start()
    print(f"# SeaweedFS S3 on {server.endpoint}, data in {data_dir}; Ctrl-C stops it. Export:")
    for key, value in server.env().items():
        print(f"export {key}={value}")
    print(f"export PRETRAIN_STORE=s3://{args.bucket}/store", flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(1.0):
            if server.process is not None and server.process.poll() is not None:
                print("error: the S3 server exited; see", data_dir / "weed.log", file=sys.stderr)
                return 1
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()
    return 0


def cmd_registry_list(args: argparse.Namespace) -> int:
    rows = list_models(_store(args))
    if args.json:
        print(json.dumps(rows, indent=2))
        return 0
    if not rows:
        print(f"no models registered in {_store(args).uri}")
        return 0
    header = ["MODEL", "ALIASES", "REGISTERED", "VAL_LOSS", "RUN NAME", "WHERE"]
    print("\n".join(_table(header, [_registry_row(r) for r in rows])))
    return 0


def _registry_row(row: dict) -> list[str]:
    """One ``registry list`` row: MODEL, ALIASES, REGISTERED, VAL_LOSS, RUN NAME, WHERE."""
    loss = metric_text("val_loss", row["metrics"]["val_loss"]) if "val_loss" in row["metrics"] else "-"
    registered, name = row["registered_at"], row.get("run_name") or "-"
    return [f"{row['name']}:{row['version']}", ",".join(row["aliases"]) or "-", registered, loss, name, row["uri"]]


def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Rows under a header, each column as wide as its widest cell (the last one left ragged)."""
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header) - 1)]
    return ["  ".join([*(cell.ljust(w) for cell, w in zip(r, widths, strict=False)), r[-1]]) for r in [header, *rows]]


def cmd_registry_show(args: argparse.Namespace) -> int:
    entry = show(_store(args), args.model)
    if args.json:
        print(json.dumps(entry.to_dict(), indent=2))
        return 0
    card = entry.card
    dirty = " (dirty tree)" if card.code.dirty else ""
    aliases = f" ({', '.join(entry.aliases)})" if entry.aliases else ""
    print(f"{card.name}:{card.version}{aliases}  registered {card.registered_at}  commit {card.code.commit}{dirty}")
    if card.run_name:
        print(f"run name: {card.run_name}")
    width = max(map(len, [*card.metrics, *vars(card.lineage)]))
    for key, value in sorted(card.metrics.items()):
        print(f"  {key:<{width}}  {metric_text(key, value)}")
    if card.gate is not None:
        print(f"quality gate: {card.gate.reason}")
    print("trained by:")
    for span in card.layouts:
        print(f"  {span.describe()}")
    if not card.layouts:
        print(f"  not recorded (card format {card.format}: only the config's parallel section, which may not be what trained it)")
    print("lineage:")
    for key, value in sorted(vars(card.lineage).items()):
        if key == "imported_from" and value is not None:
            where = value.name_or_path or value.folder
            revision = f" @ {value.revision}" if value.revision else ""
            print(f"  {key:<{width}}  {value.architecture} ({value.family}) from {where}{revision}")
            for name, digest in sorted(value.files.items()):
                print(f"  {'':<{width}}    {name}  sha256 {digest}")
            continue
        if key == "mixture":
            _print_mixture(value, width)
            continue
        print(f"  {key:<{width}}  {value if value not in ('', None) else '-'}")
    for label, text in (("greedy", card.sample), ("sampled", card.sampled)):
        if text:
            print(f"sample ({label}):")
            print("  " + text.rstrip().replace("\n", "\n  "))
    if card.hf_export:
        print(f"hugging face: {entry.uri}/{card.hf_export}/ (transformers' from_pretrained loads it, once downloaded)")
    print("files:")
    for uri in entry.files:
        print(f"  {uri}")
    return 0


def _print_mixture(shares: list, width: int) -> None:
    """The card's components: name, weight, tokens trained, passes over it, dataset."""
    if not shares:
        print(f"  {'mixture':<{width}}  -")
        return
    print(f"  {'mixture':<{width}}  " + ("1 dataset" if len(shares) == 1 else f"{len(shares)} components"))
    rows = [[s.name, f"{s.weight:.4f}", f"{s.tokens_trained:,}", f"{s.epochs:.3f}", s.dataset_version] for s in shares]
    for line in _table(["component", "weight", "tokens trained", "epochs", "dataset"], rows):
        print(f"  {'':<{width}}    {line}")


def cmd_registry_promote(args: argparse.Namespace) -> int:
    """Move the alias, refusing a version worse than the one it names (``--force`` moves it anyway)."""
    print(promotion_text(promote(_store(args), args.model, args.alias, refuse_worse=not args.force)))
    from tracking.mirror import mirror_promotion  # MLflow's aliases follow ours (best effort)
    from tracking.uri import resolve_uri

    print(mirror_promotion(_store(args), args.model.partition(":")[0], resolve_uri()), file=sys.stderr)
    return 0


def promotion_text(p: Promotion) -> str:
    """``gpt:production -> version 3``, and what it replaced, with both figures when the cards were compared."""
    moved = f"{p.name}:{p.alias} -> version {p.version}"
    if p.replaced is None:
        return f"{moved} ({p.alias} named no version before)"
    if p.replaced == p.version:
        return f"{p.name}:{p.alias} already names version {p.version}"
    if not p.metric:
        return f"{moved}, replacing version {p.replaced} (not compared: the two cards share no evaluation figure)"
    ours, theirs = metric_text(p.metric, p.figure), metric_text(p.metric, p.replaced_figure)
    forced = ", which is better: moved by --force" if p.worse else ""
    note = f"; {p.note}" if p.note else ""
    return f"{moved} ({p.metric} {ours}), replacing version {p.replaced} ({p.metric} {theirs}){forced}{note}"


def cmd_ui(args: argparse.Namespace) -> int:
    from tracking.ui import serve

    return serve(args.port, run_id=args.run)


def cmd_tracking_sync(args: argparse.Namespace) -> int:
    """Replay a registered model's execution into MLflow from the store (after an outage outlasted the pipeline)."""
    from common.errors import UserError
    from tracking.client import TrackingUnavailable, where
    from tracking.config import TrackingConfig
    from tracking.mirror import sync_model
    from tracking.uri import resolve_uri

    store = _store(args)
    name, version = resolve(store, args.model)
    uri = resolve_uri()
    try:
        run_id = sync_model(
            store,
            name,
            version,
            uri,
            args.experiment,
            retry_s=args.retry_s or TrackingConfig().retry_s,
            defaults=asdict(PipelineConfig()),  # a run it creates is named like the pipeline's (tracking.params.run_name)
        )
    except TrackingUnavailable as e:
        raise UserError(
            f"MLflow at {where(uri)} did not answer ({e}): start it, or set MLFLOW_TRACKING_URI, and run this again"
        ) from e
    print(f"{name}:{version} recorded in MLflow run {run_id} at {where(uri)}")
    return 0


def cmd_registry_download(args: argparse.Namespace) -> int:
    store = _store(args)
    name, version = resolve(store, args.model)  # the version now: an alias may move while files copy
    folder = download(store, f"{name}:{version}", args.dest)
    named = "" if args.model == f"{name}:{version}" else f"{args.model} is {name}:{version}; "
    print(f"{named}{name}:{version} downloaded to {folder}: {', '.join(sorted(p.name for p in folder.iterdir()))}")
    if (folder / HF_EXPORT).is_dir():
        print(f'  transformers: AutoModelForCausalLM.from_pretrained("{folder / HF_EXPORT}")')
    print(f"  continue pretraining from it: pretrain run --set train.init_from={name}:{version}")
    return 0


def cmd_registry_import(args: argparse.Namespace) -> int:
    from registry.hf_import import import_checkpoint  # torch and megatron: only for this command

    ref, registered = import_checkpoint(_store(args), Path(args.folder), args.name)
    if args.json:
        print(json.dumps({**asdict(ref), "registered": registered}))
        return 0
    said = "registered" if registered else "already registered (the same files) as"
    print(f"{args.folder} {said} {ref.name}:{ref.version}")
    print(f"  continue pretraining from it: pretrain run --set train.init_from={ref.name}:{ref.version}")
    return 0


def cmd_runs_list(args: argparse.Namespace) -> int:
    store = _store(args)
    views = catalog.list_runs(store)
    if args.json:
        print(json.dumps([view.summary() for view in views], indent=2))
        return 0
    if not views:
        print(f"no training runs in {store.uri}")
    for view in views:
        print(run_text.list_line(view))
    return 0


def cmd_runs_show(args: argparse.Namespace) -> int:
    store = _store(args)
    view = load_run(store, catalog.resolve_run(store, args.run))
    if args.json:
        print(json.dumps(view.to_dict(), indent=2))
        return 0
    for line in run_text.run_lines(view):
        print(line)
    return 0


def cmd_runs_compare(args: argparse.Namespace) -> int:
    """The config differences and figures of two runs or more, and their loss curves in one image."""
    from common.errors import UserError
    from reports import charts, plotting

    if len(args.runs) < 2:
        raise UserError(f"runs compare needs two runs or more, got {len(args.runs)}; `pretrain runs list` lists them")
    store = _store(args)
    views = catalog.load_runs(store, args.runs)
    names = run_text.column_names(views)
    ids = run_text.short_ids([view.id for view in views])
    out = Path(args.out) if args.out else Path.cwd() / f"loss-{'-'.join(ids[:4])}{_more(len(ids))}.png"
    if out.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise UserError(
            f"--out {args.out}: {out.suffix or 'no suffix'} is not an image format here; name a .png, .svg or .pdf file"
        )
    curves = [charts.Curve.of(name, v.loss) for name, v in zip(names, views, strict=True)]
    image = plotting.save(charts.loss_figure(curves, "training loss by run"), out).resolve()
    compared = {"store": store.uri, **catalog.compare(views), "image": str(image), "image_bytes": image.stat().st_size}
    if args.json:
        print(json.dumps(compared, indent=2))
        return 0
    for line in run_text.compare_lines(compared, names):
        print(line)
    return 0


def cmd_runs_report(args: argparse.Namespace) -> int:
    """One run as one self-contained HTML page (``reports.run_report``), written to a file."""
    from reports.charts import run_charts
    from reports.run_report import report_pages

    store = _store(args)
    view = load_run(store, catalog.resolve_run(store, args.run))
    out = Path(args.out) if args.out else Path.cwd() / f"run-{view.id[: catalog.SHORT_ID]}.html"
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_name(f".{out.name}.partial")  # a page half written never sits under its name
    partial.write_text(report_pages(store, view.dataset or "", view, run_charts(view)).run or "", encoding="utf-8")
    partial.replace(out)
    print(f"report of run {view.id}: {out.resolve()} ({out.stat().st_size:,} bytes; opens offline)")
    return 0


def _more(n: int) -> str:
    return f"-and-{n - 4}-more" if n > 4 else ""


def cmd_gc(args: argparse.Namespace) -> int:
    """Dry run by default: what would be removed (sizes, total) and what is kept and why; ``--apply`` removes it."""
    from cli import retention

    store = _store(args)
    plan = retention.plan(store, min_age_s=args.min_age * 60)
    outcome = retention.apply(store, plan) if args.apply else None
    if args.json:
        done = {"applied": args.apply, **plan.to_dict()}
        if outcome is not None:
            done["removed"] = [e.where for e in outcome.removed]
            done["skipped"] = [{"where": e.where, "why": why} for e, why in outcome.skipped]
            done["failed"] = [{"where": e.where, "why": why} for e, why in outcome.failed]
        print(json.dumps(done, indent=2))
    else:
        print("\n".join(retention.report_lines(plan, outcome)))
    if outcome is not None and outcome.failed:
        failed = f"{len(outcome.failed)} of {len(plan.removals)}"
        print(f"error: {failed} could not be removed (listed above); fix the cause and run gc again", file=sys.stderr)
        return 1
    return 0


MODEL_SPEC = "NAME[:VERSION|:ALIAS]"
"""The one grammar of a model on the command line (registry.names.parse_spec); NAME alone is ``latest``."""
MODEL_HELP = "a registered model: NAME (its latest version), NAME:VERSION or NAME:ALIAS (e.g. gpt-tiny:production)"


def _store_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--store",
        metavar="URI",
        default=os.environ.get("PRETRAIN_STORE", ""),
        help="the store: a local folder or s3://bucket/prefix (default: $PRETRAIN_STORE, else ~/.local/share/pretrain/store)",
    )


def _json_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--json", action="store_true", help="print JSON, for scripts, instead of text")


def parser() -> argparse.ArgumentParser:
    p = CommandParser(prog="pretrain", description="LLM pretraining pipeline", formatter_class=HelpFormatter)
    sub = commands_of(p, "command")
    for add in (
        _run_commands,
        add_settings_command,
        _store_commands,
        _registry_commands,
        _runs_commands,
        _tracking_commands,
        _gc_command,
    ):
        add(sub)
    return p


def _run_commands(sub) -> None:
    run = command(sub, "run", "run the whole pipeline locally (Flyte local execution)")
    check = command(sub, "check", "check a config's settings (exit 2 listing every problem) without running anything")
    for p_ in (run, check):
        p_.add_argument("--config", help="YAML preset, e.g. configs/tiny-cpu.yaml (default: the defaults)")
        p_.add_argument(
            "--set",
            action="append",
            default=[],
            metavar="KEY=VALUE",
            help="override one setting of the preset, e.g. --set train.steps=10 (repeatable; the value is read as YAML)",
        )
        p_.add_argument(
            "--store",
            metavar="URI",
            default="",
            help="the store, a local folder or s3://bucket/prefix: sets the config's store, as --set store=URI would "
            "(default: the config's store, else $PRETRAIN_STORE, else ~/.local/share/pretrain/store)",
        )
    run.add_argument("--json", action="store_true", help="end with the registered model as one JSON line, for scripts")
    run.set_defaults(fn=cmd_run)
    check.set_defaults(fn=cmd_check)


def _store_commands(sub) -> None:
    store = command_group(sub, "store", "local object store")
    up = command(store, "up", "start a SeaweedFS S3 server on 127.0.0.1 and print its environment")
    up.add_argument("--dir", help="data directory (default: a new temporary folder)")
    up.add_argument("--port", type=int, default=8333, help="the S3 port on 127.0.0.1")
    up.add_argument("--bucket", default="pretrain", help="the bucket to create")
    up.set_defaults(fn=cmd_store_up)


def _registry_commands(sub) -> None:
    registry = command_group(sub, "registry", "the model registry")
    ls = command(registry, "list", "every registered model version")
    _json_option(ls)
    _store_option(ls)
    ls.set_defaults(fn=cmd_registry_list)
    sh = command(registry, "show", "one model version's card")
    sh.add_argument("model", metavar=MODEL_SPEC, help=MODEL_HELP)
    _json_option(sh)
    _store_option(sh)
    sh.set_defaults(fn=cmd_registry_show)
    pr = command(registry, "promote", "point an alias (e.g. production) at a version")
    pr.add_argument("model", metavar="NAME:VERSION", help="the version the alias will name")
    pr.add_argument("--alias", default="production", help="the alias to move")
    pr.add_argument(
        "--force",
        action="store_true",
        help="move the alias even to a version whose evaluation figure is worse than that of the version it names now",
    )
    _store_option(pr)
    pr.set_defaults(fn=cmd_registry_promote)
    dl = command(registry, "download", "copy a version's files (checkpoint, tokenizer, card) to a folder")
    dl.add_argument("model", metavar=MODEL_SPEC, help=MODEL_HELP)
    dl.add_argument("dest", metavar="FOLDER", help="where the files go (created if needed)")
    _store_option(dl)
    dl.set_defaults(fn=cmd_registry_download)
    im = command(
        registry, "import", "register a Hugging Face checkpoint folder (Llama, Mistral, Qwen2, Qwen3) as NAME's next version"
    )
    im.add_argument("folder", metavar="DIR", help="the folder save_pretrained wrote: config.json, *.safetensors, tokenizer.json")
    im.add_argument("--name", required=True, help="the registry name, e.g. qwen2.5-0.5b (continue it with train.init_from: NAME)")
    _json_option(im)
    _store_option(im)
    im.set_defaults(fn=cmd_registry_import)


def _runs_commands(sub) -> None:
    runs_cmd = command_group(sub, "runs", "training runs in the store")
    rl = command(runs_cmd, "list", "every training run, most recently changed first")
    _json_option(rl)
    _store_option(rl)
    rl.set_defaults(fn=cmd_runs_list)
    rs = command(runs_cmd, "show", "one run: config, layouts, step-time breakdown, ranks, health, traces")
    rs.add_argument("run", metavar="RUN", help="the run id or a unique prefix of it")
    _json_option(rs)
    _store_option(rs)
    rs.set_defaults(fn=cmd_runs_show)
    rc = command(runs_cmd, "compare", "two runs or more: config differences, figures, loss curves in one image")
    rc.add_argument("runs", nargs="+", metavar="RUN", help="run ids or unique prefixes of them")
    rc.add_argument("--out", help="image file to write: .png, .svg or .pdf (default: loss-<runs>.png in this folder)")
    _json_option(rc)
    _store_option(rc)
    rc.set_defaults(fn=cmd_runs_compare)
    rr = command(runs_cmd, "report", "one run as one HTML page: curves, step time by phase and rank, warnings, dataset")
    rr.add_argument("run", metavar="RUN", help="the run id or a unique prefix of it")
    rr.add_argument("--out", help="the HTML file to write (default: run-<id>.html in this folder)")
    _store_option(rr)
    rr.set_defaults(fn=cmd_runs_report)


def _tracking_commands(sub) -> None:
    ui = command(sub, "ui", "the MLflow UI on 127.0.0.1 over the local tracking database, for you only")
    ui.add_argument("--port", type=int, default=5000, help="the port on 127.0.0.1")
    ui.add_argument(
        "--run", default="", metavar="MLFLOW_RUN_ID", help="open on this MLflow run's page (a run's summary names it)"
    )
    ui.set_defaults(fn=cmd_ui)
    tracking = command_group(sub, "tracking", "the MLflow mirror")
    ts = command(tracking, "sync", "replay a registered model's execution into MLflow from the store")
    ts.add_argument("model", metavar=MODEL_SPEC, help=MODEL_HELP)
    ts.add_argument("--experiment", default="pretrain", help="the MLflow experiment")
    ts.add_argument("--retry-s", type=float, default=0.0, help="seconds to keep retrying an unreachable server (0: one try)")
    _store_option(ts)
    ts.set_defaults(fn=cmd_tracking_sync)


def _gc_command(sub) -> None:
    gc = command(sub, "gc", "remove uncommitted leftovers and checkpoints beyond keep (dry run unless --apply)")
    gc.add_argument("--apply", action="store_true", help="remove what the dry run lists")
    gc.add_argument("--min-age", type=float, default=60.0, metavar="MINUTES", help="touch nothing written more recently")
    _json_option(gc)
    _store_option(gc)
    gc.set_defaults(fn=cmd_gc)


RAW_OUTPUT = {"run", "ui", "s3"}
"""Commands whose output is our own progress, beside children writing to the same descriptors; every other one
prints what it read from the store, through ``common.terminal.escaped``."""


def main(argv: list[str] | None = None) -> int:
    collect_less_often()  # before `run` loads torch, flytekit, MLflow: common.collector
    args = parser().parse_args(argv)
    if args.command in RAW_OUTPUT:
        return _dispatch(args)
    with escaped_output():
        return _dispatch(args)


def _dispatch(args: argparse.Namespace) -> int:
    try:
        return args.fn(args)
    except Exception as e:
        user = user_error_in(e)
        if user is None and args.command != "run":
            raise  # a bug in a quick command: its traceback is the report
        logged = TRACEBACK_LABEL in str(user or "")  # a task wrote it already
        log = write_traceback(e, args.command) if getattr(args, "started", False) and not logged else None
        where = f" {traceback_note(log)}" if log else ""
        if user is None:  # a failure inside the pipeline that is not the user's to fix: the log holds the rest
            print(f"error: {headline(e)}{where}", file=sys.stderr)
            return 1
        message = _without_flyte_prefix(str(user).strip())
        if "\n  " not in message:  # a list (failed expectations, bad settings) keeps one item per line
            message = _one_line(message)
        print(f"error: {message}{where}", file=sys.stderr)
        return 2


def _without_flyte_prefix(message: str) -> str:
    """``task_name: message`` instead of Flyte's preambles (``common.errors.peel_flyte``): a task of a dynamic
    workflow (``prepare_data``'s stages) is named, not the workflow around it."""
    tasks, message = peel_flyte(message)
    return f"{tasks[-1]}: {message}" if tasks else message


def _is_flyte(error: BaseException) -> bool:
    return type(error).__module__.split(".", 1)[0] == "flytekit"


def headline(error: BaseException) -> str:
    """The first line of a failure that is not the user's to fix, as ``task: ExcType: message``: without
    Flyte's error codes and preambles, nor the rest of the message (torch's report of every rank, a
    traceback), which the traceback log holds. A Flyte wrapper's own type is left out."""
    text = str(error).strip()
    if _is_flyte(error) and error.__cause__ is not None:
        text = text.removesuffix(f", cause={error.__cause__}")  # FlyteException's str appends its cause's
    tasks, text = peel_flyte(text)
    task = tasks[0] if tasks else ""
    first = next((line.strip() for line in text.splitlines() if line.strip()), "")
    kind = "" if _is_flyte(error) else f"{type(error).__name__}: "
    return f"{task}: {kind}{first}" if task else f"{kind}{first}"


def _one_line(text: str) -> str:
    return " ".join(line.strip() for line in text.strip().splitlines())


if __name__ == "__main__":
    sys.exit(main())
