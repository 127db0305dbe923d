"""The HTML drain report in a real browser: Debian's chromium, headless, renders it to a PNG
(under the test's temporary directory) with no console error, and a ``<script>`` in a drain
reason shows as text, never as an element (the report holds untrusted node reasons).

Chromium is installed by ``make setup`` (scripts/setup-system.sh)."""

from __future__ import annotations

import shutil
import struct
import subprocess
import time


from slurm_ft import config as config_mod
from slurm_ft.journal import open_journal
from slurm_ft.report import collect, render
from slurm_ft.slurm import Node

HOSTILE = '<script>console.error("pwned")</script><img src=x onerror="console.error(1)">'


class _Slurm:
    def __init__(self, nodes):
        self._nodes = nodes

    def nodes(self):
        return self._nodes


def _chromium(tmp_path, page, *args: str) -> subprocess.CompletedProcess:
    exe = shutil.which("chromium")
    assert exe, "chromium is missing: `make setup` installs it (scripts/setup-system.sh)"
    return subprocess.run([exe, "--headless=new", "--no-sandbox", "--disable-gpu", "--enable-logging=stderr",
                           "--v=0", f"--user-data-dir={tmp_path / 'profile'}", *args, page.as_uri()],
                          capture_output=True, text=True, timeout=120)


def _console(stderr: str) -> list[str]:
    return [ln for ln in stderr.splitlines() if ":CONSOLE" in ln]


def _png_size(path) -> tuple[int, int]:
    head = path.read_bytes()[:24]
    assert head[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", head[16:24])


def _report(tmp_path) -> str:
    now = time.time()
    cfg = config_mod.from_dict({"journal": {"path": str(tmp_path / "d.db")}})
    with open_journal(cfg.journal.path) as j:
        for job, node, xid in ((7, "n1", 79), (8, "n1", 48), (9, "n2", 79)):
            j.upsert_attempt(job, 0, nodes=node, start=now - 900, end=now - 300)
            j.upsert_attempt(job, 1, nodes="n3", start=now - 280)
            j.add_verdict(job, 0, node, "hardware", f"xid-{xid}", [{"xid": xid, "bus_id": "0000:10:00"}], [])
            j.record(job, 0, "drain", node, f"slurm-ft: Xid {xid} GPU 0000:10:00 (job {job})")
        j.add_verdict(10, 0, "n3", "infra", "nccl-timeout", [], [])
    nodes = [Node.from_json({"name": "n1", "state": "idle", "state_flags": ["DRAIN"], "gres": "gpu:4",
                             "reason": "slurm-ft: Xid 79 GPU 0000:10:00 (job 7)"}),
             Node.from_json({"name": "n2", "state": "idle", "state_flags": ["DRAIN"], "gres": "gpu:4",
                             "reason": HOSTILE}),
             Node.from_json({"name": "n3", "state": "idle", "state_flags": [], "gres": "gpu:4"})]
    return render(collect(cfg, _Slurm(nodes), now=now), "html")


def test_the_browser_sees_console_errors(tmp_path):
    """The check below can fail: a page that logs an error is caught."""
    page = tmp_path / "control.html"
    page.write_text('<!doctype html><html><body><script>console.error("boom")</script></body></html>')
    proc = _chromium(tmp_path, page, f"--screenshot={tmp_path / 'control.png'}", "--window-size=400,300")
    assert any("boom" in ln for ln in _console(proc.stderr)), proc.stderr[-2000:]


def test_report_renders_in_chromium_with_no_console_error(tmp_path):
    page = tmp_path / "report.html"
    page.write_text(_report(tmp_path))
    png = tmp_path / "report.png"
    proc = _chromium(tmp_path, page, f"--screenshot={png}", "--window-size=1280,2400")
    assert png.exists(), proc.stderr[-2000:]
    width, height = _png_size(png)
    assert (width, height) == (1280, 2400) and png.stat().st_size > 20_000   # charts and tables drawn
    assert _console(proc.stderr) == []
    dom = _chromium(tmp_path, page, "--dump-dom").stdout
    assert "<script" not in dom and "<img" not in dom          # the hostile reason made no element
    assert "&lt;script&gt;console.error" in dom                # ... it shows as text
    assert dom.count("<svg") >= 3
