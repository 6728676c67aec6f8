"""``pretrain settings [KEY] [--json]``: every setting of the pipeline config, its default and what it does, read
from the config classes themselves (their fields' docstrings, ``common.settings.documented_settings``)."""

from __future__ import annotations

import argparse
import json
import re
from dataclasses import asdict

from cli.parsing import command
from common.errors import UserError, did_you_mean
from common.settings import SettingDoc, documented_settings, value_text
from pipeline.config import PipelineConfig

DEFAULT_WIDTH = 20
"""The default column's width: a longer default (a list) overflows its own line rather than widen every line."""
SENTENCE_END = re.compile(r"(?<!\be\.g)(?<!\bi\.e)(?<!\betc)\.\s+(?=[A-Z(`])")
"""Where a description's first sentence ends: a full stop before a capital, not the one of "e.g." or "i.e."."""


def add_settings_command(sub: argparse._SubParsersAction) -> None:
    settings = command(sub, "settings", "every setting of a config (its --set KEY and YAML key), its default and what it does")
    settings.add_argument(
        "key",
        nargs="?",
        default="",
        metavar="KEY",
        help="only this setting or section (e.g. train, train.lr), or the keys containing this word (e.g. sniff)",
    )
    settings.add_argument("--json", action="store_true", help="print JSON, for scripts: key, default, type, doc, choices")
    settings.set_defaults(fn=cmd_settings)


def cmd_settings(args: argparse.Namespace) -> int:
    rows = selected(documented_settings(PipelineConfig, PipelineConfig()), args.key)
    if args.json:
        print(json.dumps([asdict(row) for row in rows], indent=2))
        return 0
    if len(rows) == 1 and rows[0].key == args.key:
        print("\n".join(one_setting_lines(rows[0])))
        return 0
    print("\n".join(table_lines(rows)))
    return 0


def selected(rows: list[SettingDoc], word: str) -> list[SettingDoc]:
    """The settings ``word`` names: that key or the section it names, else the keys that contain it."""
    if not word:
        return rows
    under = [r for r in rows if r.key == word or r.key.startswith((f"{word}.", f"{word}[]"))]
    found = under or [r for r in rows if word in r.key]
    if not found:
        names = {r.key for r in rows} | {r.key.rsplit(".", i)[0] for r in rows for i in range(1, r.key.count(".") + 1)}
        raise UserError(f"no setting {word!r}{did_you_mean(word, names)}: `pretrain settings` lists them all")
    return found


def default_text(row: SettingDoc) -> str:
    """A default as a person reads it and YAML or --set takes it: '' for an empty string, a string with line
    breaks or edge spaces quoted (JSON, which YAML reads), '-' for unset."""
    if isinstance(row.default, str) and (not row.default or row.default != " ".join(row.default.split())):
        return json.dumps(row.default) if row.default else "''"
    return value_text(row.default)


def plain(doc: str) -> str:
    """A docstring without its reStructuredText literal marks (````key````)."""
    return doc.replace("``", "")


def first_sentence(doc: str) -> str:
    return SENTENCE_END.split(plain(doc), maxsplit=1)[0].rstrip(".")


def table_lines(rows: list[SettingDoc]) -> list[str]:
    """One line a setting: its key, its default and the first sentence of its description."""
    key_width = max(len(r.key) for r in rows)
    default_width = min(DEFAULT_WIDTH, max(len("DEFAULT"), *(len(default_text(r)) for r in rows)))
    lines = [f"{'KEY':<{key_width}}  {'DEFAULT':<{default_width}}  DESCRIPTION"]
    for row in rows:
        choices = f" (one of: {', '.join(row.choices)})" if row.choices else ""
        lines.append(f"{row.key:<{key_width}}  {default_text(row):<{default_width}}  {first_sentence(row.doc)}{choices}")
    lines.append(f"{len(rows)} settings; `pretrain settings KEY` says all about one; set one with --set KEY=VALUE")
    return lines


def one_setting_lines(row: SettingDoc) -> list[str]:
    """All about one setting: key, type, default, choices and the whole description."""
    lines = [f"{row.key}: {row.type}, default {default_text(row)}"]
    if row.choices:
        lines.append(f"  one of: {', '.join(row.choices)}")
    return [*lines, f"  {plain(row.doc)}"]
