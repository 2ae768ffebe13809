"""May a helper thread call MPI beside the main thread?

hpcddp starts helper threads that call MPI: the watchdog asking the other ranks,
completing futures in the background, the optional progress pump, and the loader's
prefetch with the ``mpio`` backend. The first three make every MPI call under
``hpcddp.comm.serial.LOCK``, one thread at a time, so ``MPI_THREAD_SERIALIZED`` is enough
for them. The loader's prefetch reads through h5py's MPI-IO, whose calls hpcddp cannot
hold the lock around one by one, so it needs ``MPI_THREAD_MULTIPLE``. Below the level a
helper needs, its work is done on the calling thread instead, and a warning says once
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


def helper_threads_allowed(what: str, instead: str, serialized: bool = True) -> bool:
    """Whether MPI's thread level lets a helper thread do ``what``; if not, warn once.

    Args:
        what: the helper thread's work, e.g. "completing futures in the background".
        instead: what is done instead, e.g. "get_future() waits for completion".
        serialized: the helper makes every MPI call under ``hpcddp.comm.serial.LOCK``, so
            ``MPI_THREAD_SERIALIZED`` is enough; otherwise it needs ``MPI_THREAD_MULTIPLE``.
    """
    needed = MPI.THREAD_SERIALIZED if serialized else MPI.THREAD_MULTIPLE
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
