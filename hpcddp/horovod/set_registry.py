"""The process sets of Horovod's engine: each set's ranks, this rank's place in it, and
its executor on a communicator of its own (``execute.py``), by set id; the global set
is id 0.

Adding and removing a set are collective over the job (``hvd.add_process_set``,
``hvd.remove_process_set``, ``hvd.init(process_sets=...)``: ``process_sets.py``).
"""

from typing import Callable, Dict, Optional, Sequence

from mpi4py import MPI

from hpcddp.comm import activity
from hpcddp.horovod.requests import ProcessSetInfo

__all__ = ["SetRegistry"]


class SetRegistry:
    """The process sets over ``world`` (hpcddp's ``World``); ``make_executor(comm,
    world, ranks)`` runs a set's operations."""

    def __init__(self, world, make_executor: Callable):
        self.world, self.rank, self.size = world, world.rank, world.size
        self.infos: Dict[int, ProcessSetInfo] = {}
        self._next = 0
        self._make_executor = make_executor

    def add(self, ranks: Sequence[int]) -> int:
        """Set up a process set of Horovod ``ranks`` and return its id. Collective."""
        ranks = sorted(ranks)
        bad = [r for r in ranks if not 0 <= r < self.size]
        if bad or len(set(ranks)) != len(ranks):
            raise ValueError(f"process set {ranks}: ranks must be distinct Horovod ranks "
                             f"0..{self.size - 1}")
        member = self.rank in ranks
        with activity.named(f"hvd: setting up process set {ranks}"):
            comm = self.world.comm.Split(0 if member else MPI.UNDEFINED, self.rank)
        set_id = self._next
        self._next += 1
        executor = self._make_executor(comm, self.world, ranks) if member else None
        self.infos[set_id] = ProcessSetInfo(set_id, ranks, ranks.index(self.rank)
                                            if member else None, executor)
        return set_id

    def remove(self, set_id: int) -> bool:
        """Remove a process set; False where there is none of that id. Collective."""
        # Every rank first: the coordinator must keep the set until no rank has an
        # operation of it left (a member may still be in one as another rank gets here).
        with activity.named("hvd: removing a process set"):
            self.world.comm.Barrier()
        info = self.infos.pop(set_id, None)
        if info is None:
            return False
        if info.executor is not None:
            info.executor.close()
        return True

    def find(self, ranks: Sequence[int]) -> Optional[int]:
        """The id of the set of ``ranks``; None where there is none."""
        ranks = sorted(ranks)
        return next((i for i, s in self.infos.items() if s.ranks == ranks), None)

    def get(self, set_id: int) -> ProcessSetInfo:
        """The set of ``set_id``; ``ValueError`` where there is none."""
        info = self.infos.get(set_id)
        if info is None:
            raise ValueError("Process set does not exist or has not been registered.")
        return info

    def close(self) -> None:
        """Free every set's executor (its communicator) and forget the sets."""
        for info in self.infos.values():
            if info.executor is not None:
                info.executor.close()
        self.infos.clear()
