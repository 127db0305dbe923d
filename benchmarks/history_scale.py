#!/usr/bin/env python3
"""``ft-history`` and the drain report over a journal of 1,000,000 attempts (issue 26).

Builds (once, cached under ``--dir`` by its parameters) a daemon journal with the project's own
schema (slurm_ft.journal migrations) holding ``--attempts`` attempts: ~1/3 as many jobs over two years
(a site's history; job ids rise with submit time, as Slurm hands them out), 200 users, 64 nodes,
1-5 attempts a job; every attempt but a job's last ended with a fault
verdict (hardware 40 %, infra 30 %, hang 10 %, unknown 20 %) and a failover action, hardware ones
with a drain too; last attempts completed (75 %), user errors (15 %, a ``user`` verdict),
max-retries-exceeded (3 %) or, for jobs of the last two days, still running (7 %).

Then times, as a user would run them (``ft-history`` as a new process, interpreter start
included; median of ``--runs``):

* ``history_window_s``: ``ft-history -a -S now-30days -n -P`` (the rows it prints:
  ``history_window_rows``); ``history_window_chain_s``: the same window in the default
  (retry-chain) view; ``history_window_rendered_s``: the ``-P`` query with its columns named by
  ``-o``, which renders every job now (what the history memo saves: slurm_ft.history.memo; the
  memo is filled first, as the history service does in the background: ``memo_fill_s``);
* ``history_job_s``: ``ft-history -j ID``;
* ``history_user_s``: ``ft-history -u USER -X -S now-365days``;
* ``user_via_service_s``: the same as an ordinary user who cannot read the journal, through the
  history service and MUNGE (:func:`user_via_service`);
* ``report_s``: the drain report (HTML) over the same journal and 64 nodes, in this process (the
  journal part of ``slurm-ft report``: Slurm is asked for its nodes once, not timed here).

Goals: each ``ft-history`` query <= 0.3 s, the report <= 5 s. Prints ``name=value`` lines; the last
is ``history_worst_s``, the slowest of the four queries (both window views, -j, -u).

Run as root: ``.venv/bin/python benchmarks/history_scale.py [--attempts 1000000]``.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from slurm_ft import config as config_mod  # noqa: E402
from slurm_ft.history import memo as history_memo  # noqa: E402
from slurm_ft.history.format import LIST_FORMAT  # noqa: E402
from slurm_ft.journal import open_journal  # noqa: E402
from slurm_ft.report import collect, render  # noqa: E402
from slurm_ft.slurm import Node  # noqa: E402

DAY = 86400.0
#: Days the journal spans (30 days of it hold ~1/24 of the jobs: ~14,000 at 1M attempts).
SPAN_DAYS = 730
CLASSES = (("hardware", 0.4, "xid-79"), ("infra", 0.3, "nccl-timeout"), ("hang", 0.1, "heartbeat"),
           ("unknown", 0.2, "exit-nonzero"))
NODES = [f"g{i:03d}" for i in range(1, 65)]
USERS = [f"user{i:03d}" for i in range(200)]


def build(path: Path, attempts: int, now: float, seed: int = 1) -> dict:
    """Write the journal; returns {"jobs": N, "attempts": N, "verdicts": N, "actions": N}."""
    rnd = random.Random(seed)
    with open_journal(path):
        pass                                          # the schema, by the project's migrations
    import sqlite3

    conn = sqlite3.connect(path)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=OFF")
    jobs, atts, verdicts, actions = [], [], [], []
    job_id, made = 1000, 0
    # Slurm hands job ids out in submit order: ids rise with time (a 30-day window is the newest
    # ids, as on a real controller), about 3 attempts a job over SPAN_DAYS
    spacing, submit = SPAN_DAYS * DAY / max(1.0, attempts / 3), now - SPAN_DAYS * DAY
    while made < attempts:
        job_id += 1
        n = min(rnd.randint(1, 5), attempts - made)
        submit = min(now - 60.0, submit + rnd.uniform(0, 2 * spacing))
        t = t_first = submit
        user = rnd.choice(USERS)
        last = rnd.random()
        final = ("completed" if last < 0.75 else "user-error" if last < 0.90
                 else "max-retries-exceeded" if last < 0.93 else "running")
        if final == "running" and t < now - 2 * DAY:
            final = "completed"                        # only recent jobs still run
        for a in range(n):
            node = rnd.choice(NODES)
            run = rnd.uniform(60, 6 * 3600)
            end = t + run
            is_last = a == n - 1
            state = ("RUNNING" if final == "running" else "FAILED" if final != "completed" else "COMPLETED") \
                if is_last else "FAILED"
            atts.append((job_id, a, node, t, None if state == "RUNNING" else end, 0 if state != "FAILED" else 1,
                         0, state, end))
            if not is_last:
                r, acc = rnd.random(), 0.0
                for cls, share, rule in CLASSES:
                    acc += share
                    if r < acc:
                        break
                xids = '[{"xid": 79, "bus_id": "0000:10:00"}]' if cls == "hardware" else "[]"
                verdicts.append((job_id, a, node, cls, rule, xids, "[]", "", 1, "epilog", end + 0.2))
                actions.append((job_id, a, "failover", node, f"{cls} on {node}", "done", end + 0.5, end + 0.6))
                if cls == "hardware":
                    actions.append((job_id, a, "drain", node, f"slurm-ft: Xid 79 GPU 0000:10:00 (job {job_id})",
                                    "done", end + 0.5, end + 0.6))
                t = end + rnd.uniform(1, 30)
            elif final == "user-error":
                verdicts.append((job_id, a, node, "user", "cuda-oom", "[]", "[]", "", 1, "epilog", end + 0.2))
        ft_state = "failed-over" if final == "running" and n > 1 else final
        jobs.append((job_id, f"train-{job_id}", user, 1, 3, ft_state, "", t_first - 60, t))
        made += n
    with conn:
        conn.executemany("INSERT INTO jobs (job_id, name, user, ft_enabled, retries, ft_state, excluded_nodes, "
                         "created, updated) VALUES (?,?,?,?,?,?,?,?,?)", jobs)
        conn.executemany("INSERT INTO attempts (job_id, attempt, nodes, start, end, exit_code, signal, state, "
                         "updated) VALUES (?,?,?,?,?,?,?,?,?)", atts)
        conn.executemany("INSERT INTO verdicts (job_id, attempt, node, verdict, rule, xids, evidence, action, "
                         "exit_code, source, created) VALUES (?,?,?,?,?,?,?,?,?,?,?)", verdicts)
        conn.executemany("INSERT INTO actions (job_id, attempt, action, target, detail, status, created, "
                         "finished) VALUES (?,?,?,?,?,?,?,?)", actions)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    os.chmod(path, 0o600)
    return {"jobs": len(jobs), "attempts": len(atts), "verdicts": len(verdicts), "actions": len(actions)}


def timed(argv: list[str], runs: int, env: dict) -> tuple[float, int]:
    """(median seconds, lines printed by the last run) of ``argv`` as a new process."""
    times, lines = [], 0
    for _ in range(runs):
        t0 = time.perf_counter()
        proc = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=600)
        times.append(time.perf_counter() - t0)
        if proc.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} failed (rc {proc.returncode}): {proc.stderr[-500:]}")
        lines = len(proc.stdout.splitlines())
    return statistics.median(times), lines


def user_via_service(db: Path, runs: int) -> dict:
    """``user_via_service_s``: ``ft-history -X -S now-365days`` run by an ordinary user (the lab's,
    ``slurmft-user``, given USERS[8]'s jobs) who cannot read the journal, answered by the history
    service (slurm_ft/history/service.py, in this process, PrivateData=jobs) over TCP with a real
    MUNGE credential: interpreter start, credential, query and rendering included."""
    import pwd
    import shutil
    import sqlite3
    import tempfile

    from slurm_ft.slurm import munge
    from slurm_ft.history.service import Access, HistoryService, Server
    from slurm_ft.lab.users import LAB_USER, SYSTEM_PYTHON, ensure_user, tool_env

    try:
        munge.decode(munge.encode(b"probe"))
    except munge.MungeError as exc:
        return {"user_via_service_s": f"n/a ({exc})"}
    ensure_user()
    conn = sqlite3.connect(db)
    with conn:
        conn.execute("UPDATE jobs SET user = ? WHERE user = ?", (LAB_USER, USERS[8]))
    conn.close()
    srv = Server(HistoryService(config_mod.from_dict({"journal": {"path": str(db)}}), access=lambda: Access()),
                 "127.0.0.1", 0).start()
    d = Path(tempfile.mkdtemp(prefix="ft-history-bench-"))
    try:
        d.chmod(0o755)
        (d / "slurm-ft.toml").write_text(f'[journal]\npath = "{db}"\n'
                                         f'[history]\nendpoint = "127.0.0.1:{srv.address[1]}"\n')
        (d / "slurm-ft.toml").chmod(0o644)
        env = tool_env({"SLURM_FT_CONFIG": str(d / "slurm-ft.toml"), "PATH": "/usr/bin:/bin", "LC_ALL": "C.UTF-8"})
        argv = ["/usr/sbin/runuser", "-u", LAB_USER, "--", SYSTEM_PYTHON, "-m", "slurm_ft.cli.history", "-X", "-S",
                "now-365days", "-n", "-P"]
        seconds, lines = timed(argv, runs, env)
    finally:
        srv.stop()
        shutil.rmtree(d, ignore_errors=True)
    return {"user_via_service_rows": lines, "user_via_service_s": f"{seconds:.3f}",
            "user_via_service_uid": pwd.getpwnam(LAB_USER).pw_uid}


class _Slurm:
    def nodes(self):
        return [Node.from_json({"name": n, "state": "idle", "state_flags": [], "gres": "gpu:8"}) for n in NODES]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--attempts", type=int, default=1_000_000)
    ap.add_argument("--runs", type=int, default=5)
    ap.add_argument("--dir", default="/var/tmp/slurm-ft-bench/history")
    args = ap.parse_args()
    d = Path(args.dir)
    d.mkdir(parents=True, exist_ok=True)
    os.chmod(d, 0o700)
    db = d / f"journal-{args.attempts}-v3.db"
    # the journal's times are relative to when it was built; rebuilt when older than a day
    if not db.exists() or time.time() - db.stat().st_mtime > DAY:
        for p in d.glob(f"journal-{args.attempts}-v3.db*"):
            p.unlink()
        t0 = time.perf_counter()
        counts = build(db, args.attempts, time.time())
        print(f"build_s={time.perf_counter() - t0:.1f}")
        for k, v in counts.items():
            print(f"journal_{k}={v}")
    else:
        with open_journal(db):
            pass                                      # the project's migrations (its indexes) applied
        with open_journal(db, readonly=True) as j:
            (n_att,) = j.db.execute("SELECT COUNT(*) FROM attempts").fetchone()
        print(f"journal_attempts={n_att}")
    # what the history service's background thread does (slurm_ft.history.memo): render the
    # finished jobs of the last MEMO_DAYS days ahead, once
    t0 = time.perf_counter()
    memo = 0
    with open_journal(db) as j:
        while (n := history_memo.fill(j, limit=5000)) > 0:
            memo += n
    print(f"memo_fill_s={time.perf_counter() - t0:.1f}")
    print(f"memo_jobs_rendered={memo}")
    cfg_path = d / "slurm-ft.toml"
    cfg_path.write_text(f'[journal]\npath = "{db}"\n')
    env = {**os.environ, "SLURM_FT_CONFIG": str(cfg_path)}
    exe = str(Path(sys.executable).with_name("ft-history"))
    with open_journal(db, readonly=True) as j:
        some_job = j.db.execute("SELECT job_id FROM jobs ORDER BY job_id LIMIT 1 OFFSET 1000").fetchone()[0]
    window_s, rows = timed([exe, "--journal", str(db), "-a", "-S", "now-30days", "-n", "-P"], args.runs, env)
    # the same columns named with -o: every job rendered now (what the memo saves)
    rendered_s, _ = timed([exe, "--journal", str(db), "-a", "-S", "now-30days", "-n", "-P", "-o", LIST_FORMAT],
                          args.runs, env)
    chain_s, chain_lines = timed([exe, "--journal", str(db), "-a", "-S", "now-30days"], args.runs, env)
    job_s, _ = timed([exe, "--journal", str(db), "-j", str(some_job)], args.runs, env)
    user_s, user_rows = timed([exe, "--journal", str(db), "-u", USERS[7], "-X", "-S", "now-365days", "-n", "-P"],
                              args.runs, env)
    via_service = user_via_service(db, args.runs)
    cfg = config_mod.from_dict({"journal": {"path": str(db)}})
    t0 = time.perf_counter()
    html = render(collect(cfg, _Slurm(), since_s=30 * DAY), "html")
    report_s = time.perf_counter() - t0
    print(f"history_window_rows={rows}")
    print(f"history_window_s={window_s:.3f}")
    print(f"history_window_rendered_s={rendered_s:.3f}")
    print(f"history_window_chain_lines={chain_lines}")
    print(f"history_window_chain_s={chain_s:.3f}")
    print(f"history_job_s={job_s:.3f}")
    print(f"history_user_rows={user_rows}")
    print(f"history_user_s={user_s:.3f}")
    for k, v in via_service.items():
        print(f"{k}={v}")
    print(f"report_bytes={len(html)}")
    print(f"report_s={report_s:.3f}")
    print(f"history_worst_s={max(window_s, chain_s, job_s, user_s):.3f}")


if __name__ == "__main__":
    main()
