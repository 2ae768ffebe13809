"""End the whole job when any rank dies of an uncaught exception.

Without this, a rank that raises exits while the others wait forever in their next
collective. ``MPI_Abort`` makes the launcher kill every rank and exit non-zero.
"""

import socket
import sys
import threading
import traceback

__all__ = ["abort_job", "install_abort_hook", "uninstall_abort_hook"]

_installed = {}


def abort_job(comm, message: str, exc_info=None, code: int = 1, detail: str = "") -> None:
    """Print ``message`` prefixed with the rank, then a traceback or ``detail`` with each
    line marked by the rank, then abort ``comm``: the launcher ends every rank."""
    head = f"hpcddp: rank {comm.rank} of {comm.size} on {socket.gethostname()}: {message}"
    try:
        sys.stdout.flush()
        text = "".join(traceback.format_exception(*exc_info)) if exc_info else detail
        sys.stderr.write(head + "\n" + "".join(f"[rank {comm.rank}] {ln}"
                                               for ln in text.splitlines(True)))
        sys.stderr.flush()
    finally:
        comm.Abort(code)


def install_abort_hook(comm) -> None:
    """Abort the whole job on an uncaught exception in any thread of this rank.

    Idempotent. ``HPCDDP_ABORT_ON_ERROR=0`` keeps Python's default behaviour (the
    caller checks the setting).
    """
    _installed["comm"] = comm
    if _installed.get("hooked"):
        return
    _installed["hooked"] = True
    previous_sys, previous_thread = sys.excepthook, threading.excepthook

    def _sys_hook(exc_type, exc, tb):
        if _installed.get("comm") is None:
            return previous_sys(exc_type, exc, tb)
        abort_job(_installed["comm"], "uncaught exception; aborting all ranks "
                  "(HPCDDP_ABORT_ON_ERROR=0 turns this off)", (exc_type, exc, tb))

    def _thread_hook(args):
        if _installed.get("comm") is None or args.exc_type is SystemExit:
            return previous_thread(args)
        abort_job(_installed["comm"], f"uncaught exception in thread {args.thread.name!r}; "
                  "aborting all ranks", (args.exc_type, args.exc_value, args.exc_traceback))

    sys.excepthook = _sys_hook
    threading.excepthook = _thread_hook


def uninstall_abort_hook() -> None:
    """Stop aborting on uncaught exceptions (the hooks fall through to Python's)."""
    _installed["comm"] = None
