"""End the whole job when any rank dies of an uncaught exception.

Without this, a rank that raises exits while the others wait forever in their next
collective. ``MPI_Abort`` makes the launcher kill every rank and exit non-zero.

``import hpcddp`` installs an early form of the hook (``install_early_hook``): a rank
that raises before ``hpcddp.init()`` (an import error on one node) would otherwise leave
the others waiting in initialization. It initializes MPI only to abort, and only in a
process a launcher started as one of several ranks.
"""

import faulthandler
import io
import multiprocessing
import os
import socket
import sys
import threading
import time
import traceback

from hpcddp.faults.launcher_guard import end_launcher_later
from hpcddp.faults.report import write_report
from hpcddp.startup.mpi_init import JOB_SEGMENTS, unlink_mapped_segments

__all__ = ["abort_job", "install_abort_hook", "install_early_hook", "uninstall_abort_hook",
           "ABORT_EXIT_SECONDS", "BEFORE_ABORT"]

_installed = {}
# Called, in order, before an abort prints: whatever holds this process's output back (a
# test runner's capture, which would go down with the process) hands it over here.
BEFORE_ABORT = []
_ONE_REPORT = threading.Lock()  # taken for good by the rank's report of dead ranks

# How long MPI_Abort may take before this process ends itself. MPI_Abort can block for
# ever: a node whose link is down cannot reach the launcher, and a rank there spins in
# MPI_Abort while its peers wait, long after HPCDDP_TIMEOUT (seen on the emulated
# cluster). A process that exits lets its launcher's proxy end too.
ABORT_EXIT_SECONDS = 5.0
# How long the launcher may take to end the job after MPI_Abort (hpcddp.faults.launcher_guard).
LAUNCHER_GRACE_SECONDS = 10.0
# How long an abort waits for hpcddp's MPI thread to take it (hpcddp.comm.serial).
ABORT_LOCK_SECONDS = 2.0


def abort_job(comm, message: str, exc_info=None, code: int = 1, detail: str = "",
              grace: float = 0.0, facts=None) -> None:
    """Print ``message`` prefixed with the rank, then a traceback or ``detail`` with each
    line marked by the rank, wait ``grace`` seconds, then abort ``comm``: the launcher
    ends every rank. ``facts`` (with ``kind``) and the exception also go to the JSON
    report where ``HPCDDP_REPORT_DIR`` asks for one (``hpcddp.faults.report``)."""
    head = f"hpcddp: rank {comm.rank} of {comm.size} on {socket.gethostname()}: {message}"
    for before in list(BEFORE_ABORT):
        try:
            before()
        except Exception:  # noqa: BLE001 - nothing may keep the abort from happening
            pass
    if isinstance(sys.stderr, io.StringIO):
        # torch's init_process_group wraps sys.excepthook in one that collects what the
        # hook it wraps prints and prints it after that returns; an abort never returns.
        sys.stderr = sys.__stderr__
    try:
        sys.stdout.flush()
        text = "".join(traceback.format_exception(*exc_info)) if exc_info else detail
        sys.stderr.write(head + "\n" + "".join(f"[rank {comm.rank}] {ln}"
                                               for ln in text.splitlines(True)))
        sys.stderr.flush()
        write_report(comm.rank, comm.size, message, code, exc_info, facts)
        time.sleep(grace)
    finally:
        _exit_later(ABORT_EXIT_SECONDS)
        end_launcher_later(LAUNCHER_GRACE_SECONDS)
        # Before hpcddp.init() has removed it, MPICH's node segment is still named, and the
        # other MPIs' segments stay named until MPI_Finalize; the job is ending, so no rank
        # of this node needs a name to attach any more.
        try:
            unlink_mapped_segments(pattern=JOB_SEGMENTS)
        except Exception:  # noqa: BLE001 - nothing may keep the abort from happening
            pass
        _abort(comm, code)


def _abort(comm, code: int) -> None:
    """``MPI_Abort``, made by hpcddp's MPI thread (``hpcddp.comm.serial``).

    That thread may be inside a call that does not return (a blocking collective a lost
    rank never joins). At ``MPI_THREAD_MULTIPLE`` the abort goes in beside it after a
    while; below, entering MPI beside it is not allowed (and has crashed ranks), so this
    process ends itself and its launcher ends the others.
    """
    from mpi4py import MPI

    from hpcddp.comm import serial

    try:
        serial.call(MPI.Comm.Abort, comm, code, timeout=ABORT_LOCK_SECONDS)
    except serial.OwnerBusy:
        if MPI.Query_thread() >= MPI.THREAD_MULTIPLE:
            MPI.Comm.Abort(comm, code)
    os._exit(code)


def _exit_later(seconds: float) -> None:
    """End this process with status 1 after ``seconds`` unless it has ended before.

    faulthandler's timer runs in a C thread that needs no GIL; mpi4py holds the GIL in
    ``Abort``, so no Python thread could do it. Its traceback dump goes to /dev/null:
    the reason was printed above.
    """
    sink = open(os.devnull, "w")
    _installed["sink"] = sink  # the timer writes to its descriptor until it fires
    faulthandler.dump_traceback_later(seconds, exit=True, file=sink)


def _dead_peers(exc):
    """Where MPI knows of dead ranks (ULFM, ``hpcddp.faults.failed``) and ``exc`` is its
    error: the headline naming them and their nodes, and the report's facts; else None."""
    from hpcddp.faults.failed import failed_nodes, failed_ranks
    from hpcddp.faults.report import ranks_said

    ranks = failed_ranks(_installed["comm"], exc, timeout=ABORT_LOCK_SECONDS)
    if not ranks:
        return None
    # One report a rank: its main thread and hpcddp's MPI thread both meet the error, and
    # the first ends the process (a second waits here until then).
    _ONE_REPORT.acquire()
    nodes = failed_nodes(ranks, _installed.get("hosts") or [])
    said = "; ".join(f"{ranks_said(n['ranks'])} on node {n['node']}" for n in nodes)
    # A rank that ended the job itself (the watchdog's verdict, an exception) is dead to
    # MPI too, and its own report says why: the line says so. (Waiting for the launcher
    # to end this rank first made prterun's abort hang in 3 of 16 jobs.)
    return (f"MPI reports {said} dead ({exc.Get_error_string()}): killed, or ended by its "
            f"own abort (then its report says why); aborting all ranks",
            {"kind": "process_failed", "failed_ranks": ranks, "failed_nodes": nodes})


def install_abort_hook(comm, hosts=None) -> None:
    """Abort the whole job on an uncaught exception in any thread of this rank.

    Idempotent. ``HPCDDP_ABORT_ON_ERROR=0`` keeps Python's default behaviour (the
    caller checks the setting). ``hosts``: each rank's node, to name the nodes of ranks
    MPI reports dead.
    """
    _installed["comm"] = comm
    _installed["hosts"] = hosts
    if _installed.get("hooked"):
        return
    _installed["hooked"] = True
    previous_sys, previous_thread = sys.excepthook, threading.excepthook

    def _sys_hook(exc_type, exc, tb):
        if _installed.get("comm") is None:
            return previous_sys(exc_type, exc, tb)
        if issubclass(exc_type, KeyboardInterrupt):  # Ctrl-C: one line, not a traceback
            where = traceback.extract_tb(tb)[-1] if tb else None
            abort_job(_installed["comm"], "interrupted (Ctrl-C)" + (
                f" at {where.filename}:{where.lineno}" if where else "") + "; ending the job",
                code=130, facts={"kind": "interrupted", "where": (
                    f"{where.filename}:{where.lineno}" if where else None)})
        dead = _dead_peers(exc)
        if dead:
            abort_job(_installed["comm"], dead[0], (exc_type, exc, tb), facts=dead[1])
        abort_job(_installed["comm"], "uncaught exception; aborting all ranks "
                  "(HPCDDP_ABORT_ON_ERROR=0 turns this off)", (exc_type, exc, tb),
                  facts={"kind": "exception"})

    def _thread_hook(args):
        if _installed.get("comm") is None or args.exc_type is SystemExit:
            return previous_thread(args)
        from hpcddp.faults.failed import note_failure  # MPI's, loaded once a hook runs
        if note_failure(args.exc_value):
            return  # hpcddp.elastic recovers: every survivor now meets an error
        dead = _dead_peers(args.exc_value)
        if dead:
            abort_job(_installed["comm"], dead[0], (args.exc_type, args.exc_value,
                      args.exc_traceback), facts=dict(dead[1], thread=args.thread.name))
        abort_job(_installed["comm"], f"uncaught exception in thread {args.thread.name!r}; "
                  "aborting all ranks", (args.exc_type, args.exc_value, args.exc_traceback),
                  facts={"kind": "exception", "thread": args.thread.name})

    sys.excepthook = _sys_hook
    threading.excepthook = _thread_hook


def uninstall_abort_hook() -> None:
    """Stop aborting on uncaught exceptions (the hooks fall through to Python's)."""
    _installed["comm"] = None


def _launched_as_one_of_several() -> bool:
    """Whether a launcher started this process as one rank of several (not a worker
    process started by a rank, which inherits the launcher's variables)."""
    from hpcddp.env import detect_launcher, get_setting

    try:
        if not get_setting("ABORT_ON_ERROR"):
            return False
    except ValueError:
        pass  # a bad value is reported by init(); aborting is the safe reading here
    if multiprocessing.parent_process() is not None or os.getpid() != _installed["pid"]:
        return False
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_finalized():
        return False  # after hpcddp.finalize(): nothing left to abort
    return (detect_launcher().world_size or 1) > 1


def install_early_hook() -> None:
    """Before ``hpcddp.init()``: an uncaught exception in a rank of a multi-rank job
    aborts the whole job (``MPI_Abort`` on ``COMM_WORLD``). Idempotent; starts nothing."""
    if _installed.get("early"):
        return
    _installed["early"], _installed["pid"] = True, os.getpid()
    previous = sys.excepthook

    def _early_hook(exc_type, exc, tb):
        if _installed.get("comm") is None and _launched_as_one_of_several():
            from mpi4py import MPI  # initializes MPI if this rank never did

            # An error raised on every rank (a bad setting) reaches each rank's hook
            # within moments: a short grace lets each print its own before one aborts all.
            abort_job(MPI.COMM_WORLD, "uncaught exception before hpcddp.init() finished; "
                      "aborting all ranks (HPCDDP_ABORT_ON_ERROR=0 turns this off)",
                      (exc_type, exc, tb), grace=1.0,
                      facts={"kind": "exception", "before_init": True})
        return previous(exc_type, exc, tb)

    sys.excepthook = _early_hook
