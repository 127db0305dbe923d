"""[classify] config: overrides work, typos are errors naming the key."""

from __future__ import annotations

import pytest

from slurm_ft import config as config_mod
from slurm_ft.classify import Evidence, classify, default_policy, from_config
from slurm_ft.errors import ConfigError

XID92 = "NVRM: Xid (PCI:0000:3b:00): 92, pid=1, High single-bit ECC error rate"


def test_empty_table_is_default():
    p = from_config({})
    assert p.xids == default_policy().xids
    assert p.signatures == default_policy().signatures


def test_xid_override_changes_class_and_default_action():
    assert classify(Evidence(kernel_lines=[XID92])).verdict == "unknown"
    p = from_config({"xid": {"92": {"class": "hardware"}}})
    v = classify(Evidence(kernel_lines=[XID92]), p)
    assert (v.verdict, v.action) == ("hardware", "drain_node")
    p = from_config({"xid": {"92": {"class": "hardware", "action": "reset_gpu", "rank": 990}}})
    assert classify(Evidence(kernel_lines=[XID92]), p).action == "reset_gpu"


def test_signature_override_disable_and_add():
    oom = "torch.cuda.OutOfMemoryError: CUDA out of memory. Tried to allocate 1.70 GiB."
    p = from_config({"signature": {"cuda-oom": {"class": "infra"}}})
    assert classify(Evidence(stderr_tail=oom), p).verdict == "infra"
    p = from_config({"disable": ["cuda-oom"]})
    assert classify(Evidence(stderr_tail=oom), p).rule == "python-exception"  # the next row down
    p = from_config({"add": [{
        "id": "site-lustre-evict", "source": "kernel", "keys": ["evicted"],
        "pattern": r"LustreError: .* evicted", "class": "infra", "action": "retry", "priority": 455,
        "example": "LustreError: 167-0: scratch-OST0003-osc-ffff: This client was evicted by scratch-OST0003; in progress operations using this service will fail.",
        "ref": "site",
    }]})
    v = classify(Evidence(kernel_lines=["LustreError: 167-0: scratch-OST0003-osc-ffff: This client was evicted by scratch-OST0003;"]), p)
    assert (v.verdict, v.rule) == ("infra", "site-lustre-evict")


def test_admin_count_rule_replaces_default_for_that_xid_only():
    p = from_config({"xid": {"31": {"count": 2, "window_s": 600, "class": "hardware"}}})
    ids = {c.id: c for c in p.counts}
    assert 31 not in ids["xid-app-recurring"].xids and 13 in ids["xid-app-recurring"].xids
    assert ids["xid-31-count"].count == 2


@pytest.mark.parametrize("table,key", [
    ({"xids": {}}, "classify.xids"),
    ({"xid": {"31": {"clas": "user"}}}, "classify.xid.31.clas"),
    ({"xid": {"abc": {"class": "user"}}}, "classify.xid.abc"),
    ({"xid": {"31": {"class": "broken"}}}, "classify.xid.31.class"),
    ({"xid": {"31": {"class": "user", "action": "reboot"}}}, "classify.xid.31.action"),
    ({"xid": {"31": {"count": 3, "class": "hardware"}}}, "classify.xid.31"),
    ({"xid": {"31": {"count": 0, "window_s": 10, "class": "hardware"}}}, "classify.xid.31.count"),
    ({"xid": {"31": {"count": 3, "window_s": -1, "class": "hardware"}}}, "classify.xid.31.window_s"),
    ({"xid": {"31": {"class": "user", "rank": "high"}}}, "classify.xid.31.rank"),
    ({"xid": {"31": "hardware"}}, "classify.xid.31"),
    ({"signature": {"no-such-row": {"class": "user"}}}, "classify.signature.no-such-row"),
    ({"signature": {"cuda-oom": {"pattern": "x"}}}, "classify.signature.cuda-oom.pattern"),
    ({"disable": ["no-such-row"]}, "classify.disable"),
    ({"disable": "cuda-oom"}, "classify.disable"),
    ({"add": [{"id": "x"}]}, "classify.add[0]"),
    ({"add": [{"id": "x", "source": "kernel", "keys": ["a"], "pattern": "(", "class": "user", "action": "none",
               "priority": 1, "example": "a", "ref": "r"}]}, "classify.add[0].pattern"),
    ({"add": [{"id": "x", "source": "kernel", "keys": ["a"], "pattern": "b", "class": "user", "action": "none",
               "priority": 1, "example": "a", "ref": "r"}]}, "classify.add[0].example"),
])
def test_bad_config_names_the_key(table, key):
    with pytest.raises(ConfigError) as exc:
        from_config(table)
    assert key in str(exc.value)


def test_config_loader_validates_classify_section(tmp_path):
    path = tmp_path / "slurm-ft.toml"
    path.write_text('[classify.xid.31]\ncount = 3\nwindow_s = 3600\nclass = "hardware"\n')
    cfg = config_mod.load(path)
    assert from_config(cfg.classify).counts[-1].id == "xid-31-count"
    path.write_text('[classify.xid.31]\nwindow = 3600\n')
    with pytest.raises(ConfigError, match="classify.xid.31.window"):
        config_mod.load(path)


@pytest.mark.parametrize("toml,key", [
    ('[[consequence]]\nid = "a"\nxids = [32]\nafter = [13]\n', "missing key 'ref'"),
    ('[[consequence]]\nid = "a"\nxids = [32]\nafter = [13]\nref = "r"\nwindow_s = 3\n', "consequence[0].window_s"),
    ('[[consequence]]\nid = "a"\nxids = []\nafter = [13]\nref = "r"\n', "consequence[0].xids"),
    ('[[consequence]]\nid = "a"\nxids = [32]\nafter = ["13"]\nref = "r"\n', "consequence[0].after"),
    ('[[consequence]]\nid = "a"\nxids = [32, 13]\nafter = [13]\nref = "r"\n', "its own cause"),
    ('[[consequence]]\nid = "a"\nxids = [32]\nafter = [13]\nref = "r"\n' * 2, "duplicate consequence ids"),
])
def test_bad_consequence_rules_name_the_key(monkeypatch, toml, key):
    from slurm_ft.classify import policy as policy_mod

    monkeypatch.setattr(policy_mod, "_data_text", lambda name: toml)
    policy_mod.consequence_rules.cache_clear()
    try:
        with pytest.raises(ConfigError, match=key.replace("[", r"\[").replace("]", r"\]")):
            policy_mod.consequence_rules()
    finally:
        policy_mod.consequence_rules.cache_clear()


def test_disable_names_a_consequence_rule_or_fails():
    assert from_config({"disable": ["xid-32-after-app-fault"]}).consequences == ()
    assert from_config({}).consequences == default_policy().consequences
    with pytest.raises(ConfigError, match="no signature row or consequence rule"):
        from_config({"disable": ["xid-32-after-nothing"]})
