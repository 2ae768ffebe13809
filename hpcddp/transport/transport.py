"""``Transport``: tensor operations on one communicator, issued in the order started.

An operation is bound to its route (host memory, device memory, or staged through
pinned memory: ``routes.py``, ``staging.py``), cut into pieces where it is elementwise,
and queued; the queue (``issue_queue.IssueQueue``, its base) issues the pieces strictly
in start order, each once its data is ready. An allreduce is carried out by the
reduction ``allreduce.policy.Reductions`` picks for the buffer. A ``Transfer`` is the
``Handle`` of one operation.
"""

from typing import Optional, Sequence

import torch
from hpcddp import timeline
from hpcddp.env import get_setting
from hpcddp.faults.fingerprint import CollectiveCheck
from hpcddp.transport.allreduce.mpi import Reduction
from hpcddp.transport.allreduce.policy import Reductions
from hpcddp.transport.issue_queue import IssueQueue
from hpcddp.transport.routes import DeviceRoute, HostRoute, Route
from hpcddp.transport.staging import StagedRoute
from hpcddp.transport.transfer import Issue, Transfer, Use

__all__ = ["Transfer", "Transport"]


class Transport(IssueQueue):
    """Starts tensor operations on ``comm`` and issues them in start order.

    Args:
        comm: the communicator; nothing else may issue collectives on it.
        cuda_aware: MPI accepts CUDA device buffers.
        cuda: the CUDA API (``torch.cuda``); unit tests of the ordering pass a stand-in.
        pinned: page-lock the staging buffers (off only where there is no CUDA).
        chunk_bytes: staged allreduces travel in pieces of about this size (0: whole).
        reduction: how an allreduce is carried out at first: ``"mpi"`` (MPI's
            ``Iallreduce``), ``"ring"`` (hpcddp's ring of point-to-point) or ``"node"``
            (node-aware), all in ``allreduce/``; ``allreduce.policy.Reductions`` picks
            per buffer.
        device_reductions: MPI's own reductions other than allreduce (``Ireduce``,
            ``Ireduce_scatter``, through ``submit(..., reduces=True)``) may be given
            device buffers; False stages them (Open MPI's libnbc reduces on the host).
        inflight_bytes: the most bytes of host memory in issued, uncompleted operations
            (device buffers are not counted); a piece that would pass it waits its turn
            until earlier ones complete (one may always be in flight). None:
            ``HPCDDP_INFLIGHT_MB``; 0: no bound.

    Example::

        transport = Transport(comm, cuda_aware=world.cuda_aware)
        transfer = transport.allreduce(bucket, slot=0)   # issued when its data is ready
        ...                                              # transport.advance() meanwhile
        transfer.wait()                                  # bucket holds the sum
    """

    def __init__(self, comm, cuda_aware: bool = False, cuda=torch.cuda, pinned: bool = True,
                 chunk_bytes: int = 4 << 20, reduction: str = "mpi",
                 device_reductions: bool = True, inflight_bytes: Optional[int] = None):
        self.comm, self.cuda_aware, self.cuda = comm, cuda_aware, cuda
        self.device_reductions = device_reductions
        super().__init__(comm, inflight_bytes)
        # HPCDDP_DEBUG=detail: every collective is compared across ranks before it is issued.
        self.check = CollectiveCheck(comm) if get_setting("DEBUG") == "detail" else None
        self.chunk_bytes = chunk_bytes
        self.reductions = Reductions(comm, cuda, reduction)
        self.host = HostRoute(cuda)
        self.device = DeviceRoute(cuda)
        self.staged = StagedRoute(cuda, pinned=pinned)

    # -- routes --------------------------------------------------------------------------

    def route_for(self, tensor: torch.Tensor, reduces: bool = False) -> Route:
        """The route for ``tensor``: host memory, device memory, or staged. ``reduces``:
        MPI's own reduction other than allreduce will combine it."""
        if not tensor.is_cuda:
            return self.host
        if reduces and not self.device_reductions:
            return self.staged
        # MPI's bf16 sum is a user-defined operation that runs on the host; the ring sums
        # bf16 with torch kernels where the data is.
        if self.cuda_aware and (tensor.dtype != torch.bfloat16 or self.reduction.name == "ring"):
            return self.device
        return self.staged

    @property
    def reduction(self) -> Reduction:
        """The reduction in use (``use_reduction`` switches it)."""
        return self.reductions.current

    def use_reduction(self, name: str) -> None:
        """Carry out allreduces started from now on by ``name`` (``"mpi"``, ``"ring"``,
        ``"node"``); those already started finish as they were issued.

        .. warning:: Collective, at the same point on every rank.
        """
        self.reductions.use(name)

    # -- operations ----------------------------------------------------------------------

    def allreduce(self, tensor: torch.Tensor, op: str = "sum", slot: Optional[int] = None,
                  route: Optional[Route] = None, name: Optional[str] = None) -> Transfer:
        """Start reducing ``tensor`` in place across the ranks; elementwise, so a staged
        tensor travels in pieces.

        Called on the stream that produced the data (autograd's current stream in a
        gradient hook).

        Args:
            tensor: any tensor; the result lands in it.
            op: sum, product, min, max, band, bor or bxor.
            slot: keeps the staging buffer across calls (a DDP bucket's index).
            route: the route, when the caller chose it once for its buffer.
            name: for messages; "allreduce of N <dtype>" by default.
        """
        route = route or self.route_for(tensor)
        bindings = route.bind(tensor, read=True, write=True, slot=slot,
                              chunk_bytes=self.chunk_bytes)
        name = name or f"allreduce ({op}) of {tensor.numel()} {_dtype(tensor)}"
        reduction = self.reductions.for_tensor(tensor, on_device=route is self.device)

        def issuer(piece):
            # Pieces of one slot are in flight together: each keeps scratch of its own.
            key = None if slot is None else (slot, piece)
            return lambda binding: reduction.start(binding, op, key)
        return self._start(route, name, [([b], issuer(k)) for k, b in enumerate(bindings)],
                           tensor, f"allreduce ({op}) of {_shape(tensor)}",
                           timeline.TORCH if slot is None else timeline.BUCKET_LANE + slot)

    def broadcast(self, tensor: torch.Tensor, root: int = 0,
                  name: Optional[str] = None) -> Transfer:
        """Start overwriting ``tensor`` with rank ``root``'s on every rank."""
        is_root = self.comm.rank == root
        name = name or f"broadcast of {tensor.numel()} {_dtype(tensor)} from rank {root}"
        return self.submit(name, [Use(tensor, read=is_root, write=not is_root)],
                           lambda b: self.comm.Ibcast(b.buf, root=root), result=tensor,
                           call=f"broadcast from rank {root} of {_shape(tensor)}")

    def submit(self, name: str, tensors: Sequence[Use], issue: Issue, result=None,
               call: Optional[str] = "", reduces: bool = False) -> Transfer:
        """Start one MPI operation on ``tensors``.

        Args:
            name: what it is, for messages.
            tensors: a ``Use`` (``reads``, ``writes``, ``updates``) of each tensor MPI
                touches.
            issue: called with one ``Binding`` per tensor once all are ready; returns
                the MPI request.
            result: what the transfer's ``wait()`` returns.
            call: what every rank must agree on for a collective (kind, shape, dtype,
                root), ``name`` when empty; None for point-to-point, which is neither
                counted nor compared.
            reduces: MPI reduces the data (``Ireduce``, ``Ireduce_scatter``): device
                tensors are staged where ``device_reductions`` is off.
        """
        bindings, route = [], self.host
        for tensor, read, write in tensors:
            route = self.route_for(tensor, reduces)
            bindings.extend(route.bind(tensor, read=read, write=write))
        return self._start(route, name, [(bindings, issue)], result,
                           name if call == "" else call)

    def _start(self, route, name, parts, result, call: Optional[str],
               lane: int = timeline.TORCH) -> Transfer:
        seq = None
        if call is not None:
            seq = self.channel.issue(name, call)
            if self.check is not None:
                self.check.verify(self.channel, seq, call)
        with self.lock:
            transfer = Transfer(self, route, name, result, lane, parts,
                                None if call is None else (self.channel, seq, call))
            self._enqueue(transfer.pieces)
            return transfer

    def close(self) -> None:
        """Free what this transport made for itself (the collective check's communicator,
        the node-aware allreduce's).

        .. warning:: Collective where ``HPCDDP_DEBUG=detail``.
        """
        super().close()
        if self.check is not None:
            self.check.close()
        self.reductions.free()


def _dtype(tensor) -> str:
    return str(tensor.dtype)[6:]


def _shape(tensor) -> str:
    return f"{_dtype(tensor)}{list(tensor.shape)}"
