"""A ring allreduce of non-blocking point-to-point messages, combined by torch kernels.

Open MPI's non-blocking collectives reduce device buffers with host code and crash
(open-mpi/ompi#9845, #12045), while point-to-point on device buffers is what every
CUDA-aware MPI does reliably. The ring is bandwidth-optimal: a reduce-scatter, then an
allgather, each of ``size - 1`` steps in which every rank sends one chunk (1/size of
the data) to its right neighbour and receives one from its left, so each rank sends
``2 (size - 1) / size`` of the data in all. A buffer is cut into slices of at most
``slice_bytes``, each with a ring and a tag of its own, so the sums of one slice overlap
the messages of the others; the slices of all rings share ``POOL_CHUNKS`` chunks of
scratch (``ScratchPool``).

On a GPU the sums run on the stream that was current when the ring started (after the
producer's event, which the transport waited for), and a reduced chunk is sent on only
once the event recorded after its sum has completed. A ``Ring`` is progressed like an
MPI request: ``Test()`` moves every slice as far as it can without blocking, ``Wait()``
blocks.
"""

from collections import deque
from typing import Deque, Dict, List, Optional

import numpy as np
import torch
from mpi4py import MPI

from hpcddp.comm import serial
from hpcddp.transport.allreduce.mpi import Reduction
from hpcddp.transport.routes import alias_array, slice_bounds

__all__ = ["POOL_CHUNKS", "Ring", "RingAllreduce", "ScratchPool", "ring_bounds"]

# Slices in flight at once over all the rings of a communicator (per dtype and device):
# each holds one chunk of scratch (1/size of a slice). Scratch of every slice of every
# bucket in flight held 1/size of the gradients: half of them at two ranks.
POOL_CHUNKS = 16


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


class _Circle:
    """What every slice of one ring shares: the communicator, the neighbours, the sum and
    the sums' stream. The slices hold this, not their ``Ring``: a slice pointing back at
    the ring that lists it would be a reference cycle, keeping the bucket and its scratch
    alive until Python's cyclic collector ran."""

    __slots__ = ("comm", "cuda", "size", "rank", "left", "right", "combine", "stream")

    def __init__(self, comm, cuda, combine, stream):
        self.comm, self.cuda, self.combine, self.stream = comm, cuda, combine, stream
        self.size, self.rank = comm.size, comm.rank
        self.left, self.right = (self.rank - 1) % self.size, (self.rank + 1) % self.size


class _SliceRing:
    """The ring of one slice: 2 (size - 1) steps, each a receive, a send and maybe a sum."""

    def __init__(self, ring: _Circle, data: torch.Tensor, scratch: torch.Tensor, tag: int):
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
            elif not serial.call(MPI.Request.Testall, self.requests):
                return False
            self._received()
        return True


class ScratchPool:
    """Scratch shared by the rings of one communicator, dtype and device: at most
    ``chunks`` chunks of ``chunk`` elements, whatever the model's size.

    A slice runs while it holds a chunk (received chunks land there before they are
    summed) and gives it back when done. Chunks go to the rings in the order the rings
    started, the slices of each in order, and every rank starts rings in the same order
    with the same number of chunks: so on every rank the slices started are the first
    ones of one common order, the earliest slice not done on a rank runs there, and it
    runs on every rank where it is not done. It can always finish; no cycle of ranks
    waiting for each other's chunks can form.
    """

    def __init__(self, chunk: int, dtype: torch.dtype, device, chunks: int = POOL_CHUNKS):
        self.chunk, self.dtype, self.device, self.chunks = chunk, dtype, device, chunks
        self._free: List[torch.Tensor] = []
        self._made = 0
        self._queue: Deque["Ring"] = deque()  # rings with slices waiting, oldest first

    @property
    def made(self) -> int:
        """Chunks made so far (never more than ``chunks``)."""
        return self._made

    def line_up(self, ring: "Ring") -> None:
        self._queue.append(ring)
        self._serve()

    def give_back(self, chunk: torch.Tensor) -> None:
        self._free.append(chunk)
        self._serve()

    def _take(self) -> Optional[torch.Tensor]:
        if self._free:
            return self._free.pop()
        if self._made < self.chunks:
            self._made += 1
            return torch.empty(self.chunk, dtype=self.dtype, device=self.device)
        return None

    def _serve(self) -> None:
        while self._queue:
            ring = self._queue[0]
            if not ring.waiting:
                self._queue.popleft()
                continue
            chunk = self._take()
            if chunk is None:
                return
            ring.start_next(chunk)


class Ring:
    """One allreduce of ``data`` in place over ``comm``, as a request.

    Args:
        comm: the communicator.
        data: a contiguous 1-D tensor (CPU or CUDA) holding this rank's values.
        op: sum, product, min, max, band, bor or bxor.
        tag: the first of ``Ring.slice_count(...)`` tags no other message on ``comm`` uses
            now.
        pool: the ``ScratchPool`` of ``comm`` for ``data``'s dtype and device, its chunk
            ``Ring.chunk_elements(...)`` elements.
        slice_bytes: the size of each slice's ring.
        cuda: the CUDA API, for the sums' stream and events on a GPU.
    """

    def __init__(self, comm, data: torch.Tensor, op: str, tag: int, pool: ScratchPool,
                 slice_bytes: int, cuda=torch.cuda):
        self.circle = _Circle(comm, cuda, _combine(op, data.dtype),
                              cuda.current_stream(data.device) if data.is_cuda else None)
        parts = slice_bounds(data.numel(), data.element_size(), slice_bytes)
        self.waiting = deque((data[a:b], tag + k) for k, (a, b) in enumerate(parts))
        self._running: List[_SliceRing] = []  # in slice order
        self._pool = pool
        pool.line_up(self)

    def start_next(self, chunk: torch.Tensor) -> None:
        """Start the next waiting slice with ``chunk`` as its scratch (the pool's call)."""
        part, tag = self.waiting.popleft()
        self._running.append(_SliceRing(self.circle, part, chunk, tag))

    def _retire(self, ring: _SliceRing) -> None:
        """A slice is done (on a GPU its sums too): its chunk goes back to the pool."""
        self._running.remove(ring)
        self._pool.give_back(ring.scratch)

    @property
    def stream(self):
        """The stream the sums run on (None for host data)."""
        return self.circle.stream

    @stream.setter
    def stream(self, stream) -> None:
        self.circle.stream = stream

    @staticmethod
    def chunk_elements(size: int, slice_bytes: int, element_size: int) -> int:
        """The largest chunk of any slice: each slice's share of scratch."""
        return max(1, -(-max(1, slice_bytes // max(1, element_size)) // size))

    @staticmethod
    def slice_count(numel: int, slice_bytes: int, element_size: int) -> int:
        """How many slices (and tags) a ring of ``numel`` elements has."""
        return len(slice_bounds(numel, element_size, slice_bytes))

    def Test(self) -> bool:  # noqa: N802 - the name of MPI's request method
        """Advance without blocking; True once every slice is done."""
        progressed = True
        while progressed:  # a slice that ends lets the next one start at once
            progressed = False
            for ring in list(self._running):
                if ring.advance(block=False):
                    self._retire(ring)
                    progressed = True
        return not (self._running or self.waiting)

    def Wait(self) -> None:  # noqa: N802
        """Block until every slice is done: ``Test`` until it is (the slices of older
        rings, which may hold the chunks this one waits for, move only in their own
        ``Test``, which the transport calls)."""
        serial.poll(self.Test)


_TAGS = 1 << 14  # the ring's tags: the top of the tag space, away from users' tags


class RingAllreduce(Reduction):
    """The ring: reduce-scatter then allgather over non-blocking point-to-point.

    Args:
        comm: the communicator; its point-to-point traffic at the top of the tag space is
            the ring's.
        cuda: the CUDA API.
        slice_bytes: each slice of a buffer runs a ring of its own.
    """

    name = "ring"

    def __init__(self, comm, cuda=torch.cuda, slice_bytes: int = 1 << 20):
        super().__init__(comm, cuda)
        self.slice_bytes = slice_bytes
        top = comm.Get_attr(MPI.TAG_UB) or 32767
        self._first_tag = max(0, top - _TAGS)
        self._next = 0
        self._pools: Dict[object, ScratchPool] = {}  # per dtype and device

    def _tag(self, count: int) -> int:
        # Every rank starts rings in the same order, so the same ring gets the same tags.
        if self._next + count > _TAGS:
            self._next = 0
        tag, self._next = self._first_tag + self._next, self._next + count
        return tag

    def _pool_for(self, data: torch.Tensor) -> ScratchPool:
        key = (data.dtype, data.device)
        pool = self._pools.get(key)
        if pool is None:
            chunk = Ring.chunk_elements(self.comm.size, self.slice_bytes, data.element_size())
            pool = self._pools[key] = ScratchPool(chunk, data.dtype, data.device)
        return pool

    def start(self, binding, op, slot=None):
        data = binding.memory.reshape(-1)
        tag = self._tag(Ring.slice_count(data.numel(), self.slice_bytes, data.element_size()))
        ring = Ring(self.comm, data, op, tag, self._pool_for(data), self.slice_bytes,
                    self.cuda)
        ring.Test()  # the first messages go out now
        return ring
