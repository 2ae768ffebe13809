"""An MPI-backed torch.distributed backend, named ``"hpcddp"``.

torch's pip wheels ship without ``ProcessGroupMPI``. This backend implements, as
operations of a ``hpcddp.transport.Transport``, every collective that
``torch.distributed.ProcessGroup`` hands a backend (its methods in torch 2.13, and the
C++ ``PyProcessGroup`` trampoline through which DTensor's functional collectives reach
a Python group): broadcast; allreduce (dense, and sparse COO as gloo does) and
allreduce_coalesced; reduce; allgather (equal or unequal parts), all_gather_single and
their coalesced forms; gather; scatter; reduce_scatter (equal or unequal parts),
reduce_scatter_single and its coalesced form; all_to_all_single and alltoall;
barrier; send, recv and recv_anysource with tags. An input that aliases its output, as
FSDP2 passes them, travels as ``MPI_IN_PLACE`` or is copied first
(``hpcddp.transport.aliasing``). What no MPI backend can do is refused with its name:
``PREMUL_SUM`` (NCCL's), tags beyond the MPI's ``MPI_TAG_UB``; torch itself refuses
``monitored_barrier`` (gloo's alone) and ``split_group`` without a bound device.

So ``dist.barrier()``, ``dist.all_reduce(loss)``, torch's ``DistributedSampler``, FSDP2,
tensor parallelism, ZeRO, DCP and pipelining run on MPI with no TCP store and no ports,
and CUDA tensors get the same events and pinned staging as DDP's buckets.

Work is asynchronous (``hpcddp.backend.work``): a collective returns once its MPI request is
issued, or queued behind its CUDA producer's event.
"""

from typing import Optional

import torch
import torch.distributed as dist
from mpi4py import MPI

from hpcddp.backend.work import RecvWork, StatusRequest, Work
from hpcddp.comm import activity, lifetime
from hpcddp.comm.ops import mpi_op
from hpcddp.comm.serial import mpi_call
from hpcddp.transport import Transfer, Transport, reads, updates, writes
from hpcddp.transport.aliasing import (
    check_parts, counts_and_displs, in_place_chunk, overlaps, split_counts, unflatten_into,
    unstack_into)
from hpcddp.transport.sparse import allreduce_sparse

__all__ = ["BACKEND", "MPIProcessGroup"]

BACKEND = "hpcddp"

_REDUCE = {
    dist.ReduceOp.SUM: "sum", dist.ReduceOp.PRODUCT: "product", dist.ReduceOp.MIN: "min",
    dist.ReduceOp.MAX: "max", dist.ReduceOp.BAND: "band", dist.ReduceOp.BOR: "bor",
    dist.ReduceOp.BXOR: "bxor", dist.ReduceOp.AVG: "sum",
}


class MPIProcessGroup(dist.ProcessGroup, lifetime.Closable):
    """A torch.distributed process group whose collectives run on an mpi4py communicator.

    Args:
        comm: the communicator; group rank and size are its rank and size.
        cuda_aware: hand CUDA tensors to MPI as device buffers.
        device_reductions: hand them to MPI's ``Ireduce`` and ``Ireduce_scatter`` too
            (``World.device_reductions``); else those are staged.
        reduction: how allreduces are carried out, ``"mpi"`` or ``"ring"``.
        owns_comm: ``close()`` frees ``comm`` (a duplicate made for this group).
        timeout: seconds any of its operations may be waited for before the wait raises
            ``DistBackendError``, as gloo's (torch passes the group's ``timeout``).

    ``dist.destroy_process_group`` closes it; ``close()`` does the same by hand.
    """

    _what = "hpcddp process group"

    def __init__(self, comm, cuda_aware: bool = False, owns_comm: bool = False,
                 reduction: str = "mpi", timeout: Optional[float] = None,
                 device_reductions: bool = True):
        super().__init__(comm.rank, comm.size)
        self.timeout = timeout  # seconds every Work waits at most, as gloo's; None: none
        self._hpcddp_name = self._hpcddp_desc = ""
        self.comm = comm
        self.cuda_aware = cuda_aware
        activity.channel_for(comm, "process group")
        self.transport = Transport(comm, cuda_aware, reduction=reduction,
                                   device_reductions=device_reductions)
        self._where = f"{comm.Get_name()} (rank {comm.rank} of {comm.size})"
        self._owns_comm = owns_comm
        self._tag_ub = None
        self._opened()

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

    def shutdown(self):
        """Called by ``dist.destroy_process_group``: release the communicator."""
        self.close()

    def _release(self):
        # Whatever is still in flight completes first: its buffers are MPI's until then.
        self.transport.issue_all()
        self.transport.close()
        activity.forget(self.comm)
        if self._owns_comm:
            lifetime.free_comm(self.comm)

    # -- helpers ---------------------------------------------------------------------

    def _op_name(self, opts, tensor):
        red = opts.reduceOp
        red = red.op if hasattr(red, "op") else red
        name = _REDUCE.get(red)
        if name is None:
            what = str(red).rsplit(".", 1)[-1]
            raise ValueError(f"reduce op {what} is not supported by the hpcddp backend (NCCL "
                             f"alone has it); use SUM, AVG, PRODUCT, MIN, MAX, BAND, BOR or "
                             f"BXOR (for PREMUL_SUM: scale the tensor, then SUM)")
        if red == dist.ReduceOp.AVG and not (tensor.is_floating_point() or tensor.is_complex()):
            raise ValueError(f"ReduceOp.AVG needs a floating-point tensor, got {tensor.dtype}")
        return name, red == dist.ReduceOp.AVG

    def _submit(self, what, tensors, issue, result=None, call="", reduces=False) -> Transfer:
        """Start ``what``; ``call=None`` for point-to-point (not a collective: neither
        counted for the watchdog nor compared by HPCDDP_DEBUG=detail); ``reduces`` where
        MPI's own reduction combines the data."""
        self._check_open()
        return self.transport.submit(f"{what} on {self._where}", tensors, issue, result,
                                     what if call == "" else call, reduces)

    def _work(self, transfers, result, cls=Work):
        return cls(transfers, result, self.timeout)

    # -- collectives -----------------------------------------------------------------
    # AVG divides before the sum (torch's comm hooks do the same, against overflow), on
    # the caller's stream, so the result needs no further step after MPI completes.

    def allreduce(self, tensors, opts=None):
        opts = opts or dist.AllreduceOptions()
        if any(t.is_sparse for t in tensors):
            return self._allreduce_sparse(tensors, opts)
        transfers = []
        for tensor in tensors:
            name, avg = self._op_name(opts, tensor)
            if avg:
                tensor.div_(self.comm.size)
            self._check_open()
            transfers.append(self.transport.allreduce(
                tensor, name, name=f"{_label(f'allreduce ({name})', tensor)} on {self._where}"))
        return self._work(transfers, list(tensors))

    def _allreduce_sparse(self, tensors, opts):
        """Sparse COO tensors are summed at once (``hpcddp.transport.sparse``), as gloo does."""
        name, avg = self._op_name(opts, tensors[0])
        if name != "sum" or len(tensors) != 1:
            raise ValueError(f"all_reduce of a sparse tensor: the hpcddp backend sums one "
                             f"sparse tensor at a time (SUM or AVG), got "
                             f"{len(tensors)} tensors and {name.upper()}")
        self._check_open()
        total = self.transport.blocking(
            lambda: allreduce_sparse(self.comm, tensors[0], tensors[0]))
        tensors[0].copy_(total / self.comm.size if avg else total)
        return self._work([], list(tensors))

    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts or dist.AllreduceCoalescedOptions())

    def reduce(self, tensors, opts=None):
        opts = opts or dist.ReduceOptions()
        root, tensor = opts.rootRank, tensors[opts.rootTensor]
        name, avg = self._op_name(opts, tensor)
        is_root = self.comm.rank == root
        send = tensor if not avg else (tensor.div_(self.comm.size) if is_root
                                       else tensor / self.comm.size)

        def issue(b):
            if is_root:
                return self.comm.Ireduce(MPI.IN_PLACE, b.buf, op=mpi_op(name, b.kind), root=root)
            return self.comm.Ireduce(b.buf, None, op=mpi_op(name, b.kind), root=root)
        transfer = self._submit(_label(f"reduce ({name}) to rank {root}", tensor),
                                [(send, True, is_root)], issue, reduces=True)
        return self._work([transfer], [tensor])

    def broadcast(self, tensors, opts=None):
        opts = opts or dist.BroadcastOptions()
        root = opts.rootRank
        self._check_open()
        transfers = [self.transport.broadcast(
            t, root, f"{_label(f'broadcast from rank {root}', t)} on {self._where}")
            for t in tensors]
        return self._work(transfers, list(tensors))

    def _allgather_one(self, output, tensor, then=None):
        label = _label("allgather", tensor)
        check_parts("all_gather_into_tensor", "output", output, "input", tensor, self.comm.size)
        if in_place_chunk(output, tensor, self.comm.rank):
            # FSDP2 gathers each rank's shard from its own place in the output.
            transfer = self._submit(label, [updates(output)],
                                    lambda dst: self.comm.Iallgather(MPI.IN_PLACE, dst.buf))
        else:
            if overlaps(output, tensor):
                tensor = tensor.clone()
            transfer = self._submit(label, [reads(tensor), writes(output)],
                                    lambda src, dst: self.comm.Iallgather(src.buf, dst.buf))
        return transfer.then(then) if then else transfer

    def _allgather_uneven(self, outputs, tensor):
        """``all_gather`` into parts of different sizes (MPI's ``Iallgatherv``)."""
        counts = counts_and_displs([t.numel() for t in outputs])
        flat = tensor.new_empty(sum(counts[0]))
        transfer = self._submit(_label("allgather (uneven)", tensor),
                                [reads(tensor), writes(flat)],
                                lambda src, dst: self.comm.Iallgatherv(src.buf, [dst.buf, counts]),
                                call=f"allgather (uneven) of {str(tensor.dtype)[6:]}")
        return transfer.then(lambda: unflatten_into(flat, outputs))

    def allgather(self, output_tensors, input_tensors, opts=None):
        transfers = []
        for outputs, tensor in zip(output_tensors, input_tensors):
            # Decided on what every rank sees alike (the parts' sizes): MPI's allgather
            # and allgatherv do not match each other.
            if len({out.numel() for out in outputs}) > 1:
                transfers.append(self._allgather_uneven(outputs, tensor))
                continue
            gathered = tensor.new_empty(self.comm.size * tensor.numel())
            transfers.append(self._allgather_one(
                gathered, tensor, lambda o=outputs, g=gathered: unflatten_into(g, o)))
        return self._work(transfers, [t for outs in output_tensors for t in outs])

    def _allgather_base(self, output, input, opts=None):
        return self._work([self._allgather_one(output, input)], [output])

    def allgather_into_tensor_coalesced(self, outputs, inputs, opts=None):
        return self._work([self._allgather_one(o, i) for o, i in zip(outputs, inputs)],
                          list(outputs))

    def _reduce_scatter_one(self, output, tensor, opts, counts=None):
        """Reduce ``tensor`` and scatter it in equal parts, or in parts of ``counts``
        elements (MPI's ``Ireduce_scatter``)."""
        if counts is None:
            check_parts("reduce_scatter_tensor", "input", tensor, "output", output,
                         self.comm.size)
        name, avg = self._op_name(opts, tensor)
        if avg:
            tensor = tensor / self.comm.size
        elif overlaps(output, tensor):
            tensor = tensor.clone()
        if counts is not None:
            def uneven(src, dst):
                return self.comm.Ireduce_scatter(src.buf, dst.buf, counts,
                                                 op=mpi_op(name, dst.kind))
            return self._submit(_label(f"reduce_scatter ({name}, uneven)", output),
                                [reads(tensor), writes(output)], uneven,
                                call=f"reduce_scatter ({name}, uneven) of "
                                     f"{str(tensor.dtype)[6:]}", reduces=True)

        def issue(src, dst):
            return self.comm.Ireduce_scatter_block(src.buf, dst.buf, op=mpi_op(name, dst.kind))
        return self._submit(_label(f"reduce_scatter ({name})", output),
                            [reads(tensor), writes(output)], issue, reduces=True)

    def reduce_scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        transfers = []
        for out, ins in zip(output_tensors, input_tensors):
            flat = torch.cat([t.reshape(-1) for t in ins])
            counts = [t.numel() for t in ins]
            transfers.append(self._reduce_scatter_one(
                out, flat, opts, counts if len(set(counts)) > 1 else None))
        return self._work(transfers, list(output_tensors))

    def _reduce_scatter_base(self, output, input, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        return self._work([self._reduce_scatter_one(output, input, opts)], [output])

    def reduce_scatter_tensor_coalesced(self, outputs, inputs, opts=None):
        opts = opts or dist.ReduceScatterOptions()
        return self._work([self._reduce_scatter_one(o, i, opts)
                           for o, i in zip(outputs, inputs)], list(outputs))

    def gather(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.GatherOptions()
        root, tensor = opts.rootRank, input_tensors[0]
        label = _label(f"gather to rank {root}", tensor)
        if self.comm.rank != root:
            transfer = self._submit(label, [reads(tensor)],
                                    lambda src: self.comm.Igather(src.buf, None, root=root))
            return self._work([transfer], [])
        gathered = tensor.new_empty((self.comm.size,) + tuple(tensor.shape))
        transfer = self._submit(label, [reads(tensor), writes(gathered)],
                                lambda src, dst: self.comm.Igather(src.buf, dst.buf, root=root))
        transfer.then(lambda: unstack_into(gathered, output_tensors[0]))
        return self._work([transfer], list(output_tensors[0]))

    def scatter(self, output_tensors, input_tensors, opts=None):
        opts = opts or dist.ScatterOptions()
        root, output = opts.rootRank, output_tensors[0]
        label = _label(f"scatter from rank {root}", output)
        if self.comm.rank != root:
            transfer = self._submit(label, [writes(output)],
                                    lambda dst: self.comm.Iscatter(None, dst.buf, root=root))
            return self._work([transfer], [output])
        stacked = torch.stack(list(input_tensors[0]))
        transfer = self._submit(label, [reads(stacked), writes(output)],
                                lambda src, dst: self.comm.Iscatter(src.buf, dst.buf, root=root))
        return self._work([transfer], [output])

    def alltoall_base(self, output, input, output_split_sizes, input_split_sizes, opts=None):
        if not output_split_sizes and not input_split_sizes:
            def issue(src, dst):
                return self.comm.Ialltoall(src.buf, dst.buf)
        else:
            send = split_counts(input, input_split_sizes, self.comm.size)
            recv = split_counts(output, output_split_sizes, self.comm.size)

            def issue(src, dst):
                return self.comm.Ialltoallv([src.buf, send], [dst.buf, recv])
        # With split sizes each rank's input may differ: only the dtype must agree.
        transfer = self._submit(_label("all_to_all", input),
                                [reads(input), writes(output)], issue,
                                call=f"all_to_all of {str(input.dtype)[6:]}")
        return self._work([transfer], [output])

    def alltoall(self, output_tensors, input_tensors, opts=None):
        send = counts_and_displs([t.numel() for t in input_tensors])
        recv = counts_and_displs([t.numel() for t in output_tensors])
        flat_in = torch.cat([t.reshape(-1) for t in input_tensors])
        flat_out = flat_in.new_empty(sum(recv[0]))

        def issue(src, dst):
            return self.comm.Ialltoallv([src.buf, send], [dst.buf, recv])
        transfer = self._submit(_label("all_to_all", flat_in),
                                [reads(flat_in), writes(flat_out)], issue,
                                call=f"all_to_all of {str(flat_in.dtype)[6:]}")
        transfer.then(lambda: unflatten_into(flat_out, output_tensors))
        return self._work([transfer], list(output_tensors))

    def barrier(self, opts=None):
        return self._work([self._submit("barrier", [], lambda: self.comm.Ibarrier())], [])

    def _check_tag(self, tag, what):
        """MPI tags run from 0 to the MPI's ``MPI_TAG_UB`` (at least 32767); refuse others
        here rather than with MPI's 'Invalid tag'."""
        if self._tag_ub is None:
            self._tag_ub = self.comm.Get_attr(MPI.TAG_UB)
        if not 0 <= tag <= self._tag_ub:
            raise ValueError(f"{what} with tag={tag}: this MPI's tags run from 0 to "
                             f"{self._tag_ub} (MPI_TAG_UB); use a tag in that range")

    def send(self, tensors, dstRank, tag):
        self._check_tag(tag, f"send to rank {dstRank}")
        transfers = [self._submit(_label(f"send to rank {dstRank}", t), [reads(t)],
                                  lambda b: self.comm.Isend(b.buf, dest=dstRank, tag=tag),
                                  call=None)
                     for t in tensors]
        return self._work(transfers, list(tensors))

    def recv(self, tensors, srcRank, tag):
        self._check_tag(tag, f"receive from rank {srcRank}")
        transfers = [self._submit(_label(f"receive from rank {srcRank}", t),
                                  [writes(t)],
                                  lambda b: self.comm.Irecv(b.buf, source=srcRank, tag=tag),
                                  call=None)
                     for t in tensors]
        return self._work(transfers, list(tensors))

    def recv_anysource(self, tensors, tag):
        self._check_tag(tag, "receive from any rank")
        status = mpi_call(MPI.Status)  # even a Status is made with MPI calls

        def issue(b):
            return StatusRequest(self.comm.Irecv(b.buf, source=MPI.ANY_SOURCE, tag=tag), status)
        transfer = self._submit(_label("receive from any rank", tensors[0]),
                                [writes(tensors[0])], issue, call=None)
        transfer.then(lambda: setattr(transfer, "result", status.Get_source()))
        return self._work([transfer], list(tensors), RecvWork)

    def allgather_coalesced(self, output_lists, input_tensors, opts=None):
        """torch's lists are by rank, then tensor (``allgather``'s are by tensor, then
        rank): rank ``r``'s ``i``-th input lands in ``output_lists[r][i]``."""
        size = self.comm.size
        if len(output_lists) != size or any(len(o) != len(input_tensors) for o in output_lists):
            raise ValueError(
                f"all_gather_coalesced: output_tensor_lists must hold one list per rank "
                f"({size}), each of one tensor per input ({len(input_tensors)}); got "
                f"{len(output_lists)} lists of {[len(o) for o in output_lists]} tensors")
        by_tensor = [[output_lists[r][i] for r in range(size)]
                     for i in range(len(input_tensors))]
        return self.allgather(by_tensor, input_tensors, opts)

    # torch >= 2.10 calls these names from Python; they are the "_base" collectives.
    all_gather_single = _allgather_base
    all_gather_single_coalesced = allgather_into_tensor_coalesced
    reduce_scatter_single = _reduce_scatter_base
    reduce_scatter_single_coalesced = reduce_scatter_tensor_coalesced
    all_to_all_single = alltoall_base


def _label(what, tensor):
    return f"{what} of {tensor.numel()} {str(tensor.dtype)[6:]} {list(tensor.shape)}"
