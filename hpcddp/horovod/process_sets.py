"""Horovod's process sets: collectives on a subset of the ranks.

A ``ProcessSet`` is made from a list of Horovod ranks or from an mpi4py communicator,
and gets its id when ``hvd.init(process_sets=[...])`` or ``add_process_set`` sets it up
(every rank of the job takes part in both, as in Horovod). ``global_process_set`` (id 0)
holds every rank. Sets added after ``init()`` need ``HOROVOD_DYNAMIC_PROCESS_SETS=1``
(or ``init(process_sets="dynamic")``). A set's ranks are Horovod ranks, and so is every
root rank given to an operation on it.

Example::

    even = hvd.ProcessSet([0, 2])
    hvd.init(process_sets=[even])
    if even.included():
        hvd.allreduce(t, process_set=even)
"""

import os
from typing import List, Optional, Sequence, Union

__all__ = ["ProcessSet", "global_process_set", "add_process_set", "remove_process_set"]

_engine = None  # the running engine.Engine, set by basics.init()


def _require():
    from hpcddp.horovod.common import NOT_INITIALIZED

    if _engine is None:
        raise ValueError(NOT_INITIALIZED)
    return _engine


class ProcessSet:
    """A set of Horovod processes that run collectives together.

    Args:
        ranks_or_comm: Horovod ranks (any order; kept sorted) or an mpi4py communicator
            (every rank of the job passes its own, ``MPI.COMM_NULL`` where it is in none).
    """

    process_set_id: Optional[int] = None
    ranks: Optional[List[int]] = None
    mpi_comm = None

    def __init__(self, ranks_or_comm: Union[Sequence[int], "object"]):
        from mpi4py import MPI

        if isinstance(ranks_or_comm, MPI.Comm):
            self.mpi_comm = ranks_or_comm
            return
        try:
            ranks = sorted(ranks_or_comm)
        except TypeError:
            raise ValueError("ProcessSet should be initialized with a list of process ranks "
                             "or an mpi4py Comm object") from None
        if any(not isinstance(r, int) for r in ranks):
            raise ValueError("ProcessSet should be initialized with a list of process ranks "
                             "or an mpi4py Comm object")
        self.ranks = ranks

    def _invalidate(self) -> None:
        self.process_set_id = None

    def size(self) -> Optional[int]:
        """The number of processes in the set; None until it is set up."""
        if self.process_set_id is None:
            return None
        return len(_require().sets.get(self.process_set_id).ranks)

    def rank(self) -> Optional[int]:
        """This process's rank within the set; None until it is set up; ``ValueError``
        on a process outside it."""
        if self.process_set_id is None:
            return None
        found = _require().sets.get(self.process_set_id)
        if found.rank is None:
            raise ValueError("Process is not part of provided process set.")
        return found.rank

    def included(self) -> Optional[bool]:
        """Whether this process is in the set; None where its ranks are not known yet."""
        if self.ranks is None:
            return None
        return _require().world.rank in self.ranks

    def __str__(self) -> str:
        return (f"ProcessSet(process_set_id={self.process_set_id}, ranks={self.ranks}, "
                f"mpi_comm={self.mpi_comm})")

    __repr__ = __str__


global_process_set = ProcessSet([])
global_process_set.process_set_id = 0


def _ranks_of(comm) -> Optional[List[int]]:
    """The Horovod ranks of ``comm``'s processes, on a member; None elsewhere."""
    from mpi4py import MPI

    if comm == MPI.COMM_NULL:
        return None
    world_group = _require().world.comm.group
    return sorted(MPI.Group.Translate_ranks(comm.group, list(range(comm.size)), world_group))


def start(engine, sets: List[ProcessSet]) -> None:
    """Set up the global set and ``sets`` on every rank (``hvd.init``). Collective."""
    global _engine
    _engine = engine
    global_process_set.ranks = list(range(engine.world.size))
    global_process_set.process_set_id = 0
    from_comms = [ps for ps in sets if ps.ranks is None]
    if from_comms:
        # Every rank says which ranks each of its communicators holds.
        mine = [_ranks_of(ps.mpi_comm) for ps in from_comms]
        seen = engine.world.comm.allgather(mine)
        for k, ps in enumerate(from_comms):
            found = next((r[k] for r in seen if r[k] is not None), None)
            if found is None:
                raise ValueError(f"process set {k} of hvd.init(process_sets=...) is an "
                                 f"mpi4py communicator no rank is a member of")
            ps.ranks = found
    known = {tuple(global_process_set.ranks)}
    for k, ps in enumerate(sets):
        key = tuple(ps.ranks)
        if key in known:
            raise ValueError(f"Horovod could not be initialized because process_sets entry "
                             f"number {k} is a duplicate: {ps}")
        known.add(key)
        ps.process_set_id = engine.sets.add(ps.ranks)


def stop() -> None:
    global _engine
    _engine = None


def _dynamic() -> bool:
    return os.environ.get("HOROVOD_DYNAMIC_PROCESS_SETS", "0") not in ("", "0")


def add_process_set(process_set: Union[ProcessSet, Sequence[int]]) -> ProcessSet:
    """Add a set after ``init()`` (``HOROVOD_DYNAMIC_PROCESS_SETS=1``) and return it.

    .. warning:: Collective: every rank of the job calls it with the same ranks.
    """
    engine = _require()
    if not isinstance(process_set, ProcessSet):
        process_set = ProcessSet(process_set)
    if process_set.ranks is None:
        raise NotImplementedError("Dynamically adding process sets defined by an MPI "
                                  "communicator is not implemented. Please build the process "
                                  "set via a list of ranks.")
    if not _dynamic():
        raise ValueError("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow adding process sets "
                         "after Horovod initialization.")
    if engine.sets.find(process_set.ranks) is not None:
        raise ValueError(f"Attempted to add a duplicate process set: {process_set}")
    process_set.process_set_id = engine.sets.add(process_set.ranks)
    return process_set


def remove_process_set(process_set: ProcessSet) -> bool:
    """Remove a set added before; False for the global set or one not set up.

    .. warning:: Collective: every rank of the job calls it.
    """
    engine = _require()
    set_id = process_set.process_set_id
    if set_id is None or set_id == 0:
        return False
    if not _dynamic():
        raise ValueError("Set HOROVOD_DYNAMIC_PROCESS_SETS=1 to allow removing process sets "
                         "after Horovod initialization.")
    process_set._invalidate()
    return engine.sets.remove(set_id)
