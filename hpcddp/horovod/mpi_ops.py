"""``horovod.torch``'s allreduces and handles, with Horovod's signatures and semantics;
the operations that move rows (allgather, broadcast, alltoall, reducescatter) are in
``gather_ops.py``.

Each ``*_async`` starts a named operation on the engine (``engine.py``) and returns its
handle at once; ``poll(handle)`` says whether it completed, ``synchronize(handle)``
waits and returns the result (an operation that failed raises
``HorovodInternalError`` there, on every rank it failed on). The out-of-place forms
without ``_async`` run through autograd with Horovod's gradients: an allreduce's is the
same allreduce of the gradient, an allgather's the averaged gradient's own rows, a
broadcast's the averaged gradient on the root and zeros elsewhere, an alltoall's the
alltoall back, a reducescatter's the gathered gradient.

Example::

    handle = hvd.allreduce_async(loss.detach(), name="loss")
    ...                                   # compute; the reduction moves meanwhile
    mean_loss = hvd.synchronize(handle)
"""

from typing import List

import torch

from hpcddp.horovod import basics
from hpcddp.horovod.basics import check_average
from hpcddp.horovod.common import Adasum, HorovodInternalError
from hpcddp.horovod.compression import Compression
from hpcddp.horovod.requests import Request
from hpcddp.horovod.process_sets import ProcessSet, global_process_set

__all__ = ["allreduce", "allreduce_", "allreduce_async", "allreduce_async_",
           "grouped_allreduce", "grouped_allreduce_", "grouped_allreduce_async",
           "grouped_allreduce_async_", "poll", "synchronize", "join", "barrier"]

# Horovod's dtypes, and bfloat16.
_DTYPES = {torch.uint8: "uint8", torch.int8: "int8", torch.int16: "int16",
           torch.int32: "int32", torch.int64: "int64", torch.float16: "float16",
           torch.bfloat16: "bfloat16", torch.float32: "float32", torch.float64: "float64",
           torch.bool: "bool"}
_group_counter = [0]


def _check(tensor: torch.Tensor, what: str) -> str:
    if not isinstance(tensor, torch.Tensor):
        raise ValueError(f"hvd.{what}: expected a torch.Tensor, got {type(tensor).__name__}")
    dtype = _DTYPES.get(tensor.dtype)
    if dtype is None:
        raise ValueError(f"Tensor type {tensor.type()} is not supported.")
    if not tensor.is_contiguous():
        raise ValueError("Tensor is required to be contiguous.")
    return dtype


def _set_id(process_set: ProcessSet) -> int:
    if process_set.process_set_id is None:
        raise ValueError(f"hvd: {process_set} is not set up: pass it to hvd.init(process_sets="
                         f"[...]) or hvd.add_process_set() first")
    return process_set.process_set_id


def _request(kind, tensor, name, process_set, **fields) -> Request:
    dtype = _check(tensor, kind) if tensor is not None else ""
    shape = tuple(tensor.shape) if tensor is not None else ()
    device = str(tensor.device) if tensor is not None else "cpu"
    return Request(_set_id(process_set), name, kind, dtype, shape, device, **fields)


def _submit(request, tensor, output, finish=None) -> int:
    return basics.engine().submit(request, tensor, output, finish)


def _reduce_op(op, average, what):
    op = check_average(op, average)
    if op not in basics.OP_NAMES:
        raise ValueError(f"hvd.{what}: op={op!r} is not one of hvd.Average, Sum, Min, Max, "
                         f"Product")
    return op


# -- allreduce ---------------------------------------------------------------------------

def _check_adasum(tensors, process_set, what) -> None:
    """Adasum combines floating-point gradients of a power-of-two number of ranks."""
    size = _set_size(process_set)
    if size & (size - 1):
        raise ValueError(f"hvd.{what}(op=hvd.Adasum): the process set has {size} ranks; "
                         f"Adasum pairs ranks recursively and needs a power of two; use "
                         f"op=hvd.Average or run on 2, 4, 8, ... ranks")
    for tensor in tensors:
        if not tensor.is_floating_point():
            raise ValueError(f"hvd.{what}(op=hvd.Adasum): a tensor of {tensor.dtype}; "
                             f"Adasum combines floating-point gradients only")


def _allreduce_async(tensor, output, name, op, prescale_factor, postscale_factor,
                     process_set, group=None):
    if op == Adasum:
        _check_adasum([tensor], process_set, "allreduce")
    request = _request("allreduce", tensor, name, process_set, op=op,
                       prescale=float(prescale_factor), postscale=float(postscale_factor),
                       group=group)
    return _submit(request, tensor, output)


def allreduce_async(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                    postscale_factor=1.0, process_set=global_process_set) -> int:
    """Start averaging (or summing, ``op=``) ``tensor`` over the set; it is not modified."""
    op = _reduce_op(op, average, "allreduce_async")
    return _allreduce_async(tensor, torch.empty_like(tensor), name, op, prescale_factor,
                            postscale_factor, process_set)


def allreduce_async_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
                     postscale_factor=1.0, process_set=global_process_set) -> int:
    """Start averaging ``tensor`` in place."""
    op = _reduce_op(op, average, "allreduce_async_")
    return _allreduce_async(tensor, tensor, name, op, prescale_factor, postscale_factor,
                            process_set)


def allreduce_(tensor, average=None, name=None, op=None, prescale_factor=1.0,
               postscale_factor=1.0, process_set=global_process_set) -> torch.Tensor:
    """Average ``tensor`` in place over the set; returns it."""
    return synchronize(allreduce_async_(tensor, average, name, op, prescale_factor,
                                        postscale_factor, process_set))


class _Allreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, tensor, name, op, prescale, postscale, process_set):
        ctx.args = (op, prescale, postscale, process_set)
        return synchronize(_allreduce_async(tensor, torch.empty_like(tensor), name, op,
                                            prescale, postscale, process_set))

    @staticmethod
    def backward(ctx, grad):
        op, prescale, postscale, process_set = ctx.args
        return (allreduce(grad.contiguous(), op=op, prescale_factor=prescale,
                          postscale_factor=postscale, process_set=process_set),
                None, None, None, None, None)


def allreduce(tensor, average=None, name=None, compression=Compression.none, op=None,
              prescale_factor=1.0, postscale_factor=1.0,
              process_set=global_process_set) -> torch.Tensor:
    """The average (or sum, ``op=``) of ``tensor`` over the set, through autograd."""
    op = _reduce_op(op, average, "allreduce")
    compressed, ctx = compression.compress(tensor)
    reduced = _Allreduce.apply(compressed, name, op, prescale_factor, postscale_factor,
                               process_set)
    return compression.decompress(reduced, ctx)


def _grouped_async(tensors, outputs, name, op, prescale, postscale, process_set):
    if not tensors:
        raise ValueError("hvd.grouped_allreduce: the list of tensors is empty")
    _group_counter[0] += 1
    base = name if name is not None else f"grouped_allreduce.noname.{_group_counter[0]}"
    key = (base, _group_counter[0]) if name is None else (base,)
    handles = [_allreduce_async(t, o, f"{base}.{k}", op, prescale, postscale, process_set,
                                group=(key, len(tensors)))
               for k, (t, o) in enumerate(zip(tensors, outputs))]
    return _Group(handles)


class _Group(int):
    """A grouped operation's handle: one per tensor inside, as Horovod's returns one."""

    def __new__(cls, handles):
        self = int.__new__(cls, handles[0])
        self.handles = handles
        return self


def grouped_allreduce_async(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                            postscale_factor=1.0, process_set=global_process_set):
    op = _reduce_op(op, average, "grouped_allreduce_async")
    return _grouped_async(tensors, [torch.empty_like(t) for t in tensors], name, op,
                          prescale_factor, postscale_factor, process_set)


def grouped_allreduce_async_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                             postscale_factor=1.0, process_set=global_process_set):
    op = _reduce_op(op, average, "grouped_allreduce_async_")
    return _grouped_async(tensors, tensors, name, op, prescale_factor, postscale_factor,
                          process_set)


def grouped_allreduce_(tensors, average=None, name=None, op=None, prescale_factor=1.0,
                       postscale_factor=1.0, process_set=global_process_set):
    return synchronize(grouped_allreduce_async_(tensors, average, name, op, prescale_factor,
                                                postscale_factor, process_set))


class _GroupedAllreduce(torch.autograd.Function):
    @staticmethod
    def forward(ctx, name, op, prescale, postscale, process_set, *tensors):
        ctx.args = (op, prescale, postscale, process_set)
        return tuple(synchronize(_grouped_async(
            list(tensors), [torch.empty_like(t) for t in tensors], name, op, prescale,
            postscale, process_set)))

    @staticmethod
    def backward(ctx, *grads):
        op, prescale, postscale, process_set = ctx.args
        reduced = grouped_allreduce([g.contiguous() for g in grads], op=op,
                                    prescale_factor=prescale, postscale_factor=postscale,
                                    process_set=process_set)
        return (None, None, None, None, None, *reduced)


def grouped_allreduce(tensors, average=None, name=None, compression=Compression.none,
                      op=None, prescale_factor=1.0, postscale_factor=1.0,
                      process_set=global_process_set) -> List[torch.Tensor]:
    """The allreduce of each tensor of ``tensors``, fused and completed together."""
    op = _reduce_op(op, average, "grouped_allreduce")
    pairs = [compression.compress(t) for t in tensors]
    reduced = _GroupedAllreduce.apply(name, op, prescale_factor, postscale_factor,
                                      process_set, *[c for c, _ in pairs])
    return [compression.decompress(r, ctx) for r, (_, ctx) in zip(reduced, pairs)]


def _set_size(process_set) -> int:
    return len(basics.engine().sets.get(_set_id(process_set)).ranks)


# -- handles -----------------------------------------------------------------------------

def poll(handle) -> bool:
    """Whether the operation of ``handle`` has completed: ``synchronize`` then returns at
    once."""
    handles = getattr(handle, "handles", [handle])
    return all(basics.engine().poll(h) for h in handles)


def synchronize(handle):
    """Wait for the operation of ``handle`` and return its result (a tensor, a tuple for
    alltoall, a list for a grouped operation); None for a handle not in flight."""
    engine = basics.engine()
    handles = getattr(handle, "handles", None)
    if handles is not None:
        return [synchronize(h) for h in handles]
    try:
        entry = engine.wait(handle)
    except ValueError:
        return None
    except HorovodInternalError:
        raise
    except RuntimeError as error:
        raise HorovodInternalError(str(error)) from error
    return entry.result


def join(device: int = -1) -> int:
    """Wait, taking part with zeros in the other ranks' allreduces, until every rank has
    joined; returns the last rank to join. For uneven data: a rank out of batches joins,
    and the others' averages still divide by the number of ranks. An allgather,
    broadcast, alltoall or reducescatter started while a rank has joined fails on the
    ranks that started it. ``device`` is accepted for Horovod's signature."""
    return int(synchronize(_submit(Request(_set_id(global_process_set), None, "join"),
                                   None, None)))


def barrier(process_set=global_process_set) -> None:
    """Wait until every rank of the set has reached it."""
    synchronize(_submit(Request(_set_id(process_set), None, "barrier"), None, None))
