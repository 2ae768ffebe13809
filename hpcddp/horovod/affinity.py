"""Where Horovod's engine runs: hpcddp's MPI thread, placed at ``hvd.init()``.

Horovod's background thread runs beside the training thread; on a rank with a core to
spare it takes that core. Where the rank's torch threads take every core it may use
(one core per rank, the common CPU layout), the engine's polling and its reductions
during backward time-share the core backward runs on: measured on 2 ranks of one core
each, an MLP's backward took 34.6 ms beside them against 21.7 ms with every reduction
after it. A nice value of 19 on that thread lets backward run first; the kernel still
runs the thread at once on a core that is idle, so where the cores wait (for a GPU, or
for MPI) nothing changes. ``HPCDDP_HOROVOD_NICE`` sets it (0-19; auto: 19 where the
torch threads take every core, else unchanged).

``HOROVOD_THREAD_AFFINITY`` (Horovod's: one core per local rank, comma separated) pins
the thread to this local rank's core.

Raising a thread's nice value needs no privilege; lowering it again does, so
``hvd.shutdown()`` leaves it.
"""

import logging
import os
from typing import Optional

from hpcddp.env import ConfigError, get_setting

__all__ = ["nice_for", "pinned_core", "place"]

log = logging.getLogger("hpcddp.horovod")

_MAX_NICE = 19


def nice_for(setting: str, torch_threads: int, cores: int) -> int:
    """The nice value to give the MPI thread, from ``HPCDDP_HOROVOD_NICE``.

    >>> nice_for("auto", 1, 1), nice_for("auto", 4, 8), nice_for("5", 4, 8)
    (19, 0, 5)
    """
    value = setting.strip().lower()
    if value in ("", "auto"):
        return _MAX_NICE if torch_threads >= cores else 0
    if value.isdigit() and int(value) <= _MAX_NICE:
        return int(value)
    raise ConfigError(f"HPCDDP_HOROVOD_NICE={setting!r} is neither auto nor a nice value "
                      f"from 0 to {_MAX_NICE}; e.g. HPCDDP_HOROVOD_NICE=0 to leave the "
                      f"thread's priority alone")


def pinned_core(setting: str, local_rank: int) -> Optional[int]:
    """This local rank's core in ``HOROVOD_THREAD_AFFINITY`` (None: unset).

    >>> pinned_core("0,8", 1), pinned_core("", 0)
    (8, None)
    """
    if not setting.strip():
        return None
    cores = [c.strip() for c in setting.split(",")]
    if not all(c.isdigit() for c in cores) or local_rank >= len(cores):
        raise ValueError(f"HOROVOD_THREAD_AFFINITY={setting!r}: give one core number per "
                         f"local rank, comma separated (local rank {local_rank} needs one)")
    return int(cores[local_rank])


def place(thread, world, environ=os.environ) -> None:
    """Give the MPI ``thread`` (a started ``threading.Thread``) its nice value and core."""
    if thread is None or thread.native_id is None:
        return  # no helper thread: the caller's threads enter MPI themselves
    nice = nice_for(get_setting("HOROVOD_NICE", environ), world.num_threads, world.cores)
    core = pinned_core(environ.get("HOROVOD_THREAD_AFFINITY", ""), world.local_rank)
    tid = thread.native_id
    if nice:
        try:
            os.setpriority(os.PRIO_PROCESS, tid, max(nice, os.getpriority(os.PRIO_PROCESS,
                                                                             tid)))
        except OSError as error:
            log.debug("hpcddp.horovod: could not renice the MPI thread: %s", error)
    if core is not None:
        try:
            os.sched_setaffinity(tid, {core})
        except OSError as error:
            raise ValueError(f"HOROVOD_THREAD_AFFINITY: core {core} of local rank "
                             f"{world.local_rank} cannot be used ({error.strerror}); give "
                             f"cores this rank may run on, "
                             f"{sorted(os.sched_getaffinity(0))}") from None
