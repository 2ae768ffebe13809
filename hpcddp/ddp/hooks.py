"""What is done to a full bucket: the bucket hook.

A hook is called with a ``GradBucket`` once all its gradients are in and returns a
handle whose ``wait()`` gives the reduced flat tensor. It also says by what each gradient
is divided as it enters the bucket (``divisor``); that is where averaging happens, and
nowhere else. The reducer moves buckets and knows nothing of averaging.

Three kinds:

- ``AllreduceMean``: the default, the mean through the reducer's transport.
- ``CompressedMean``: the same, with the bucket sent as float16 or bfloat16
  (``fp16_compress_hook`` and ``bf16_compress_hook`` select it).
- ``FutureHook``: any hook with torch's contract, ``hook(state, bucket) -> Future``, such
  as torch's PowerSGD; its collectives run on a torch.distributed group.
"""

from typing import Dict, List

import torch
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks

from hpcddp.torch_compat import compress_hook, future_base
from hpcddp.transport import Transfer
from hpcddp.backend.work import deferred_futures, settle

__all__ = ["AllreduceMean", "CompressedMean", "FutureHook", "allreduce_hook",
           "bf16_compress_hook", "fp16_compress_hook", "hook_for"]


class AllreduceMean:
    """The default hook: the mean over ranks, as torch's DDP computes it without a hook.

    Every gradient is divided by the world size as it enters the bucket (fused into
    that copy), and the bucket is then summed by one non-blocking allreduce; 16-bit
    sums over many ranks cannot overflow this way.

    Args:
        transport: the gradient communicator's transport.
    """

    def __init__(self, transport):
        self.transport = transport
        self.divisor = transport.comm.size

    def __call__(self, bucket) -> Transfer:
        buffer = bucket.buffer()
        return self.transport.allreduce(
            buffer, slot=bucket.index(), route=bucket.route,
            name=f"DDP bucket {bucket.index()} ({buffer.numel()} {buffer.dtype}, "
                 f"{len(bucket.layout.params)} parameters)")


class CompressedMean(AllreduceMean):
    """The mean, with each bucket cast to ``dtype`` for the wire and back on arrival.

    The division happens in the bucket's own precision as gradients enter it; the cast
    is one pass into a buffer kept per bucket (allocated once, only grown). 16-bit sums
    in host memory are carried out by the transport's ring with torch kernels.

    Args:
        transport: the gradient communicator's transport.
        dtype: ``torch.float16`` or ``torch.bfloat16``.
    """

    def __init__(self, transport, dtype: torch.dtype):
        super().__init__(transport)
        self.dtype = dtype
        self._wire: Dict[int, torch.Tensor] = {}
        self._routes: Dict[int, object] = {}

    def _wire_for(self, bucket) -> torch.Tensor:
        index, source = bucket.index(), bucket.storage
        held = self._wire.get(index)
        if held is None or held.numel() < source.numel() or held.device != source.device:
            held = torch.empty(source.numel(), dtype=self.dtype, device=source.device)
            self._wire[index] = held
            self._routes[index] = self.transport.route_for(held)
        return held[:source.numel()]

    def __call__(self, bucket) -> Transfer:
        if not bucket.storage.is_floating_point() or bucket.storage.element_size() <= 2:
            return super().__call__(bucket)
        wire = self._wire_for(bucket)
        wire.copy_(bucket.storage)
        return self.transport.allreduce(
            wire, slot=bucket.index(), route=self._routes[bucket.index()],
            name=f"DDP bucket {bucket.index()} ({wire.numel()} {bucket.storage.dtype} "
                 f"sent as {self.dtype}, {len(bucket.layout.params)} parameters)")


class _HookResult:
    """The handle of one ``FutureHook`` call: its future, and the work it must settle."""

    __slots__ = ("future", "works")

    def __init__(self, future, works):
        self.future, self.works = future, works

    def wait(self) -> torch.Tensor:
        settle(self.works)
        value = self.future.wait()
        if isinstance(value, (list, tuple)):
            if len(value) != 1:
                raise RuntimeError(f"a DDP communication hook's future must hold one tensor, "
                                   f"got {len(value)}")
            value = value[0]
        if not isinstance(value, torch.Tensor):
            raise RuntimeError(f"a DDP communication hook's future must hold a tensor, got "
                               f"{type(value).__name__}")
        return value


class FutureHook:
    """A hook with torch's contract: ``hook(state, bucket)`` returns a
    ``torch.futures.Future`` of the reduced flat tensor.

    Gradients enter the bucket undivided, as in torch: averaging is the hook's business
    (``allreduce_hook`` divides by the group size itself). The collectives the hook starts
    are issued at once, during backward; the futures they return are completed at the
    end of backward in bucket order (``hpcddp.backend.work.settle``), so that collectives started
    from ``.then()`` callbacks are issued in the same order on every rank.
    """

    divisor = 1

    def __init__(self, state, hook):
        self.state, self.hook = state, hook

    def __call__(self, bucket) -> _HookResult:
        works: List = []
        with deferred_futures(works):
            future = self.hook(self.state, bucket)
        if not isinstance(future, future_base()):  # torch.futures.Future or its C base
            settle(works)
            raise TypeError(f"the DDP communication hook {_name(self.hook)} returned "
                            f"{type(future).__name__}; a hook returns a "
                            f"torch.futures.Future of the reduced tensor")
        return _HookResult(future, works)


class _TransportHook:
    """A hook that DDP runs inside its transport, the bucket cast to ``dtype`` if given.

    Given to ``hpcddp.DistributedDataParallel.register_comm_hook`` it becomes an
    ``AllreduceMean`` or a ``CompressedMean`` (``state`` must be None: the wrapper's own
    communicator is used). Called as a torch hook elsewhere, such as on torch's own DDP,
    it is torch's hook of the same name.
    """

    def __init__(self, dtype, name):
        self.dtype, self.__name__ = dtype, name
        self.__qualname__ = name

    def __call__(self, state, bucket):
        if self.dtype is None:
            return default_hooks.allreduce_hook(state, bucket)
        return compress_hook(self.dtype, state, bucket)

    def __repr__(self):
        return f"hpcddp.{self.__name__}"


allreduce_hook = _TransportHook(None, "allreduce_hook")
fp16_compress_hook = _TransportHook(torch.float16, "fp16_compress_hook")
bf16_compress_hook = _TransportHook(torch.bfloat16, "bf16_compress_hook")


def hook_for(state, hook, transport):
    """The bucket hook for ``register_comm_hook(state, hook)``."""
    if isinstance(hook, _TransportHook):
        if state is not None:
            raise ValueError(f"hpcddp.{hook.__name__} reduces on the DDP wrapper's own "
                             f"communicator; register it with state=None (got {state!r})")
        if hook.dtype is None:
            return AllreduceMean(transport)
        return CompressedMean(transport, hook.dtype)
    if not callable(hook):
        raise TypeError(f"register_comm_hook needs a callable hook(state, bucket), got "
                        f"{hook!r}")
    return FutureHook(state, hook)


def _name(hook):
    return getattr(hook, "__qualname__", None) or repr(hook)
