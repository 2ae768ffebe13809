"""An MPI-backed torch.distributed backend, named ``"hpcddp"``.

torch's pip wheels ship without ``ProcessGroupMPI``. This backend implements the
collectives torch.distributed scripts use (allreduce, broadcast, allgather,
reduce_scatter, reduce, gather, scatter, alltoall, barrier, send/recv) on mpi4py's
non-blocking operations, so ``dist.barrier()``, ``dist.all_reduce(loss)`` and torch's
own ``DistributedSampler`` work after ``hpcddp.init()`` with no TCP store and no ports.
"""

from datetime import timedelta
from itertools import accumulate
from typing import List

import torch
import torch.distributed as dist
from mpi4py import MPI

from hpcddp.buffers import BOOL, mpi_view
from hpcddp.comm import Handle
from hpcddp.comm.ops import mpi_op

__all__ = ["BACKEND", "MPIProcessGroup", "comm_of", "destroy_default_group",
           "init_default_group"]

BACKEND = "hpcddp"

_REDUCE = {
    dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "product", dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max", dist.ReduceOp.BAND: "band", dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor", dist.ReduceOp.AVG: "sum",
}
# On 0/1 bytes, sum and product of bools are "any" and "all".
_BOOL_REDUCE = {"sum": "bor", "product": "band"}


class _Work(dist._Work):
    """The torch Work of an hpcddp collective: waits on its MPI handles."""

    def __init__(self, handles: List[Handle], result: List[torch.Tensor]):
        super().__init__()
        self._handles = handles
        self._result = result
        self._future = torch.futures.Future()

    def wait(self, timeout=timedelta(0)):
        for handle in self._handles:
            handle.wait()
        if not self._future.done():
            self._future.set_result(self._result)
        return True

    def is_completed(self):
        return all(handle.test() for handle in self._handles)

    def is_success(self):
        return self.is_completed()

    def result(self):
        self.wait()
        return self._result

    def get_future(self):
        # A future nobody completes would hang its waiter: complete it here.
        self.wait()
        return self._future


class _RecvWork(_Work):
    """A receive from any source, which can tell where the message came from."""

    def _source_rank(self):
        return self._handles[0].source()


class MPIProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on an mpi4py communicator.

    Args:
        comm: the communicator; group rank and size are its rank and size.
        cuda_aware: hand CUDA tensors to MPI as device buffers.
    """

    def __init__(self, comm, cuda_aware: bool = False):
        super().__init__(comm.rank, comm.size)
        self._hpcddp_name = self._hpcddp_desc = ""
        self.comm = comm
        self.cuda_aware = cuda_aware

    def getBackendName(self):
        return BACKEND

    # torch keeps a group's name and description on its C++ backends, and a Python
    # group has none, so they are kept here.
    def _set_group_name(self, name):
        self._hpcddp_name = name

    @property
    def group_name(self):
        return self._hpcddp_name

    def _set_group_desc(self, desc):
        self._hpcddp_desc = desc

    @property
    def group_desc(self):
        return self._hpcddp_desc

    # -- helpers ---------------------------------------------------------------------

    def _view(self, tensor, writable=True):
        return mpi_view(tensor, self.cuda_aware, writable)

    def _op(self, opts, view):
        red = opts.reduceOp
        name = _REDUCE.get(red.op if hasattr(red, "op") else red)
        if name is None:
            raise ValueError(f"reduce op {red} is not supported by the hpcddp backend; "
                             f"use SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR or BXOR")
        if view.kind == BOOL:
            name = _BOOL_REDUCE.get(name, name)
        return mpi_op(name, view.kind)

    def _is_avg(self, opts, tensor):
        red = opts.reduceOp
        if (red.op if hasattr(red, "op") else red) != dist.ReduceOp.AVG:
            return False
        if not (tensor.is_floating_point() or tensor.is_complex()):
            raise ValueError(f"ReduceOp.AVG needs a floating-point tensor, got {tensor.dtype}")
        return True

    def _handle(self, request, views, after=None):
        """One Handle: wait ``request``, copy staged results back, then run ``after``."""
        def complete():
            for view in views:
                if view.finish is not None:
                    view.finish()
            if after is not None:
                after()
        return Handle([request], keep=[v.buf for v in views], on_complete=complete)

    def _reduced(self, tensor, opts, make_request):
        view = self._view(tensor)
        avg = self._is_avg(opts, tensor)
        after = (lambda: tensor.div_(self.comm.size)) if avg else None
        return self._handle(make_request(view, self._op(opts, view)), [view], after)

    # -- collectives -----------------------------------------------------------------

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        handles = [self._reduced(t, opts, lambda v, op: self.comm.Iallreduce(
            MPI.IN_PLACE, v.buf, op=op)) for t in tensors]
        return _Work(handles, list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts or dist.AllreduceCoalescedOptions())

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        root = opts.rootRank

        def request(view, op):
            if self.comm.rank == root:
                return self.comm.Ireduce(MPI.IN_PLACE, view.buf, op=op, root=root)
            return self.comm.Ireduce(view.buf, None, op=op, root=root)
        tensor = tensors[opts.rootTensor]
        if self.comm.rank != root and self._is_avg(opts, tensor):
            # Only the root's tensor holds the result; others must not be divided.
            view = self._view(tensor, writable=False)
            return _Work([self._handle(request(view, self._op(opts, view)), [view])], [tensor])
        return _Work([self._reduced(tensor, opts, request)], [tensor])

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        root = opts.rootRank
        handles = []
        for tensor in tensors:
            view = self._view(tensor, writable=self.comm.rank != root)
            handles.append(self._handle(self.comm.Ibcast(view.buf, root=root), [view]))
        return _Work(handles, list(tensors))

    def _allgather_one(self, output, tensor):
        src = self._view(tensor, writable=False)
        dst = self._view(output)
        return self._handle(self.comm.Iallgather(src.buf, dst.buf), [src, dst])

    def allgather(self, output_tensors, input_tensors, opts=None):
        handles = []
        for outputs, tensor in zip(output_tensors, input_tensors):
            gathered = tensor.new_empty((self.comm.size,) + tuple(tensor.shape))
            handle = self._allgather_one(gathered, tensor)
            handles.append(handle.then(lambda o=outputs, g=gathered: _unstack(g, o)))
        return _Work(handles, [t for outs in output_tensors for t in outs])

    def _allgather_base(self, output, input, opts=None):
        return _Work([self._allgather_one(output, input)], [output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return _Work([self._allgather_one(o, i) for o, i in zip(outputs, inputs)],
                     list(outputs))

    def _reduce_scatter_one(self, output, tensor, opts):
        src = self._view(tensor, writable=False)

        def request(view, op):
            return self.comm.Ireduce_scatter_block(src.buf, view.buf, op=op)
        return self._reduced(output, opts, request).keep_alive(src.buf)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        handles = [self._reduce_scatter_one(out, torch.stack(list(ins)), opts)
                   for out, ins in zip(output_tensors, input_tensors)]
        return _Work(handles, list(output_tensors))

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        return _Work([self._reduce_scatter_one(output, input, opts)], [output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        return _Work([self._reduce_scatter_one(o, i, opts) for o, i in zip(outputs, inputs)],
                     list(outputs))

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        root, tensor = opts.rootRank, input_tensors[0]
        src = self._view(tensor, writable=False)
        if self.comm.rank != root:
            return _Work([self._handle(self.comm.Igather(src.buf, None, root=root), [src])], [])
        gathered = tensor.new_empty((self.comm.size,) + tuple(tensor.shape))
        dst = self._view(gathered)
        handle = self._handle(self.comm.Igather(src.buf, dst.buf, root=root), [src, dst],
                              lambda: _unstack(gathered, output_tensors[0]))
        return _Work([handle], list(output_tensors[0]))

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ScatterOptions()
        root, output = opts.rootRank, output_tensors[0]
        dst = self._view(output)
        if self.comm.rank != root:
            return _Work([self._handle(self.comm.Iscatter(None, dst.buf, root=root), [dst])],
                         [output])
        src = self._view(torch.stack(list(input_tensors[0])), writable=False)
        handle = self._handle(self.comm.Iscatter(src.buf, dst.buf, root=root), [src, dst])
        return _Work([handle], [output])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        src, dst = self._view(input, writable=False), self._view(output)
        if not output_split_sizes and not input_split_sizes:
            request = self.comm.Ialltoall(src.buf, dst.buf)
        else:
            send = _counts(input, input_split_sizes, self.comm.size)
            recv = _counts(output, output_split_sizes, self.comm.size)
            request = self.comm.Ialltoallv([src.buf, send], [dst.buf, recv])
        return _Work([self._handle(request, [src, dst])], [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        sizes = [t.numel() for t in input_tensors]
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        flat_out = flat_in.new_empty(sum(t.numel() for t in output_tensors))
        src, dst = self._view(flat_in, writable=False), self._view(flat_out)
        recv_sizes = [t.numel() for t in output_tensors]
        request = self.comm.Ialltoallv([src.buf, (sizes, _displs(sizes))],
                                       [dst.buf, (recv_sizes, _displs(recv_sizes))])
        handle = self._handle(request, [src, dst], lambda: _unflatten(flat_out, output_tensors))
        return _Work([handle], list(output_tensors))

    def barrier(self, opts=None):
        return _Work([Handle([self.comm.Ibarrier()])], [])

    def send(self, tensors, dstRank, tag):
        views = [self._view(t, writable=False) for t in tensors]
        return _Work([self._handle(self.comm.Isend(v.buf, dest=dstRank, tag=tag), [v])
                      for v in views], list(tensors))

    def recv(self, tensors, srcRank, tag):
        views = [self._view(t) for t in tensors]
        return _Work([self._handle(self.comm.Irecv(v.buf, source=srcRank, tag=tag), [v])
                      for v in views], list(tensors))

    def recv_anysource(self, tensors, tag):
        view = self._view(tensors[0])
        request = self.comm.Irecv(view.buf, source=MPI.ANY_SOURCE, tag=tag)
        handle = Handle([request], keep=[view.buf], on_complete=view.finish, statuses=True)
        return _RecvWork([handle], list(tensors))

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        return self.allgather(output_lists, input_tensors, opts)

    # torch >= 2.10 calls these names from Python; they are the "_base" collectives.
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base


def _unstack(stacked, outputs):
    for out, part in zip(outputs, stacked.unbind(0)):
        out.copy_(part)


def _unflatten(flat, outputs):
    offset = 0
    for out in outputs:
        out.copy_(flat[offset:offset + out.numel()].view_as(out))
        offset += out.numel()


def _displs(counts):
    return [0] + list(accumulate(counts))[:-1]


def _counts(tensor, split_sizes, size):
    """Element counts and displacements for an alltoallv split along dim 0."""
    rows = list(split_sizes) if split_sizes else [tensor.shape[0] // size] * size
    per_row = tensor[0].numel() if tensor.dim() > 0 and tensor.shape[0] else 1
    counts = [r * per_row for r in rows]
    return (counts, _displs(counts))


def comm_of(group):
    """Return the mpi4py communicator behind an hpcddp process group (None: the default)."""
    group = group if group is not None else dist.group.WORLD
    backend = group
    if not isinstance(group, MPIProcessGroup):
        try:
            backend = group._get_backend(torch.device("cpu"))
        except RuntimeError:
            backend = None
    if not isinstance(backend, MPIProcessGroup):
        raise TypeError(f"process group {group!r} is not an hpcddp (MPI) group; pass an "
                        f"mpi4py communicator or a group created after hpcddp.init()")
    return backend.comm


def _create(options, _pg_options):
    from hpcddp.world import _world_for_backend
    world = _world_for_backend()
    ranks = list(options.global_ranks_in_group or [])
    if not ranks or ranks == list(range(world.size)):
        comm = world.comm.Dup()
    else:
        comm = world.comm.Create_group(world.comm.group.Incl(ranks))
    comm.Set_name(f"hpcddp.torch.{options.group_id}")
    return MPIProcessGroup(comm, world.cuda_aware)


def _register():
    if not hasattr(dist.Backend, BACKEND.upper()):
        dist.Backend.register_backend(BACKEND, _create, extended_api=True,
                                      devices=["cpu", "cuda"])


def init_default_group(world) -> bool:
    """Initialize torch.distributed's default group on MPI, unless one exists.

    Returns:
        True if hpcddp initialized it, False if the user already had one.
    """
    _register()
    if dist.is_initialized():
        return False
    # A process-local store: ranks find each other through MPI, not through the store.
    dist.init_process_group(BACKEND, store=dist.HashStore(), rank=world.rank,
                            world_size=world.size)
    return True


def destroy_default_group() -> None:
    """Destroy torch.distributed's default group if it is hpcddp's."""
    if dist.is_initialized() and dist.get_backend() == BACKEND:
        dist.destroy_process_group()
