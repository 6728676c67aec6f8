"""The ``pretrain`` command line's parsers: a command group given without its command prints its help, and a
mistyped command gets a did-you-mean instead of argparse's "invalid choice" naming an internal ``dest``."""

from __future__ import annotations

import argparse
import difflib
import sys
from collections.abc import Callable, Iterable

NO_COMMAND_STATUS = 2
"""The exit status of ``pretrain`` (or a group, ``pretrain runs``) given without a command: its help is printed,
but nothing ran (argparse's status for a usage error)."""


class HelpFormatter(argparse.HelpFormatter):
    """Each option's help says its default, when it has one worth saying (not a flag's False, None or empty)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        default = action.default
        said = "%(default)" in text or "(default:" in text
        empty = default is None or default is False or (isinstance(default, (str, list, tuple)) and not default)
        if said or empty or default == argparse.SUPPRESS or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def unknown_command(word: str, commands: Iterable[str]) -> str:
    """The one-line error for a command ``word`` that is none of ``commands``, with the closest one if any."""
    known = list(commands)
    close = difflib.get_close_matches(word, known, n=1)
    hint = f"did you mean {close[0]!r}?" if close else f"the commands are {', '.join(known)}"
    return f"unknown command {word!r}; {hint}"


class CommandParser(argparse.ArgumentParser):
    """An ArgumentParser whose command groups (its subparsers, which argparse makes of the same class) refuse a
    mistyped command with a did-you-mean (exit status 2, as any usage error)."""

    def _check_value(self, action: argparse.Action, value: object) -> None:
        # argparse's own message names the group's dest ("argument runs_command: invalid choice: ...").
        if isinstance(action, argparse._SubParsersAction) and value not in action.choices:
            self.error(unknown_command(str(value), action.choices))
        super()._check_value(action, value)


def help_printer(parser: argparse.ArgumentParser) -> Callable[[argparse.Namespace], int]:
    """The command of a parser given without a command: its full help (every command listed), status 2."""

    def print_help(_args: argparse.Namespace) -> int:
        parser.print_help(sys.stdout)
        return NO_COMMAND_STATUS

    return print_help


def command(group: argparse._SubParsersAction, name: str, help: str) -> argparse.ArgumentParser:  # noqa: A002 - argparse's own word
    return group.add_parser(name, help=help, description=help, formatter_class=HelpFormatter)


def commands_of(parser: argparse.ArgumentParser, dest: str) -> argparse._SubParsersAction:
    """The commands of ``parser`` (a group: ``pretrain runs``), which prints its help when given none of them."""
    parser.set_defaults(fn=help_printer(parser))
    return parser.add_subparsers(dest=dest, title="commands")


def command_group(group: argparse._SubParsersAction, name: str, help: str) -> argparse._SubParsersAction:  # noqa: A002
    """A command ``name`` that holds commands of its own (``pretrain registry show``)."""
    return commands_of(command(group, name, help), f"{name}_command")
