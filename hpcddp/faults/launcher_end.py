"""Ending some processes of the job through its launcher, over PMIx: what the survivors
of a recovery do to the ranks they left behind that may still live (a frozen node, a
rank stuck in a call, a node cut off), so that the job can still end when the survivors
finish (the launcher waits for every process it started).

Under Open MPI 5's ``mpirun`` (PRRTE) a process of the job asks the launcher with
``PMIx_Job_control`` and ``PMIX_JOB_CTRL_KILL`` on the targets: PRRTE's daemon on each
target's node ends it (SIGTERM, then SIGKILL; a stopped process too). The PMIx library is
the one the MPI already loaded and initialised; hpcddp calls it through ``ctypes``
(mpi4py does not expose PMIx). Where the launcher does not implement job control
(Slurm's PMIx plugin, say) or the MPI is not on PMIx, ``end_processes`` says why not.

PMIx names a process by its job's namespace and its rank in ``MPI_COMM_WORLD``;
``world_ranks`` translates the ranks of a communicator there.
"""

import ctypes
import sys
from typing import List, Optional

from mpi4py import MPI

__all__ = ["end_processes", "end_stuck", "world_ranks"]

_PMIX_BOOL = 1
_PMIX_SUCCESS = 0
_KILL = b"pmix.jctrl.kill"   # PMIX_JOB_CTRL_KILL


class _Proc(ctypes.Structure):
    """``pmix_proc_t``: the namespace (PMIX_MAX_NSLEN + 1 bytes) and the rank."""
    _fields_ = [("nspace", ctypes.c_char * 256), ("rank", ctypes.c_uint32)]


def world_ranks(comm, ranks: List[int]) -> List[int]:
    """``comm``'s ``ranks`` as ranks of ``MPI_COMM_WORLD`` (PMIx's ranks)."""
    group, world = MPI.Comm.Get_group(comm), MPI.COMM_WORLD.Get_group()
    try:
        return list(MPI.Group.Translate_ranks(group, list(ranks), world))
    finally:
        group.Free()
        world.Free()


def _loaded_pmix() -> Optional[str]:
    """The path of the PMIx library this process has loaded (the MPI's), if any."""
    try:
        with open("/proc/self/maps") as maps:
            for line in maps:
                path = line.rstrip("\n").split(" ")[-1]
                if "/libpmix.so" in path:
                    return path
    except OSError:
        pass
    return None


def end_processes(ranks: List[int]) -> Optional[str]:
    """Have the launcher end the processes of ``MPI_COMM_WORLD`` ``ranks``. None when it
    took the request; else why it could not (said in the recovery's report)."""
    if not ranks:
        return None
    path = _loaded_pmix()
    if path is None:
        return "this MPI is not on PMIx"
    lib = ctypes.CDLL(path)
    if not lib.PMIx_Initialized():
        return "PMIx is not initialised in this process"
    me = _Proc()
    status = lib.PMIx_Init(ctypes.byref(me), None, ctypes.c_size_t(0))  # counted: no 2nd init
    if status != _PMIX_SUCCESS:
        return f"PMIx_Init returned {status}"
    lib.PMIx_Info_create.restype = ctypes.c_void_p
    info = ctypes.c_void_p(lib.PMIx_Info_create(ctypes.c_size_t(1)))
    try:
        yes = ctypes.c_bool(True)
        lib.PMIx_Info_load(info, _KILL, ctypes.byref(yes), ctypes.c_uint16(_PMIX_BOOL))
        targets = (_Proc * len(ranks))(*[_Proc(me.nspace, r) for r in ranks])
        results, count = ctypes.c_void_p(), ctypes.c_size_t(0)
        status = lib.PMIx_Job_control(targets, ctypes.c_size_t(len(ranks)), info,
                                      ctypes.c_size_t(1), ctypes.byref(results),
                                      ctypes.byref(count))
    finally:
        lib.PMIx_Info_free(info, ctypes.c_size_t(1))
        lib.PMIx_Finalize(None, ctypes.c_size_t(0))
    if status != _PMIX_SUCCESS:
        lib.PMIx_Error_string.restype = ctypes.c_char_p
        said = lib.PMIx_Error_string(ctypes.c_int(status)) or b""
        return f"the launcher refused PMIx job control ({said.decode() or status})"
    return None


def end_stuck(comm, rank: int, missing: List[int], what: str, reason: str) -> bool:
    """The watchdog's, at ``HPCDDP_TIMEOUT`` inside ``hpcddp.elastic.run`` under ULFM:
    have the launcher end the ranks of ``comm`` that have not reached the wait ``what``
    (alive, stuck in their own code or a call that never returns), so that the MPI
    fails them and the survivors recover, instead of the job ending. True when the
    launcher took it; False: the caller ends the job as without ULFM."""
    from hpcddp.comm import serial
    from hpcddp.faults.failed import recovery_armed
    from hpcddp.faults.report import ranks_said

    if not missing or not recovery_armed():
        return False
    why = end_processes(serial.call(world_ranks, comm, missing))
    if why is not None:
        sys.stderr.write(f"hpcddp: rank {rank}: {ranks_said(missing)} could not be ended "
                         f"through the launcher ({why}); ending the job\n")
        return False
    sys.stderr.write(f"hpcddp: rank {rank}: {ranks_said(missing)} had not reached "
                     f"{what} ({reason}); ended through the launcher, so that the others "
                     f"recover without {'it' if len(missing) == 1 else 'them'}\n")
    sys.stderr.flush()
    return True
