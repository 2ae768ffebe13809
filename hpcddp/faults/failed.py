"""Which ranks MPI itself knows to be dead, where the MPI implements ULFM, the process
fault tolerance of MPI's Fault Tolerance Working Group (Open MPI 5 under
``mpirun --with-ft ulfm``).

There an operation whose peer died fails with ``MPI_ERR_PROC_FAILED`` (Open MPI's
non-blocking collectives say ``MPI_ERR_OTHER``) instead of the MPI aborting the job from
inside its transport, and ``MPIX_Comm_get_failed`` lists the processes this one knows to
be dead. hpcddp's abort names them, and their nodes, in its report
(``hpcddp.faults.abort``). Without ULFM (MPICH, Intel MPI, Open MPI without it) nothing
here calls MPI.
"""

from typing import Dict, List

from mpi4py import MPI

from hpcddp.comm import serial

__all__ = ["has_ulfm", "failed_ranks", "failed_nodes"]


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
