"""Starting MPI without waiting forever for a rank that never will.

``MPI_Init`` waits for every process the launcher started. A rank that fails before it
ever initializes MPI (an import error on one node) leaves the others inside
``MPI_Init`` for good: Hydra and most launchers do not end a job for one process's
non-zero exit while the rest wait in PMI. ``MPI_Init`` holds Python's GIL, so no thread
of this process can intervene; a small watcher process can. It is started before MPI
(nothing of MPI is inherited), and if ``MPI_Init`` has not returned within
``HPCDDP_TIMEOUT`` it prints why and kills this rank, which makes the launcher end the
job. It is stopped the moment ``MPI_Init`` returns.
"""

import os
import subprocess
import sys

__all__ = ["start_mpi"]

_WATCHER = r"""
import os, signal, sys, time
parent, seconds, message = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3]
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    if os.getppid() != parent:
        sys.exit(0)
sys.stderr.write(message)
sys.stderr.flush()
os.kill(parent, signal.SIGKILL)
"""


def _launched_rank() -> str:
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return f"rank {os.environ[var]} ({var})"
    return "this rank"


def start_mpi(timeout: float) -> None:
    """Import ``mpi4py.MPI`` (``MPI_Init``), ending this rank if that takes longer than
    ``timeout`` seconds in a job of several ranks. Does nothing once MPI is started.
    """
    if "mpi4py.MPI" in sys.modules:
        return
    from hpcddp.env import detect_launcher

    if not timeout or (detect_launcher().world_size or 1) < 2:
        from mpi4py import MPI  # noqa: F401
        return
    message = (f"hpcddp: {_launched_rank()}: MPI_Init did not return within {timeout:g} s "
               f"(HPCDDP_TIMEOUT): another rank of this job has not started MPI. It may "
               f"have failed before (its error is printed above); ending the job.\n")
    watcher = subprocess.Popen([sys.executable, "-S", "-c", _WATCHER, str(os.getpid()),
                                str(timeout), message], stdin=subprocess.DEVNULL)
    try:
        from mpi4py import MPI  # noqa: F401
    finally:
        watcher.kill()
        watcher.wait()
