"""Every row of the classifier's data tables, checked against its own real excerpt."""

from __future__ import annotations

import csv
import re
from pathlib import Path

import pytest

from slurm_ft.classify import Evidence, classify, default_policy
from slurm_ft.classify.model import ACTIONS, CLASSES
from slurm_ft.classify.table import count_rules, signatures, xid_catalog

SHARED_CATALOG = Path(__file__).resolve().parents[2] / "shared" / "corpus" / "xid_catalog.csv"
ROWS = signatures()


def _evidence_for(row) -> Evidence:
    """The row's example, fed through the evidence field its source reads."""
    if row.source in ("kernel", "any", "xid", "sxid"):
        return Evidence(kernel_lines=[row.example])
    if row.source == "output":
        return Evidence(stderr_tail=row.example)
    if row.source == "slurm_state":
        return Evidence(slurm_state=row.example)
    m = re.fullmatch(r"exit=(\S+) signal=(\S+)", row.example)
    assert m, row.example
    return Evidence(exit_code=None if m[1] == "none" else int(m[1]), signal=None if m[2] == "none" else int(m[2]))


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_signature_row_matches_its_excerpt(row):
    line = row.example.encode()
    assert row.regex.search(line), f"{row.id}: pattern does not match its example"
    if row.source in ("kernel", "output", "any"):
        assert any(k in line.lower() for k in row.keys), f"{row.id}: example holds none of its keys (prefilter would skip it)"
    assert row.ref, row.id


@pytest.mark.parametrize("row", ROWS, ids=[r.id for r in ROWS])
def test_signature_row_decides_alone(row):
    v = classify(_evidence_for(row))
    # job output is untrusted: a node action it suggests becomes "verify" (docs/security.md)
    untrusted = row.source == "output" and row.action in ("drain_node", "reset_gpu")
    assert (v.verdict, v.rule, v.action) == (row.cls, row.id, "verify" if untrusted else row.action)
    assert v.evidence, row.id


def test_signature_ids_unique_and_fields_valid():
    ids = [r.id for r in ROWS]
    assert len(ids) == len(set(ids))
    for r in ROWS:
        assert r.cls in CLASSES and r.cls != "ok"
        assert r.action in ACTIONS
        assert all(k == k.lower() for k in r.keys)


def test_xid_catalog_is_complete_and_cites_sources():
    cat = xid_catalog()
    assert len(cat) == 156
    if SHARED_CATALOG.exists():
        with open(SHARED_CATALOG, newline="") as fh:
            assert {int(r["xid"]) for r in csv.DictReader(fh)} == set(cat)
    for row in cat.values():
        assert row.cls in CLASSES and row.cls != "ok"
        assert row.action in ACTIONS
        assert row.meaning and row.bucket and row.policy and row.source


@pytest.mark.parametrize("xid,cls", [(48, "hardware"), (79, "hardware"), (94, "hardware"), (95, "hardware"),
                                     (13, "user"), (31, "user"), (43, "user"), (45, "unknown")])
def test_product_document_xids(xid, cls):
    assert xid_catalog()[xid].cls == cls


@pytest.mark.parametrize("xid", sorted(xid_catalog()))
def test_every_catalog_xid_classifies_by_its_row(xid):
    row = xid_catalog()[xid]
    line = f"[Fri Aug 30 11:43:09 2024] NVRM: Xid (PCI:0000:cb:00): {xid}, pid=1797828, name=pt_main_thread, Ch 00000008"
    v = classify(Evidence(kernel_lines=[line]))
    assert (v.verdict, v.rule, v.action) == (row.cls, f"xid-{xid}", row.action)
    assert [(x.xid, x.bus_id) for x in v.xids] == [(xid, "0000:cb:00")]


def test_default_count_rules_valid():
    for rule in count_rules():
        assert rule.count >= 1 and rule.window_s > 0 and rule.xids
        assert rule.cls in CLASSES and rule.action in ACTIONS


def test_policy_index_covers_every_text_row():
    idx = default_policy().index
    for r in ROWS:
        if r.source in ("kernel", "output", "any"):
            targets = ("kernel", "output") if r.source == "any" else (r.source,)
            for t in targets:
                assert any(r in rows for rows in idx[t].values()), r.id


def test_every_row_is_documented():
    doc = (Path(__file__).resolve().parents[1] / "docs" / "classifier.md").read_text()
    missing = [r.id for r in ROWS if f"`{r.id}`" not in doc]
    assert not missing, f"rows missing from docs/classifier.md: {missing}"
