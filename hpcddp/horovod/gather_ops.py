"""``horovod.torch``'s operations that move rows between ranks: allgather (first
dimensions may differ), broadcast, alltoall (with splits, returning the received
splits), reducescatter (the first dimension split among the ranks), and the sparse
allreduce built on allgathers. Each has Horovod's signature and gradient; handles and
the submission helpers are ``mpi_ops.py``'s.
"""

from typing import List, Optional

import torch

from hpcddp.horovod import basics
from hpcddp.horovod.common import Adasum, Average, HorovodInternalError, Sum
from hpcddp.horovod.compression import Compression
from hpcddp.horovod.mpi_ops import (
    _Group, _reduce_op, _request, _set_id, _set_size, _submit, allreduce, synchronize)
from hpcddp.horovod.process_sets import global_process_set

__all__ = ["sparse_allreduce_async", "allgather", "allgather_async", "grouped_allgather",
           "grouped_allgather_async", "broadcast", "broadcast_", "broadcast_async",
           "broadcast_async_", "alltoall", "alltoall_async", "reducescatter",
           "reducescatter_async", "grouped_reducescatter", "grouped_reducescatter_async"]


def sparse_allreduce_async(tensor, name, op, process_set=global_process_set):
    """Start reducing a sparse COO tensor by gathering its indices and values; returns a
    function that waits and gives the reduced sparse tensor (Horovod's form)."""
    t = tensor.coalesce() if not tensor.is_coalesced() else tensor
    indices = allgather_async(t.indices().transpose(0, 1).contiguous(),
                              name=f"{name}.indices", process_set=process_set)
    values = allgather_async(t.values().contiguous(), name=f"{name}.values",
                             process_set=process_set)

    def result():
        vals = synchronize(values)
        idx = synchronize(indices)
        if op == Average:
            vals = vals / _set_size(process_set)
        if idx.dim() == 0 or vals.dim() == 0:
            return t.new().resize_as_(t)
        return torch.sparse_coo_tensor(idx.transpose(0, 1), vals, t.size())
    return result


def allgather_async(tensor, name=None, process_set=global_process_set) -> int:
    """Start concatenating ``tensor`` from every rank of the set along the first
    dimension (which may differ between ranks)."""
    return _submit(_request("allgather", tensor, name, process_set), tensor, None)


class _Allgather(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, process_set):
        ctx.rows = tensor.shape[0] if tensor.dim() else 1
        ctx.process_set = process_set
        return synchronize(allgather_async(tensor, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
        rows = allgather(torch.tensor([ctx.rows], dtype=torch.int64),
                         process_set=ctx.process_set)
        me = basics.engine().sets.get(_set_id(ctx.process_set)).rank
        offset = int(rows[:me].sum())
        return reduced.narrow(0, offset, ctx.rows), None, None


def allgather(tensor, name=None, process_set=global_process_set) -> torch.Tensor:
    """``tensor`` of every rank of the set, concatenated along the first dimension."""
    return _Allgather.apply(tensor, name, process_set)


def grouped_allgather_async(tensors, name=None, process_set=global_process_set):
    base = name if name is not None else None
    handles = [allgather_async(t, None if base is None else f"{base}.{k}", process_set)
               for k, t in enumerate(tensors)]
    return _Group(handles)


def grouped_allgather(tensors, name=None, process_set=global_process_set):
    return [allgather(t, None if name is None else f"{name}.{k}", process_set)
            for k, t in enumerate(tensors)]


def _broadcast_async(tensor, output, root_rank, name, process_set) -> int:
    ranks = basics.engine().sets.get(_set_id(process_set)).ranks
    if root_rank not in ranks:
        raise ValueError(f"hvd.broadcast: root_rank={root_rank} is not a rank of the process "
                         f"set {ranks}; give a Horovod rank within it")
    request = _request("broadcast", tensor, name, process_set, root=int(root_rank))
    return _submit(request, tensor, output)


def broadcast_async(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    """Start copying ``root_rank``'s ``tensor`` to every rank of the set (a new tensor)."""
    return _broadcast_async(tensor, torch.empty_like(tensor), root_rank, name, process_set)


def broadcast_async_(tensor, root_rank, name=None, process_set=global_process_set) -> int:
    """Start overwriting ``tensor`` with ``root_rank``'s."""
    return _broadcast_async(tensor, tensor, root_rank, name, process_set)


def broadcast_(tensor, root_rank, name=None, process_set=global_process_set):
    return synchronize(broadcast_async_(tensor, root_rank, name, process_set))


class _Broadcast(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, root_rank, name, process_set):
        ctx.root, ctx.process_set = root_rank, process_set
        return synchronize(broadcast_async(tensor, root_rank, name, process_set))

    @staticmethod
    def backward(ctx, grad):
        reduced = allreduce(grad.contiguous(), op=Average, process_set=ctx.process_set)
        if basics.rank() != ctx.root:
            reduced = reduced * 0
        return reduced, None, None, None


def broadcast(tensor, root_rank, name=None, process_set=global_process_set):
    """``root_rank``'s ``tensor`` on every rank of the set; ``tensor`` is not modified."""
    return _Broadcast.apply(tensor, root_rank, name, process_set)


def _splits(splits) -> Optional[List[int]]:
    if splits is None:
        return None
    if isinstance(splits, torch.Tensor) and splits.dtype != torch.int32:
        raise ValueError(f"hvd.alltoall: splits is a tensor of {splits.dtype}; give 32-bit "
                         f"integers (torch.int32), or a list")
    values = splits.tolist() if isinstance(splits, torch.Tensor) else list(splits)
    if any(int(v) < 0 for v in values):
        raise ValueError(f"hvd.alltoall: splits {values} must not be negative")
    return [int(v) for v in values]


def alltoall_async(tensor, splits=None, name=None, process_set=global_process_set) -> int:
    """Start sending rows of ``tensor`` to each rank of the set (``splits`` rows to each,
    equal parts without) and receiving theirs."""
    split_list = _splits(splits)
    size = _set_size(process_set)
    if split_list is not None and len(split_list) != size:
        raise ValueError(f"hvd.alltoall: splits has {len(split_list)} entries, the process "
                         f"set {size} ranks; give one count per rank")
    if tensor.dim() == 0:
        raise ValueError("hvd.alltoall: a 0-d tensor has no rows to split; reshape it to (1,)")
    rows = tensor.shape[0]
    if split_list is None and rows % size:
        raise ValueError(f"hvd.alltoall: without splits the {rows} rows of the tensor are "
                         f"split equally, but they do not divide among {size} ranks; pass "
                         f"splits= (one row count per rank)")
    if split_list is not None and sum(split_list) > rows:
        raise ValueError(f"hvd.alltoall: splits {split_list} sum to {sum(split_list)}, more "
                         f"than the tensor's {rows} rows")
    request = _request("alltoall", tensor, name, process_set, splits=split_list)
    return _submit(request, tensor, None, finish=lambda e: (e.output, e.extra))


class _Alltoall(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, splits, name, process_set):
        output, received = synchronize(alltoall_async(tensor, splits, name, process_set))
        ctx.received, ctx.process_set = received, process_set
        if splits is None:
            return output
        ctx.mark_non_differentiable(received)
        return output, received

    @staticmethod
    def backward(ctx, grad, *unused):
        back, _ = alltoall(grad.contiguous(), splits=ctx.received,
                           process_set=ctx.process_set)
        return back, None, None, None


def alltoall(tensor, splits=None, name=None, process_set=global_process_set):
    """Rows exchanged between the set's ranks: the rows received, and with ``splits`` also
    how many came from each rank (``(output, received_splits)``), as Horovod returns."""
    return _Alltoall.apply(tensor, splits, name, process_set)


def reducescatter_async(tensor, name=None, op=Average, process_set=global_process_set,
                        prescale_factor=1.0, postscale_factor=1.0) -> int:
    """Start reducing ``tensor`` over the set and keeping this rank's rows of the result
    (the first dimension split as evenly as it goes, earlier ranks one row more)."""
    op = _reduce_op(op, None, "reducescatter_async")
    if op == Adasum:  # Horovod's: refused as the operation is enqueued
        raise HorovodInternalError("hvd.reducescatter does not support op=hvd.Adasum; use "
                                   "hvd.Sum or hvd.Average")
    if tensor.dim() == 0:
        raise ValueError("hvd.reducescatter: a 0-d tensor has no rows to scatter")
    request = _request("reducescatter", tensor, name, process_set, op=op,
                       prescale=float(prescale_factor), postscale=float(postscale_factor))
    return _submit(request, tensor, None)


class _Reducescatter(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, process_set, prescale, postscale):
        ctx.args = (op, process_set, prescale, postscale)
        return synchronize(reducescatter_async(tensor, name, op, process_set, prescale,
                                               postscale))

    @staticmethod
    def backward(ctx, grad):
        op, process_set, prescale, postscale = ctx.args
        grad = grad.contiguous()
        if op == Sum:
            grad = grad * _set_size(process_set)
        grad = grad * (prescale * postscale)
        return allgather(grad, process_set=process_set), None, None, None, None, None


def reducescatter(tensor, name=None, compression=Compression.none, op=Average,
                  process_set=global_process_set, prescale_factor=1.0,
                  postscale_factor=1.0) -> torch.Tensor:
    """This rank's rows of the set's reduction of ``tensor``."""
    compressed, ctx = compression.compress(tensor)
    out = _Reducescatter.apply(compressed, name, op, process_set, prescale_factor,
                               postscale_factor)
    return compression.decompress(out, ctx)


def grouped_reducescatter_async(tensors, name=None, op=Average,
                                process_set=global_process_set, prescale_factor=1.0,
                                postscale_factor=1.0):
    handles = [reducescatter_async(t, None if name is None else f"{name}.{k}", op,
                                   process_set, prescale_factor, postscale_factor)
               for k, t in enumerate(tensors)]
    return _Group(handles)


def grouped_reducescatter(tensors, name=None, compression=Compression.none, op=Average,
                          process_set=global_process_set, prescale_factor=1.0,
                          postscale_factor=1.0):
    return [reducescatter(t, None if name is None else f"{name}.{k}", compression, op,
                          process_set, prescale_factor, postscale_factor)
            for k, t in enumerate(tensors)]
