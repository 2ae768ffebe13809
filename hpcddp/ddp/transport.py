"""How a bucket travels through ``Iallreduce``: from host memory, from device memory, or
staged through pinned host memory.

MPI knows nothing of CUDA streams. A device buffer handed to MPI before the kernels
writing it have run gives random results (mpi4py/mpi4py#60), so every CUDA bucket
starts with an event recorded on the stream that produced its gradients, and MPI sees
the bucket only once that event has completed. Waiting on the event rather than the
device keeps overlap: a bucket waits for its own gradients, never for later work.

- ``host``: a CPU bucket; the ``Iallreduce`` is issued at once on its own memory.
- ``device``: MPI is CUDA-aware; the ``Iallreduce`` gets the device buffer once the
  producer's event has completed. A completed request means the result is in device
  memory, so the consumer needs no further synchronization.
- ``staged``: MPI is not CUDA-aware (giving it a device pointer would segfault,
  mpi4py/mpi4py#115). A side stream waits for the producer's event and copies the
  bucket into its pinned host buffer, in pieces of a few MiB with one event each; each
  piece's ``Iallreduce`` is issued once its copy's event has completed; as each request
  completes, the side stream copies that piece back, and the consumer stream waits for
  the last copy's event. Pieces pipeline the copies with the reduction, which a whole
  bucket would do one after the other.

MPI requires every rank to issue collectives in the same order, so transfers are issued
strictly in the order they were started, however their events complete.
"""

from collections import deque
from typing import Deque, Dict, List, Optional

import torch
from mpi4py import MPI

from hpcddp.buffers import numpy_view, transfer_mode
from hpcddp.comm import Handle
from hpcddp.comm.ops import mpi_op
from hpcddp.pinned import HostBuffer

__all__ = ["Transport", "Transfer"]


class _Piece:
    """A contiguous run of a bucket with its own ``Iallreduce``."""

    __slots__ = ("transfer", "buffer", "host", "ready", "handle")

    def __init__(self, transfer, buffer, host):
        self.transfer, self.buffer, self.host = transfer, buffer, host
        self.ready = None  # the event after which MPI may read the memory it is given
        self.handle: Optional[Handle] = None

    def is_ready(self) -> bool:
        return self.ready is None or self.ready.query()

    def issue(self, transport: "Transport") -> None:
        source = self.buffer if self.host is None else self.host
        if self.transfer.mode == "device":
            buf, kind = source, None  # mpi4py reads the CUDA array interface / DLPack
        else:
            buf, kind = numpy_view(source)
        request = transport.comm.Iallreduce(MPI.IN_PLACE, buf, op=mpi_op("sum", kind))
        self.handle = Handle([request], keep=[buf, source])
        transport.collectives += 1
        transport._issued.append(self)


class Transfer:
    """One bucket's allreduce, from start to a result the consumer stream can read.

    Created by ``Transport.start``; ``Transport`` issues its pieces, ``wait`` completes it.
    A staged bucket larger than the transport's ``chunk_bytes`` travels in pieces, so the
    copies of one piece overlap with the reduction of its neighbours.
    """

    __slots__ = ("transport", "buffer", "mode", "host", "pieces")

    def __init__(self, transport: "Transport", buffer: torch.Tensor, mode: str,
                 host: Optional[torch.Tensor]):
        self.transport, self.buffer, self.mode, self.host = transport, buffer, mode, host
        self.pieces: List[_Piece] = []

    @property
    def ready(self):
        """The event the first piece waits for (None for a host bucket)."""
        return self.pieces[0].ready

    @ready.setter
    def ready(self, event):
        for piece in self.pieces:
            piece.ready = event

    @property
    def issued(self) -> bool:
        return all(piece.handle is not None for piece in self.pieces)

    def wait(self) -> None:
        """Block until the result is in ``buffer`` as seen by the current stream.

        .. warning:: Synchronization point: issues every earlier transfer, waits for this
           bucket's producer (or copy) events and for every rank's contribution.
        """
        for piece in self.pieces:
            if piece.handle is None:
                self.transport.issue_through(piece)
            piece.handle.wait()
            if self.mode == "staged":
                self.transport.copy_back(piece)
        if self.mode == "staged":
            self.transport.consumer_waits(self.buffer.device)


class Transport:
    """Starts bucket allreduces and issues them in start order.

    Args:
        comm: the gradient communicator.
        cuda_aware: MPI accepts device buffers.
        cuda: the CUDA API (``torch.cuda``); unit tests of the ordering pass a stand-in.
        pinned: page-lock the staging buffers (off only where there is no CUDA).
        chunk_bytes: staged buckets travel in pieces of about this size (0: whole).
    """

    def __init__(self, comm, cuda_aware: bool, cuda=torch.cuda, pinned: bool = True,
                 chunk_bytes: int = 4 << 20):
        self.comm, self.cuda_aware, self.cuda, self.pinned = comm, cuda_aware, cuda, pinned
        self.chunk_bytes = chunk_bytes
        self._unissued: Deque[_Piece] = deque()
        self._issued: List[_Piece] = []  # issued, not yet seen complete
        self._staging: Dict[int, HostBuffer] = {}
        self._side = {}  # device -> the stream that runs staging copies
        self.collectives = 0  # Iallreduce calls issued, for inspection

    def _side_stream(self, device):
        if device not in self._side:
            self._side[device] = self.cuda.Stream(device)
        return self._side[device]

    def host_buffer(self, slot: int) -> HostBuffer:
        """The pinned staging buffer of bucket ``slot``, kept across bucket rebuilds."""
        if slot not in self._staging:
            self._staging[slot] = HostBuffer(pinned=self.pinned)
        return self._staging[slot]

    def _bounds(self, buffer: torch.Tensor):
        numel = buffer.numel()
        if self.chunk_bytes <= 0:
            return [(0, numel)]
        step = max(1, self.chunk_bytes // buffer.element_size())
        return [(a, min(a + step, numel)) for a in range(0, max(numel, 1), step)]

    def start(self, buffer: torch.Tensor, slot: int, mode: Optional[str] = None) -> Transfer:
        """Begin reducing ``buffer`` (bucket ``slot``), whose gradients are all in.

        Called on the stream that produced the gradients (autograd's current stream in a
        gradient hook). Issues it at once when nothing is waiting ahead of it and its
        data is ready.

        Args:
            buffer: the bucket, contiguous.
            slot: the bucket's index, which names its staging buffer.
            mode: ``transfer_mode(buffer, cuda_aware)`` unless given.
        """
        mode = mode or transfer_mode(buffer, self.cuda_aware)
        if mode != "staged":
            transfer = Transfer(self, buffer, mode, None)
            transfer.pieces = [_Piece(transfer, buffer, None)]
            if mode == "device":
                produced = self.cuda.Event()
                produced.record(self.cuda.current_stream(buffer.device))
                transfer.ready = produced
        else:
            host = self.host_buffer(slot).get(buffer.numel(), buffer.dtype)
            transfer = Transfer(self, buffer, mode, host)
            self._stage_out(transfer)
        self._unissued.extend(transfer.pieces)
        self.advance()
        return transfer

    def _stage_out(self, transfer: Transfer) -> None:
        """Queue the copies to pinned memory on the side stream, one event per piece."""
        buffer, host = transfer.buffer, transfer.host
        produced = self.cuda.Event()
        produced.record(self.cuda.current_stream(buffer.device))
        side = self._side_stream(buffer.device)
        side.wait_event(produced)
        with self.cuda.stream(side):
            for a, b in self._bounds(buffer):
                piece = _Piece(transfer, buffer[a:b], host[a:b])
                piece.host.copy_(piece.buffer, non_blocking=True)
                piece.ready = self.cuda.Event()
                piece.ready.record(side)
                transfer.pieces.append(piece)

    def advance(self) -> None:
        """Issue, in order, the pieces whose data is ready, and ``Test`` the issued ones
        so MPI makes progress; never blocks."""
        while self._unissued and self._unissued[0].is_ready():
            self._unissued.popleft().issue(self)
        self._issued = [p for p in self._issued if not p.handle.test()]

    def issue_all(self) -> None:
        """Issue every started transfer as soon as its data is ready.

        On a GPU the gradient hooks run ahead of the kernels they queue, so at the end of
        backward most buckets are still waiting for their events. Polling the events
        while driving MPI on the issued requests lets each bucket's reduction start the
        moment its own copy is done, overlapping with the GPU still computing the rest
        and with the copies of later buckets; blocking on one event after another would
        leave MPI idle meanwhile.

        .. warning:: Synchronization point with the producing streams.
        """
        while self._unissued:
            self.advance()

    def issue_through(self, piece: _Piece) -> None:
        """Issue every piece up to and including ``piece``, blocking on their events.

        .. warning:: Synchronization point with the producing streams.
        """
        while piece.handle is None:
            head = self._unissued.popleft()
            if head.ready is not None:
                head.ready.synchronize()
            head.issue(self)

    def copy_back(self, piece: _Piece) -> None:
        """Queue the copy of a staged piece's result back to the device."""
        with self.cuda.stream(self._side_stream(piece.buffer.device)):
            piece.buffer.copy_(piece.host, non_blocking=True)

    def consumer_waits(self, device) -> None:
        """Make the current stream wait for every copy back queued so far."""
        side = self._side_stream(device)
        back = self.cuda.Event()
        back.record(side)
        self.cuda.current_stream(device).wait_event(back)

    def pending(self) -> int:
        """Transfers started but not yet issued."""
        return len(self._unissued)
