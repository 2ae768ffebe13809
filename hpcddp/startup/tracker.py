"""multiprocessing's resource tracker, started where a launcher's kill does not reach it.

A rank's ``spawn`` and ``forkserver`` queues, locks and events are POSIX semaphores
named in ``/dev/shm`` (``sem.mp-*``, three per queue), and ``multiprocessing.
shared_memory`` blocks are named files there too. The process that made one removes
its name when done; the resource tracker, a helper process multiprocessing starts at the
first one, removes whatever is left once every process holding it has ended.

A launcher ends a rank by signalling the rank's whole process group: Hydra (MPICH's and
Intel MPI's ``mpiexec``) starts each rank as the leader of a session of its own and ends
it with ``killpg``, and Open MPI's daemons do the same. The tracker, in that group, dies
in the same instant, and the names stay until the node reboots: for every rank of every
job that ends so (an abort, hpcddp's watchdog, one rank's failure), on every node.

``keep_tracker_apart()`` has the tracker started in a session of its own. The
launcher's signal passes it by; it still ends when the last process that holds it
(the rank, its workers) has ended, and removes what they left. A tracker started before
this is called stays where it is. Under Slurm, ``srun`` ends every process of a step
through its cgroup, the tracker included; Slurm's ``job_container/tmpfs`` gives each job
a ``/dev/shm`` of its own.
"""

import subprocess
import threading
from multiprocessing import resource_tracker, util

__all__ = ["keep_tracker_apart"]

_lock = threading.RLock()  # a finalizer may call in again (multiprocessing's own gh-109629)
# The trackers started here. Kept: a Popen dropped while its process runs is reaped by
# subprocess itself, and the tracker's owner waits for that PID when it restarts one.
_started = []


def _spawn_apart(path, args, passfds):
    """``multiprocessing.util.spawnv_passfds`` with the child in a session of its own."""
    proc = subprocess.Popen(args, executable=path, pass_fds=tuple(passfds), close_fds=True,
                            start_new_session=True)
    _started.append(proc)
    return proc.pid


def keep_tracker_apart() -> bool:
    """Start this process's resource tracker, when it first needs one, in a session of
    its own. Idempotent; False where this Python's multiprocessing has no such tracker
    (then nothing changes)."""
    tracker = getattr(resource_tracker, "_resource_tracker", None)
    spawn = getattr(util, "spawnv_passfds", None)
    if tracker is None or spawn is None or not hasattr(tracker, "ensure_running"):
        return False
    if getattr(tracker.ensure_running, "hpcddp_apart", False):
        return True
    original = tracker.ensure_running

    def ensure_running():
        with _lock:  # spawnv_passfds is swapped only while the tracker is started
            util.spawnv_passfds = _spawn_apart
            try:
                return original()
            finally:
                util.spawnv_passfds = spawn

    ensure_running.hpcddp_apart = True
    tracker.ensure_running = ensure_running  # what register() and getfd() call
    resource_tracker.ensure_running = ensure_running  # what forkserver calls
    return True
