"""How a torch tensor is shown to MPI.

MPI needs a contiguous buffer of a type it knows. CPU tensors are handed over in place
as NumPy views; bfloat16 travels as raw 16-bit words (reduced by ``comm.ops``); bool as
bytes. A CUDA tensor goes to MPI as a device buffer only when MPI is CUDA-aware, after
an event recorded on the stream that produced it has completed (MPI knows nothing of
CUDA streams: mpi4py/mpi4py#60); otherwise it is staged through host memory. This is
the blocking path of the torch.distributed backend; DDP's buckets travel through
``hpcddp.ddp.transport``, which overlaps the same steps with backward.
"""

from typing import Callable, NamedTuple, Optional

import numpy as np
import torch

from hpcddp.comm.ops import BFLOAT16

__all__ = ["MPIView", "mpi_view", "numpy_view", "transfer_mode"]

BOOL = "bool"


class MPIView(NamedTuple):
    """A buffer MPI can read or write, standing for ``tensor``.

    ``finish`` copies the result back into ``tensor`` when the buffer is a staged copy,
    and is None when MPI works on the tensor's own memory.
    """

    buf: object
    kind: Optional[str]
    finish: Optional[Callable[[], None]]


def numpy_view(tensor: torch.Tensor):
    """Return ``(array, kind)`` sharing memory with a contiguous CPU tensor."""
    tensor = tensor.detach()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(np.uint16), BFLOAT16
    if tensor.dtype == torch.bool:
        return tensor.view(torch.uint8).numpy(), BOOL
    return tensor.numpy(), None


def transfer_mode(tensor: torch.Tensor, cuda_aware: bool) -> str:
    """``host``, ``device`` or ``staged``: how ``tensor`` is shown to MPI."""
    if not tensor.is_cuda:
        return "host"
    # The bf16 sum is a user-defined MPI op that runs on the host, so bf16 is staged.
    if cuda_aware and tensor.dtype != torch.bfloat16:
        return "device"
    return "staged"


def mpi_view(tensor: torch.Tensor, cuda_aware: bool, writable: bool = True) -> MPIView:
    """Show ``tensor`` to MPI.

    Args:
        tensor: any tensor.
        cuda_aware: MPI accepts CUDA device buffers.
        writable: MPI writes the result here; staged copies are copied back by ``finish``.
    """
    tensor = tensor.detach()
    if transfer_mode(tensor, cuda_aware) == "device":
        work = tensor if tensor.is_contiguous() else tensor.contiguous()
        # MPI reads now: wait for the kernels queued on the producing stream up to here,
        # not for the whole device (later work on other streams may go on).
        produced = torch.cuda.Event()
        produced.record(torch.cuda.current_stream(tensor.device))
        produced.synchronize()
        finish = (lambda: tensor.copy_(work)) if writable and work is not tensor else None
        return MPIView(work, None, finish)
    if tensor.device.type == "cpu" and tensor.is_contiguous():
        array, kind = numpy_view(tensor)
        return MPIView(array, kind, None)
    work = tensor.to("cpu", memory_format=torch.contiguous_format, copy=True)
    array, kind = numpy_view(work)
    finish = (lambda: tensor.copy_(work)) if writable else None
    return MPIView(array, kind, finish)
