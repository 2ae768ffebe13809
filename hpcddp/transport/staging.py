"""CUDA tensors for an MPI that is not CUDA-aware: staged through pinned host memory.

Giving such an MPI a device pointer would segfault (mpi4py/mpi4py#115). A side stream
waits for the producer's event and copies the tensor into pinned host memory, in pieces
of a few MiB with one event each, so each piece's MPI operation is issued once its own
copy has completed; as each completes, the side stream copies that piece back, and the
consumer waits for the last copy's event. Pieces pipeline the copies with the
reduction, which a whole tensor would do one after the other.

Pinning costs far more than the copy it enables, so staging memory is pinned once and
only grows: one buffer per slot (a DDP bucket keeps its own across steps and rebuilds),
and a few spare buffers lent to one-off operations (torch.distributed calls).
"""

from typing import Dict, List

import torch

from hpcddp.transport.pinned import HostBuffer
from hpcddp.transport.routes import Binding, Route, host_array, slice_bounds

__all__ = ["StagedRoute"]

_SPARES = 4  # spare buffers kept for one-off operations; more are dropped once returned


class StagedRoute(Route):
    """Device tensors copied to pinned host memory on a side stream and back.

    Args:
        cuda: the CUDA API.
        pinned: page-lock the staging memory (off only where there is no CUDA).
    """

    name = "staged"

    def __init__(self, cuda=torch.cuda, pinned: bool = True):
        super().__init__(cuda)
        self.pinned = pinned
        self._slots: Dict[int, HostBuffer] = {}
        self._spares: List[HostBuffer] = []
        self._side = {}  # device -> the stream that runs staging copies

    def side_stream(self, device):
        if device not in self._side:
            self._side[device] = self.cuda.Stream(device)
        return self._side[device]

    def host_buffer(self, slot: int) -> HostBuffer:
        """The staging buffer of ``slot``, kept for as long as this route lives."""
        if slot not in self._slots:
            self._slots[slot] = HostBuffer(pinned=self.pinned)
        return self._slots[slot]

    @property
    def staged_bytes(self) -> int:
        """Pinned bytes held for slots."""
        return sum(buffer.capacity for buffer in self._slots.values())

    @property
    def spares(self) -> int:
        """Spare buffers waiting for the next one-off operation."""
        return len(self._spares)

    def _borrow(self):
        buffer = self._spares.pop() if self._spares else HostBuffer(pinned=self.pinned)

        def give_back():
            if len(self._spares) < _SPARES:
                self._spares.append(buffer)
        return buffer, give_back

    def bind(self, tensor, read=True, write=True, slot=None, chunk_bytes=0):
        tensor = tensor.detach()
        work = tensor if tensor.is_contiguous() else tensor.contiguous()
        if slot is None:
            buffer, release = self._borrow()
        else:
            buffer, release = self.host_buffer(slot), None
        host = buffer.get(work.numel(), work.dtype)
        produced = self.cuda.Event()
        produced.record(self.cuda.current_stream(work.device))
        side = self.side_stream(work.device)
        side.wait_event(produced)
        bindings = []
        # Every piece gets a side-stream event even when MPI only writes: the host buffer
        # may still be read by the copy back of the previous operation on this slot.
        flat = work.view(-1)  # the host buffer is flat: pieces are flat ranges
        with self.cuda.stream(side):
            for a, b in slice_bounds(work.numel(), work.element_size(), chunk_bytes):
                part, mirror = flat[a:b], host[a:b]
                if read:
                    mirror.copy_(part, non_blocking=True)
                ready = self.cuda.Event()
                ready.record(side)
                finish = self._copy_back(part, mirror, side) if write else None
                bindings.append(Binding(part, *host_array(mirror), host=mirror, ready=ready,
                                        finish=finish))
        if write and work is not tensor:
            bindings[-1].finish = self._then_into(bindings[-1].finish, tensor, work, side)
        bindings[-1].release = release
        return bindings

    def _copy_back(self, part, mirror, side):
        def finish():
            with self.cuda.stream(side):
                part.copy_(mirror, non_blocking=True)
            return side
        return finish

    def _then_into(self, finish, tensor, work, side):
        def finish_and_scatter():
            finish()
            with self.cuda.stream(side):
                tensor.copy_(work)
            return side
        return finish_and_scatter
