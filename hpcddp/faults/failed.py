"""Which ranks MPI itself knows to be dead, where the MPI implements ULFM, the process
fault tolerance of MPI's Fault Tolerance Working Group (Open MPI 5 under
``mpirun --with-ft ulfm``).

There an operation whose peer died fails with ``MPI_ERR_PROC_FAILED`` (Open MPI's
non-blocking collectives say ``MPI_ERR_OTHER``) instead of the MPI aborting the job from
inside its transport, and ``MPIX_Comm_get_failed`` lists the processes this one knows to
be dead. hpcddp's abort names them, and their nodes, in its report
(``hpcddp.faults.abort``). Without ULFM (MPICH, Intel MPI, Open MPI without it) nothing
here calls MPI.

Inside ``hpcddp.elastic.run`` under ULFM (``armed_recovery()``), a process failure is not the
end of the job: the rank that meets it notes it (``note_failure``) and revokes every
communicator hpcddp has open, so that every survivor, wherever it waits, gets an error
and reaches the recovery too.
"""

import threading

from typing import Dict, List, Optional

from mpi4py import MPI

from hpcddp.comm import serial
from hpcddp.startup.mpi_init import ulfm_requested

__all__ = ["FAILURE_CLASSES", "failed_nodes", "failed_ranks", "has_ulfm", "is_process_failure",
           "armed_recovery", "note_failure", "recovery_armed", "revoke_all", "take_noted",
           "ulfm_enabled"]


def has_ulfm() -> bool:
    """Whether this MPI defines ULFM's error classes and ``MPIX_Comm_get_failed`` (mpi4py
    gives an undefined error class the value of ``MPI_ERR_UNKNOWN``)."""
    return MPI.ERR_PROC_FAILED != MPI.ERR_UNKNOWN and hasattr(MPI.Comm, "Get_failed")


def _known_dead(comm) -> List[int]:
    """``comm``'s ranks in ``MPIX_Comm_get_failed``; on hpcddp's MPI thread."""
    failed, group = MPI.Comm.Get_failed(comm), MPI.Comm.Get_group(comm)
    try:
        return sorted(MPI.Group.Translate_ranks(failed, list(range(failed.size)), group))
    finally:
        group.Free()
        if failed != MPI.GROUP_EMPTY:
            failed.Free()


def failed_ranks(comm, error: BaseException, timeout: float) -> List[int]:
    """The ranks of ``comm`` the MPI knows to be dead, where ``error`` is an MPI error and
    the MPI implements ULFM; else, or where asking fails or takes over ``timeout``
    seconds (hpcddp's MPI thread stuck elsewhere), none."""
    if not isinstance(error, MPI.Exception) or not has_ulfm():
        return []
    try:
        return serial.call(_known_dead, comm, timeout=timeout)
    except Exception:  # noqa: BLE001 - a report goes on without the names
        return []


def failed_nodes(ranks: List[int], hosts: List[str]) -> List[Dict]:
    """``ranks`` by node, in the order of their first rank: ``node``, ``ranks``."""
    nodes: Dict[str, List[int]] = {}
    for rank in ranks:
        nodes.setdefault(hosts[rank] if rank < len(hosts) else "?", []).append(rank)
    return [{"node": node, "ranks": found} for node, found in nodes.items()]


# MPI_ERR_PROC_FAILED, MPI_ERR_PROC_FAILED_PENDING and MPI_ERR_REVOKED; Open MPI's
# non-blocking collectives report a peer's death as MPI_ERR_OTHER, and MPI_Testall and
# MPI_Waitall over point-to-point requests (the ring's) as MPI_ERR_IN_STATUS: seen when
# a frozen node's rank was declared failed during a ring's step on 3 nodes. Taken only
# where ULFM recovers; the shrink that follows tells who is gone (maybe no one).
FAILURE_CLASSES = tuple(getattr(MPI, name) for name in (
    "ERR_PROC_FAILED", "ERR_PROC_FAILED_PENDING", "ERR_REVOKED", "ERR_OTHER",
    "ERR_IN_STATUS")
    if hasattr(MPI, name) and getattr(MPI, name) != MPI.ERR_UNKNOWN)

_recovery = {"armed": 0, "noted": None}
_recovery_lock = threading.Lock()
REVOKE_PATIENCE = 0.5  # seconds revoke_all waits for the owner to take its call


def ulfm_enabled() -> bool:
    """Whether this job runs with ULFM's fault tolerance on (``mpirun --with-ft ulfm``
    sets ``OMPI_MCA_mpi_ft_enable``): survivors of a dead rank get errors, not an abort."""
    return has_ulfm() and ulfm_requested()


def is_process_failure(error: BaseException) -> bool:
    """Whether ``error`` (or one it was raised from) is MPI saying a process failed or a
    communicator was revoked."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        if isinstance(error, MPI.Exception) and error.Get_error_class() in FAILURE_CLASSES:
            return True
        error = error.__cause__ or error.__context__
    return False


class armed_recovery:
    """While open (``hpcddp.elastic.run``'s body), a process failure is recoverable:
    ``note_failure`` takes it instead of the job ending."""

    def __enter__(self):
        with _recovery_lock:
            _recovery["armed"] += 1
        return self

    def __exit__(self, *exc):
        with _recovery_lock:
            _recovery["armed"] -= 1


def recovery_armed() -> bool:
    """Whether a recovery is armed (``hpcddp.elastic.run``'s body runs) under ULFM."""
    return bool(_recovery["armed"]) and ulfm_enabled()


def note_failure(error: BaseException) -> bool:
    """Take ``error`` as a recoverable process failure, where a recovery is armed and it
    is one: revoke every communicator (once per failure) and return True. Else False."""
    if not _recovery["armed"] or not ulfm_enabled() or not is_process_failure(error):
        return False
    with _recovery_lock:
        first = _recovery["noted"] is None
        _recovery["noted"] = _recovery["noted"] or error
    if first:
        revoke_all()
    return True


def take_noted() -> Optional[BaseException]:
    """The failure noted since the last call (None: none), forgotten."""
    with _recovery_lock:
        noted, _recovery["noted"] = _recovery["noted"], None
    return noted


def revoke_all() -> None:
    """Revoke every communicator hpcddp holds (``MPIX_Comm_revoke``, local and never
    blocking): each survivor's pending and later operations on them fail, so none
    waits for a dead rank. The owner revokes them between its calls, never beside one
    that frees or makes a communicator; where it is held longer than
    ``REVOKE_PATIENCE`` in a call that waits for the dead (``MPIX_Comm_shrink``), the
    calling thread does, under ``MPI_THREAD_MULTIPLE``."""
    def revoke(comms):
        for comm in comms:
            try:
                MPI.Comm.Revoke(comm)
            except MPI.Exception:
                pass  # freed meanwhile, or revoked already
    multiple = MPI.Query_thread() >= MPI.THREAD_MULTIPLE
    try:
        serial.call(revoke, serial.live_comms(), timeout=REVOKE_PATIENCE if multiple else None)
    except serial.OwnerBusy:
        revoke(serial.live_comms())
