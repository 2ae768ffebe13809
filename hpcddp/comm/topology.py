"""The library's private communicator and the node layout derived from it."""

import time
from typing import List, NamedTuple, Optional

from mpi4py import MPI

from hpcddp.comm.serial import made_live, serialize
from hpcddp.startup.mpi_init import JOB_SEGMENTS, MPICH_SEGMENT, unlink_mapped_segments

__all__ = ["MissingRanksError", "NodeLayout", "clone_comm", "forget_segment_names",
           "node_layout"]


class MissingRanksError(RuntimeError):
    """Not every rank arrived at a collective start within the time allowed."""


class NodeLayout(NamedTuple):
    """Where a rank sits: its node-local communicator and the node numbering."""

    local_comm: "MPI.Intracomm"
    local_rank: int
    local_size: int
    node_rank: int
    num_nodes: int


def clone_comm(comm=None, name="hpcddp.world", timeout: Optional[float] = None,
               what: str = "") -> "MPI.Intracomm":
    """Return a private duplicate of ``comm`` (COMM_WORLD by default).

    Library traffic on the duplicate can never match a message or collective the user
    issues on the original.

    Args:
        timeout: seconds to wait for every rank to arrive; None or 0 waits for ever.
        what: the call that duplicates, for the timeout's message.

    Raises:
        MissingRanksError: ``timeout`` ran out (the duplicate stays pending).

    .. warning:: Collective.
    """
    source = serialize(MPI.COMM_WORLD if comm is None else comm)
    if not timeout:
        dup = source.Dup()
    else:
        dup, request = source.Idup()
        deadline = time.monotonic() + timeout
        while not request.Test():
            if time.monotonic() > deadline:
                raise MissingRanksError(
                    f"hpcddp: not every one of the {source.size} ranks reached {what or name} "
                    f"within {timeout:g} s (HPCDDP_TIMEOUT). A rank may have failed before "
                    f"it (its error is printed above), or be still busy; if ranks start "
                    f"this slowly, raise HPCDDP_TIMEOUT or pass hpcddp.init(timeout=...)")
            time.sleep(0.001)
        made_live(dup)
    dup = serialize(dup)
    dup.Set_name(name)
    return dup


def node_layout(comm: "MPI.Intracomm") -> NodeLayout:
    """Compute local rank, local size, node rank and node count for ``comm``.

    Local ranks come from ``Split_type(COMM_TYPE_SHARED)``, i.e. from which processes
    share memory, never from launcher variables: inside ``sbatch``, ranks started by
    ``mpiexec`` all see ``SLURM_PROCID=0``.

    .. warning:: Collective over ``comm``.
    """
    local = comm.Split_type(MPI.COMM_TYPE_SHARED, key=comm.rank)
    local.Set_name("hpcddp.local")
    leaders = comm.Split(0 if local.rank == 0 else MPI.UNDEFINED, key=comm.rank)
    numbering = None
    if leaders != MPI.COMM_NULL:
        numbering = (leaders.rank, leaders.size)
        leaders.Free()
    node_rank, num_nodes = local.bcast(numbering, root=0)
    return NodeLayout(local, local.rank, local.size, node_rank, num_nodes)


def forget_segment_names(local: "MPI.Intracomm", maps: str = "/proc/self/maps") -> List[str]:
    """Unlink the names of MPICH's node shared-memory segment once every rank of the
    node has it mapped; return the names unlinked (on the node's first rank).

    MPICH names the segment in ``MPI_Init`` and removes the name in ``MPI_Finalize``, so
    a job that ends any other way (an abort, a killed rank, a lost node) leaves it in
    ``/dev/shm`` (2 MiB or more a node, every time). The ranks only need the mapping, not
    the name, as with an unlinked temporary file: without the name the memory is freed
    when the last rank of the node exits, however it exits. Finalize finds no name to
    remove and goes on. Only names this process maps are touched.

    A rank alone on its node (a singleton, ``python train.py``) has no peer that could
    attach to any of its segments, so it unlinks every MPI library's (``JOB_SEGMENTS``):
    Open MPI 5 leaves its 16 MiB sm segment behind after every singleton run, even one
    that calls ``MPI_Finalize``, because only its launcher's daemon removes it.

    .. warning:: Collective over ``local``.
    """
    local.Barrier()  # every rank of the node is past MPI_Init: all have mapped it
    pattern = JOB_SEGMENTS if local.size == 1 else MPICH_SEGMENT
    removed = unlink_mapped_segments(maps, pattern) if local.rank == 0 else []
    local.Barrier()
    return removed
