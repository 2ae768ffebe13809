"""May a helper thread call MPI beside the main thread?

hpcddp starts helper threads that need MPI: the watchdog asking the other ranks,
completing futures in the background, the optional progress pump, and the loader's
prefetch with the ``mpio`` backend. Each hands its calls to hpcddp's MPI thread
(``hpcddp.comm.owner``), the one thread that enters MPI, and that thread exists from
``MPI_THREAD_SERIALIZED`` on. Below it (single, funneled) only the main thread may call
MPI: a helper's work is done on the calling thread instead, and a warning says once
what changed and how to get the level.
"""

import warnings

from mpi4py import MPI

__all__ = ["LEVELS", "helper_threads_allowed", "thread_level_name"]

LEVELS = {MPI.THREAD_SINGLE: "single", MPI.THREAD_FUNNELED: "funneled",
          MPI.THREAD_SERIALIZED: "serialized", MPI.THREAD_MULTIPLE: "multiple"}
_warned = set()


def thread_level_name() -> str:
    """MPI's thread level in this process, as a word."""
    level = MPI.Query_thread()
    return LEVELS.get(level, str(level))


def helper_threads_allowed(what: str, instead: str) -> bool:
    """Whether MPI's thread level lets a helper thread do ``what`` (through hpcddp's MPI
    thread: ``MPI_THREAD_SERIALIZED``); if not, warn once.

    Args:
        what: the helper thread's work, e.g. "completing futures in the background".
        instead: what is done instead, e.g. "get_future() waits for completion".
    """
    needed = MPI.THREAD_SERIALIZED
    if MPI.Query_thread() >= needed:
        return True
    if what not in _warned:
        _warned.add(what)
        warnings.warn(
            f"hpcddp: MPI runs at thread level {thread_level_name()!r}, below what a helper "
            f"thread needs to call MPI (MPI_THREAD_{LEVELS[needed].upper()}): {what} is off "
            f"and {instead}. Leave mpi4py's default (MPI4PY_RC_THREAD_LEVEL=multiple) and "
            f"use an MPI built with thread support",
            RuntimeWarning, stacklevel=3)
    return False
