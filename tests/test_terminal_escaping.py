"""Store strings reach the terminal escaped (issue 50 finding 7): ``runs list`` and ``runs show`` printed control
characters from the store as they were, so an OSC 52 sequence in a metric string wrote the reader's clipboard."""

from __future__ import annotations

import json

import pytest

from cli.main import main as cli
from common.contracts import metrics_key
from common.terminal import escaped
from storage import open_store

OSC52 = "\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\x07"  # sets the clipboard to a command to paste
BIDI = "\u202e"  # shows what follows right to left


def test_escaped_keeps_lines_and_text_and_escapes_the_rest():
    assert escaped("loss 2.0\n\tcafé\u2003ok") == "loss 2.0\n\tcafé\u2003ok"
    assert escaped(OSC52) == "\\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\x07"
    assert escaped(f"a{BIDI}b\r\x85\u2028") == "a\\u202eb\\r\\x85\\u2028"


@pytest.mark.parametrize("command", [["runs", "list"], ["runs", "show", "r1"], ["runs", "show", "r1", "--json"]])
def test_runs_commands_print_a_planted_control_sequence_escaped(tmp_path, capsys, command):
    store = open_store(str(tmp_path / "store"))
    planted = {
        "step": 1,
        "loss": 2.0,
        "peak_flops": 1e12,
        "peak_flops_source": f"H100 {OSC52}",
        "straggler_warning": f"rank 1 {BIDI}slow",
        "health": {"step": 1, "problem": f"loss NaN {OSC52}", "action": "stopped"},
    }
    store.put_bytes(metrics_key("runs/r1"), (json.dumps(planted) + "\n").encode())
    capsys.readouterr()
    assert cli([*command, "--store", store.uri]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out and BIDI not in out
    if command[1] == "show" and "--json" not in command:
        assert "H100 \\x1b]52;c;Y3VybCBldmlsLnNoIHwgc2g=\\x07" in out and "loss NaN \\x1b]52" in out
