"""Running the coordinator's responses on one process set's communicator.

Each response runs as collectives of hpcddp's torch.distributed backend
(``MPIProcessGroup``) on a communicator of the set's own, so CUDA tensors take the same
routes as everywhere in hpcddp (device buffers where MPI is CUDA-aware, pinned staging
otherwise) and bfloat16 reduces as torch rounds it. Started on hpcddp's MPI thread in
the coordinator's order, each without waiting for the ones before it.

Horovod's semantics, kept here:

- allreduce: ``Average`` is a sum divided by the set's size, after ``prescale_factor``
  and with ``postscale_factor``; integer tensors are scaled in float64 and truncated, as
  Horovod's ``ScaleBuffer`` does. A fused allreduce's tensors travel as one flat
  buffer, but for those of ``_ALONE_BYTES`` or more, each reduced where it lies.
- Adasum: each tensor's per-rank values combined pairwise in a binary tree, ranks
  (0, 1), (2, 3), ... first, then the pairs' results, as Horovod's recursive halving
  pairs them; ``adasum`` says the rule. The set's size must be a power of two. The
  values travel by one allgather (each rank holds every rank's tensor for a moment:
  Horovod halves the vectors instead, for less traffic, to the same result up to
  rounding).
- allgather: concatenated along the first dimension, which may differ between ranks.
- broadcast: the root is a Horovod rank, not a rank within the set.
- alltoall: rows to each rank by ``splits`` (equal parts without), returning the rows
  received from each rank.
- reducescatter: the first dimension split among the set's ranks, the first
  ``rows % size`` ranks taking one row more.
- join: nothing moves; a rank that has joined reduces zeros in the others' allreduces
  (``engine.py``), and the join returns the last rank to join.
"""

from typing import List

import torch
import torch.distributed as dist

from hpcddp.horovod.common import Adasum, Average, Max, Min, Product, Sum
from hpcddp.torch_compat import flatten_dense, foreach_copy, foreach_mul, unflatten_dense

__all__ = ["Executor", "Running", "adasum", "adasum_tree", "reducescatter_rows"]

_REDUCE_OPS = {Sum: dist.ReduceOp.SUM, Average: dist.ReduceOp.SUM, Min: dist.ReduceOp.MIN,
               Max: dist.ReduceOp.MAX, Product: dist.ReduceOp.PRODUCT}


def reducescatter_rows(rows: int, size: int) -> List[int]:
    """Rows of each rank's part: as equal as can be, the earlier ranks one more.

    >>> reducescatter_rows(7, 3)
    [3, 2, 2]
    """
    return [rows // size + (1 if r < rows % size else 0) for r in range(size)]


def adasum(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Adasum of two gradients: ``(1 - a.b / 2|a|^2) a + (1 - a.b / 2|b|^2) b``, the dot
    products in float64 (a zero vector keeps coefficient 1). Parallel vectors average,
    orthogonal ones add.

    >>> adasum(torch.tensor([2.0, 0.0]), torch.tensor([2.0, 0.0])).tolist()
    [2.0, 0.0]
    >>> adasum(torch.tensor([1.0, 0.0]), torch.tensor([0.0, 3.0])).tolist()
    [1.0, 3.0]
    """
    a64, b64 = a.double(), b.double()
    dot = torch.dot(a64.reshape(-1), b64.reshape(-1))
    na, nb = a64.square().sum(), b64.square().sum()
    ca = 1 - dot / (2 * na) if na > 0 else torch.tensor(1.0, dtype=torch.float64)
    cb = 1 - dot / (2 * nb) if nb > 0 else torch.tensor(1.0, dtype=torch.float64)
    return (ca * a64 + cb * b64).to(a.dtype)


def adasum_tree(parts: List[torch.Tensor]) -> torch.Tensor:
    """Every rank's tensor (``parts``, in rank order, a power of two of them) combined by
    ``adasum`` in pairs of neighbours, then pairs of pairs."""
    while len(parts) > 1:
        parts = [adasum(parts[i], parts[i + 1]) for i in range(0, len(parts), 2)]
    return parts[0]


def scale(tensor: torch.Tensor, factor: float) -> torch.Tensor:
    """``tensor * factor`` in ``tensor``'s dtype; integers scaled in float64, truncated."""
    if factor == 1.0:
        return tensor
    if tensor.is_floating_point() or tensor.is_complex():
        return tensor * factor
    return (tensor.to(torch.float64) * factor).trunc().to(tensor.dtype)


def scale_into(out: torch.Tensor, src: torch.Tensor, factor: float) -> None:
    """``out[...] = scale(src, factor)`` in one pass where it can be (``src`` may be
    ``out`` itself)."""
    if factor == 1.0:
        if src.data_ptr() != out.data_ptr():
            out.copy_(src)
    elif out.is_floating_point() or out.is_complex():
        torch.mul(src, factor, out=out)
    else:
        out.copy_(scale(src, factor))


# In a fused allreduce, a tensor of this many bytes or more is reduced where it lies (in
# place, where the caller reduces in place) rather than copied into the fused buffer and
# back: the copies of a model's large gradients cost more than their own allreduce's
# latency. Decided from the response, so every rank issues the same collectives.
_ALONE_BYTES = 1 << 20


def _unfuse(flat: torch.Tensor, entries, factor: float) -> None:
    """Each entry's part of the fused ``flat``, times ``factor``, into its output: in
    two calls for them all where the dtype allows (a ResNet's 62 gradients: 0.4 ms, a
    loop of copies 1.4 ms), else one at a time (integers scale in float64)."""
    parts = unflatten_dense(flat, [e.tensor for e in entries])
    if factor != 1.0 and not (flat.is_floating_point() or flat.is_complex()):
        for entry, part in zip(entries, parts):
            scale_into(entry.output, part, factor)
        return
    if factor != 1.0:
        foreach_mul(parts, factor)
    foreach_copy([e.output for e in entries], parts)


class Running:
    """A response started on MPI: its collectives' works, and what completes it."""

    __slots__ = ("works", "then", "entries")

    def __init__(self, works, then, entries):
        self.works, self.then, self.entries = works, then, entries

    def test(self) -> bool:
        """Whether MPI has completed it (never blocks)."""
        while self.works and self.works[0].is_completed():
            self.works.pop(0)
        return not self.works

    def finish(self) -> None:
        """Results into place and each handle's outcome (once ``test()`` is true)."""
        if self.then is not None:
            with torch.no_grad():
                self.then()
        for entry in self.entries:
            entry.result = entry.finish(entry) if entry.finish else entry.output


class Executor:
    """The collectives of one process set, on ``comm`` (this rank's duplicate of the
    set's communicator). ``start`` issues a response's collectives without waiting for
    them; the engine tests and finishes the ``Running`` it returns, in any order."""

    def __init__(self, comm, world, ranks):
        from hpcddp.backend.process_group import MPIProcessGroup

        self.ranks, self.size = list(ranks), comm.size
        self.group = MPIProcessGroup(comm, cuda_aware=world.cuda_aware, owns_comm=True,
                                     reduction=world.reduction,
                                     device_reductions=world.device_reductions)

    def close(self) -> None:
        self.group.close()

    def start(self, response, entries) -> Running:
        with torch.no_grad():  # data only: autograd is the callers' (mpi_ops' Functions)
            works, then = getattr(self, "_" + response.kind)(response, entries)
        return Running(works, then, entries)

    # -- the kinds: each issues its collectives and returns (works, then) ----------------

    def _allreduce(self, response, entries):
        head = entries[0].request
        if head.op == Adasum:
            return self._adasum(entries)
        alone = [e for e in entries if e.tensor.numel() * e.tensor.element_size()
                 >= _ALONE_BYTES] if len(entries) > 1 else []
        fused = [e for e in entries if not any(e is a for a in alone)]
        post = head.postscale / self.size if head.op == Average else head.postscale
        opts = dist.AllreduceOptions()
        opts.reduceOp = _REDUCE_OPS[head.op]
        buffers = []
        if fused:
            buffers.append((self._fused_buffer(fused, head.prescale), fused))
        buffers += [(self._own_buffer(e, head.prescale), [e]) for e in alone]
        works = [self.group.allreduce([flat], opts) for flat, _ in buffers]

        def then():
            for flat, part_of in buffers:
                if len(part_of) == 1:  # scaled on the way out: one pass over the bytes
                    entry = part_of[0]
                    scale_into(entry.output, flat.view(entry.tensor.shape), post)
                else:
                    _unfuse(flat, part_of, post)
        return works, then

    @staticmethod
    def _own_buffer(entry, prescale: float) -> torch.Tensor:
        """What one tensor is reduced in: itself where the result goes there, else a
        scaled copy (the input stays as it was)."""
        tensor = entry.tensor
        if tensor is entry.output and tensor.is_contiguous():
            scale_into(tensor, tensor, prescale)
            return tensor  # in place: reduced where it is
        flat = scale(tensor.contiguous(), prescale)
        return flat.clone() if flat.data_ptr() == tensor.data_ptr() else flat

    def _fused_buffer(self, entries, prescale: float) -> torch.Tensor:
        if len(entries) == 1:
            return self._own_buffer(entries[0], prescale)
        return scale(flatten_dense([e.tensor for e in entries]), prescale)

    def _adasum(self, entries):
        head = entries[0].request
        flat = scale(torch.cat([e.tensor.reshape(-1) for e in entries]), head.prescale)
        sizes = [e.tensor.numel() for e in entries]
        gathered = [torch.empty_like(flat) for _ in range(self.size)]
        work = self.group.allgather([gathered], [flat])

        def then():
            pieces = [part.split(sizes) for part in gathered]
            for k, entry in enumerate(entries):
                combined = adasum_tree([rank[k] for rank in pieces])
                scale_into(entry.output, combined.view(entry.tensor.shape), head.postscale)
        return [work], then

    def _allgather(self, response, entries):
        (entry,) = entries
        tensor = entry.tensor.contiguous()
        rows = response.sizes
        rest = tuple(tensor.shape[1:]) if tensor.dim() else ()
        out = tensor.new_empty((sum(rows),) + rest) if tensor.dim() else \
            tensor.new_empty((len(rows),))
        parts = list(out.split(rows)) if tensor.dim() else list(out.split(1))
        work = self.group.allgather([parts], [tensor.reshape(parts[self._mine()].shape)])
        entry.output = out
        return [work], None

    def _broadcast(self, response, entries):
        (entry,) = entries
        root = self.ranks.index(entry.request.root)
        target = entry.output
        if target.data_ptr() != entry.tensor.data_ptr():
            target.copy_(entry.tensor)
        buf = target if target.is_contiguous() else target.contiguous()
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        work = self.group.broadcast([buf], opts)
        return [work], (None if buf is target else lambda: target.copy_(buf))

    def _alltoall(self, response, entries):
        (entry,) = entries
        me = self._mine()
        send = response.sizes[me]
        tensor = entry.tensor[:sum(send)].contiguous()  # rows past the splits stay
        recv = [row[me] for row in response.sizes]
        out = tensor.new_empty((sum(recv),) + tuple(tensor.shape[1:]))
        work = self.group.alltoall_base(out, tensor, recv, send)
        entry.output = out
        entry.extra = torch.tensor(recv, dtype=torch.int32)
        return [work], None

    def _reducescatter(self, response, entries):
        (entry,) = entries
        head = entry.request
        tensor = scale(entry.tensor.contiguous(), head.prescale)
        rows = reducescatter_rows(tensor.shape[0], self.size)
        parts = list(tensor.split(rows))
        out = torch.empty_like(parts[self._mine()])
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = _REDUCE_OPS[head.op]
        work = self.group.reduce_scatter([out], [parts], opts)
        post = head.postscale / self.size if head.op == Average else head.postscale

        def then():
            entry.output = scale(out, post)
        return [work], then

    def _barrier(self, response, entries):
        return [self.group.barrier()], None

    def _join(self, response, entries):
        # Every rank has joined; no data moves. The result: the last rank to join.
        (entry,) = entries
        entry.output = response.sizes[0]
        return [], None

    def _mine(self) -> int:
        return self.group.comm.rank
