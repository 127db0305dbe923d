"""Node prolog: note when the job started here (for the epilog's kernel-log window) and check
the node's GPUs before the job runs on them.

Run by slurmd as root on every node of a job at allocation (``PrologFlags=Alloc``,
``Prolog=.../prolog/slurm-ft-prolog``). Reads ``SLURM_JOB_ID``, ``SLURMD_NODENAME``,
``SLURM_JOB_RESTART_COUNT``, ``SLURM_JOB_GPUS``, ``SLURM_JOB_PARTITION`` and the node's Slurm
record (``scontrol show node``, cached for ``[health] scope_cache_s``: which checks apply here,
slurm_ft.health.scope). Writes the start marker under ``[node_state] dir`` and health results to
the node's journal.

Exit status: 0 lets the job start. Non-zero only when a health check fails: Slurm then drains the
node and requeues the job (the daemon releases it elsewhere at once, see failover/daemon.py).
Our own errors never block a job: they are logged and the prolog exits 0; an unexpected one
(a bug) goes through slurm_ft.node.boundary, whose ``[node_state] on_internal_error`` decides (default
``pass``: exit 0). :func:`run` returns 1 for a refusal; the process (``python -m``) exits
``boundary.EXIT_DRAIN`` (3) for it, which the wrapper turns into 1, so that the wrapper can tell
it from a crash before the boundary (an import error: Python's 1).
"""

from __future__ import annotations


from slurm_ft.node.boundary import note, report, root_entry
from slurm_ft.errors import SlurmFTError
from slurm_ft.node.job import NodeJob, write_start_marker
from slurm_ft.node.log import start_script


@root_entry("prolog")
def run(env: dict[str, str] | None = None, *, detach: bool = False) -> int:
    """The whole prolog; returns the process exit status (see module doc).

    ``detach`` (the ``python -m slurm_ft.node.prolog`` entry point): work that cannot change the exit
    status (a passing job's health rows for the journal) is done by a child process detached from
    the prolog (:func:`after_exit`), so Slurm starts the job without waiting for the journal
    (issue 24, docs/architecture.md "Per-job cost"). Without it (in-process callers, tests) that
    work is done before returning."""
    job, cfg, log = start_script("prolog", env)
    if cfg is None:
        return 0
    note(cfg=cfg, node=job.node, log=log)
    try:
        write_start_marker(cfg.node_state.dir, job)
    except OSError as exc:
        log(f"start marker not written: {exc}")
    later: list | None = [] if detach else None
    rc = health_gate(cfg, job, log, env, later)
    if rc == 0:
        start_hang_watch(cfg, job, env, log)
        flush_mailbox(cfg, job, log, later)
    if later:
        after_exit(later, cfg, log)
    return rc


#: ``nice`` increment of the detached child of :func:`after_exit` (lower CPU priority, never starved).
AFTER_EXIT_NICE = 10


def after_exit(work: list, cfg, log) -> None:
    """Run the callables ``work`` in a child process detached from the prolog, then return at once.

    The child starts a new session (slurmd's kill of the prolog's process group does not reach it)
    and puts its stdin/stdout/stderr on ``/dev/null`` (slurmd reads the prolog's output until
    EOF: a child holding it would keep the job waiting); only then does the parent return (a pipe
    handshake). The child then lowers its CPU priority (:data:`AFTER_EXIT_NICE`: on a busy node the
    job's own start goes first). Errors in the child go to the node log, syslog and the internal-error counter
    (slurm_ft.node.boundary.report); they cannot change the prolog's exit status, which nothing in
    ``work`` may decide. When no child can be made, ``work`` runs here, before returning."""
    import os

    try:
        ready_r, ready_w = os.pipe()
        pid = os.fork()
    except OSError as exc:
        log(f"no detached child ({exc}); journaling before the job starts")
        for fn in work:
            fn()
        return
    if pid:
        os.close(ready_w)
        try:
            os.read(ready_r, 1)     # the child has left our session and our stdout/stderr
        finally:
            os.close(ready_r)
        return
    status = 0
    try:
        os.close(ready_r)
        os.setsid()
        null = os.open(os.devnull, os.O_RDWR)
        for std in (0, 1, 2):
            os.dup2(null, std)
        os.close(null)
        os.write(ready_w, b"1")
        os.close(ready_w)
        try:    # behind the job's own start on a busy node (srun, slurmstepd): the rows can wait
            os.nice(AFTER_EXIT_NICE)
        except OSError:
            pass
        for fn in work:
            fn()
    except BaseException as exc:  # noqa: BLE001 - the child reports and exits; it never returns into the prolog
        status = 1
        try:
            report("prolog", exc, cfg=cfg, log=log)
        except BaseException:  # noqa: BLE001
            pass
    finally:
        os._exit(status)


def flush_mailbox(cfg, job: NodeJob, log, later: list | None) -> None:
    """Post what this node's outbox holds and put back verdicts a slurmctld state rollback erased
    from its mailbox field (slurm_ft.failover.repost), in the detached part (``later``) when there
    is anything to do. The fast path (nothing ever posted here, or all confirmed: neither file
    exists) pays two ``lstat`` calls and no import (issue 24)."""
    import os

    if not any(os.path.lexists(os.path.join(cfg.node_state.dir, f"{kind}-{job.node}.json"))
               for kind in ("outbox", "posted")):     # mailbox._outbox_path, repost.ledger_path
        return
    from slurm_ft.failover import mailbox, repost

    if not repost.pending(cfg.node_state.dir, job.node):
        return
    work = lambda: mailbox.check_node(cfg, job.node, log)  # noqa: E731
    if later is None:
        work()
    else:
        later.append(work)


def start_hang_watch(cfg, job: NodeJob, env: dict[str, str] | None, log) -> None:
    """For a job submitted with ``--ft-hang-timeout`` (its SPANK hint ``SPANK_FT_HANG_TIMEOUT``):
    make its heartbeat directory and start its hang watcher, detached (slurm_ft.hang.watcher,
    docs/hang.md). Costs the prolog a directory and a fork; any failure is logged and the job
    starts unwatched (never refused for it)."""
    import os

    env = dict(os.environ if env is None else env)
    if not env.get("SPANK_FT_HANG_TIMEOUT"):   # the common case: no watcher, no import (issue 24)
        return
    from slurm_ft.hang.watcher import start, wanted
    if not wanted(env):
        return
    try:
        start(cfg, job, env, log)
    except Exception as exc:  # the watcher is an extra: it must never keep a job from running
        log(f"hang watcher not started: {exc!r}")


def health_scope(cfg, job: NodeJob, env: dict[str, str] | None, log):
    """Which checks run here (slurm_ft.health.scope.decide): from the node's Slurm record (cached
    under ``[node_state] dir`` for ``[health] scope_cache_s``), the GPUs and partition slurmd gave
    the job, and the ``[health]`` scope. Raises ConfigError for a bad ``[health]`` table."""
    import os

    from slurm_ft.health.config import from_config
    from slurm_ft.health.scope import decide, node_facts, scontrol_lookup

    hcfg = from_config(cfg.health)
    env = os.environ if env is None else env
    facts = node_facts(cfg.node_state.dir, job.node, ttl_s=hcfg.scope_cache_s, job_gpus=len(job.gpus or ()),
                       job_partition=env.get("SLURM_JOB_PARTITION", ""), lookup=scontrol_lookup(cfg), log=log)
    return decide(facts, hcfg)


def health_gate(cfg, job: NodeJob, log, env: dict[str, str] | None = None, later: list | None = None) -> int:
    """Run the GPU health checks that apply to this node (:func:`health_scope`: none on a node
    whose Slurm record has no ``gres/gpu``, so it passes); on a failing check, journal it, drain the node with a
    ``slurm-ft: <check>: <measurement>`` reason (an admin's reason is kept), tell the daemon through
    the node mailbox (it releases the job elsewhere at once) and return 1 so Slurm does not start
    the job here. A check that could not run is a fail (see slurm_ft.health); a broken config is
    logged and lets the job start (our bug must not take a node out of service).

    ``later``: a list (the prolog run with ``detach``): a pass appends the journaling of its results
    there instead of doing it (see :func:`run`); a fail always journals here, before the drain."""
    from slurm_ft.health import run_checks, unhealthy
    from slurm_ft.health.actions import journal_results

    try:
        scope = health_scope(cfg, job, env, log)
        if not scope.checks:
            log(scope.why)
            return 0
        results = run_checks(cfg, job.node, only=list(scope.checks), expected_gpus=scope.expected_gpus)
    except SlurmFTError as exc:
        log(f"health checks not run: {exc}")
        return 0
    failing = unhealthy(results)
    if not failing and later is not None:
        # a pass: the rows are trend data, not the gate; journaled after the job has its answer
        later.append(lambda: journal_results(cfg, job.node, results, job.job_id, log))
        return 0
    try:
        journal_results(cfg, job.node, results, job.job_id, log)
    except Exception as exc:  # a bug while journaling must not let a job onto a failing GPU
        if not failing:
            raise
        report("prolog", exc, cfg=cfg, log=log)
    if not failing:
        return 0
    from slurm_ft.failover import (  # the failing path only: a passing job pays no import (issue 24)
        mailbox, policy)
    from slurm_ft.health.actions import act_on_node
    from slurm_ft.slurm import Slurm

    slurm = Slurm.from_config(cfg)
    try:
        outcome = act_on_node(cfg, job.node, results, slurm, log)
        if outcome.startswith("breaker-open"):
            # too many nodes out of service already: a cluster-wide cause (a driver update, a
            # broken rule) is likelier than this node; let the job run and say so loudly
            log(f"ALERT {outcome}; job {job.job_id} allowed to start despite {failing[0].check} failing")
            return 0
        if slurm.observe:   # [failover] mode = "observe": the drain above was only observed (slurm.py)
            log(f"observed (mode = observe): would refuse job {job.job_id} here ({failing[0].check} failed); "
                "allowed to start")
            return 0
        mailbox.post(cfg, slurm, job.node, job.job_id, job.attempt, "hardware",
                     f"{policy.HEALTH_RULE}{failing[0].check}")
    except SlurmFTError as exc:
        log(f"could not drain/report: {exc}")
    except Exception as exc:  # a bug while acting: the check still failed, the job still may not start
        report("prolog", exc, cfg=cfg, log=log)
    return 1


def main() -> None:
    """The process entry (``python -m slurm_ft.node.prolog``; the checkout's wrapper calls it after its
    ``-S`` start): run the prolog with detached journaling and exit (slurm_ft.node.boundary.exit_process)."""
    from slurm_ft.node.boundary import exit_process
    exit_process(run(detach=True))


if __name__ == "__main__":
    main()
