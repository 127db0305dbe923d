"""Break-fix remediation: the I/O around :mod:`slurm_ft.remediate.policy`.

Two halves, by where they run (docs/drain-report.md, "Break-fix remediation"):

* **controller, in the daemon** (root; :class:`Remediator`, called from each node poll of
  ``slurm_ft.failover.daemon``): reads Slurm's node list (already read by the daemon) and the
  journal's ``remediate-*`` rows, asks the policy, and acts through Slurm only:
  ``scontrol reboot reason="slurm-ft: remediate: reboot ..." NODE`` (the node is drained and
  idle already, so Slurm keeps it drained after the reboot: checked on 22.05), a GPU reset asked
  of the node through its drain reason (``slurm-ft: remediate: reset GPU <bus> ...``), an RMA
  reason. Every step is an action row ``remediate-<kind>`` with a JSON detail, journaled before
  Slurm is asked (intent -> done/failed); observe mode journals it as observed.
* **node, in ``slurm-ft health --act``** (root, Slurm's HealthCheckProgram: it runs when slurmd
  starts, i.e. after the reboot, before the node registers; :func:`after_checks`): a node whose
  reason asks for a reset gets it (:func:`reset_gpu`: persistence mode off, ``nvidia-smi -r``,
  persistence mode back; on failure a ``nvidia-bug-report.sh`` for the vendor), then the trusted
  checks decide: all pass -> ``State=RESUME``; a fail -> reason ``slurm-ft: remediate: failed:
  <check>``, which the daemon reads as a failed repair.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import time
from dataclasses import dataclass

from slurm_ft.errors import SlurmFTError
from slurm_ft.remediate import policy as P

log = logging.getLogger("slurm_ft.remediate")

#: Journal action names, one per step kind (``remediate-reboot`` ...).
ACTIONS = tuple(f"remediate-{k}" for k in P.STEP_KINDS)
#: Slurm node flags of a reboot requested or under way.
REBOOT_FLAGS = ("REBOOT", "REBOOT_REQUESTED", "REBOOT_ISSUED")
SAFE_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
#: Seconds before a step Slurm refused on a node (a failed ``scontrol reboot``) is tried again.
RETRY_AFTER_REFUSAL_S = 60.0


def catalog() -> dict[int, P.CatalogRow]:
    """The shipped Xid catalog's repair columns (``xid_catalog.csv``: ``repair``, ``cancels``)."""
    from slurm_ft.classify.table import xid_catalog

    return {x: P.CatalogRow(r.repair, r.cancels) for x, r in xid_catalog().items()}


def _detail(step_kind: str, **fields) -> str:
    return json.dumps({"kind": step_kind, **fields}, sort_keys=True)


def steps_from_rows(rows) -> dict[str, list[P.Step]]:
    """Journal ``remediate-*`` action rows (oldest first) -> each node's steps. Rows Slurm
    refused (``failed``) or left as an intent are no step; an observe-mode row (``observed``) is."""
    out: dict[str, list[P.Step]] = {}
    for r in rows:
        if r.get("action") not in ACTIONS or r.get("status") not in ("done", "observed"):
            continue
        try:
            d = json.loads(r.get("detail") or "{}")
        except ValueError:
            d = {}
        if not isinstance(d, dict):
            d = {}
        xids = tuple(int(x) for x in d.get("xids", []) if isinstance(x, int))
        out.setdefault(r.get("target") or "", []).append(P.Step(
            r["action"][len("remediate-"):], float(r.get("created") or 0.0), xids, str(d.get("bus", "")),
            int(r.get("job_id") or 0) if (r.get("job_id") or 0) > 0 else 0, str(d.get("what", ""))))
    return out


def node_facts(node, steps: list[P.Step], later_xids: tuple[int, ...] = ()) -> P.NodeFacts:
    """A ``slurm_ft.slurm.Node`` (``sinfo --json``) and its journal steps -> policy facts. Idle:
    Slurm's base state IDLE (a draining node with a job is MIXED/ALLOCATED; a DOWN node, whose
    slurmd does not answer, cannot run a RebootProgram)."""
    flags = {f.upper() for f in node.flags}
    return P.NodeFacts(
        name=node.name, drained=node.drained, idle=node.state.upper() == "IDLE" and "COMPLETING" not in flags,
        rebooting=bool(flags & set(REBOOT_FLAGS)), reason=node.reason, steps=tuple(steps), later_xids=later_xids)


class Remediator:
    """The daemon's remediation step (``d``: the :class:`slurm_ft.failover.daemon.Daemon`)."""

    def __init__(self, d):
        self.d = d
        self.cfg = d.cfg.remediate
        self.catalog = catalog()

    def limits(self, nodes, in_flight: int) -> P.Limits:
        from slurm_ft.drain.breaker import limit_for

        allowance = limit_for(self.d.cfg.breaker, len(nodes))
        return P.Limits(self.cfg.max_repairs, self.cfg.window_s, self.cfg.repair_timeout_s, self.cfg.reset,
                        observe=self.d.cfg.failover.mode == "observe",
                        may_start=self.d.breaker_latched is None and in_flight < allowance)

    def scan(self, nodes) -> None:
        """One pass over the cluster's nodes (the daemon's last ``sinfo --json``). Errors are
        logged per node and retried at the next node poll; they never stop the daemon's cycle."""
        now = self.d.clock()
        j = self.d.journal
        try:
            rows = j.actions_named(ACTIONS, now - max(self.cfg.window_s, self.cfg.repair_timeout_s) - 86400.0)
        except SlurmFTError as exc:
            log.error("remediate: journal: %s", exc)
            return
        steps = steps_from_rows(rows)
        later = self._later_xids(nodes)
        facts = [node_facts(n, steps.get(n.name, []), later.get(n.name, ())) for n in nodes]
        in_flight = sum(1 for f in facts if f.steps and f.steps[-1].kind in P.REPAIR_KINDS)
        refused = {r.get("target") for r in rows if r.get("status") == "failed"
                   and (r.get("finished") or r.get("created") or 0) > now - RETRY_AFTER_REFUSAL_S}
        for f in facts:
            if not f.steps and not (f.drained and f.reason.startswith(P.LEADER)):
                continue
            if f.name in refused:
                continue                   # Slurm refused a step here just now: not every poll
            for action in P.decide(f, self.limits(nodes, in_flight), self.catalog, now):
                try:
                    self.apply(action)
                except SlurmFTError as exc:
                    log.error("remediate %s: %s", f.name, exc)
                    break
                if isinstance(action, P.Repair):
                    in_flight += 1

    def _later_xids(self, nodes) -> dict[str, tuple[int, ...]]:
        """Xids the journal recorded on each slurm-ft-drained node since its drain reason was set
        (a later Xid may cancel the fault: catalog ``cancels``); one bounded query, only when a
        node is drained by slurm-ft."""
        drained = {n.name: n.reason_time for n in nodes
                   if n.drained and n.reason.startswith(P.LEADER) and n.reason_time}
        if not drained:
            return {}
        try:
            rows = self.d.journal.recent_xid_verdicts(min(drained.values()))
        except SlurmFTError:
            return {}
        out: dict[str, list[int]] = {}
        for r in reversed(rows):                           # oldest first
            if r["node"] in drained and (r["created"] or 0) >= drained[r["node"]]:
                out.setdefault(r["node"], []).extend(
                    int(x["xid"]) for x in r["xids"] if isinstance(x, dict) and str(x.get("xid", "")).isdigit())
        return {k: tuple(v) for k, v in out.items()}

    def apply(self, a) -> None:
        """Journal and carry out one policy action (Slurm commands through the daemon's client, so
        observe mode's gate applies). Raises :class:`SlurmFTError` (Slurm refused, journal)."""
        j, slurm = self.d.journal, self.d.slurm
        if isinstance(a, P.Repair):
            fields = dict(xids=list(a.xids), bus=a.bus, what=a.what, n=a.n, reason=a.reason)
            aid = j.intend(a.job_id, 0, f"remediate-{a.kind}", a.node, _detail(a.kind, **fields))
            try:
                if a.kind == "reboot":
                    # plain reboot of a drained node: Slurm keeps it drained after the reboot (no
                    # ASAP, no nextstate=RESUME: those clear the drain whatever the checks say)
                    slurm.run("scontrol", "reboot", f"reason={a.reason}", a.node)
                else:
                    slurm.drain(a.node, a.reason)    # the node's HealthCheckProgram does the reset
            except SlurmFTError as exc:
                j.finish(aid, "failed", _detail(a.kind, why=str(exc), **fields))
                raise
            j.finish(aid)
            log.warning("%s: remediate: %s (%s)", a.node, a.kind, a.reason)
        elif isinstance(a, P.Rma):
            aid = j.intend(a.job_id, 0, "remediate-rma", a.node, _detail("rma", reason=a.reason, repairs=a.repairs))
            try:
                slurm.drain(a.node, a.reason)
            except SlurmFTError as exc:
                j.finish(aid, "failed", _detail("rma", reason=a.reason, why=str(exc)))
                raise
            j.finish(aid)
            log.warning("%s: %s", a.node, a.reason)
        elif isinstance(a, P.Pass):
            from slurm_ft.failover import reconcile

            j.record(a.job_id, 0, "remediate-pass", a.node, _detail("pass", why=a.why))
            # the drain is over: reconciliation must neither call it lifted by someone else nor
            # drain the node again after a controller restart
            j.record(a.job_id, 0, reconcile.ACTION, a.node, reconcile.detail(
                reconcile.DRAIN_LIFTED, f"{a.node} resumed by slurm-ft after a repair passed the trusted checks"))
            log.warning("%s: remediate: pass (%s)", a.node, a.why)
        elif isinstance(a, P.Fail):
            j.record(a.job_id, 0, "remediate-fail", a.node, _detail("fail", why=a.why, repair=a.kind))
            log.warning("%s: remediate: %s failed: %s", a.node, a.kind, a.why)
        elif isinstance(a, P.Cancel):
            j.record(a.job_id, 0, "remediate-cancel", a.node, _detail("cancel", why=a.why))
            log.warning("%s: remediate: %s", a.node, a.why)


# ------------------------------------------------------------------------- node side
@dataclass(frozen=True)
class ResetOutcome:
    """What :func:`reset_gpu` did: ``ok``; ``why`` (one line); ``bug_report``: the report's path,
    "" when none was written (absent script, success)."""

    ok: bool
    why: str
    bug_report: str = ""


def _smi(cfg, *args: str, timeout_s: float = 120.0) -> subprocess.CompletedProcess:
    return subprocess.run([cfg.remediate.nvidia_smi, *args], capture_output=True, text=True, errors="replace",
                          timeout=timeout_s, env={"PATH": SAFE_PATH, "LC_ALL": "C"}, stdin=subprocess.DEVNULL)


def reset_gpu(cfg, node: str, bus: str, *, smi=None, bug_report=None) -> ResetOutcome:
    """Reset GPU ``bus`` (PCI bus id) on this node: persistence mode off first (the driver refuses
    a reset while it holds the device), ``nvidia-smi -r -i BUS``, persistence mode restored as it
    was, whatever the reset did. A failed reset collects ``nvidia-bug-report.sh`` output (skipped,
    and said so, when the script is absent). ``[nvml] backend = "fake"`` (the lab) resets the fake
    inventory instead (:func:`fake_reset`). ``smi``/``bug_report``: replaceable for tests."""
    if cfg.nvml.backend == "fake" and smi is None:
        return fake_reset(cfg, node, bus)
    smi = smi or (lambda *a: _smi(cfg, *a))
    try:
        q = smi("-i", bus, "--query-gpu=persistence_mode", "--format=csv,noheader")
        persistent = q.returncode == 0 and q.stdout.strip().lower().startswith("enabled")
        if persistent:
            smi("-i", bus, "-pm", "0")
        try:
            r = smi("-r", "-i", bus)
            ok, why = r.returncode == 0, ((r.stdout or r.stderr).strip().splitlines() or [""])[-1]
        finally:
            if persistent:
                smi("-i", bus, "-pm", "1")
    except (OSError, subprocess.TimeoutExpired) as exc:
        ok, why = False, f"nvidia-smi: {exc}"
    if ok:
        return ResetOutcome(True, f"GPU {bus} reset")
    report = (bug_report or collect_bug_report)(cfg, node)
    return ResetOutcome(False, f"GPU {bus} reset failed: {why}"[:160], report)


def collect_bug_report(cfg, node: str) -> str:
    """Run ``[remediate] bug_report`` into ``bug_report_dir`` (made 0700, root's); returns the
    report's path, or "" when the script is absent or failed (logged)."""
    script = cfg.remediate.bug_report
    if not script or not os.access(script, os.X_OK):
        log.warning("%s: no %s: no bug report collected", node, script or "bug_report script")
        return ""
    d = cfg.remediate.bug_report_dir
    try:
        os.makedirs(d, mode=0o700, exist_ok=True)
        st = os.lstat(d)
        if not os.path.isdir(d) or os.path.islink(d) or st.st_uid != os.geteuid():
            log.warning("%s: %s is not a directory of this user's: no bug report", node, d)
            return ""
        base = os.path.join(d, f"nvidia-bug-report-{node}-{time.strftime('%Y%m%dT%H%M%S')}.log")
        subprocess.run([script, "--output-file", base], capture_output=True, timeout=600,
                       env={"PATH": SAFE_PATH, "LC_ALL": "C"}, stdin=subprocess.DEVNULL, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        log.warning("%s: bug report failed: %s", node, exc)
        return ""
    return base + ".gz" if os.path.exists(base + ".gz") else base


def same_bus(a: str, b: str) -> bool:
    """Whether two PCI bus ids name one GPU: NVML's ``00000000:10:00.0`` and the kernel log's
    ``0000:10:00`` (domain width and the function number differ)."""
    def key(text: str):
        parts = text.lower().split(".")[0].split(":")
        try:
            return tuple(int(p, 16) for p in parts[-3:]) if len(parts) >= 3 else None
        except ValueError:
            return None
    return key(a) is not None and key(a) == key(b)


def fake_reset(cfg, node: str, bus: str) -> ResetOutcome:
    """The lab's GPU reset on the fake inventory: refused while persistence mode is on (as the
    driver does; :func:`reset_gpu` turns it off first on a real node, here the refusal is
    modelled), and refused when the GPU is marked ``lost`` (a reset cannot bring back a GPU that
    fell off the bus); else it clears the GPU's pending Xid events."""
    from slurm_ft.nvml import inventory

    path = cfg.nvml_inventory_path(node)
    try:
        inv = inventory.read(path)
    except (OSError, ValueError, SlurmFTError) as exc:
        return ResetOutcome(False, f"fake inventory {path}: {exc}")
    gpu = next((g for g in inv["gpus"] if same_bus(g["pci_bus_id"], bus)), None)
    if gpu is None:
        return ResetOutcome(False, f"no GPU {bus} on {node}")
    if gpu["lost"]:
        return ResetOutcome(False, f"GPU {bus} reset failed: GPU is lost")
    inventory.set_gpu_field(path, gpu["index"], "xid_events", "")
    return ResetOutcome(True, f"GPU {bus} reset")


def after_checks(cfg, node: str, results, slurm, log_line, rerun=None) -> str | None:
    """``slurm-ft health --act`` on a node under repair (``[remediate] enabled``; reason
    ``slurm-ft: remediate: ...`` not yet ``failed``): a reset asked for is done first, then the
    checks are run again (``rerun()``); every check passes -> the node is resumed ("resumed"), a
    fail -> reason ``slurm-ft: remediate: failed: ...`` ("remediate-failed"). None: not a node
    under repair (the caller does what it always does)."""
    from slurm_ft.drain.reason import health_reason

    try:
        info = slurm.show_node(node)
    except SlurmFTError as exc:
        log_line(f"{node}: remediate: node state unknown ({exc})")
        return None
    reason, state = info.get("Reason", ""), info.get("State", "")
    if not reason.startswith(P.REMEDIATE) or reason.startswith(P.FAILED) or "DRAIN" not in state:
        return None
    if "REBOOT_REQUESTED" in state:
        log_line(f"{node}: remediate: a reboot is pending; the checks after it decide")
        return "still-drained"        # a periodic run before the reboot: not the repair's outcome
    if reason.startswith(f"{P.REMEDIATE} reset GPU "):
        bus = reason[len(f"{P.REMEDIATE} reset GPU "):].split()[0]
        outcome = reset_gpu(cfg, node, bus)
        report = f" (bug report {outcome.bug_report})" if outcome.bug_report else ""
        log_line(f"{node}: remediate: {outcome.why}{report}")
        if not outcome.ok:
            slurm.drain(node, f"{P.FAILED}: reset: {outcome.why}"[:200])
            return "remediate-failed"
        if rerun is not None:
            results = rerun()
    bad = health_reason(results)
    if bad:
        slurm.drain(node, f"{P.FAILED}: {bad[len(P.LEADER):].strip()}"[:200])
        log_line(f"{node}: remediate: checks still fail after the repair: {bad}")
        return "remediate-failed"
    slurm.resume(node)
    log_line(f"{node}: remediate: every check passes after the repair: resumed (was: {reason})")
    return "resumed"
