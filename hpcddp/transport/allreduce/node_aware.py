"""A node-aware allreduce: within the node, across nodes, within the node again.

With several ranks on each node, a flat allreduce sends data between nodes from every
rank it pairs across them: a flat ring of ``p`` ranks on ``n`` nodes makes each node send
``2 (p - 1) / p`` of the buffer over its link, recursive doubling a whole buffer per rank.
Here the node's ranks first reduce-scatter the buffer among themselves (shared memory),
each rank then allreduces its ``1/k`` share with the ranks of the same local rank on the
other nodes, and an allgather inside the node gives every rank the whole result. Each
node sends ``2 (n - 1) / n`` of the buffer over its link, the least any allreduce can,
and every rank of the node carries a part of it.

Every stage is one of MPI's non-blocking collectives on a communicator of its own. A
buffer is cut into slices (4 MiB by default) that move through the stages one after the
other, so the link carries one slice while shared memory reduces the next. Slices move
through the stages in the order they were started, on every rank: MPI matches
collectives on a communicator by the order they are issued, so a later slice never
enters a stage before an earlier one has. Unsliced, the link idles while shared memory
reduces; slices of 1-4 MiB keep it busiest (docs/benchmarks.md#across-emulated-nodes).
"""

from typing import List, Optional

import numpy as np
import torch
from mpi4py import MPI

from hpcddp.comm.backoff import Backoff, poll_until
from hpcddp.comm.ops import mpi_op
from hpcddp.comm.topology import node_layout
from hpcddp.transport.allreduce.mpi import Reduction
from hpcddp.transport.allreduce.ring import ring_bounds

__all__ = ["NodeAwareAllreduce", "NodeGroups"]


class NodeGroups:
    """The communicators the node-aware allreduce runs on. Collective to construct.

    Attributes:
        local: the ranks of this node (shared memory; ``hpcddp.comm.topology``).
        cross: the ranks of the same local rank on every node.
        uniform: every node holds the same number of ranks.
    """

    def __init__(self, comm):
        self.local = node_layout(comm).local_comm
        self.cross = comm.Split(color=self.local.rank, key=comm.rank)
        self.uniform = len(set(comm.allgather(self.local.size))) == 1

    def why_not(self) -> Optional[str]:
        """Why the node-aware allreduce cannot run on these groups, or None."""
        return None if self.uniform else "the nodes hold different numbers of ranks"

    def free(self) -> None:
        self.local.Free()
        self.cross.Free()


def _empty(buf, count: int):
    if isinstance(buf, torch.Tensor):
        return torch.empty(count, dtype=buf.dtype, device=buf.device)
    return np.empty(count, dtype=buf.dtype)


class _Chain:
    """One slice's three stages."""

    def __init__(self, owner: "NodeAwareAllreduce", buf, mop):
        self.owner = owner
        local_size = owner.local_rs.size
        bounds = ring_bounds(len(buf), local_size)
        counts = [b - a for a, b in bounds]
        displs = [a for a, _ in bounds]
        share = _empty(buf, counts[owner.local_rs.rank])
        self.stages = [
            lambda: owner.local_rs.Ireduce_scatter(buf, share, recvcounts=counts, op=mop),
            lambda: owner.cross.Iallreduce(MPI.IN_PLACE, share, op=mop),
            lambda: owner.local_ag.Iallgatherv(share, [buf, (counts, displs)]),
        ]
        self.share = share  # kept alive until the last stage completes
        self.issued = 0
        self.request = None

    @property
    def finished(self) -> bool:
        return self.issued == len(self.stages) and self.request is None

    def advance(self, limit: int) -> None:
        """Issue the next stages whose predecessors have completed, up to stage ``limit``."""
        while True:
            if self.request is not None:
                if not self.request.Test():
                    return
                self.request = None
            if self.issued >= min(limit, len(self.stages)):
                return
            self.request = self.stages[self.issued]()
            self.issued += 1



class _Slices:
    """A buffer's slices, each a ``_Chain``; a request (``Test``/``Wait``)."""

    def __init__(self, owner: "NodeAwareAllreduce", chains: List[_Chain]):
        self.owner, self.chains = owner, chains

    def Test(self) -> bool:  # noqa: N802 - the name of MPI's request method
        self.owner.advance()
        return all(chain.finished for chain in self.chains)

    def Wait(self) -> None:  # noqa: N802
        # Each poll also issues the next stage of a slice whose stage completed, so the
        # pauses stop short (0.1 ms): no core held spinning, and the pipeline kept fed.
        poll_until(self.Test, Backoff(cap=1e-4))


class NodeAwareAllreduce(Reduction):
    """The node-aware allreduce on ``comm`` (see the module's description). Collective
    to construct.

    Raises:
        ValueError: the layout cannot carry it (``NodeLayout.why_not``).
    """

    name = "node"

    def __init__(self, comm, cuda=torch.cuda, groups: Optional[NodeGroups] = None,
                 slice_bytes: int = 4 << 20):
        super().__init__(comm, cuda)
        self.slice_bytes = slice_bytes
        groups = groups or NodeGroups(comm)
        why = groups.why_not()
        if why:
            groups.free()
            raise ValueError(f"the node-aware allreduce cannot run here: {why}; "
                             f"use HPCDDP_REDUCE=mpi or ring")
        self.local_rs, self.cross = groups.local, groups.cross
        self.local_ag = groups.local.Dup()
        self._chains: List[_Chain] = []

    def advance(self) -> None:
        """Move every buffer in flight on, earlier buffers first: a buffer issues a stage
        only once every earlier buffer has issued it."""
        ceiling = 3
        for chain in self._chains:
            chain.advance(ceiling)
            ceiling = chain.issued
        self._chains = [c for c in self._chains if not c.finished]

    def free(self) -> None:
        """Free the communicators. Collective; nothing may be in flight."""
        for comm in (self.local_rs, self.cross, self.local_ag):
            comm.Free()

    def start(self, binding, op, slot=None):
        buf, mop = binding.buf, mpi_op(op, binding.kind)
        step = max(1, self.slice_bytes // binding.memory.element_size())
        chains = [_Chain(self, buf[k:k + step], mop) for k in range(0, max(len(buf), 1), step)]
        self._chains.extend(chains)
        self.advance()
        return _Slices(self, chains)
