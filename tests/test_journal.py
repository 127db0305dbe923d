"""The SQLite journal: migrations, WAL, idempotent verdicts, intents, corruption handling."""

import sqlite3

import pytest

from slurm_ft.errors import JournalError
from slurm_ft.history.query import history, render_table
from slurm_ft.journal import open_journal
from slurm_ft.journal import migrations


def test_schema_wal_and_migrations_recorded(tmp_path):
    with open_journal(tmp_path / "j.db") as j:
        assert j.db.conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        assert {"jobs", "attempts", "verdicts", "actions", "health", "_migrations"} <= set(j.db.table_names())
    with open_journal(tmp_path / "j.db") as j:  # reopening applies nothing twice
        assert j.db.conn.execute("SELECT count(*) FROM _migrations").fetchone()[0] == len(migrations.MIGRATIONS)


def test_verdicts_are_idempotent_and_history_renders(tmp_path):
    with open_journal(tmp_path / "j.db") as j:
        j.upsert_job(7, name="train", user="u", ft_enabled=1, retries=3, ft_state="running", excluded_nodes="")
        j.upsert_attempt(7, 0, nodes="n1", start=1.0, end=2.0, state="FAILED")
        assert j.add_verdict(7, 0, "n1", "hardware", "xid-79", [{"xid": 79, "bus_id": "0000:10:00"}], ["line"])
        assert not j.add_verdict(7, 0, "n1", "hardware", "xid-79")
        aid = j.intend(7, 0, "drain", "n1", "slurm-ft: Xid 79")
        assert [a["id"] for a in j.pending_intents()] == [aid]
        j.finish(aid)
        h = history(j, 7)
    assert h["attempts"][0]["verdict"] == "hardware" and h["attempts"][0]["xids"] == ["79@0000:10:00"]
    assert h["attempts"][0]["action"] == "drain n1"
    assert "xid-79" in render_table(h)


def test_corrupted_journal_is_a_clear_error(tmp_path):
    p = tmp_path / "bad.db"
    p.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(JournalError, match="move it aside"):
        open_journal(p)


def test_newer_schema_is_refused(tmp_path):
    p = tmp_path / "j.db"
    open_journal(p).close()
    conn = sqlite3.connect(p)
    conn.execute("INSERT INTO _migrations VALUES ('999_future', 0)")
    conn.commit()
    conn.close()
    with pytest.raises(JournalError, match="newer"):
        open_journal(p)


def test_readers_never_create_or_write_a_journal(tmp_path):
    from click.testing import CliRunner

    from slurm_ft.cli.history import command
    missing = tmp_path / "typo.db"
    r = CliRunner().invoke(command, ["-j", "1", "--journal", str(missing)])
    assert r.exit_code == 1 and "no journal here" in r.output and not missing.exists()
    empty = tmp_path / "empty.db"
    empty.write_bytes(b"")
    r = CliRunner().invoke(command, ["-j", "1", "--journal", str(empty)])
    assert r.exit_code == 1 and empty.stat().st_size == 0
    assert "Traceback" not in r.output


def test_inject_xid_refuses_unknown_nodes(tmp_path):
    from click.testing import CliRunner

    from slurm_ft.cli.main import main
    r = CliRunner().invoke(main, ["lab", "inject-xid", "n9", "79", "--dir", str(tmp_path)])
    assert r.exit_code == 2 and "not a node of the lab" in r.output
    r = CliRunner().invoke(main, ["lab", "inject-xid", "n1", "0", "--dir", str(tmp_path)])
    assert r.exit_code == 2
