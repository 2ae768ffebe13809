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
  bucket into its pinned host buffer; the ``Iallreduce`` is issued once that copy's
  event has completed; when the request completes, the side stream copies the result
  back and the consumer stream waits for that copy's event.

MPI requires every rank to issue collectives in the same order, so transfers are issued
strictly in the order they were started, however their events complete.
"""

from collections import deque
from typing import Deque, Dict, List, Optional

import torch
from mpi4py import MPI

from hpcddp.buffers import numpy_view
from hpcddp.comm import Handle
from hpcddp.comm.ops import mpi_op
from hpcddp.pinned import HostBuffer

__all__ = ["Transport", "Transfer", "transfer_mode"]


def transfer_mode(tensor: torch.Tensor, cuda_aware: bool) -> str:
    """``host``, ``device`` or ``staged``: how ``tensor`` is shown to MPI."""
    if not tensor.is_cuda:
        return "host"
    # The bf16 sum is a user-defined MPI op that runs on the host, so bf16 is staged.
    if cuda_aware and tensor.dtype != torch.bfloat16:
        return "device"
    return "staged"


class Transfer:
    """One bucket's allreduce, from start to a result the consumer stream can read.

    Created by ``Transport.start``; ``Transport`` issues it, ``wait`` completes it.
    """

    __slots__ = ("transport", "buffer", "mode", "host", "ready", "handle")

    def __init__(self, transport: "Transport", buffer: torch.Tensor, mode: str,
                 host: Optional[torch.Tensor]):
        self.transport, self.buffer, self.mode, self.host = transport, buffer, mode, host
        self.ready = None    # the event after which MPI may read the buffer it is given
        self.handle: Optional[Handle] = None

    def is_ready(self) -> bool:
        return self.ready is None or self.ready.query()

    def _issue(self) -> None:
        source = self.host if self.mode == "staged" else self.buffer
        if self.mode == "device":
            buf, kind = source, None  # mpi4py reads the CUDA array interface / DLPack
        else:
            buf, kind = numpy_view(source)
        request = self.transport.comm.Iallreduce(MPI.IN_PLACE, buf, op=mpi_op("sum", kind))
        self.handle = Handle([request], keep=[buf, source])
        self.transport.collectives += 1
        self.transport._issued.append(self)

    def wait(self) -> None:
        """Block until the result is in ``buffer`` as seen by the current stream.

        .. warning:: Synchronization point: issues every earlier transfer, waits for this
           bucket's producer (or copy) event and for every rank's contribution.
        """
        if self.handle is None:
            self.transport.issue_through(self)
        self.handle.wait()
        if self.mode == "staged":
            self.transport.copy_back(self)


class Transport:
    """Starts bucket allreduces and issues them in start order.

    Args:
        comm: the gradient communicator.
        cuda_aware: MPI accepts device buffers.
        cuda: the CUDA API (``torch.cuda``); unit tests of the ordering pass a stand-in.
        pinned: page-lock the staging buffers (off only where there is no CUDA).
    """

    def __init__(self, comm, cuda_aware: bool, cuda=torch.cuda, pinned: bool = True):
        self.comm, self.cuda_aware, self.cuda, self.pinned = comm, cuda_aware, cuda, pinned
        self._unissued: Deque[Transfer] = deque()
        self._issued: List[Transfer] = []  # issued, not yet seen complete
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
        host = None
        if mode == "staged":
            host = self.host_buffer(slot).get(buffer.numel(), buffer.dtype)
        transfer = Transfer(self, buffer, mode, host)
        if mode != "host":
            produced = self.cuda.Event()
            produced.record(self.cuda.current_stream(buffer.device))
            transfer.ready = produced
        if mode == "staged":
            side = self._side_stream(buffer.device)
            side.wait_event(transfer.ready)
            with self.cuda.stream(side):
                host.copy_(buffer, non_blocking=True)
                copied = self.cuda.Event()
                copied.record(side)
            transfer.ready = copied
        self._unissued.append(transfer)
        self.advance()
        return transfer

    def advance(self) -> None:
        """Issue, in order, the transfers whose data is ready, and ``Test`` the issued
        ones so MPI makes progress; never blocks."""
        while self._unissued and self._unissued[0].is_ready():
            self._unissued.popleft()._issue()
        self._issued = [t for t in self._issued if not t.handle.test()]

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

    def issue_through(self, transfer: Transfer) -> None:
        """Issue every transfer up to and including ``transfer``, blocking on their events.

        .. warning:: Synchronization point with the producing streams.
        """
        while transfer.handle is None:
            head = self._unissued.popleft()
            if head.ready is not None:
                head.ready.synchronize()
            head._issue()

    def copy_back(self, transfer: Transfer) -> None:
        """Bring a staged result back to the device; the current stream waits for it."""
        device = transfer.buffer.device
        side = self._side_stream(device)
        with self.cuda.stream(side):
            transfer.buffer.copy_(transfer.host, non_blocking=True)
            back = self.cuda.Event()
            back.record(side)
        self.cuda.current_stream(device).wait_event(back)

    def pending(self) -> int:
        """Transfers started but not yet issued."""
        return len(self._unissued)
