"""mpi4py's pickle-based collectives (``bcast``, ``allgather``, ``gather``, ``scatter``,
``alltoall``, ``allreduce``, ``reduce``, ``send``, ``recv``) for ``SerialComm``: each as
a nonblocking collective of the pickles' sizes and one of their bytes, every call and
every wait handed to the owner (``hpcddp.comm.handover``); ``recv`` polls a matched
probe. Each returns what mpi4py's would; the reductions combine the values in rank
order on every rank.
"""

import functools
import itertools
from array import array
from typing import Any, List, Optional

from mpi4py import MPI

from hpcddp.comm.handover import counted, polled_call
from hpcddp.comm.owner import OWNER

__all__ = ["PickledCollectives"]


def _offsets(sizes) -> List[int]:
    """Where each of ``sizes`` starts, packed one after another."""
    return [0, *itertools.accumulate(sizes)][:len(sizes)]


def _split(data: bytearray, sizes) -> List[Any]:
    return [MPI.pickle.loads(data[start:start + size]) if size else None
            for start, size in zip(_offsets(sizes), sizes)]


class PickledCollectives:
    """mpi4py's pickle-based collectives as two nonblocking collectives each (sizes, then
    bytes), every call and every wait handed to the owner. Each returns what
    mpi4py's would; the reductions combine the values in rank order on every rank."""

    @counted
    def bcast(self, obj=None, root: int = 0):
        data = bytearray(MPI.pickle.dumps(obj)) if self.rank == root else bytearray()
        size = array("q", [len(data)])
        polled_call(MPI.Intracomm.Ibcast, self, [size, MPI.INT64_T], root=root)
        if self.rank != root:
            data = bytearray(size[0])
        polled_call(MPI.Intracomm.Ibcast, self, [data, MPI.BYTE], root=root)
        return MPI.pickle.loads(data)

    @counted
    def allgather(self, obj) -> List[Any]:
        mine = MPI.pickle.dumps(obj)
        sizes = array("q", [0] * self.size)
        polled_call(MPI.Intracomm.Iallgather, self, [array("q", [len(mine)]), MPI.INT64_T],
                     [sizes, MPI.INT64_T])
        data = bytearray(sum(sizes))
        polled_call(MPI.Intracomm.Iallgatherv, self, [mine, MPI.BYTE],
                     [data, (list(sizes), _offsets(sizes)), MPI.BYTE])
        return _split(data, sizes)

    @counted
    def gather(self, obj, root: int = 0) -> Optional[List[Any]]:
        mine, is_root = MPI.pickle.dumps(obj), self.rank == root
        sizes = array("q", [0] * self.size)
        polled_call(MPI.Intracomm.Igather, self, [array("q", [len(mine)]), MPI.INT64_T],
                     [sizes, MPI.INT64_T] if is_root else None, root=root)
        data = bytearray(sum(sizes))
        polled_call(MPI.Intracomm.Igatherv, self, [mine, MPI.BYTE],
                     [data, (list(sizes), _offsets(sizes)), MPI.BYTE] if is_root else None,
                     root=root)
        return _split(data, sizes) if is_root else None

    @counted
    def scatter(self, objs=None, root: int = 0):
        is_root = self.rank == root
        pieces = [MPI.pickle.dumps(o) for o in objs] if is_root else []
        if is_root and len(pieces) != self.size:
            raise ValueError(f"scatter: expecting {self.size} items, got {len(pieces)}")
        sizes = array("q", [len(p) for p in pieces])
        size = array("q", [0])
        polled_call(MPI.Intracomm.Iscatter, self, [sizes, MPI.INT64_T] if is_root else None,
                     [size, MPI.INT64_T], root=root)
        data = bytearray(size[0])
        polled_call(MPI.Intracomm.Iscatterv, self,
                     [b"".join(pieces), (list(sizes), _offsets(sizes)), MPI.BYTE]
                     if is_root else None, [data, MPI.BYTE], root=root)
        return MPI.pickle.loads(data)

    @counted
    def alltoall(self, objs) -> List[Any]:
        pieces = [MPI.pickle.dumps(o) for o in objs]
        if len(pieces) != self.size:
            raise ValueError(f"alltoall: expecting {self.size} items, got {len(pieces)}")
        out_sizes = array("q", [len(p) for p in pieces])
        in_sizes = array("q", [0] * self.size)
        polled_call(MPI.Intracomm.Ialltoall, self, [out_sizes, MPI.INT64_T],
                     [in_sizes, MPI.INT64_T])
        data = bytearray(sum(in_sizes))
        polled_call(MPI.Intracomm.Ialltoallv, self,
                     [b"".join(pieces), (list(out_sizes), _offsets(out_sizes)), MPI.BYTE],
                     [data, (list(in_sizes), _offsets(in_sizes)), MPI.BYTE])
        return _split(data, in_sizes)

    @counted
    def allreduce(self, obj, op=MPI.SUM):
        return functools.reduce(op, self.allgather(obj))

    @counted
    def reduce(self, obj, op=MPI.SUM, root: int = 0):
        values = self.gather(obj, root=root)
        return None if values is None else functools.reduce(op, values)

    def send(self, obj, dest: int, tag: int = 0) -> None:
        polled_call(MPI.Intracomm.isend, self, obj, dest=dest, tag=tag)

    def recv(self, buf=None, source: int = MPI.ANY_SOURCE, tag: int = MPI.ANY_TAG,
             status: Optional["MPI.Status"] = None):
        """A matched probe, polled by the owner until the message is there."""
        def received():
            message = MPI.Intracomm.improbe(self, source, tag, status)
            return None if message is None else (message.recv(status=status),)
        return OWNER.until(received)[0]


