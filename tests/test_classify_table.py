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
    if row.source in ("xid", "sxid"):  # a qualifier reads the driver's record, from its header on
        at = max(row.example.find("NVRM: Xid"), row.example.find("nvidia-nvswitch"), 0)
        return Evidence(kernel_lines=[row.example[at:]])
    if row.source in ("kernel", "any"):
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
    from slurm_ft.classify.parse import kernel_header, message_body

    v = classify(_evidence_for(row))
    body = message_body(row.example.encode())
    if (row.source in ("kernel", "any") and (row.cls == "hardware" or row.action in ("drain_node", "reset_gpu"))
            and kernel_header(body) is None):
        # not a kernel-owned record (docs/security.md): as kernel text it decides nothing (the
        # driver's words naming no GPU are "unplaced": they only ask for the trusted checks) ...
        assert v.verdict != "hardware" and v.action not in ("drain_node", "reset_gpu"), row.id
        assert bool(v.unplaced) == (body.startswith(b"NVRM: ") and row.cls == "hardware"), row.id
        if row.source == "any":  # ... and as the job's output (a tool's message) it asks for them
            v = classify(Evidence(stderr_tail=row.example))
            assert (v.verdict, v.rule, v.action) == (row.cls, row.id, "verify"), row.id
        return
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


def test_a_depends_xid_is_never_acted_on_alone():
    """NVIDIA's catalog column ``hardware``: an Xid it calls ``depends`` (driver or application
    causes too) is no proof against the GPU: a hardware class there carries action ``verify``;
    only ``hardware = yes`` rows may drain or reset by themselves (issue 27)."""
    for row in xid_catalog().values():
        hw = _catalog_hardware(row.xid)
        if row.action in ("drain_node", "reset_gpu"):
            assert hw == "yes", f"xid {row.xid}: {row.action} but catalog hardware={hw}"
        if hw == "depends" and row.cls == "hardware":
            assert row.action == "verify" and "depends" in row.policy, row.xid


def _catalog_hardware(xid: int) -> str:
    with open(Path(__file__).resolve().parents[1] / "slurm_ft" / "data" / "xid_catalog.csv", newline="") as fh:
        return next(r["hardware"] for r in csv.DictReader(fh) if int(r["xid"]) == xid)


def test_default_consequence_rules_valid():
    from slurm_ft.classify.policy import consequence_rules

    rules = consequence_rules()
    assert rules and len({r.id for r in rules}) == len(rules)
    cat = xid_catalog()
    for r in rules:
        assert r.xids and r.after and not (r.xids & r.after) and r.ref
        assert (r.xids | r.after) <= set(cat), r.id
        # a consequence is re-judged as a cause that is no hardware proof itself
        assert all(cat[x].cls != "hardware" for x in r.after), r.id
    assert default_policy().consequences == rules
