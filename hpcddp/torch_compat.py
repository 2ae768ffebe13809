"""Every private name of torch that hpcddp uses, in one place, and what each is for.

torch promises nothing about these names; a release that moves one breaks hpcddp here
and only here. Each was checked on torch 2.13, the oldest torch setup.cfg allows. torch
itself is imported only when a function is called: ``hpcddp.backend.torch_init`` uses this
module before torch.distributed has finished importing.
"""

import sys

__all__ = ["backend_of", "batchnorm_base", "compress_hook", "default_group", "flatten_dense",
           "foreach_copy", "foreach_mul", "future_base", "profiler_check",
           "queue_backward_callback", "rendezvous_handlers", "unflatten_dense"]


def future_base():
    """``torch._C.Future``: the C base of ``torch.futures.Future``, which futures made in
    C++ (a ``Work``'s ``get_future()``) are instances of; a comm hook may return either."""
    import torch
    return torch._C.Future


def flatten_dense(tensors):
    """``torch._utils._flatten_dense_tensors``: tensors of one dtype into one flat tensor,
    the loop in C++ (half the time of ``torch.cat`` of their ``reshape(-1)`` for a
    ResNet's 62 gradients: hpcddp.horovod's fused allreduce)."""
    import torch
    return torch._utils._flatten_dense_tensors(tensors)


def unflatten_dense(flat, tensors):
    """``torch._utils._unflatten_dense_tensors``: views of ``flat`` shaped as ``tensors``."""
    import torch
    return torch._utils._unflatten_dense_tensors(flat, tensors)


def foreach_copy(destinations, sources) -> None:
    """``torch._foreach_copy_``: ``d.copy_(s)`` for each pair, in one call."""
    import torch
    torch._foreach_copy_(destinations, sources)


def foreach_mul(tensors, factor: float) -> None:
    """``torch._foreach_mul_``: ``t.mul_(factor)`` for each tensor, in one call."""
    import torch
    torch._foreach_mul_(tensors, factor)


def queue_backward_callback(callback) -> None:
    """Run ``callback`` once the autograd engine finishes the current backward pass, as
    torch's own DDP reducer does (``Variable._execution_engine.queue_callback``)."""
    import torch
    torch.autograd.Variable._execution_engine.queue_callback(callback)


def profiler_check():
    """``torch.autograd._profiler_enabled``: the cheap test of whether a profiler
    records, made before each span the timeline mirrors into torch's traces."""
    import torch
    return torch.autograd._profiler_enabled


def rendezvous_handlers() -> dict:
    """torch.distributed's table of rendezvous handlers by URL scheme: the ``env``
    entry is wrapped (``hpcddp.backend.torch_init``), since ``register_rendezvous_handler``
    refuses a scheme that is already registered."""
    return sys.modules["torch.distributed.rendezvous"]._rendezvous_handlers


def default_group():
    """torch.distributed's default process group, or None, read without the error
    ``dist.group.WORLD`` raises before ``init_process_group``."""
    return sys.modules["torch.distributed.distributed_c10d"]._world.default_pg


def backend_of(group, device):
    """The backend object behind ``group`` for ``device`` (``ProcessGroup._get_backend``):
    an hpcddp group is an ``MPIProcessGroup`` there."""
    return group._get_backend(device)


def batchnorm_base():
    """``torch.nn.modules.batchnorm._BatchNorm``, the base of every BatchNorm layer, which
    ``SyncBatchNorm`` derives from and converts."""
    from torch.nn.modules.batchnorm import _BatchNorm
    return _BatchNorm


def compress_hook(dtype, state, bucket):
    """torch's ``default_hooks._compress_hook``: the body of its ``fp16_compress_hook``
    and ``bf16_compress_hook`` for any dtype, which hpcddp's hooks of those names call
    when they run on a DDP other than hpcddp's (torch's own, on gloo)."""
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    return default_hooks._compress_hook(dtype, state, bucket)
