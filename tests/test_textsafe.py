"""Control characters from the journal never reach a terminal raw: ft-history and the text drain
report escape them (``slurm_ft.textsafe``); --json stays valid JSON; HTML stays autoescaped."""

from __future__ import annotations

import json

from click.testing import CliRunner

from slurm_ft import config as config_mod
from slurm_ft.history.query import history, render_table
from slurm_ft.cli.history import command
from slurm_ft.journal import open_journal
from slurm_ft.report import collect, render
from slurm_ft.slurm import Node
from slurm_ft.textsafe import terminal_safe

HOSTILE = "\x1b[31mred\r\x07bell\x9bcsi\x7f"


def _raw_controls(text: str) -> set[str]:
    """Control characters in printed output other than the line breaks of the layout itself."""
    return {c for c in text if (ord(c) < 0x20 and c != "\n") or 0x7f <= ord(c) <= 0x9f}


def test_terminal_safe_escapes_controls_and_keeps_printable_unicode():
    assert terminal_safe("\x1b[31m") == "\\x1b[31m"
    assert terminal_safe("a\rb\x07c\x9bd\x7fe\x00\n\t") == "a\\x0db\\x07c\\x9bd\\x7fe\\x00\\x0a\\x09"
    assert terminal_safe("\x85\x8d\x90\x9d") == "\\x85\\x8d\\x90\\x9d"           # C1 (NEL, RI, DCS, OSC)
    assert terminal_safe("abc\u202edcb \u2066x\u2069 \u2028") == "abc\\u202edcb \\u2066x\\u2069 \\u2028"
    text = "ckpt/épreuve-日本語-Ωμέγα 🙂 ü"
    assert terminal_safe(text) == text
    assert terminal_safe(terminal_safe(HOSTILE)) == terminal_safe(HOSTILE)   # idempotent
    assert not _raw_controls(terminal_safe(HOSTILE + "".join(map(chr, range(0xa0)))))
    assert terminal_safe(12) == "12"


def _hostile_journal(path):
    with open_journal(path) as j:
        j.upsert_job(5, name=f"train{HOSTILE}", user="alice", ft_enabled=1, retries=2, ft_state="running",
                     excluded_nodes="")
        j.upsert_attempt(5, 0, nodes="n1", start=1.0, end=2.0, state="FAILED")
        j.add_verdict(5, 0, "n1", "hardware", f"xid-79{HOSTILE}", [{"xid": 79, "bus_id": "0000:10:00"}],
                      [f"evidence {HOSTILE}"])
        j.record(5, 0, "ckpt-ack", "n1", f"saved step=12 path=/ckpt/{HOSTILE}")
        j.record(5, 0, "decide", "", f"internal-error: {HOSTILE}")


def test_history_table_escapes_checkpoint_path_rule_and_actions(tmp_path):
    _hostile_journal(tmp_path / "j.db")
    with open_journal(tmp_path / "j.db", readonly=True) as j:
        h = history(j, 5)
    assert h["attempts"][0]["rule"] == f"xid-79{HOSTILE}"           # data unchanged, only printing escapes
    out = render_table(h)
    assert not _raw_controls(out)
    assert "xid-79\\x1b[31mred\\x0d\\x07bell\\x9bcsi\\x7f" in out
    assert "/ckpt/\\x1b[31mred" in out and "train\\x1b[31mred" in out
    assert "internal-error: \\x1b[31m" in out


def test_ft_history_cli_human_and_json_output_are_terminal_safe(tmp_path):
    _hostile_journal(tmp_path / "j.db")
    r = CliRunner().invoke(command, ["-j", "5", "--journal", str(tmp_path / "j.db")])
    assert r.exit_code == 0, r.output
    assert not _raw_controls(r.output) and "\\x1b[31m" in r.output
    r = CliRunner().invoke(command, ["-j", "5", "--json", "--journal", str(tmp_path / "j.db")])
    assert r.exit_code == 0, r.output
    assert not _raw_controls(r.output) and r.output.isascii()
    data = json.loads(r.output)                                       # valid JSON, original text back
    assert data["attempts"][0]["verdicts"][0]["evidence"] == [f"evidence {HOSTILE}"]
    assert data["attempts"][0]["checkpoint"]["path"].startswith("/ckpt/\x1b[31m")


def test_ft_history_error_messages_are_terminal_safe(tmp_path):
    missing = tmp_path / "x\x1b]52;c;bad\x07.db"
    r = CliRunner().invoke(command, ["-j", "1", "--journal", str(missing)])
    assert r.exit_code == 1 and not _raw_controls(r.output) and "\\x1b]52" in r.output


class _Slurm:
    def __init__(self, nodes):
        self._nodes = nodes

    def nodes(self):
        return self._nodes


def test_drain_report_text_is_terminal_safe_and_html_autoescaped(tmp_path):
    cfg = config_mod.from_dict({"journal": {"path": str(tmp_path / "d.db")}})
    with open_journal(cfg.journal.path) as j:
        j.add_verdict(7, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": "0000:10:00"}], [])
        j.record(7, 0, "drain", f"n1{HOSTILE}", f"slurm-ft: Xid 79 {HOSTILE}")
    nodes = [Node.from_json({"name": "n3", "state": "idle", "state_flags": ["DRAIN"],
                             "reason": f"<b>x</b>{HOSTILE}"})]
    data = collect(cfg, _Slurm(nodes))
    text = render(data, "text")
    assert not _raw_controls(text)
    assert "\\x1b[31mred\\x0d\\x07bell\\x9bcsi\\x7f" in text and "slurm-ft: Xid 79 \\x1b[31m" in text
    html = render(data, "html")
    assert "<b>x</b>" not in html and "&lt;b&gt;x&lt;/b&gt;" in html      # autoescape on for .html
    assert not _raw_controls(html)
