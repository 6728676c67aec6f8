"""Issue 51 items 1-3: ``pretrain`` or a command group without a command prints its help with the commands, never
argparse's internal dest names; a mistyped command gets a did-you-mean."""

from __future__ import annotations

import argparse

import pytest

from cli.main import main, parser
from cli.parsing import unknown_command


def groups() -> dict[str, list[str]]:
    """Every command that holds commands, and its commands' names."""
    found = {}
    for action in parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                inner = [a for a in child._actions if isinstance(a, argparse._SubParsersAction)]
                if inner:
                    found[name] = list(inner[0].choices)
    return found


def pretrain(capsys, *argv: str) -> tuple[int, str, str]:
    """``pretrain *argv`` in this process: its exit status (a usage error's SystemExit too), stdout, stderr."""
    capsys.readouterr()
    try:
        status = main(list(argv))
    except SystemExit as e:
        status = e.code
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_pretrain_alone_prints_the_help_with_every_command(capsys):
    status, out, err = pretrain(capsys)
    assert status == 2 and err == ""
    assert out.startswith("usage: pretrain ") and "commands:" in out
    for name in ("run", "check", "settings", "registry", "runs", "gc"):
        assert f"\n    {name} " in out, name  # each command with its one-line description
    assert "the following arguments are required" not in out


@pytest.mark.parametrize("group", ["store", "registry", "runs", "tracking"])
def test_a_group_alone_prints_its_help_with_its_commands_and_no_dest_name(group, capsys):
    commands = groups()[group]
    status, out, err = pretrain(capsys, group)
    assert status == 2 and err == ""
    assert out.startswith(f"usage: pretrain {group} [-h] {{{','.join(commands)}}} ...")
    assert "_command" not in out + err
    for name in commands:
        assert f"\n    {name} " in out, name


def test_every_group_is_covered():
    assert set(groups()) == {"store", "registry", "runs", "tracking"}


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["rnus", "list"], "pretrain: error: unknown command 'rnus'; did you mean 'runs'?"),
        (["registry", "shwo", "gpt"], "pretrain registry: error: unknown command 'shwo'; did you mean 'show'?"),
        (["runs", "lsit"], "pretrain runs: error: unknown command 'lsit'; did you mean 'list'?"),
        (["tracking", "snyc"], "pretrain tracking: error: unknown command 'snyc'; did you mean 'sync'?"),
    ],
)
def test_a_mistyped_command_gets_the_closest_one(argv, said, capsys):
    status, out, err = pretrain(capsys, *argv)
    assert status == 2 and out == ""
    assert err.splitlines()[-1] == said
    assert "_command" not in err and "invalid choice" not in err


def test_a_word_close_to_no_command_lists_them():
    assert unknown_command("zzz", ["list", "show"]) == "unknown command 'zzz'; the commands are list, show"
