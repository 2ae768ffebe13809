"""Running the coordinator's responses on one process set's communicator.

Each response runs as collectives of hpcddp's torch.distributed backend
(``MPIProcessGroup``) on a communicator of the set's own, so CUDA tensors take the same
routes as everywhere in hpcddp (device buffers where MPI is CUDA-aware, pinned staging
otherwise) and bfloat16 reduces as torch rounds it. Called on the engine's thread, in
the coordinator's order.

Horovod's semantics, kept here:

- allreduce: ``Average`` is a sum divided by the set's size, after ``prescale_factor``
  and with ``postscale_factor``; integer tensors are scaled in float64 and truncated, as
  Horovod's ``ScaleBuffer`` does. Fused allreduces travel as one flat buffer.
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

__all__ = ["Executor", "adasum", "adasum_tree", "reducescatter_rows"]

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


class Executor:
    """The collectives of one process set, on ``comm`` (this rank's duplicate of the
    set's communicator)."""

    def __init__(self, comm, world, ranks):
        from hpcddp.backend.process_group import MPIProcessGroup

        self.ranks, self.size = list(ranks), comm.size
        self.group = MPIProcessGroup(comm, cuda_aware=world.cuda_aware, owns_comm=True,
                                     reduction=world.reduction,
                                     device_reductions=world.device_reductions)

    def close(self) -> None:
        self.group.close()

    def run(self, response, entries) -> None:
        with torch.no_grad():  # data only: autograd is the callers' (mpi_ops' Functions)
            getattr(self, "_" + response.kind)(response, entries)
        for entry in entries:
            entry.result = entry.finish(entry) if entry.finish else entry.output

    # -- the kinds -----------------------------------------------------------------------

    def _allreduce(self, response, entries) -> None:
        head = entries[0].request
        tensors = [e.tensor for e in entries]
        if len(tensors) == 1:
            tensor = tensors[0]
            if tensor is entries[0].output and tensor.is_contiguous():
                flat = tensor  # in place: reduced where it is
                scale_into(flat, flat, head.prescale)
            else:
                flat = scale(tensor.contiguous(), head.prescale)
                if flat.data_ptr() == tensor.data_ptr():
                    flat = flat.clone()  # the input stays as it was
        else:
            flat = scale(torch.cat([t.reshape(-1) for t in tensors]), head.prescale)
        if head.op == Adasum:
            flat = self._adasum(flat.reshape(-1), [e.tensor.numel() for e in entries])
        else:
            opts = dist.AllreduceOptions()
            opts.reduceOp = _REDUCE_OPS[head.op]
            self.group.allreduce([flat], opts).wait()
        post = head.postscale / self.size if head.op == Average else head.postscale
        offset = 0
        for entry in entries:  # scaled on the way out: one pass over the bytes
            n = entry.tensor.numel()
            part = flat.reshape(-1)[offset:offset + n].view(entry.tensor.shape)
            offset += n
            scale_into(entry.output, part, post)

    def _adasum(self, flat: torch.Tensor, sizes: List[int]) -> torch.Tensor:
        gathered = [torch.empty_like(flat) for _ in range(self.size)]
        self.group.allgather([gathered], [flat]).wait()
        pieces = [part.split(sizes) for part in gathered]
        return torch.cat([adasum_tree([rank[k] for rank in pieces])
                          for k in range(len(sizes))])

    def _allgather(self, response, entries) -> None:
        (entry,) = entries
        tensor = entry.tensor.contiguous()
        rows = response.sizes
        rest = tuple(tensor.shape[1:]) if tensor.dim() else ()
        out = tensor.new_empty((sum(rows),) + rest) if tensor.dim() else \
            tensor.new_empty((len(rows),))
        parts = list(out.split(rows)) if tensor.dim() else list(out.split(1))
        self.group.allgather([parts], [tensor.reshape(parts[self._mine()].shape)]).wait()
        entry.output = out

    def _broadcast(self, response, entries) -> None:
        (entry,) = entries
        root = self.ranks.index(entry.request.root)
        target = entry.output
        if target.data_ptr() != entry.tensor.data_ptr():
            target.copy_(entry.tensor)
        buf = target if target.is_contiguous() else target.contiguous()
        opts = dist.BroadcastOptions()
        opts.rootRank = root
        self.group.broadcast([buf], opts).wait()
        if buf is not target:
            target.copy_(buf)

    def _alltoall(self, response, entries) -> None:
        (entry,) = entries
        me = self._mine()
        send = response.sizes[me]
        tensor = entry.tensor[:sum(send)].contiguous()  # rows past the splits stay
        recv = [row[me] for row in response.sizes]
        out = tensor.new_empty((sum(recv),) + tuple(tensor.shape[1:]))
        self.group.alltoall_base(out, tensor, recv, send).wait()
        entry.output = out
        entry.extra = torch.tensor(recv, dtype=torch.int32)

    def _reducescatter(self, response, entries) -> None:
        (entry,) = entries
        head = entry.request
        tensor = scale(entry.tensor.contiguous(), head.prescale)
        rows = reducescatter_rows(tensor.shape[0], self.size)
        parts = list(tensor.split(rows))
        out = torch.empty_like(parts[self._mine()])
        opts = dist.ReduceScatterOptions()
        opts.reduceOp = _REDUCE_OPS[head.op]
        self.group.reduce_scatter([out], [parts], opts).wait()
        post = head.postscale / self.size if head.op == Average else head.postscale
        entry.output = scale(out, post)

    def _barrier(self, response, entries) -> None:
        self.group.barrier().wait()

    def _join(self, response, entries) -> None:
        # Every rank has joined; no data moves. The result: the last rank to join.
        (entry,) = entries
        entry.output = response.sizes[0]

    def _mine(self) -> int:
        return self.group.comm.rank
