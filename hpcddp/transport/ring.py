"""A ring allreduce of non-blocking point-to-point messages, combined by torch kernels.

Open MPI's non-blocking collectives reduce device buffers with host code and crash
(open-mpi/ompi#9845, #12045), while point-to-point on device buffers is what every
CUDA-aware MPI does reliably. The ring is bandwidth-optimal: a reduce-scatter, then an
allgather, each of ``size - 1`` steps in which every rank sends one chunk (1/size of
the data) to its right neighbour and receives one from its left, so each rank sends
``2 (size - 1) / size`` of the data in all. A buffer is cut into slices of at most
``slice_bytes``, each with a ring and a tag of its own, so the sums of one slice overlap
the messages of the others.

On a GPU the sums run on the stream that was current when the ring started (after the
producer's event, which the transport waited for), and a reduced chunk is sent on only
once the event recorded after its sum has completed. A ``Ring`` is progressed like an
MPI request: ``Test()`` moves every slice as far as it can without blocking, ``Wait()``
blocks.
"""

from typing import List, Optional

import numpy as np
import torch
from mpi4py import MPI

from hpcddp.comm import serial
from hpcddp.transport.routes import alias_array, slice_bounds

__all__ = ["Ring", "ring_bounds"]


def _combine(op: str, dtype: torch.dtype):
    if dtype == torch.bool:
        op = {"sum": "bor", "product": "band"}.get(op, op)
    if op == "sum":
        return lambda a, b: a.add_(b)
    if op == "product":
        return lambda a, b: a.mul_(b)
    if op == "min":
        return lambda a, b: torch.minimum(a, b, out=a)
    if op == "max":
        return lambda a, b: torch.maximum(a, b, out=a)
    if op in ("band", "bor", "bxor"):
        method = {"band": "bitwise_and_", "bor": "bitwise_or_", "bxor": "bitwise_xor_"}[op]
        return lambda a, b: getattr(a, method)(b)
    raise ValueError(f"reduction {op!r} is not supported by the ring; use sum, product, min, "
                     f"max, band, bor or bxor")


def ring_bounds(numel: int, parts: int):
    """``parts`` contiguous (start, stop) ranges covering ``numel``, sizes differing by ≤ 1."""
    base, extra = divmod(numel, parts)
    bounds, start = [], 0
    for k in range(parts):
        stop = start + base + (1 if k < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def _wire(tensor: torch.Tensor):
    """The bytes of a contiguous 1-D tensor, as MPI reads and writes them."""
    if not tensor.is_cuda:
        return alias_array(tensor, np.uint8)
    return tensor.view(torch.uint8) if tensor.numel() else torch.empty(0, dtype=torch.uint8,
                                                                         device=tensor.device)


class _SliceRing:
    """The ring of one slice: 2 (size - 1) steps, each a receive, a send and maybe a sum."""

    def __init__(self, ring: "Ring", data: torch.Tensor, scratch: torch.Tensor, tag: int):
        self.ring, self.data, self.scratch, self.tag = ring, data, scratch, tag
        self.chunks = [data[a:b] for a, b in ring_bounds(data.numel(), ring.size)]
        self.step = 0
        self.requests: Optional[List[MPI.Request]] = None
        self.summed = None  # the event after this step's sum, on a GPU

    @property
    def done(self) -> bool:
        return self.step >= 2 * (self.ring.size - 1)

    def _indices(self):
        size, rank, step = self.ring.size, self.ring.rank, self.step
        if step < size - 1:  # reduce-scatter: chunk rank-step goes right
            return (rank - step) % size, (rank - step - 1) % size
        step -= size - 1     # allgather: the reduced chunk rank+1-step goes right
        return (rank + 1 - step) % size, (rank - step) % size

    def _post(self) -> None:
        ring = self.ring
        send, receive = self._indices()
        into = self.chunks[receive]
        if self.step < ring.size - 1:
            into = self.scratch[:into.numel()]
        self.requests = [ring.comm.Irecv([_wire(into), MPI.BYTE], source=ring.left, tag=self.tag),
                         ring.comm.Isend([_wire(self.chunks[send]), MPI.BYTE], dest=ring.right,
                                         tag=self.tag)]

    def _received(self) -> None:
        ring = self.ring
        self.requests = None
        if self.step < ring.size - 1:
            target = self.chunks[self._indices()[1]]
            if ring.stream is None:
                ring.combine(target, self.scratch[:target.numel()])
            else:
                with ring.cuda.stream(ring.stream):
                    ring.combine(target, self.scratch[:target.numel()])
                    self.summed = ring.cuda.Event()
                    self.summed.record(ring.stream)
                return
        self.step += 1

    def advance(self, block: bool) -> bool:
        """Move as far as possible; with ``block``, to the end. Returns ``done``."""
        while not self.done:
            if self.summed is not None:
                if block:
                    self.summed.synchronize()
                elif not self.summed.query():
                    return False
                self.summed = None
                self.step += 1
                continue
            if self.requests is None:
                self._post()
            if block:
                serial.wait_all(self.requests)
            else:
                with serial.LOCK:
                    if not MPI.Request.Testall(self.requests):
                        return False
            self._received()
        return True


class Ring:
    """One allreduce of ``data`` in place over ``comm``, as a request.

    Args:
        comm: the communicator.
        data: a contiguous 1-D tensor (CPU or CUDA) holding this rank's values.
        op: sum, product, min, max, band, bor or bxor.
        tag: the first of ``Ring.slice_count(...)`` tags no other message on ``comm`` uses
            now.
        scratch: a tensor like ``data`` of at least one chunk per slice; received
            chunks land here before they are combined.
        slice_bytes: the size of each slice's ring.
        cuda: the CUDA API, for the sums' stream and events on a GPU.
    """

    def __init__(self, comm, data: torch.Tensor, op: str, tag: int, scratch: torch.Tensor,
                 slice_bytes: int, cuda=torch.cuda):
        self.comm, self.cuda = comm, cuda
        self.size, self.rank = comm.size, comm.rank
        self.left, self.right = (self.rank - 1) % self.size, (self.rank + 1) % self.size
        self.combine = _combine(op, data.dtype)
        self.stream = cuda.current_stream(data.device) if data.is_cuda else None
        chunk = self.chunk_elements(self.size, slice_bytes, data.element_size())
        parts = slice_bounds(data.numel(), data.element_size(), slice_bytes)
        self.slices = [_SliceRing(self, data[a:b], scratch[k * chunk:(k + 1) * chunk], tag + k)
                       for k, (a, b) in enumerate(parts)]

    @staticmethod
    def chunk_elements(size: int, slice_bytes: int, element_size: int) -> int:
        """The largest chunk of any slice: each slice's share of scratch."""
        return max(1, -(-max(1, slice_bytes // max(1, element_size)) // size))

    @staticmethod
    def slice_count(numel: int, slice_bytes: int, element_size: int) -> int:
        """How many slices (and tags) a ring of ``numel`` elements has."""
        return len(slice_bounds(numel, element_size, slice_bytes))

    @staticmethod
    def scratch_elements(numel: int, size: int, slice_bytes: int, element_size: int) -> int:
        """How many elements of scratch a ring of ``numel`` elements needs."""
        return (Ring.slice_count(numel, slice_bytes, element_size)
                * Ring.chunk_elements(size, slice_bytes, element_size))

    def Test(self) -> bool:  # noqa: N802 - the name of MPI's request method
        """Advance without blocking; True once every slice is done."""
        return all([ring.advance(block=False) for ring in self.slices])

    def Wait(self) -> None:  # noqa: N802
        """Block until every slice is done."""
        for ring in self.slices:
            ring.advance(block=True)
