"""Kernel records: blame needs the kernel's own header (issue 27, docs/security.md).

A kernel record counts for hardware only when it BEGINS with a kernel-owned header
(``slurm_ft/data/kernel_headers.toml``).  Many kernel messages begin with a process name (comm,
at most 15 bytes) or an interface name, and many carry a file name: whatever such a name holds,
the record blames no GPU and no node.  The proofs here are structural, not a list of attacks:

* :func:`test_no_header_can_be_completed_by_a_process_name` decides, for every header row and
  every real printk format that prints a user-chosen name, whether ANY name of 0-15 bytes (and any
  numbers, any later file name) can make the record begin with the header: an exact
  regular-language intersection of the header's regex with the format (a small NFA product).
* the hypothesis tests build records from those formats with arbitrary names, file names and
  numbers around driver-looking text and run them through the classifier (as the epilog does)
  and the health check's parser.
"""

from __future__ import annotations

import os
import re
import time
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from slurm_ft import config as config_mod
from slurm_ft.classify import Evidence, classify
from slurm_ft.classify.parse import kernel_header
from slurm_ft.classify.table import MIN_HEADER_BYTES, kernel_headers
from slurm_ft.node.epilog import verify_untrusted
from slurm_ft.health import CheckResult
from slurm_ft.health.xid import kmsg_events
from slurm_ft.node.job import NodeJob

BUS, BUS2 = "0000:10:00", "0000:11:00"                     # the node's GPUs 0 and 1 (fake inventory)
NODE_BUS = {BUS: 0, BUS2: 1}
NVML_BUS = {0: "00000000:10:00.0", 1: "00000000:11:00.0"}
NODE_ACTIONS = ("drain_node", "reset_gpu")
FAST = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# ------------------------------------------------------------------ real printk formats
#: Kernel messages that print a name a user chooses: a process name (comm, TASK_COMM_LEN 16: at
#: most 15 bytes), an interface name (IFNAMSIZ 16) or a file/path name.  (Linux source file.)
PRINTK_FORMATS = [
    ("fs/proc/base.c __set_oom_adj", "%s (%d): /proc/%d/oom_adj is deprecated, please use /proc/%d/oom_score_adj instead."),
    ("mm/mmap.c may_expand_vm", "%s (%d): VmData %lu exceed data ulimit %lu. Update limits%s."),
    ("mm/mremap.c", "%s (%d): attempted to duplicate a private mapping with mremap.  This is not supported."),
    ("mm/mmap.c remap_file_pages", "%s (%d) uses deprecated remap_file_pages() syscall. See Documentation/mm/remap_file_pages.rst."),
    ("ipc/shm.c newseg", "%s (%d): Using mlock ulimits for SHM_HUGETLB is obsolete"),
    ("fs/drop_caches.c", "%s (%d): drop_caches: %d"),
    ("kernel/cgroup/cgroup.c", '%s (%d) created nested cgroup for controller "%s" which has incomplete hierarchy support.'),
    ("arch/x86/mm/fault.c show_signal_msg", "%s[%d]: segfault at %lx ip %px sp %px error %lx in %s[%lx+%lx]"),
    ("arch/x86/mm/fault.c show_signal_msg", "%s[%d]: segfault at %lx ip %px sp %px error %lx likely on CPU %d (core %d, socket %d)"),
    ("arch/x86/kernel/traps.c do_trap", "traps: %s[%d] trap %s ip:%lx sp:%lx error:%lx in %s[%lx+%lx]"),
    ("arch/x86/kernel/traps.c", "traps: %s[%d] general protection fault ip:%lx sp:%lx error:%lx in %s[%lx+%lx]"),
    ("arch/x86/kernel/signal.c", "%s[%d] bad frame in %s frame:%px ip:%lx sp:%lx orax:%lx"),
    ("arch/x86/entry/vsyscall/vsyscall_64.c", "%s[%d] %s ip:%lx cs:%lx sp:%lx ax:%lx si:%lx di:%lx"),
    ("kernel/signal.c print_fatal_signal", "%s/%d: potentially unexpected fatal signal %d."),
    ("arch/x86/mm/fault.c pgtable_bad", "%s: Corrupted page table at address %lx"),
    ("mm/page_alloc.c warn_alloc", "%s: page allocation failure: order:%u, mode:%#x(%pGg), nodemask=%*pbl"),
    ("mm/oom_kill.c dump_header", "%s invoked oom-killer: gfp_mask=%#x(%pGg), order=%d, oom_score_adj=%hd"),
    ("mm/oom_kill.c __oom_kill_process", "Out of memory: Killed process %d (%s) total-vm:%lukB, anon-rss:%lukB, file-rss:%lukB, shmem-rss:%lukB, UID:%u pgtables:%lukB oom_score_adj:%hd"),
    ("mm/oom_kill.c oom_reap_task_mm", "oom_reaper: reaped process %d (%s), now anon-rss:%lukB, file-rss:%lukB, shmem-rss:%lukB"),
    ("kernel/hung_task.c", "INFO: task %s:%d blocked for more than %ld seconds."),
    ("kernel/sched/core.c sched_show_task", "task:%-15.15s state:%c stack:%-5lu pid:%-5d tgid:%-5d ppid:%-6d flags:0x%08lx"),
    ("lib/dump_stack.c", "CPU: %d PID: %d Comm: %.20s %s%s %s %.*s"),
    ("fs/exec.c", "process '%s' started with executable stack"),
    ("fs/exec.c", "process '%s' launched '%s' with NULL argv: empty string added"),
    ("kernel/exit.c", "note: %s[%d] exited with irqs disabled"),
    ("kernel/exit.c", "note: %s[%d] exited with preempt_count %d"),
    ("kernel/capability.c", "warning: `%s' uses 32-bit capabilities (legacy support in use)"),
    ("kernel/sysctl.c", "%s wrote to %s when file position was not 0!"),
    ("net/packet/af_packet.c", "%s uses obsolete (PF_INET,SOCK_PACKET)"),
    ("net/bridge/br_stp.c (bridge and port: interface names)", "%s: port %u(%s) entered %s state"),
    ("net/core/dev.c", "device %s entered promiscuous mode"),
    ("net/core/dev.c", "%s: renamed from %s"),
    ("mm/memory.c print_bad_pte", "BUG: Bad page map in process %s  pte:%08llx pmd:%08llx"),
    ("mm/util.c __vm_enough_memory", "__vm_enough_memory: pid: %d, comm: %s, bytes: %ld not enough memory for the allocation"),
    ("kernel/auditsc.c", 'audit: type=1326 audit(%lu.%03lu:%u): auid=%u uid=%u gid=%u ses=%u pid=%d comm="%s" exe="%s" sig=%ld arch=%x syscall=%d compat=%d ip=0x%lx code=0x%x'),
    ("fs/ioctl.c compat", "ioctl32(%s:%d): Unknown cmd fd(%d) cmd(%08x){t:%s;sz:%u} arg(%08x) on %s"),
    ("security/yama/yama_lsm.c", 'ptrace attach of "%s"[%d] was attempted by "%s"[%d]'),
]

_CONV = re.compile(r"%(?:%|[-#0 +]*(?:\d+|\*)?(?:\.(?:\d+|\*))?(?:hh|h|ll|l|L|z)?(?:p[A-Za-z]+|[a-zA-Z]))")
COMM = r"[^\n]{0,15}"     # the first name: a comm / interface name, at most 15 bytes
FREE = r"[^\n]*"          # any later name (a file name, a second comm): anything


def format_regex(fmt: str) -> str:
    """A printk format -> the regex of every record it can print: the first ``%s`` is a name of at
    most 15 bytes (``%.20s``: 20), every later ``%s`` and every ``%p<ext>`` anything, numbers any
    digits, ``%c`` any byte."""
    out, at, first = [], 0, True
    for m in _CONV.finditer(fmt):
        out.append(re.escape(fmt[at:m.start()]))
        conv = m.group()
        if conv == "%%":
            out.append("%")
        elif conv.endswith("s"):
            width = re.search(r"\.(\d+)s$", conv)
            out.append((r"[^\n]{0,%s}" % (int(width.group(1)) if width else 15)) if first and "*" not in conv else FREE)
            first = False
        elif conv.startswith("%p") and len(conv) > 2 and conv[2:] not in ("x",) or "*" in conv:
            out.append(FREE)
        elif conv[-1] in "xXp":
            out.append(r"(?:0x)?[0-9a-fA-F]{1,16}")
        elif conv[-1] == "c":
            out.append(r"[^\n]")
        else:
            out.append(r"-?[0-9]{1,20}")
        at = m.end()
    out.append(re.escape(fmt[at:]))
    return "".join(out)


# ------------------------------------------------------------------ a tiny NFA for exact answers
ALL = (1 << 256) - 1


class NFA:
    """Thompson NFA of a Python bytes regex (``re._parser`` tree), over byte-set transitions.
    Lookarounds and anchors are dropped: that only enlarges the language (a sound check)."""

    def __init__(self, pattern: str):
        import re._parser as sre  # the regex module's own parser: the same syntax tree re compiles

        self.trans: list[list[tuple[int, int]]] = []
        self.eps: list[list[int]] = []
        tree = sre.parse(pattern, 0)
        assert not tree.state.flags & re.IGNORECASE, "headers are case-sensitive"
        self.start = self._new()
        self.accept = self._build(list(tree), self.start)

    def _new(self) -> int:
        self.trans.append([])
        self.eps.append([])
        return len(self.trans) - 1

    @staticmethod
    def _mask(items) -> int:
        mask, neg = 0, False
        for op, av in items:
            name = str(op)
            if name == "NEGATE":
                neg = True
            elif name == "LITERAL":
                mask |= 1 << av
            elif name == "RANGE":
                for c in range(av[0], av[1] + 1):
                    mask |= 1 << c
            elif name == "CATEGORY":
                cat = str(av)
                chars = {"DIGIT": b"0123456789", "SPACE": b" \t\n\r\f\v",
                         "WORD": b"abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"}
                key = cat.replace("CATEGORY_", "").replace("NOT_", "")
                m = sum(1 << c for c in chars[key])
                mask |= (ALL & ~m) if "NOT_" in cat else m
            else:
                raise AssertionError(f"unsupported class item {name}")
        return (ALL & ~mask) if neg else mask

    def _build(self, items, cur: int) -> int:
        for op, av in items:
            name = str(op)
            if name in ("LITERAL", "NOT_LITERAL", "ANY", "IN"):
                mask = {"LITERAL": lambda: 1 << av, "NOT_LITERAL": lambda: ALL & ~(1 << av),
                        "ANY": lambda: ALL & ~(1 << 10), "IN": lambda: self._mask(av)}[name]()
                nxt = self._new()
                self.trans[cur].append((mask, nxt))
                cur = nxt
            elif name in ("MAX_REPEAT", "MIN_REPEAT", "POSSESSIVE_REPEAT"):
                lo, hi, sub = av
                for _ in range(lo):
                    cur = self._build(list(sub), cur)
                if hi > 10_000:  # unbounded
                    loop = self._new()
                    self.eps[cur].append(loop)
                    self.eps[self._build(list(sub), loop)].append(loop)
                    cur = loop
                else:
                    ends = [cur]
                    for _ in range(hi - lo):
                        cur = self._build(list(sub), cur)
                        ends.append(cur)
                    fin = self._new()
                    for e in ends:
                        self.eps[e].append(fin)
                    cur = fin
            elif name in ("SUBPATTERN", "ATOMIC_GROUP"):
                sub = av[-1] if name == "SUBPATTERN" else av
                cur = self._build(list(sub), cur)
            elif name == "BRANCH":
                fin = self._new()
                for alt in av[1]:
                    self.eps[self._build(list(alt), cur)].append(fin)
                cur = fin
            elif name in ("AT", "ASSERT", "ASSERT_NOT"):
                continue
            else:
                raise AssertionError(f"unsupported regex construct {name}")
        return cur

    def closure(self, states) -> frozenset[int]:
        seen, todo = set(states), list(states)
        while todo:
            for n in self.eps[todo.pop()]:
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return frozenset(seen)

    def live(self) -> set[int]:
        """States from which the accepting state can be reached."""
        back: dict[int, list[int]] = {}
        for s, edges in enumerate(self.trans):
            for _, n in edges:
                back.setdefault(n, []).append(s)
            for n in self.eps[s]:
                back.setdefault(n, []).append(s)
        seen, todo = {self.accept}, [self.accept]
        while todo:
            for p in back.get(todo.pop(), ()):
                if p not in seen:
                    seen.add(p)
                    todo.append(p)
        return seen


def header_can_begin(header: str, record: str) -> bool:
    """Exactly whether some record of the regex ``record`` begins with a match of ``header``
    (that is: ``re.match(header, r)`` succeeds for some ``r`` in the language of ``record``)."""
    h, t = NFA(header), NFA(record)
    live = t.live()
    start = (h.closure([h.start]), t.closure([t.start]))
    seen, todo = {start}, [start]
    while todo:
        hs, ts = todo.pop()
        if h.accept in hs and ts & live:
            return True
        steps: dict[tuple[frozenset, frozenset], None] = {}
        for a in hs:
            for ma, na in h.trans[a]:
                for b in ts:
                    for mb, nb in t.trans[b]:
                        m = ma & mb
                        if m:
                            steps.setdefault((frozenset([na]), frozenset([nb])), None)
        # group by byte would be exact-DFA; pairwise singletons are exact for an NFA product
        for (na, nb) in steps:
            nxt = (h.closure(na), t.closure(nb))
            if nxt not in seen:
                seen.add(nxt)
                todo.append(nxt)
    return False


@lru_cache(maxsize=None)
def _header_pattern(row_id: str) -> str:
    return next(r.regex.pattern.decode() for r in kernel_headers() if r.id == row_id)


# ------------------------------------------------------------------ the table itself
def test_every_header_row_matches_its_example_and_is_long_enough():
    rows = kernel_headers()
    assert len({r.id for r in rows}) == len(rows) >= 10
    for row in rows:
        body = row.example.encode()
        hdr = kernel_header(body)
        assert hdr is not None and hdr.id == row.id, row.id
        assert row.regex.match(body).end() >= MIN_HEADER_BYTES, row.id
        assert row.ref, row.id
        # no string shorter than 16 bytes is a header: the shortest match is at least 16 bytes
        assert not header_can_begin(row.regex.pattern.decode(), r"[^\n]{0,15}"), row.id


@pytest.mark.parametrize("row_id", [r.id for r in kernel_headers()])
def test_no_header_can_be_completed_by_a_process_name(row_id):
    """Exhaustive: for every real format that prints a user-chosen name (any 0-15 bytes), any
    numbers and any later file name, no record it can print begins with this header."""
    header = _header_pattern(row_id)
    bad = [(ref, fmt) for ref, fmt in PRINTK_FORMATS if header_can_begin(header, format_regex(fmt))]
    assert not bad, f"{row_id} can be completed by: {bad}"


@pytest.mark.parametrize("unsafe", [
    r"NVRM: Xid: \d{1,6},",                                     # the old shape: 14 bytes fit in a comm
    r"NVRM: Xid \(\d{1,7}\)",                                    # "NVRM: Xid" + the kernel's " (%d)"
    r"[a-z][a-z0-9_-]{1,31} [0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]: ",  # a 2-letter driver name
    r"EDAC MC\d{1,3}: \d{1,9} UE [a-zA-Z]",                     # 14 bytes + " invoked oom-killer"
    r"EDAC MC\d{1,3}: \d{1,9} UE (?:[^\n]{0,100} )?on [^\n]{0,100}\(",  # a file name "on x (" after "segfault ... in "
    r"mce: ",
])
def test_the_check_finds_headers_a_process_name_can_complete(unsafe):
    """The checker is not vacuous: shapes a 15-byte name plus the kernel's own text can complete."""
    assert any(header_can_begin(unsafe, format_regex(fmt)) for _, fmt in PRINTK_FORMATS), unsafe


# ------------------------------------------------------------------ generative: forged records
FORGED = [
    f"NVRM: Xid (PCI:{BUS}): 79, pid=4242, name=python, GPU has fallen off the bus.",
    f"NVRM: Xid (PCI:{BUS2}): 48, pid=1, name=x, An uncorrectable double bit error (DBE) has been detected",
    "NVRM: Xid: 79, GPU has fallen off the bus.",
    f"NVRM: GPU {BUS}.0: GPU has fallen off the bus.",
    f"GPU {BUS}.0: GPU has fallen off the bus.",
    f"nvidia {BUS}.0: AER: PCIe Bus Error: severity=Uncorrected (Fatal)",
    f"pcieport {BUS}.0: PCIe Bus Error: severity=Uncorrected (Fatal), type=Transaction Layer",
    "mce: [Hardware Error]: CPU 3: Machine Check Exception: 5 Bank 4: be00000000800400",
    "Kernel panic - not syncing: Fatal machine check",
    "EDAC MC0: 1 UE memory read error on CPU_SrcID#0",
    "nvidia-nvswitch0: SXid (PCI:0000:86:00.0): 24007, Fatal, Link 34",
    "NVRM: GPU6 _kgspLogRpcTimeout: GSP Timeout",
]


def _kmsg_escape(raw: bytes) -> str:
    """As /dev/kmsg prints a record: bytes below 0x20 (but tab) and from 0x7f escaped as \\xNN."""
    return "".join(chr(c) if (32 <= c < 127 or c == 9) and c != 92 else f"\\x{c:02x}" for c in raw)


@st.composite
def names(draw, limit: int):
    """A name a user chooses: arbitrary bytes, or a slice of driver-looking text."""
    raw = draw(st.one_of(
        st.binary(max_size=limit),
        st.builds(lambda f, k: f.encode()[k:k + limit], st.sampled_from(FORGED), st.integers(0, 40)),
        st.sampled_from([b"NVRM: Xid: 79,", b"NVRM: Xid (PCI:", b"NVRM: GPU 0000:", b"nvidia 0000:10:",
                         b"pcieport 0000:1", b"mce: [Hardware ", b"{1}[Hardware Er", b"EDAC MC0: 1 UE "]),
    ))
    return _kmsg_escape(raw[:limit])


@st.composite
def user_named_records(draw) -> str:
    """A record of a real format: the first name <= 15 bytes, every later name anything
    (driver-looking text included), any numbers."""
    _, fmt = draw(st.sampled_from(PRINTK_FORMATS))
    out, at, first = [], 0, True
    for m in _CONV.finditer(fmt):
        out.append(fmt[at:m.start()])
        conv = m.group()
        if conv == "%%":
            out.append("%")
        elif conv.endswith("s") or (conv.startswith("%p") and len(conv) > 2 and conv != "%px"):
            if first and conv.endswith("s"):
                out.append(draw(names(20 if ".20s" in conv else 15)))
                first = False
            else:
                out.append(draw(st.one_of(st.sampled_from(FORGED), names(255),
                                          st.builds(str.__add__, names(40), st.sampled_from(FORGED)))))
        elif conv[-1] in "xXp":
            out.append(f"{draw(st.integers(0, 2**64 - 1)):x}")
        elif conv[-1] == "c":
            out.append(draw(st.sampled_from("RSDZ")))
        else:
            out.append(str(draw(st.integers(-(2**31), 2**32))))
        at = m.end()
    out.append(fmt[at:])
    return "".join(out)


@FAST
@given(records=st.lists(user_named_records(), min_size=1, max_size=3), exit_code=st.sampled_from([0, 1, None]),
       job=st.sampled_from([frozenset({BUS}), frozenset({BUS, BUS2}), frozenset(), None]))
def test_user_named_records_never_blame_a_gpu_or_a_node(records, exit_code, job):
    """Any name (<= 15 bytes first, any file name after) in any of those formats, around any
    driver-looking text: no hardware verdict, no node action, no Xid; the health check's parser
    counts no Xid of this node's GPUs either."""
    v = classify(Evidence(kernel_lines=records, exit_code=exit_code, job_bus_ids=job, node_bus_ids=NODE_BUS,
                          kernel_records=True))
    assert v.verdict != "hardware" and v.action not in NODE_ACTIONS and v.xids == (), (records, v)
    assert kmsg_events(records, NVML_BUS) == [], records


#: An independent reference for the one header the test feeds: the driver's Xid line.
REFERENCE = re.compile(rb"NVRM: Xid \(PCI:0000:10:00\): 79, ")
RECORD = f"NVRM: Xid (PCI:{BUS}): 79, pid=4242, name=python, GPU has fallen off the bus."


@FAST
@given(prefix=st.one_of(st.binary(min_size=1, max_size=40).map(_kmsg_escape),
                        st.sampled_from(["NVRM: Xid (PCI:", "NVRM: ", "kernel: ", "[  219.470994] ", "<3>",
                                         "python (42): ", "x[1]: segfault at 0 in ", " "]),
                        names(15).map(lambda n: n + " (4242): ")),
       exit_code=st.sampled_from([1, 137, None]))
def test_the_verdict_depends_only_on_the_header_at_the_start(prefix, exit_code):
    """Anything in front of a real driver record makes it text: not hardware, no Xid; the record
    alone is hardware on the job's GPU.  Decided against an independent reference regex."""
    def judge(line: str):
        return classify(Evidence(kernel_lines=[line], exit_code=exit_code, job_bus_ids=frozenset({BUS}),
                                 node_bus_ids=NODE_BUS, kernel_records=True))

    line = prefix + RECORD
    expect = REFERENCE.match(line.encode()) is not None
    v = judge(line)
    assert (v.verdict == "hardware") == expect and bool(v.xids) == expect, (line, v)
    assert (kmsg_events([line], NVML_BUS) == [(0, 79)]) == expect
    v = judge(RECORD)
    assert (v.verdict, v.rule, v.action) == ("hardware", "xid-79", "drain_node")
    assert kmsg_events([RECORD], NVML_BUS) == [(0, 79)]


# ------------------------------------------------------------------ attribution
def _cfg(tmp_path, inventory=False):
    d = {"journal": {"path": str(tmp_path / "d.db"), "node_path": str(tmp_path / "node-{node}.db")}}
    if inventory:
        from slurm_ft.nvml import fake
        fake.write_inventory(str(tmp_path / "n1.json"), "n1", [{"index": 0}, {"index": 1}])
        d["nvml"] = {"backend": "fake", "inventory": str(tmp_path / "{node}.json")}
    return config_mod.from_dict(d)


def _job(gpus, exit_code=1):
    return NodeJob(job_id=7, node="n1", attempt=0, uid=os.getuid(), gpus=gpus, exit_code=exit_code, signal=None,
                   stdout=None, stderr=None, work_dir=None)


def _checks(*results):
    return lambda cfg, node: list(results)


@pytest.mark.parametrize("line", [
    "NVRM: Xid: 79, GPU has fallen off the bus.",
    "NVRM: Xid (3): 79, GPU has fallen off the bus.",
    "NVRM: Xid (PCI:0000:99:00): 79, pid=1, name=x, GPU has fallen off the bus.",  # no GPU of this node
    "NVRM: GPU 0000:99:00.0: GPU has fallen off the bus.",
])
def test_an_xid_without_a_bus_id_is_attributed_to_no_job(line, tmp_path):
    """Unplaced: no job's evidence (whatever the job's GPUs), no node action by itself; the epilog
    runs the trusted checks for it: a failing one drains (verified:unplaced), none changes nothing."""
    for job_bus in (frozenset({BUS}), frozenset(), None):
        v = classify(Evidence(kernel_lines=[line], exit_code=1, job_bus_ids=job_bus, node_bus_ids=NODE_BUS,
                              kernel_records=True))
        assert v.verdict != "hardware" and v.action not in NODE_ACTIONS and v.xids == (), (job_bus, v)
        assert v.unplaced == (line,)
    cfg = _cfg(tmp_path)
    v = classify(Evidence(kernel_lines=[line], exit_code=1, job_bus_ids=frozenset({BUS}), node_bus_ids=NODE_BUS,
                          kernel_records=True))
    same = verify_untrusted(cfg, _job((0,)), v, print, run_checks=_checks(CheckResult("ecc_volatile", "pass", 0, "ok")))
    assert same == v
    gone = verify_untrusted(cfg, _job((0,)), v, print, run_checks=lambda c, n: (_ for _ in ()).throw(
        __import__("slurm_ft.errors", fromlist=["SlurmFTError"]).SlurmFTError("checks broken")))
    assert gone == v
    mine = verify_untrusted(cfg, _job((0,)), v, print,
                            run_checks=_checks(CheckResult("nvml_responsive", "fail", None, "NVML init failed")))
    assert (mine.verdict, mine.rule, mine.action) == ("hardware", "verified:unplaced", "drain_node")
    # another job's GPU fails: the node is drained, this job (its own exit 1) is not blamed
    other = verify_untrusted(cfg, _job((0,)), v, print,
                             run_checks=_checks(CheckResult("ecc_volatile", "fail", 1, "GPU1 2 DBE")))
    assert (other.verdict, other.rule, other.action, other.cause) == (v.verdict, v.rule, "drain_node",
                                                                       "verified:unplaced")


def test_a_job_without_gpus_owns_none(tmp_path, monkeypatch):
    """No SLURM_JOB_GPUS: the job's bus-id set is empty, not 'every GPU of the node' (epilog, hang
    watcher, in-place restarts); a real Xid 79 on GPU 0 and another job's failing GPU check never
    make it hardware, and its own untrusted output is not confirmed by another job's GPU."""
    from slurm_ft.node import epilog
    from slurm_ft.job import inplace
    from slurm_ft.classify import sources
    from slurm_ft.hang import evidence as hang_evidence

    xid = f"NVRM: Xid (PCI:{BUS}): 79, pid=4242, name=python, GPU has fallen off the bus."
    monkeypatch.setattr(sources, "read_kmsg", lambda since, **kw: [xid])
    cfg = _cfg(tmp_path, inventory=True)

    ev = epilog.gather_evidence(cfg, _job(None), 0.0, print)
    assert ev.job_bus_ids == frozenset() and ev.node_bus_ids == NODE_BUS
    v = classify(ev)
    assert (v.verdict, v.xids) == ("user", ())
    assert classify(epilog.gather_evidence(cfg, _job((0,)), 0.0, print)).verdict == "hardware"

    assert hang_evidence.kernel_verdict(cfg, "n1", None, 0.0).verdict != "hardware"
    assert hang_evidence.kernel_verdict(cfg, "n1", (0,), 0.0).verdict == "hardware"

    env = {"SLURMD_NODENAME": "n1"}
    lines, node_bus, job_bus, _ = inplace.kernel_since(cfg, env, time.monotonic())
    assert (lines, node_bus, job_bus) == ([xid], NODE_BUS, frozenset())
    assert inplace.kernel_since(cfg, {**env, "SLURM_JOB_GPUS": "0"}, time.monotonic())[2] == frozenset({BUS})

    # its own output suggests hardware; only another job's GPU fails the trusted check
    out = classify(Evidence(stderr_tail="RuntimeError: CUDA error: uncorrectable ECC error encountered", exit_code=1,
                            job_bus_ids=frozenset(), node_bus_ids=NODE_BUS, kernel_records=True))
    assert out.action == "verify"
    r = verify_untrusted(cfg, _job(None), out, print, run_checks=_checks(CheckResult("ecc_volatile", "fail", 0, "GPU0 DBE")))
    assert (r.verdict, r.action) == ("unknown", "retry")
    r = verify_untrusted(cfg, _job(None), out, print,
                         run_checks=_checks(CheckResult("nvml_responsive", "fail", None, "NVML init failed")))
    assert (r.verdict, r.action) == ("hardware", "drain_node")  # a node-level fault is everyone's
