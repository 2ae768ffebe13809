"""How a tensor's memory is shown to MPI: one ``Route`` class per way.

MPI needs a contiguous buffer of a type it knows. bfloat16 travels as raw 16-bit words
(reduced by ``comm.ops``'s user operation), bool as bytes. MPI knows nothing of CUDA
streams: a device buffer handed to MPI before the kernels writing it have run gives
random results (mpi4py/mpi4py#60), so a CUDA tensor is bound with an event recorded on
the stream that produced it, and MPI sees it only once that event has completed. A
route waits for that event, never for the whole device, so later work goes on.
"""

from typing import Callable, List, Optional

import numpy as np
import torch

from hpcddp.comm.ops import BFLOAT16, BOOL

__all__ = ["Binding", "DeviceRoute", "HostRoute", "Route", "alias_array", "host_array",
           "slice_bounds"]


def slice_bounds(numel: int, element_size: int, slice_bytes: int):
    """(start, stop) ranges of at most ``slice_bytes`` covering ``numel`` elements; one
    range for the whole buffer when ``slice_bytes`` is 0, and one empty range for none."""
    if slice_bytes <= 0:
        return [(0, numel)]
    step = max(1, slice_bytes // max(1, element_size))
    return [(a, min(a + step, numel)) for a in range(0, max(numel, 1), step)]


_NUMPY_DTYPES = {}


def alias_array(tensor: torch.Tensor, dtype=None) -> np.ndarray:
    """A flat NumPy array over a contiguous CPU tensor's memory, of ``dtype`` (the
    tensor's own by default), that torch does not know of.

    ``Tensor.numpy()`` would mark the tensor's storage unresizable for good, and hooks
    resize bucket buffers (torch's batched PowerSGD does). The caller keeps ``tensor``
    alive for as long as the array is used.
    """
    if dtype is None:
        dtype = _NUMPY_DTYPES.get(tensor.dtype)
        if dtype is None:
            dtype = _NUMPY_DTYPES[tensor.dtype] = torch.empty(0, dtype=tensor.dtype).numpy().dtype
    nbytes = tensor.numel() * tensor.element_size()
    if nbytes == 0:
        return np.empty(0, dtype=dtype)
    dtype = np.dtype(dtype)
    return np.asarray(_Memory(tensor.data_ptr(), nbytes // dtype.itemsize, dtype.str))


class _Memory:
    """Memory at an address, as NumPy's array interface describes it (writable). A ctypes
    array over it would make a new ctypes type per size, and each type is a reference
    cycle left for Python's cyclic collector."""

    __slots__ = ("__array_interface__",)

    def __init__(self, address: int, count: int, typestr: str):
        self.__array_interface__ = {"data": (address, False), "shape": (count,),
                                    "typestr": typestr, "version": 3}


def host_array(tensor: torch.Tensor):
    """Return ``(array, kind)``: a flat NumPy alias of a contiguous, detached CPU tensor
    (``alias_array``), and how MPI must read it (``BFLOAT16``, ``BOOL`` or None)."""
    if tensor.dtype == torch.bfloat16:
        return alias_array(tensor, np.uint16), BFLOAT16
    if tensor.dtype == torch.bool:
        return alias_array(tensor, np.uint8), BOOL
    return alias_array(tensor), None


class Binding:
    """One tensor (or one piece of it) of one operation, as MPI sees it.

    Attributes:
        tensor: the caller's tensor, or the part of it this piece covers.
        buf: what MPI reads or writes.
        kind: ``BFLOAT16`` or ``BOOL`` where MPI sees raw words, else None.
        host: the pinned host copy MPI works on, for a staged tensor; else None.
        memory: the contiguous tensor whose memory ``buf`` is (the tensor itself, a
            contiguous copy, or ``host``): what a ring reduces with torch kernels.
        ready: an event after which MPI may touch ``buf``; None: at once.
        finish: after MPI has completed, brings the result into ``tensor``; returns the
            stream it queued that work on (the consumer must wait for it), or None.
        release: called once the whole operation is over (returns a borrowed buffer).
    """

    __slots__ = ("tensor", "buf", "kind", "host", "ready", "finish", "release", "memory")

    def __init__(self, tensor, buf, kind=None, host=None, ready=None,
                 finish: Optional[Callable[[], object]] = None,
                 release: Optional[Callable[[], None]] = None, memory=None):
        self.tensor, self.buf, self.kind, self.host = tensor, buf, kind, host
        self.ready, self.finish, self.release = ready, finish, release
        self.memory = memory if memory is not None else (host if host is not None else tensor)

    def is_ready(self) -> bool:
        return self.ready is None or self.ready.query()


class Route:
    """How tensors of one kind reach MPI. A ``Transport`` holds one instance of each.

    Args:
        cuda: the CUDA API (``torch.cuda``); unit tests of the ordering pass a stand-in.
    """

    name = "route"

    def __init__(self, cuda=torch.cuda):
        self.cuda = cuda

    def bind(self, tensor: torch.Tensor, read: bool = True, write: bool = True,
             slot: Optional[int] = None, chunk_bytes: int = 0) -> List[Binding]:
        """Show ``tensor`` to MPI for one operation.

        Args:
            tensor: the caller's tensor.
            read: MPI reads the tensor's current values.
            write: MPI's result must end up in the tensor.
            slot: a buffer that stays this operation's across calls (a DDP bucket's
                index); staging memory is kept per slot.
            chunk_bytes: an elementwise operation may travel in pieces of this size
                (only staging splits; 0 keeps it whole).

        Returns:
            One binding per piece, in order.
        """
        raise NotImplementedError

    def __repr__(self):
        return f"<{type(self).__name__}>"


class HostRoute(Route):
    """CPU tensors: MPI works on the tensor's own memory (a contiguous copy if need be)."""

    name = "host"

    def bind(self, tensor, read=True, write=True, slot=None, chunk_bytes=0):
        tensor = tensor.detach()
        if tensor.is_contiguous():
            return [Binding(tensor, *host_array(tensor))]
        work = tensor.contiguous()

        def finish():
            tensor.copy_(work)
        return [Binding(tensor, *host_array(work), finish=finish if write else None,
                        memory=work)]


class DeviceRoute(Route):
    """CUDA tensors for a CUDA-aware MPI: the device buffer itself goes to MPI, through
    ``__cuda_array_interface__`` / DLPack (no CuPy needed), once its producer's event
    has completed. A completed request means the result is in device memory."""

    name = "device"

    def bind(self, tensor, read=True, write=True, slot=None, chunk_bytes=0):
        tensor = tensor.detach()
        stream = self.cuda.current_stream(tensor.device)
        work = tensor if tensor.is_contiguous() else tensor.contiguous()
        produced = self.cuda.Event()
        produced.record(stream)
        buf, kind = (work.view(torch.uint8), BOOL) if work.dtype == torch.bool else (work, None)
        finish = None
        if write and work is not tensor:
            def finish():
                with self.cuda.stream(stream):
                    tensor.copy_(work)
                return stream
        return [Binding(tensor, buf, kind, ready=produced, finish=finish, memory=work)]
