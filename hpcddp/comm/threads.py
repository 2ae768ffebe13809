"""May a helper thread call MPI beside the main thread?

Only at ``MPI_THREAD_MULTIPLE``. hpcddp starts helper threads that call MPI for three
things: completing futures in the background, the loader's prefetch with the ``mpio``
backend, and the optional progress pump. Below MULTIPLE each of those is done on the
calling thread instead, and a warning says once what changed and how to get MULTIPLE.
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
    """True at ``MPI_THREAD_MULTIPLE``; otherwise warn once about ``what`` and return False.

    Args:
        what: the helper thread's work, e.g. "completing futures in the background".
        instead: what is done instead, e.g. "get_future() waits for completion".
    """
    if MPI.Query_thread() >= MPI.THREAD_MULTIPLE:
        return True
    if what not in _warned:
        _warned.add(what)
        warnings.warn(
            f"hpcddp: MPI runs at thread level {thread_level_name()!r}, so no helper thread "
            f"may call MPI: {what} is off and {instead}. For MPI_THREAD_MULTIPLE, leave "
            f"mpi4py's default (MPI4PY_RC_THREAD_LEVEL=multiple) and use an MPI built with "
            f"thread support", RuntimeWarning, stacklevel=3)
    return False
