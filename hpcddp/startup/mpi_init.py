"""Starting MPI without waiting forever for a rank that never will.

``MPI_Init`` waits for every process the launcher started. A rank that fails before it
ever initializes MPI (an import error on one node) leaves the others inside
``MPI_Init`` for good: Hydra and most launchers do not end a job for one process's
non-zero exit while the rest wait in PMI. ``MPI_Init`` holds Python's GIL, so no thread
of this process can intervene; a small watcher process can. It is started before MPI
(nothing of MPI is inherited), and if ``MPI_Init`` has not returned within
``HPCDDP_TIMEOUT`` it prints why and kills this rank, which makes the launcher end the
job. It is stopped the moment ``MPI_Init`` returns. Before it kills the rank it removes the
names of the MPI library's segments that the rank has mapped (MPICH's node segment and
the like, ``JOB_SEGMENTS``): ``MPI_Init`` names them, only ``MPI_Finalize`` removes the
names, and ``hpcddp.init()``, which removes MPICH's otherwise, is never reached (the
memory itself goes with the node's last rank).

A process that ``multiprocessing`` started from a rank (a DataLoader worker under
``spawn`` or ``forkserver``, which imports the training script again) never starts MPI:
``MPI_Init`` there fails deep in PMI with a stack that hides the cause. Importing hpcddp
there loads mpi4py without initializing MPI, so a guarded script's imports work; only
``hpcddp.init()`` (or ``init_process_group("hpcddp")``) there prints one line naming
the cause and the fix and exits (``refuse_in_child``), and the rank's DataLoader then
fails, which ends the job. A child forked after ``hpcddp.init()`` has MPI in its memory
already and is not refused.
"""

import os
import re
import subprocess
import sys
from typing import List

__all__ = ["JOB_SEGMENTS", "MPICH_SEGMENT", "refuse_in_child", "start_mpi",
           "unlink_mapped_segments"]

# MPICH's node segment, made in MPI_Init and named until MPI_Finalize unlinks it:
# /dev/shm/mpich_shm_<hash of the job>_<node>. Its other segments are unlinked once attached.
MPICH_SEGMENT = r"^/dev/shm/mpich_shm_[0-9a-f]+_[0-9]+$"
# Every name an MPI library gives a job's shared memory in /dev/shm and removes only in
# MPI_Finalize (or, for Open MPI, its daemon at the job's end): MPICH's node segment, Open
# MPI's sm segment (sm_segment.<host>.<uid>.<job>.<local rank>), UCX's POSIX segments,
# Intel MPI's. A process that is ending may remove them all: no rank of an ending job
# attaches any more.
JOB_SEGMENTS = (r"^/dev/shm/(mpich_shm_[0-9a-f]+_[0-9]+|sm_segment\.[^/]+|"
                r"ucx_shm_posix_[0-9a-f]+|Intel_MPI_[^/]+)$")

_WATCHER = r"""
import os, re, signal, sys, time
parent, seconds, message, segment = int(sys.argv[1]), float(sys.argv[2]), sys.argv[3], sys.argv[4]
deadline = time.monotonic() + seconds
while time.monotonic() < deadline:
    time.sleep(min(0.5, max(0.0, deadline - time.monotonic())))
    if os.getppid() != parent:
        sys.exit(0)
sys.stderr.write(message)
sys.stderr.flush()
try:
    with open(f"/proc/{parent}/maps") as maps:
        names = {line.split()[-1] for line in maps if "/dev/shm/" in line}
except OSError:
    names = set()
for name in names:
    if re.match(segment, name):
        try:
            os.unlink(name)
        except OSError:
            pass
os.kill(parent, signal.SIGKILL)
"""


def unlink_mapped_segments(maps: str = "/proc/self/maps",
                           pattern: str = MPICH_SEGMENT) -> List[str]:
    """Unlink the names of the segments in /dev/shm that this process maps and that match
    ``pattern`` (MPICH's node segment unless told); return them.

    The mapping stays: the memory goes with the node's last process, however it ends.
    A rank of the same node still in ``MPI_Init`` can no longer attach, so this is for a
    node whose ranks have all mapped it, or a job that is ending.
    """
    try:
        with open(maps) as mapped:
            names = {line.split()[-1] for line in mapped if "/dev/shm/" in line}
    except OSError:
        return []
    removed = []
    for name in sorted(n for n in names if re.match(pattern, n)):
        try:
            os.unlink(name)
            removed.append(name)
        except OSError:
            pass  # gone already, or not ours to remove
    return removed


def _launched_rank() -> str:
    for var in ("PMI_RANK", "OMPI_COMM_WORLD_RANK", "PMIX_RANK", "SLURM_PROCID"):
        if var in os.environ:
            return f"rank {os.environ[var]} ({var})"
    return "this rank"


def _child_of_rank() -> bool:
    """Whether this process is a ``multiprocessing`` child of a launched rank."""
    import multiprocessing

    parent = multiprocessing.parent_process()
    # While a spawn/forkserver child imports the parent's main module again, it has no
    # parent_process() yet; it is "inheriting" (what multiprocessing itself checks).
    inheriting = getattr(multiprocessing.current_process(), "_inheriting", False)
    return (parent is not None or inheriting) and _launched_rank() != "this rank"


def refuse_in_child() -> None:
    """Exit with one line on stderr if this process is a ``multiprocessing`` child of
    a launched rank that has not started MPI (``hpcddp.init()`` would start it now)."""
    if not _child_of_rank():
        return
    mpi = sys.modules.get("mpi4py.MPI")
    if mpi is not None and mpi.Is_initialized():
        return  # forked after init(): the rank's MPI is in its memory
    rank = _launched_rank()
    sys.stderr.write(
        f"hpcddp: hpcddp.init() or init_process_group(\"hpcddp\") ran in a process that "
        f"multiprocessing started from {rank} "
        f"(pid {os.getpid()}): a child process must not join the MPI job. A 'spawn' or "
        f"'forkserver' child (a DataLoader worker) imports the training script again; put "
        f"the script's training code under `if __name__ == \"__main__\":`.\n")
    sys.stderr.flush()
    os._exit(1)


def mca_flag(name: str, environ=os.environ) -> bool:
    """Whether the Open MPI setting ``name`` (an ``OMPI_MCA_*`` variable) is on."""
    return environ.get(name, "").strip().lower() in ("1", "true", "yes", "on", "enabled")


def ulfm_requested(environ=os.environ) -> bool:
    """Whether the launcher turned ULFM's fault tolerance on (``mpirun --with-ft ulfm``
    sets ``OMPI_MCA_mpi_ft_enable``)."""
    return mca_flag("OMPI_MCA_mpi_ft_enable", environ)


def detector_needs_progress(environ=os.environ) -> bool:
    """Whether Open MPI's failure detector runs in the progress engine (on, and not on
    a thread of its own), so needs ``hpcddp.startup.heartbeats``."""
    return mca_flag("OMPI_MCA_mpi_ft_detector", environ) and \
        not mca_flag("OMPI_MCA_mpi_ft_detector_thread", environ)


def finalize_without_the_dead(environ=os.environ) -> None:
    """Under ULFM (``mpirun --with-ft ulfm`` sets ``OMPI_MCA_mpi_ft_enable``), no barrier
    at the start of ``MPI_Finalize`` (``OMPI_MCA_async_mpi_finalize=1``, unless set):
    Open MPI 5.0's waits there for every process of the job, the dead ones included,
    after a recovery (open-mpi/ompi#11404; seen here in 1 of 3 jobs that lost two ranks).
    hpcddp's shutdown has every live rank leave together already (the watchdog's leaving
    handshake), so the barrier adds nothing."""
    if ulfm_requested(environ):
        environ.setdefault("OMPI_MCA_async_mpi_finalize", "1")


def detect_silent_ranks(environ=os.environ) -> None:
    """Under ULFM, Open MPI's failure detector (``OMPI_MCA_mpi_ft_detector``) declares a
    process failed once its heartbeat has not come for ``HPCDDP_ELASTIC_DETECT``
    seconds, unless the job sets the detector itself: without it a frozen or cut-off
    process is never failed, and the survivors' next collective waits on it until
    ``HPCDDP_TIMEOUT`` ends the job. Open MPI asks that the timeout be over three
    heartbeat periods; the period is a fifth of it. The detector runs in MPI's progress
    engine, which ``hpcddp.startup.heartbeats`` keeps turning; that needs
    ``MPI_THREAD_MULTIPLE``, so at a lower level (``MPI4PY_RC_THREAD_LEVEL``) it stays
    off."""
    if not ulfm_requested(environ) or "OMPI_MCA_mpi_ft_detector" in environ:
        return
    from hpcddp.env import get_setting

    seconds = get_setting("ELASTIC_DETECT", environ=environ)
    level = environ.get("MPI4PY_RC_THREAD_LEVEL", "multiple").strip().lower()
    if not seconds or level != "multiple":
        return
    environ["OMPI_MCA_mpi_ft_detector"] = "true"
    environ.setdefault("OMPI_MCA_mpi_ft_detector_thread", "false")
    environ.setdefault("OMPI_MCA_mpi_ft_detector_timeout", f"{seconds:g}")
    environ.setdefault("OMPI_MCA_mpi_ft_detector_period", f"{seconds / 5:g}")


def _after_init() -> None:
    from hpcddp.startup import heartbeats

    if detector_needs_progress():
        period = float(os.environ.get("OMPI_MCA_mpi_ft_detector_period", "3"))
        heartbeats.pump(period / 10)


def start_mpi(timeout: float) -> None:
    """Import ``mpi4py.MPI`` (``MPI_Init``), ending this rank if that takes longer than
    ``timeout`` seconds in a job of several ranks. Does nothing once MPI is started; in
    a child process of a rank it loads mpi4py without starting MPI (``init()`` there
    refuses to run: ``refuse_in_child``).
    """
    if "mpi4py.MPI" in sys.modules:
        return
    if _child_of_rank():
        import mpi4py

        mpi4py.rc.initialize = False
        mpi4py.rc.finalize = False
        from mpi4py import MPI  # noqa: F401
        return
    from hpcddp.env import detect_launcher
    from hpcddp.env.netmod import apply_netmod

    apply_netmod()  # the mpich wheel's network module, before MPI_Init reads it
    finalize_without_the_dead()
    detect_silent_ranks()

    if not timeout or (detect_launcher().world_size or 1) < 2:
        from mpi4py import MPI  # noqa: F401
        _after_init()
        return
    message = (f"hpcddp: {_launched_rank()}: MPI_Init did not return within {timeout:g} s "
               f"(HPCDDP_TIMEOUT): another rank of this job has not started MPI. It may "
               f"have failed before (its error is printed above); ending the job.\n")
    watcher = subprocess.Popen([sys.executable, "-S", "-c", _WATCHER, str(os.getpid()),
                                str(timeout), message, JOB_SEGMENTS],
                               stdin=subprocess.DEVNULL)
    try:
        from mpi4py import MPI  # noqa: F401
    finally:
        watcher.kill()
        watcher.wait()
    _after_init()
